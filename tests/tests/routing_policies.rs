//! Routing policies in real Envoy: each strategy picks the candidates in
//! its order (cheapest by price, fastest by measured latency on both
//! workers, least busy by requests in flight), fallback walks that order,
//! conditional routes and pinned providers choose as written.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;
use std::time::Duration;

/// The test plugin with `routing` extended and per-provider prices for
/// gpt-4o-mini (the backup is cheaper).
fn plugin(routing: &str) -> String {
    let base = test_plugin();
    let chain = "routing:\n  chain: [primary, backup]\n";
    assert!(base.contains(chain), "envoy/plugin.yaml: routing changed");
    let p = base.replace(chain, &format!("{chain}{routing}"));
    let p = p.replacen(
        "      - name: gpt-4o-mini\n        weight: 3\n",
        "      - name: gpt-4o-mini\n        weight: 3\n        price: {input: 1.0, output: 2.0}\n",
        1,
    );
    let p = p.replacen(
        "      - name: gpt-4o-mini\n        id: openai/gpt-4o-mini\n",
        "      - name: gpt-4o-mini\n        id: openai/gpt-4o-mini\n        price: {input: 0.1, output: 0.2}\n",
        1,
    );
    assert_eq!(
        p.matches("price: {input").count(),
        2,
        "envoy/plugin.yaml: models changed"
    );
    p
}

fn who(r: &Resp) -> String {
    assert_eq!(r.status, 200, "{}", r.body);
    r.header("x-portcullis-provider").unwrap_or("").to_string()
}

#[test]
fn cheapest_goes_to_the_cheaper_provider_and_falls_back_in_price_order() {
    let s = Stack::start(&plugin("  strategies: {gpt-4o-mini: cheapest}\n"), 1);
    assert_eq!(
        who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))),
        "backup"
    );
    assert_eq!(
        who(&s.chat(DEMO_KEY, &chat_body("mini", "hi"))),
        "backup",
        "by alias too"
    );
    // Models without a strategy keep the chain order.
    assert_eq!(
        who(&s.chat(DEMO_KEY, &chat_body("gpt-4o", "hi"))),
        "primary"
    );
    s.backup.script(json!([{"status": 503}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(who(&r), "primary");
    assert_eq!(r.header("x-portcullis-attempts"), Some("2"));
}

#[test]
fn fastest_follows_measured_latency_on_both_workers() {
    let s = Stack::start(
        &plugin("  strategies: {gpt-4o-mini: fastest}\n  fastest: {initial_ms: {primary: 100, backup: 200}, explore: 0, alpha: 0.5}\n"),
        2,
    );
    assert_eq!(
        who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))),
        "primary"
    );
    // The primary turns slow: its average passes the backup's.
    s.primary.default_step(json!({"delay_ms": 400}));
    let mut slow = 0;
    poll_until(
        Duration::from_secs(30),
        "the backup to become the fastest",
        || {
            slow += 1;
            (who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))) == "backup").then_some(())
        },
    );
    assert!(
        slow >= 2,
        "one slow answer does not move an average from 100 past 200 ({slow})"
    );
    // Every worker reads the same averages.
    for _ in 0..8 {
        assert_eq!(
            who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))),
            "backup"
        );
    }
}

#[test]
fn least_busy_sends_around_a_provider_with_requests_in_flight() {
    // Two workers: each counts its own requests in flight exactly and
    // publishes them at its tick; the other reads them.
    let s = Stack::start(&plugin("  strategy: least_busy\n"), 2);
    s.primary.script(json!([{"hold": true}]));
    let held = {
        let url = s.envoy.url("/v1/chat/completions");
        let body = json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "hold"}]}).to_string();
        std::thread::spawn(move || {
            post(
                &url,
                &[("authorization", &format!("Bearer {DEMO_KEY}"))],
                &body,
            )
        })
    };
    poll_until(
        Duration::from_secs(10),
        "the held stream to reach the primary",
        || (s.primary.hits() == 1).then_some(()),
    );
    poll_until(
        Duration::from_secs(10),
        "every worker to see the held request",
        || {
            (0..6)
                .all(|_| who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))) == "backup")
                .then_some(())
        },
    );
    s.primary.release();
    assert_eq!(held.join().unwrap().status, 200);
    // Nothing in flight any more: chain order again.
    poll_until(
        Duration::from_secs(10),
        "the primary to be idle again",
        || (who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))) == "primary").then_some(()),
    );
}

#[test]
fn conditional_routes_and_pinned_providers_choose_as_written() {
    let s = Stack::start(
        &plugin(
            "  routes:\n    - {match: {headers: {x-team: research}}, to: gpt-4o}\n    - {match: {metadata: {tier: gold}, models: [auto]}, to: llama-3.1-8b}\n    - {match: {clients: [mini-only]}, strategy: cheapest}\n",
        )
        .replace(
            "  - name: demo\n    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8\n",
            "  - name: demo\n    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8\n    allow_overrides: true\n",
        ),
        1,
    );
    let auth = format!("Bearer {DEMO_KEY}");
    let url = s.envoy.url("/v1/chat/completions");
    let r = post(
        &url,
        &[("authorization", &auth), ("x-team", "research")],
        &chat_body("gpt-4o-mini", "hi"),
    );
    assert_eq!(r.header("x-portcullis-model"), Some("gpt-4o"), "{}", r.body);
    let gold = json!({"model": "auto", "metadata": {"tier": "gold"}, "messages": [{"role": "user", "content": "hi"}]});
    let r = s.chat(DEMO_KEY, &gold.to_string());
    assert_eq!(
        r.header("x-portcullis-model"),
        Some("llama-3.1-8b"),
        "{}",
        r.body
    );
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(r.header("x-portcullis-model"), Some("gpt-4o-mini"));
    assert_eq!(who(&r), "primary", "no rule: chain order");
    assert_eq!(
        who(&s.chat(MINI_KEY, &chat_body("gpt-4o-mini", "hi"))),
        "backup",
        "the rule's strategy"
    );
    // A pinned provider, for a client allowed to pin.
    let r = post(
        &url,
        &[
            ("authorization", &auth),
            ("x-portcullis-pin-provider", "backup"),
        ],
        &chat_body("gpt-4o-mini", "hi"),
    );
    assert_eq!(who(&r), "backup");
    let r = post(
        &url,
        &[
            ("authorization", &auth),
            ("x-portcullis-pin-provider", "backup"),
        ],
        &chat_body("gpt-4o", "hi"),
    );
    assert_openai_error(&r, 400, "invalid_pin");
    let mini = format!("Bearer {MINI_KEY}");
    let r = post(
        &url,
        &[
            ("authorization", &mini),
            ("x-portcullis-pin-provider", "backup"),
        ],
        &chat_body("gpt-4o-mini", "hi"),
    );
    assert_openai_error(&r, 403, "override_not_allowed");
}

/// The primary retried by Envoy (`retries: {attempts: 2}`) before the
/// gateway falls over to the backup.
fn retrying() -> Stack {
    let base = test_plugin();
    let at = "    timeout_ms: 30000\n";
    assert!(base.contains(at));
    Stack::start(
        &base.replacen(at, &format!("{at}    retries: {{attempts: 2}}\n"), 1),
        1,
    )
}

fn request_times(m: &Mock) -> Vec<u64> {
    m.requests()
        .iter()
        .filter_map(|r| r["at_ms"].as_u64())
        .collect()
}

#[test]
fn retries_answer_from_the_same_provider_honour_retry_after_and_never_retry_a_400() {
    let s = retrying();
    s.primary.script(json!([{"status": 503}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(who(&r), "primary");
    assert_eq!(r.header("x-portcullis-attempts"), Some("2"));
    assert!(
        r.header("x-envoy-attempt-count").is_none(),
        "Envoy's count stays inside"
    );
    assert_eq!((s.primary.hits(), s.backup.hits()), (2, 0));

    // A 429 with Retry-After: 1 is tried again after that second.
    s.primary.script(json!([{"status": 429, "retry_after": 1}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(who(&r), "primary");
    let t = request_times(&s.primary);
    let gap = t[t.len() - 1] - t[t.len() - 2];
    assert!(
        gap >= 900,
        "the retry waited {gap} ms, not the 1 s the provider asked for"
    );

    // A 400 is the client's: never retried, never fallen over.
    s.primary.script(json!([{"status": 400}]));
    let before = s.primary.hits();
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(r.status, 400);
    assert_eq!(s.primary.hits(), before + 1);
    assert_eq!(s.backup.hits(), 0);

    // Retries spent, the gateway falls over: three tries, then the backup.
    s.primary
        .script(json!([{"status": 503}, {"status": 503}, {"status": 503}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(who(&r), "backup");
    assert_eq!(r.header("x-portcullis-attempts"), Some("4"));
}

const TOO_LONG: &str = r#"{"error":{"message":"This model's maximum context length is 8192 tokens.","type":"invalid_request_error","code":"context_length_exceeded"}}"#;

#[test]
fn context_length_falls_over_to_a_larger_context_when_configured_and_passes_through_otherwise() {
    let windows = |p: String| {
        p.replacen(
            "        price: {input: 1.0, output: 2.0}\n",
            "        price: {input: 1.0, output: 2.0}\n        context_window: 8192\n",
            1,
        )
        .replacen(
            "        price: {input: 0.1, output: 0.2}\n",
            "        price: {input: 0.1, output: 0.2}\n        context_window: 128000\n",
            1,
        )
    };
    let s = Stack::start(
        &windows(plugin("  fallback_on: [rate_limited, overloaded, transient, timeout, connect, context_length]\n")),
        1,
    );
    s.primary.script(json!([{"status": 400, "body": TOO_LONG}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "a long prompt"));
    assert_eq!(who(&r), "backup", "{}", r.body);
    assert_eq!(r.header("x-portcullis-attempts"), Some("2"));
    // A plain client error is still the client's.
    s.primary
        .script(json!([{"status": 400, "body": "{\"error\":{\"message\":\"bad temperature\"}}"}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(r.status, 400);
    assert!(
        r.body.contains("bad temperature"),
        "passed through verbatim: {}",
        r.body
    );
    let line = poll_until(Duration::from_secs(10), "the class metric", || {
        let prom = s.envoy.prometheus();
        prom.lines()
            .find(|l| l.contains("context_length") && !l.starts_with('#'))
            .map(String::from)
    });
    assert!(
        line.ends_with(r#"portcullis_failures{provider="primary",class="context_length"} 1"#),
        "{line}"
    );

    // Without context_length in fallback_on, the 400 goes to the client.
    let s = Stack::start(&windows(plugin("")), 1);
    s.primary.script(json!([{"status": 400, "body": TOO_LONG}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "a long prompt"));
    assert_eq!(r.status, 400);
    assert!(r.body.contains("context_length_exceeded"));
    assert_eq!(s.backup.hits(), 0);
}

#[test]
fn adaptive_concurrency_halves_on_429_pauses_for_retry_after_and_widens_again() {
    let base = test_plugin();
    let at = "    timeout_ms: 30000\n";
    let s = Stack::start(
        &base.replacen(
            at,
            &format!("{at}    concurrency: {{initial: 4, min: 1, max: 8, increase_after: 2}}\n"),
            1,
        ),
        2,
    );
    let gauge = "wasmcustom.portcullis.provider.primary.concurrency_limit";
    s.envoy.wait_stat(gauge, 4);
    s.primary.script(json!([{"status": 429, "retry_after": 2}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!(who(&r), "backup", "the 429 fell over");
    s.envoy.wait_stat(gauge, 2);
    // Paused for its Retry-After: skipped like an open breaker.
    let hits = s.primary.hits();
    assert_eq!(
        who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))),
        "backup"
    );
    assert_eq!(s.primary.hits(), hits, "a paused provider gets nothing");
    // A model only the paused provider serves: 503 with retry-after, saying why.
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", "hi"));
    assert_openai_error(&r, 503, "providers_unavailable");
    assert!(r.header("retry-after").is_some());
    assert!(
        r.body.contains("paused or at its concurrency limit"),
        "{}",
        r.body
    );
    poll_until(Duration::from_secs(10), "the pause to end", || {
        (who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))) == "primary").then_some(())
    });
    // Two successes in a row widen the limit by one.
    assert_eq!(
        who(&s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"))),
        "primary"
    );
    s.envoy.wait_stat(gauge, 3);
}
