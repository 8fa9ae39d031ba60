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
