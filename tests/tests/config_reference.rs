//! The config reference (`docs/config-reference.md`) is what
//! `scripts/gen-config-ref.py` writes from the config's serde structs, and
//! every key has a doc comment: a new or changed key fails here until the
//! reference is written again.
use portcullis_tests::repo_root;
use std::process::Command;

#[test]
fn the_config_reference_is_current_and_every_key_is_documented() {
    let out = Command::new("python3")
        .arg(repo_root().join("scripts/gen-config-ref.py"))
        .arg("--check")
        .output()
        .expect("run python3 scripts/gen-config-ref.py --check");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The reference names every section's keys the filter accepts: a few
    // from across the tree, as they are spelled in YAML.
    let doc = std::fs::read_to_string(repo_root().join("docs/config-reference.md")).unwrap();
    for key in [
        "## `providers[]`",
        "| `aws_env_prefix` |",
        "| `token_cluster` |",
        "## `routing.routes[].match`",
        "| `max_users_per_key` |",
        "## `guardrails.input[].external`",
    ] {
        assert!(doc.contains(key), "{key} missing from the reference");
    }
}
