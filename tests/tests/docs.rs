//! The documentation holds together: the README stays short; every
//! relative link in README.md, BENCHMARKS.md and docs/ names a file that
//! exists (and a heading that exists, when it names one); the book's
//! SUMMARY.md lists every page; every `make` target quoted is one of the
//! Makefile's; and the README's tour works as written against the shipped
//! config (real Envoy, the mock providers).

mod common;

use common::Stack;
use portcullis_tests::*;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn pages() -> Vec<PathBuf> {
    let root = repo_root();
    let mut out = vec![root.join("README.md"), root.join("BENCHMARKS.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .collect();
    docs.sort();
    out.extend(docs);
    out
}

/// A page split into its prose and its code (fenced blocks, and each code
/// span on a line of its own): links in code are not links, and commands
/// are quoted in code.
fn split(text: &str) -> (String, String) {
    let (mut prose, mut code) = (String::new(), String::new());
    let mut fence = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fence = !fence;
            continue;
        }
        if fence {
            code.push_str(line);
            code.push('\n');
            continue;
        }
        for (i, part) in line.split('`').enumerate() {
            let to = if i % 2 == 1 { &mut code } else { &mut prose };
            to.push_str(part);
            if i % 2 == 1 {
                code.push('\n');
            }
        }
        prose.push('\n');
    }
    (prose, code)
}

/// Markdown link targets: `](target)`.
fn links(text: &str) -> Vec<String> {
    let (text, _) = split(text);
    let mut out = Vec::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            out.push(rest[..end].trim().to_string());
            rest = &rest[end..];
        }
    }
    out
}

/// GitHub's (and mdBook's) anchor of a heading.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn anchors(page: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(page).unwrap_or_default();
    let mut fence = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fence = !fence;
        } else if !fence && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#')));
        }
    }
    out
}

#[test]
fn the_readme_is_short() {
    let size = std::fs::metadata(repo_root().join("README.md"))
        .unwrap()
        .len();
    assert!(
        size <= 12 * 1024,
        "README.md is {size} bytes, over 12 KB: move detail into docs/"
    );
}

/// Every source path a page names (under `filter/src` or `filter/core/src`)
/// names a file or folder that exists: the pages say where things are, and
/// a move must take them along (BENCHMARKS.md and the history keep the
/// names a past session measured).
#[test]
fn every_source_path_a_page_quotes_exists() {
    let root = repo_root();
    let mut missing = Vec::new();
    let mut seen = 0;
    for page in pages() {
        let name = page.file_name().unwrap().to_string_lossy().to_string();
        if name == "BENCHMARKS.md" || name.contains("history") {
            continue;
        }
        let text = std::fs::read_to_string(&page).unwrap();
        for (at, _) in text.match_indices("filter/") {
            let path: String = text[at..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || "_/.-".contains(*c))
                .collect();
            let path = path.trim_end_matches(['.', '-']);
            if !(path.starts_with("filter/src/") || path.starts_with("filter/core/src/")) {
                continue;
            }
            seen += 1;
            if !root.join(path).exists() {
                missing.push(format!("{name}: {path}"));
            }
        }
    }
    assert!(
        seen > 10,
        "no quoted source paths found: the reader is wrong"
    );
    assert!(
        missing.is_empty(),
        "pages quote source paths that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn every_relative_link_names_a_file_and_heading_that_exist() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
                || target.is_empty()
            {
                continue;
            }
            checked += 1;
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                page.parent().unwrap().join(file)
            };
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(a) = anchor.filter(|_| path.extension().is_some_and(|x| x == "md")) {
                if !anchors(&path).contains(a) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser broken?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_books_summary_lists_every_page() {
    let docs = repo_root().join("docs");
    let summary = std::fs::read_to_string(docs.join("SUMMARY.md")).unwrap();
    let listed: BTreeSet<String> = links(&summary).into_iter().collect();
    for l in &listed {
        assert!(
            docs.join(l).exists(),
            "SUMMARY.md lists {l}, which does not exist"
        );
    }
    for page in pages() {
        if page.parent() != Some(docs.as_path()) {
            continue;
        }
        let name = page.file_name().unwrap().to_string_lossy().to_string();
        if name == "SUMMARY.md" {
            continue;
        }
        assert!(
            listed.contains(&name),
            "docs/{name} is not in docs/SUMMARY.md"
        );
    }
    let book = std::fs::read_to_string(docs.join("book.toml")).unwrap();
    assert!(book.contains("src = \".\""), "{book}");
}

/// `make X` quoted in code (spans or blocks) names a Makefile target.
#[test]
fn every_quoted_make_target_exists() {
    let makefile = std::fs::read_to_string(repo_root().join("Makefile")).unwrap();
    let targets: BTreeSet<String> = makefile
        .lines()
        .filter_map(|l| {
            let (name, _) = l.split_once(':')?;
            (!name.is_empty()
                && !name.starts_with(['\t', '#', '.'])
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'))
            .then(|| name.to_string())
        })
        .collect();
    assert!(
        targets.contains("run") && targets.contains("test"),
        "{targets:?}"
    );
    let mut unknown = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let (_, code) = split(&text);
        for line in code.lines() {
            let mut words = line.split_whitespace().peekable();
            while let Some(w) = words.next() {
                if w != "make" {
                    continue;
                }
                let Some(t) = words.peek() else { continue };
                let t = t.trim_end_matches([';', ',', ')', '.']);
                if t.starts_with('-') || t.contains('=') || t.is_empty() {
                    continue;
                }
                if !targets.contains(t) {
                    unknown.push(format!("{}: make {t}", page.display()));
                }
            }
        }
    }
    assert!(
        unknown.is_empty(),
        "make targets that do not exist:\n{}",
        unknown.join("\n")
    );
}

/// The README's tour and the docs' calls to the gateway, as written: each
/// `curl` to 127.0.0.1:10000 run by the shell with the port of a real Envoy
/// serving the shipped config; every one answers 200 but the unknown
/// key's, 401.
#[test]
fn the_readmes_tour_works_as_written() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let tries: Vec<&str> = readme
        .lines()
        .filter(|l| l.starts_with("curl -s http://127.0.0.1:10000/"))
        .collect();
    assert!(tries.len() >= 5, "the tour lost its tries: {tries:?}");
    // And every docs page's shell blocks' calls to the gateway.
    let mut docs = Vec::new();
    for page in pages() {
        let rel = relative(&page);
        if rel.starts_with("docs/") {
            docs.extend(
                shell_curls(&rel)
                    .into_iter()
                    .map(|(c, _)| c)
                    .filter(|c| c.contains("http://127.0.0.1:10000/")),
            );
        }
    }
    assert!(docs.len() >= 2, "the docs lost their tries: {docs:?}");
    let tries: Vec<&str> = tries
        .into_iter()
        .chain(docs.iter().map(String::as_str))
        .collect();
    let stack = Stack::start(&shipped_plugin(), 1);
    for t in tries {
        let line = t.replace("http://127.0.0.1:10000", &stack.envoy.url(""));
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!("{line} -o /dev/null -w '%{{http_code}}'"))
            .output()
            .expect("run curl");
        let status = String::from_utf8_lossy(&out.stdout).to_string();
        let want = if t.contains("sk-nobody") {
            "401"
        } else {
            "200"
        };
        assert_eq!(
            status,
            want,
            "{t}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `make run`'s ready line: its one-capability tries (scripts/run.sh, as
/// the shell prints them) against real Envoy with the shipped config, the
/// ports swapped for the test's; each shows what its comment says.
#[test]
fn the_ready_lines_tries_show_what_they_say() {
    let run = std::fs::read_to_string(repo_root().join("scripts/run.sh")).unwrap();
    let start = run
        .find("One capability each")
        .expect("run.sh: the tries' heading");
    let end = start
        + run[start..]
            .find("Edit envoy/plugin.yaml")
            .expect("run.sh: the end of the tries");
    // The heredoc prints `\$` as `$`.
    let tries: Vec<String> = run[start..end]
        .lines()
        .skip(1)
        .filter(|l| l.starts_with("  ") && !l.trim_start().starts_with('#'))
        .map(|l| l.trim_start().replace("\\$", "$"))
        .collect();
    assert_eq!(tries.len(), 6, "{tries:?}");
    // The demo's MCP server `notes`, which takes only its own credential.
    let notes = common::mock("notes", Some(common::MCP_NOTES_TOKEN));
    let notes_port = format!("port_value: {}", notes.port);
    // Two replicas sharing the limiter (and the cache's tier in its Redis),
    // as `make run` starts them.
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let primary = common::mock("primary", Some(common::PRIMARY_KEY));
    let backup = common::mock("backup", Some(common::BACKUP_KEY));
    let plugin = shipped_plugin();
    let replica = || {
        Envoy::start(EnvoyOpts {
            plugin_yaml: &plugin,
            primary_port: primary.port,
            backup_port: backup.port,
            collector_port: dead_port(),
            ratelimit_port: limiter.port,
            workers: 1,
            side_tls: None,
            bootstrap_patch: vec![("port_value: 18012", &notes_port)],
            control: None,
            clusters: None,
            env: vec![
                ("OPENAI_API_KEY", common::PRIMARY_KEY),
                ("BACKUP_API_KEY", common::BACKUP_KEY),
                ("ANTHROPIC_API_KEY", common::PRIMARY_KEY),
                ("MCP_NOTES_TOKEN", common::MCP_NOTES_TOKEN),
                ("PORTCULLIS_LIMITER_TOKEN", LIMITER_TOKEN),
            ],
        })
    };
    let (first, second) = (replica(), replica());
    let wants = [
        "write to [REDACTED:email]",
        "x-portcullis-provider: backup",
        "x-portcullis-experiment: tour-ab/",
        "429",
        r#""text":"notes: hi""#,
        "x-portcullis-cache: hit-shared",
    ];
    for (t, want) in tries.iter().zip(wants) {
        let line = t
            .replace("http://127.0.0.1:10000", &first.url(""))
            .replace("http://127.0.0.1:10001", &second.url(""))
            .replace("http://127.0.0.1:18001", &primary.url(""));
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&line)
            .output()
            .expect("run the try");
        let shown = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(
            shown.contains(want),
            "{t}\nshowed {shown:?}, wanted {want:?}"
        );
    }
}

/// A page's path from the repository's root (`docs/x.md`).
fn relative(page: &Path) -> String {
    page.strip_prefix(repo_root())
        .unwrap()
        .display()
        .to_string()
}

/// The curl lines of a page's shell blocks (continuation lines joined),
/// with the comment after each, if any.
fn shell_curls(page: &str) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join(page)).unwrap();
    let mut out = Vec::new();
    let mut in_sh = false;
    let mut pending: Option<String> = None;
    for line in text.lines() {
        if line.starts_with("```") {
            in_sh = line == "```sh";
            continue;
        }
        if !in_sh {
            continue;
        }
        let joined = match pending.take() {
            Some(head) => format!("{head} {}", line.trim()),
            None if line.starts_with("curl ") => line.to_string(),
            None => continue,
        };
        if let Some(head) = joined.strip_suffix('\\') {
            pending = Some(head.trim_end().to_string());
            continue;
        }
        let (cmd, comment) = match joined.split_once("   #") {
            Some((c, m)) => (c.trim().to_string(), m.trim().to_string()),
            None => (joined.trim().to_string(), String::new()),
        };
        out.push((cmd, comment));
    }
    out
}

/// docs/control-plane.md's API calls, as written and in the page's order,
/// against a real control plane (`$T` its admin token, `:9400` its port;
/// the one placeholder, `<64 hex>`, a key's hash): each answers 2xx, but
/// one whose comment starts with `422`.
#[test]
fn the_control_planes_calls_work_as_written() {
    // Each page's calls in its order, against a control plane of its own.
    let mut total = 0;
    for page in pages() {
        let rel = relative(&page);
        let api: Vec<(String, String)> = shell_curls(&rel)
            .into_iter()
            .filter(|(c, _)| c.contains(":9400/v1/"))
            .collect();
        if !api.is_empty() {
            total += api.len();
            run_control_calls(&api);
        }
    }
    assert!(total >= 15, "the pages lost their calls ({total})");
}

fn run_control_calls(api: &[(String, String)]) {
    let control = Control::start(&test_plugin());
    let dir = TempDir::new("docs-control");
    let hash = "a".repeat(64);
    for (cmd, comment) in api {
        let line = cmd
            .replace(
                "127.0.0.1:9400",
                &format!("127.0.0.1:{}", control.admin_port),
            )
            .replace(" :9400", &format!(" 127.0.0.1:{}", control.admin_port))
            .replace(" ':9400", &format!(" '127.0.0.1:{}", control.admin_port))
            .replace("<64 hex>", &hash)
            .replace("compose-control-token", &control.write_token)
            .replace("$(cat .run/control-admin-token)", "$T");
        // The status on stderr: a line may send the body to a file.
        let mut line = line.replacen("curl ", "curl -w '%{stderr}%{http_code}' ", 1);
        if !line.contains(" > ") {
            line.push_str(" -o /dev/null");
        }
        let out = std::process::Command::new("bash")
            .arg("-c")
            .arg(&line)
            .current_dir(&dir.0)
            .env("T", &control.write_token)
            .output()
            .expect("run curl");
        let status = String::from_utf8_lossy(&out.stderr).to_string();
        let want_422 = comment.starts_with("422");
        assert!(
            if want_422 {
                status == "422"
            } else {
                status.starts_with('2')
            },
            "{cmd}\n({comment}) answered {status}"
        );
    }
}
