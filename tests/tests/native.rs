//! The native build's own mechanics (the rest of the suite runs on it too,
//! `make integration-native`): a panic in a hook is caught there, answered
//! 500 in the client's API shape, and the next request is served.
mod common;
use common::*;
use portcullis_tests::*;

fn native_stack(workers: u32) -> (Mock, Mock, Envoy) {
    // Every test here runs the native build, whatever the suite's build.
    std::env::set_var("PORTCULLIS_BUILD", "native");
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let plugin = test_plugin();
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("BACKUP_API_KEY", BACKUP_KEY),
            ("ANTHROPIC_API_KEY", PRIMARY_KEY),
            // Allows the test-only panic trigger.
            ("PORTCULLIS_TESTING", "1"),
        ],
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
    });
    (primary, backup, envoy)
}

#[test]
fn a_panic_in_a_hook_is_answered_500_and_the_next_request_is_served() {
    let (primary, _backup, envoy) = native_stack(1);
    let auth = format!("Bearer {DEMO_KEY}");
    let ok = post(
        &envoy.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        &chat_body("gpt-4o-mini", "before"),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let hits = primary.hits();

    let r = post(
        &envoy.url("/v1/chat/completions"),
        &[("authorization", &auth), ("x-portcullis-test-panic", "1")],
        &chat_body("gpt-4o-mini", "boom"),
    );
    assert_eq!(r.status, 500, "{}", r.body);
    let err = r.json();
    assert!(err["error"]["message"].is_string(), "{}", r.body);
    assert_eq!(
        primary.hits(),
        hits,
        "a request that panicked is not sent on"
    );
    assert!(
        envoy.log().contains("panic in request_headers caught"),
        "the panic is logged"
    );

    // One worker: the same thread serves the next requests.
    for i in 0..5 {
        let r = post(
            &envoy.url("/v1/chat/completions"),
            &[("authorization", &auth)],
            &chat_body("gpt-4o-mini", &format!("after {i}")),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    // An Anthropic-shaped client gets its own error shape.
    let r = post(
        &envoy.url("/v1/messages"),
        &[
            ("x-api-key", DEMO_KEY),
            ("anthropic-version", "2023-06-01"),
            ("x-portcullis-test-panic", "1"),
        ],
        r#"{"model":"gpt-4o-mini","max_tokens":10,"messages":[{"role":"user","content":"hi"}]}"#,
    );
    assert_eq!(r.status, 500, "{}", r.body);
    assert_eq!(r.json()["type"], "error", "{}", r.body);
}

#[test]
fn the_panic_trigger_is_ignored_without_the_testing_environment() {
    std::env::set_var("PORTCULLIS_BUILD", "native");
    let s = Stack::start(&test_plugin(), 1);
    let auth = format!("Bearer {DEMO_KEY}");
    let r = post(
        &s.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth), ("x-portcullis-test-panic", "1")],
        &chat_body("gpt-4o-mini", "hi"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
}
