//! The core's tests run natively and again on wasm32 (`make wasm-unit`),
//! where only `wasm_bindgen_test` runs: a test module of the core declared
//! with plain `#[test]` alone would silently run natively only.

use portcullis_tests::repo_root;
use std::collections::{BTreeMap, BTreeSet};
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

/// An empty directory of this process's own for a made-up source tree.
fn scratch_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("portcullis-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
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

/// A file's code without its test items: each item under `#[cfg(test)]`
/// (a `mod tests { ... }` block, a `mod x;` declaration, a function) is
/// left out, everything before and after it is kept (a file's imports may
/// follow its test module). Braces inside strings, raw strings and char
/// literals do not count.
fn non_test_code(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let b = text.as_bytes();
    let mut out = String::new();
    let mut from = 0usize;
    while let Some(found) = text[from..].find(MARK) {
        let start = from + found;
        out.push_str(&text[from..start]);
        let mut i = start + MARK.len();
        // Further attributes and blanks before the item.
        loop {
            while i < b.len() && b[i].is_ascii_whitespace() {
                i += 1;
            }
            if b.get(i..i + 2) == Some(b"#[") {
                while i < b.len() && b[i] != b']' {
                    i += 1;
                }
                i += 1;
            } else {
                break;
            }
        }
        // The item: up to its `;` or through its balanced braces.
        let mut depth = 0usize;
        while i < b.len() {
            match b[i] {
                b';' if depth == 0 => {
                    i += 1;
                    break;
                }
                b'{' => depth += 1,
                b'}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        i += 1;
                        break;
                    }
                }
                b'\'' if b.get(i + 2) == Some(&b'\'') => i += 2,
                b'r' if b.get(i + 1) == Some(&b'#') || b.get(i + 1) == Some(&b'"') => {
                    let hashes = b[i + 1..].iter().take_while(|c| **c == b'#').count();
                    if b.get(i + 1 + hashes) == Some(&b'"') {
                        let close: String = std::iter::once('"')
                            .chain("#".repeat(hashes).chars())
                            .collect();
                        let body = i + 2 + hashes;
                        i = text[body..]
                            .find(&close)
                            .map_or(b.len(), |e| body + e + close.len())
                            - 1;
                    }
                }
                b'"' => {
                    i += 1;
                    while i < b.len() && b[i] != b'"' {
                        if b[i] == b'\\' {
                            i += 1;
                        }
                        i += 1;
                    }
                }
                _ => {}
            }
            i += 1;
        }
        from = i.min(b.len());
    }
    out.push_str(&text[from..]);
    out
}

#[test]
fn test_items_are_left_out_and_code_after_them_is_kept() {
    let text = "use crate::a;\n#[cfg(test)]\nmod tests {\n    fn f() { let s = \"}\"; let c = '}'; let r = r#\"{\"#; }\n    use crate::hidden;\n}\nuse crate::after;\n#[cfg(test)]\n#[path = \"x.rs\"]\nmod x;\nuse crate::last;\n";
    let code = non_test_code(text);
    assert!(
        code.contains("crate::a") && code.contains("crate::after") && code.contains("crate::last"),
        "{code}"
    );
    assert!(
        !code.contains("hidden") && !code.contains("mod x"),
        "{code}"
    );
}

/// A module folder's graph: its modules (each `.rs` file but `lib.rs`,
/// `main.rs` and `mod.rs`, and each subfolder) and, for each, the sibling
/// modules its code names. `prefixes` are how a file names a sibling:
/// `crate::` at a crate's root; `super::` (from a file directly inside) and
/// `crate::a::b::` (the folder's own path) in a folder module. Every file
/// under a module counts for it, however deep; test code (after
/// `#[cfg(test)]`, or a file named for tests) does not.
fn folder_graph(dir: &Path, module_path: &str) -> BTreeMap<String, BTreeSet<String>> {
    let mut names = BTreeSet::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        let name = p
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        let folder = p.is_dir() && !name.starts_with('.') && !name.contains("test");
        let file = p.extension().is_some_and(|x| x == "rs")
            && !["lib", "main", "mod"].contains(&name.as_str());
        if folder || file {
            names.insert(name);
        }
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> =
        names.iter().map(|n| (n.clone(), BTreeSet::new())).collect();
    let own = if module_path.is_empty() {
        "crate::".to_string()
    } else {
        format!("crate::{module_path}::")
    };
    let mut files = Vec::new();
    rust_files(dir, &mut files);
    for f in files {
        let rel = f.strip_prefix(dir).unwrap_or(&f);
        let first = rel
            .components()
            .next()
            .map(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .trim_end_matches(".rs")
                    .to_string()
            })
            .unwrap_or_default();
        let file_name = f
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        if !names.contains(&first) || file_name.contains("test") {
            continue;
        }
        // How deep the file's module is under the folder: `super::` that
        // many times names the folder's own modules.
        let depth = rel.components().count() - usize::from(file_name == "mod.rs");
        let mut prefixes = vec![own.clone()];
        if depth >= 1 && !module_path.is_empty() {
            prefixes.push("super::".repeat(depth));
        }
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let code = non_test_code(&text);
        let code: String = code
            .lines()
            .filter(|l| !l.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for prefix in &prefixes {
            for part in code.split(prefix.as_str()).skip(1) {
                // `prefix::name` or `prefix::{a, b::c}`.
                let heads: Vec<String> = match part.strip_prefix('{') {
                    Some(group) => group
                        .split('}')
                        .next()
                        .unwrap_or("")
                        .split(',')
                        .map(|i| ident(i.trim_start()))
                        .collect(),
                    None => vec![ident(part)],
                };
                for m in heads {
                    if m != first && names.contains(&m) {
                        graph.entry(first.clone()).or_default().insert(m);
                    }
                }
            }
        }
    }
    graph
}

fn ident(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// A cycle through `start`, if there is one.
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    let mut stack = vec![vec![start.to_string()]];
    let mut seen = BTreeSet::new();
    while let Some(path) = stack.pop() {
        let last = path.last()?.clone();
        for next in graph.get(&last).into_iter().flatten() {
            if next == start {
                return Some(path);
            }
            if seen.insert(next.clone()) {
                let mut p = path.clone();
                p.push(next.clone());
                stack.push(p);
            }
        }
    }
    None
}

/// Every cycle in a crate's source folder and in each of its folder
/// modules, however deep, as `folder: a -> b -> a`.
fn cycles_in(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut folders = vec![(root.to_path_buf(), String::new())];
    while let Some((dir, module_path)) = folders.pop() {
        let graph = folder_graph(&dir, &module_path);
        for m in graph.keys() {
            if let Some(mut c) = cycle_from(&graph, m) {
                c.push(m.clone());
                out.push(format!("{}: {}", dir.display(), c.join(" -> ")));
                break;
            }
        }
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = e.path();
            let name = p
                .file_name()
                .unwrap_or_default()
                .to_string_lossy()
                .to_string();
            if p.is_dir() && !name.starts_with('.') && !name.contains("test") {
                let sub = if module_path.is_empty() {
                    name
                } else {
                    format!("{module_path}::{name}")
                };
                folders.push((p, sub));
            }
        }
    }
    out
}

/// The layering docs/architecture.md describes holds: no module of any
/// crate, and no module inside a folder module, imports one that imports
/// it back (directly or around a longer loop).
#[test]
fn no_import_cycle_in_any_crate_or_folder_module() {
    let crates = [
        "filter/src",
        "filter/core/src",
        "collector/src",
        "control/src",
        "limiter/src",
        "service/src",
    ];
    let mut found = Vec::new();
    for dir in crates {
        let root = repo_root().join(dir);
        assert!(
            folder_graph(&root, "").len() > 1 || dir == "service/src",
            "{dir}: modules not found"
        );
        found.extend(cycles_in(&root));
    }
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The detector sees what the old one missed: a folder module in a cycle
/// with a file module, and two files of a folder module naming each other
/// through `super::`.
#[test]
fn the_cycle_detector_sees_folder_modules_and_super_paths() {
    let dir = scratch_dir("cycles");
    std::fs::create_dir_all(dir.join("api/inner")).unwrap();
    std::fs::write(dir.join("lib.rs"), "pub mod api; pub mod error;").unwrap();
    std::fs::write(dir.join("error.rs"), "fn f() { crate::api::served(); }").unwrap();
    std::fs::write(dir.join("api/mod.rs"), "mod a; mod b; mod inner;").unwrap();
    std::fs::write(dir.join("api/inner/deep.rs"), "use crate::{error::E, api};").unwrap();
    std::fs::write(dir.join("api/a.rs"), "use super::b::X;").unwrap();
    std::fs::write(
        dir.join("api/b.rs"),
        "use crate::api::a::Y;\n#[cfg(test)]\nuse super::inner;",
    )
    .unwrap();
    let found = cycles_in(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        found
            .iter()
            .any(|c| c.contains("api -> error -> api") || c.contains("error -> api -> error")),
        "{found:?}"
    );
    assert!(
        found
            .iter()
            .any(|c| c.contains("a -> b -> a") || c.contains("b -> a -> b")),
        "{found:?}"
    );
    assert_eq!(found.len(), 2, "{found:?}");
}

/// What only the core may name: the provider formats and the inbound APIs.
const FORMAT_AND_API_NAMES: &[&str] = &[
    "anthropic",
    "bedrock",
    "vertex",
    "gemini",
    "azure",
    "openai",
    "api::chatcompletions",
    "api::messages",
    "api::embeddings",
    "api::counttokens",
    "api::responses",
    "chat_completions",
    "count_tokens",
];

/// The lines of a file's code (not its comments, not its tests) that name
/// a provider format or an inbound API.
fn naming_lines(text: &str) -> Vec<String> {
    let code = non_test_code(text);
    code.lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .map(|l| l.split("//").next().unwrap_or("").to_ascii_lowercase())
        .filter(|l| FORMAT_AND_API_NAMES.iter().any(|n| l.contains(n)))
        .collect()
}

/// The host layer carries out generic mechanisms (a header, a signature, a
/// fetched token; an API's own events read for usage; kept answers by id)
/// that the core describes as data: adding a provider format or an inbound
/// API never touches it.
#[test]
fn the_host_names_no_provider_format_and_no_inbound_api() {
    let mut files = Vec::new();
    rust_files(&repo_root().join("filter/src"), &mut files);
    assert!(files.len() > 30, "the host's sources were not found");
    let mut found = Vec::new();
    for f in &files {
        let rel = f.strip_prefix(repo_root()).unwrap_or(f).to_string_lossy();
        let name = f.file_name().unwrap_or_default().to_string_lossy();
        if rel.contains("test") || name.starts_with("fake") {
            continue;
        }
        let text = std::fs::read_to_string(f).unwrap_or_default();
        for line in naming_lines(&text) {
            found.push(format!("{}: {}", f.display(), line.trim()));
        }
    }
    assert!(
        found.is_empty(),
        "host code naming a provider format or an inbound API (say it in the core, as data):\n{}",
        found.join("\n")
    );
    // The names are the ones the core uses.
    let core =
        std::fs::read_to_string(repo_root().join("filter/core/src/translate/mod.rs")).unwrap();
    for n in ["bedrock", "gemini", "api::messages", "api::responses"] {
        assert!(
            naming_lines(&core).iter().any(|l| l.contains(n)),
            "`{n}` is not named by the core's matrix: the list is stale"
        );
    }
}

/// The modules a `May use:` line names: its backticked words (`nothing`
/// names none); `None` when the text has no such line.
fn may_use(text: &str) -> Option<BTreeSet<String>> {
    let line = text
        .lines()
        .find_map(|l| l.trim_start().strip_prefix("//! May use:"))?;
    Some(
        line.split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect(),
    )
}

/// The text that states a top-level module's rules: a folder's `mod.rs`,
/// else the file beside the folder, else the module's own file.
fn rules_text(root: &Path, name: &str) -> Option<String> {
    [
        root.join(name).join("mod.rs"),
        root.join(format!("{name}.rs")),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
}

/// Every breach of the folder rules in one crate's source folder: a folder
/// without a `May use:` line, and every import of a top-level module its
/// line does not name (files state theirs by choice and are held to it).
fn rule_breaches(root: &Path) -> Vec<String> {
    let graph = folder_graph(root, "");
    let mut out = Vec::new();
    for (name, uses) in &graph {
        if name.contains("test") {
            continue;
        }
        let folder = root.join(name).is_dir();
        match rules_text(root, name).as_deref().and_then(may_use) {
            None if folder => out.push(format!(
                "{}/{name}: no `May use:` line in its mod.rs",
                root.display()
            )),
            None => {}
            Some(allowed) => {
                for u in uses.difference(&allowed) {
                    out.push(format!(
                        "{}/{name} uses `{u}`, which its `May use:` line does not name",
                        root.display()
                    ));
                }
            }
        }
    }
    out
}

/// A newcomer finds a capability by its folder: each folder says what it
/// owns and which folders it may use, and the code keeps to it; at most a
/// dozen files stay at the top of the host and of the core.
#[test]
fn every_folder_keeps_to_the_modules_its_rules_name() {
    let mut found = Vec::new();
    for dir in ["filter/src", "filter/core/src"] {
        let root = repo_root().join(dir);
        found.extend(rule_breaches(&root));
        let top: Vec<String> = std::fs::read_dir(&root)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs"))
            .map(|p| {
                p.file_name()
                    .unwrap_or_default()
                    .to_string_lossy()
                    .to_string()
            })
            .collect();
        assert!(
            top.len() <= 12,
            "{dir} has {} files at its top (a dozen at most): {top:?}",
            top.len()
        );
    }
    assert!(
        found.is_empty(),
        "folder rules broken:\n{}",
        found.join("\n")
    );
}

/// The rule check sees what it must: an import its folder does not name
/// (through `crate::` and through `super::super::` from a nested file, and a
/// `pub use`), and a folder that states no rules.
#[test]
fn the_rule_check_sees_imports_a_folder_does_not_name() {
    let dir = scratch_dir("rules");
    std::fs::create_dir_all(dir.join("low")).unwrap();
    std::fs::create_dir_all(dir.join("high/inner")).unwrap();
    std::fs::create_dir_all(dir.join("bare")).unwrap();
    std::fs::write(dir.join("lib.rs"), "mod low; mod high; mod bare; mod leaf;").unwrap();
    std::fs::write(dir.join("leaf.rs"), "pub fn f() {}").unwrap();
    std::fs::write(
        dir.join("low/mod.rs"),
        "//! May use: nothing.\npub use crate::leaf::f;",
    )
    .unwrap();
    std::fs::write(dir.join("high/mod.rs"), "//! May use: `low`.\nmod inner;").unwrap();
    std::fs::write(
        dir.join("high/inner/deep.rs"),
        "use crate::low::X;\nuse crate::bare::Y;",
    )
    .unwrap();
    std::fs::write(dir.join("bare/mod.rs"), "//! No rules.\nuse crate::low::Z;").unwrap();
    let found = rule_breaches(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        found.iter().any(|b| b.contains("/low uses `leaf`")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|b| b.contains("/high uses `bare`")),
        "{found:?}"
    );
    assert!(
        found.iter().any(|b| b.contains("/bare: no `May use:`")),
        "{found:?}"
    );
    assert_eq!(found.len(), 3, "{found:?}");
}

/// The parts of a request's state that no longer hang on its holder stay
/// off it: the record is written from what the request hands it when it
/// ends (`request::Ended`), a client's limits are `RequestLimits`, whose
/// fields only `limits/` reads, and the guardrails, the prompt cache and the
/// request builder are functions over the parts the steps hand them. None
/// of them names `RequestContext`.
#[test]
fn the_services_of_the_request_path_do_not_reach_into_the_request_holder() {
    let mut found = Vec::new();
    for dir in [
        "filter/src/telemetry",
        "filter/src/limits",
        "filter/src/guardrails.rs",
    ] {
        let path = repo_root().join(dir);
        let mut files = Vec::new();
        if path.is_file() {
            files.push(path);
        } else {
            rust_files(&path, &mut files);
        }
        assert!(!files.is_empty(), "no files under {dir}");
        for f in files {
            let text = std::fs::read_to_string(&f).unwrap();
            if non_test_code(&text).contains("RequestContext") {
                found.push(f.display().to_string());
            }
        }
    }
    assert!(found.is_empty(), "these name RequestContext: {found:?}");
}

/// Where each part of a request's state may be touched: its owner, and the
/// holder (`request/mod.rs`) that hands it over. (part, what touching it
/// looks like in the code, the files and folders that may).
const PARTS: &[(&str, &[&str], &[&str])] = &[
    ("an MCP call", &["self.mcp"], &["mcp/", "request/mod.rs"]),
    (
        "a files or batches call",
        &["self.stored"],
        &["files.rs", "request/mod.rs"],
    ),
    (
        "a Realtime session",
        &["self.realtime"],
        &["realtime.rs", "request/mod.rs"],
    ),
    (
        "the external guards' calls",
        &["self.guarding"],
        &["llm/guard.rs", "request/mod.rs"],
    ),
    (
        "a whole answer held for the vendor checks",
        &["self.held_answer"],
        &["llm/answer.rs", "request/mod.rs"],
    ),
    (
        "the fleet cache's lookup",
        &["self.shared_lookup"],
        &["llm/cache.rs", "request/mod.rs"],
    ),
    (
        "a paused run of the steps",
        &["self.paused"],
        &["llm/pipeline.rs", "request/mod.rs"],
    ),
    (
        "the prompt cache's part of a flight",
        &[
            ".cache.fill",
            ".cache.seen",
            ".cache.head",
            ".cache.status =",
            ".cache.semantic =",
        ],
        &["cache/", "request/flight.rs"],
    ),
    (
        "the request builder's part of a flight",
        &[".upstream.forwarded", ".upstream.token_provider"],
        &["upstream/", "request/flight.rs"],
    ),
];

/// `mark` in `code` as a whole name (`self.mcp`, not `self.mcp_headers`).
fn touches(code: &str, mark: &str) -> bool {
    code.match_indices(mark).any(|(i, _)| {
        !code[i + mark.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    })
}

/// Which files (relative to `root`, `/`-separated) touch a part outside
/// its owners.
fn parts_touched_elsewhere(root: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(root, &mut files);
    let mut found = Vec::new();
    for f in files {
        let rel = f
            .strip_prefix(root)
            .unwrap_or(&f)
            .to_string_lossy()
            .replace('\\', "/");
        if rel.starts_with("lifecycle_tests") {
            continue;
        }
        let code = non_test_code(&std::fs::read_to_string(&f).unwrap());
        for (part, marks, owners) in PARTS {
            let owned = owners
                .iter()
                .any(|o| rel == *o || (o.ends_with('/') && rel.starts_with(o)));
            if !owned && marks.iter().any(|m| touches(&code, m)) {
                found.push(format!("{rel} touches {part}"));
            }
        }
    }
    found
}

/// A request's state is parts, each touched by its owner only (and handed
/// over by the holder); what the others need they get through the owner's
/// methods or what the holder hands them.
#[test]
fn every_part_of_a_requests_state_is_touched_by_its_owner_only() {
    let found = parts_touched_elsewhere(&repo_root().join("filter/src"));
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check sees a part touched outside its owner, and lets the owner be.
#[test]
fn the_parts_check_sees_a_part_touched_elsewhere() {
    let dir = scratch_dir("parts");
    std::fs::create_dir_all(dir.join("mcp")).unwrap();
    std::fs::create_dir_all(dir.join("llm")).unwrap();
    std::fs::write(dir.join("mcp/mod.rs"), "fn f() { self.mcp.take(); }").unwrap();
    std::fs::write(dir.join("llm/headers.rs"), "fn h() { self.mcp_headers(); }").unwrap();
    std::fs::write(dir.join("llm/answer.rs"), "fn g() { f.cache.fill = None; }").unwrap();
    let found = parts_touched_elsewhere(&dir);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        found,
        vec!["llm/answer.rs touches the prompt cache's part of a flight".to_string()]
    );
}
