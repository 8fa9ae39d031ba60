//! The core's tests run natively and again on wasm32 (`make wasm-unit`),
//! where only `wasm_bindgen_test` runs: a test module of the core declared
//! with plain `#[test]` alone would silently run natively only.

use portcullis_tests::repo_root;
use std::path::{Path, PathBuf};

const ALIAS: &str =
    "#[cfg(target_arch = \"wasm32\")]\nuse wasm_bindgen_test::wasm_bindgen_test as test;";

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A file's text with each line's leading blanks removed, so an alias
/// indented inside `mod tests` matches.
fn unindented(text: &str) -> String {
    text.lines()
        .map(str::trim_start)
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn every_core_test_module_runs_on_wasm32() {
    let mut files = Vec::new();
    rust_files(&repo_root().join("filter/core/src"), &mut files);
    assert!(
        files.len() > 30,
        "the core's sources were not found: {files:?}"
    );
    let mut with_tests = 0;
    let mut missing = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        if !text.contains("#[test]") {
            continue;
        }
        with_tests += 1;
        if !unindented(&text).contains(ALIAS) {
            missing.push(f.display().to_string());
        }
    }
    assert!(
        with_tests > 20,
        "only {with_tests} core files declare tests"
    );
    assert!(
        missing.is_empty(),
        "these core files declare #[test] without the wasm32 alias, so `make wasm-unit` skips them:\n{}\nadd:\n{ALIAS}",
        missing.join("\n")
    );
}

/// The modules of a source folder each file's code (not its comments or
/// tests) names through `crate::`.
fn module_graph(dir: &Path) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut files = Vec::new();
    if let Ok(entries) = std::fs::read_dir(dir) {
        files.extend(
            entries
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "rs")),
        );
    }
    let names: Vec<String> = files
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_string_lossy().to_string()))
        .collect();
    let mut graph = std::collections::BTreeMap::new();
    for (f, name) in files.iter().zip(&names) {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        let mut deps = Vec::new();
        for line in code.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for part in line.split("crate::").skip(1) {
                let m: String = part
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if &m != name && names.contains(&m) && !deps.contains(&m) {
                    deps.push(m);
                }
            }
        }
        graph.insert(name.clone(), deps);
    }
    graph
}

/// A cycle through `start`, if there is one.
fn cycle_from(
    graph: &std::collections::BTreeMap<String, Vec<String>>,
    start: &str,
) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    while let Some(path) = stack.pop() {
        let last = path.last()?;
        for next in graph.get(last).into_iter().flatten() {
            if next == start {
                return Some(path);
            }
            if !path.contains(next) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push(p);
            }
        }
    }
    None
}

#[test]
fn no_import_cycle_in_the_filter_or_the_collector() {
    for dir in ["filter/src", "filter/core/src", "collector/src"] {
        let graph = module_graph(&repo_root().join(dir));
        assert!(graph.len() > 8, "{dir}: modules not found");
        for m in graph.keys() {
            if let Some(c) = cycle_from(&graph, m) {
                panic!("{dir}: import cycle {} -> {m}", c.join(" -> "));
            }
        }
    }
}
