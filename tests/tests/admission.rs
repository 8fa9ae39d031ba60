//! Per-key limits and sticky experiments in real Envoy with 2 workers.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;
use std::time::Duration;

/// The test plugin with `limits` (inline YAML map) on the demo client, and
/// extra top-level sections.
fn plugin(limits: &str, extra: &str) -> String {
    let base = test_plugin();
    let demo = format!("  - name: demo\n    key_sha256: {}\n", key_hash(DEMO_KEY));
    assert!(base.contains(&demo));
    base.replace(&demo, &format!("{demo}    limits: {limits}\n")) + extra
}

fn burst(s: &Stack, n: usize, body: &str) -> Vec<Resp> {
    let url = s.envoy.url("/v1/chat/completions");
    let auth = format!("Bearer {DEMO_KEY}");
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|_| sc.spawn(|| post(&url, &[("authorization", &auth)], body)))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn count(rs: &[Resp], status: u16) -> usize {
    rs.iter().filter(|r| r.status == status).count()
}

#[test]
fn burst_of_five_times_the_request_limit_admits_exactly_the_limit() {
    let s = Stack::start(&plugin("{requests_per_minute: 10}", ""), 2);
    let rs = burst(&s, 50, &chat_body("gpt-4o-mini", "hi"));
    assert_eq!((count(&rs, 200), count(&rs, 429)), (10, 40));
    for r in rs.iter().filter(|r| r.status == 429) {
        assert_openai_error(r, 429, "rate_limit_exceeded");
        assert!(r.header("retry-after").unwrap().parse::<u64>().unwrap() >= 1);
        assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
    }
    assert_eq!(s.primary.hits(), 10);
}

#[test]
fn rate_limit_headers_count_down() {
    let s = Stack::start(
        &plugin("{requests_per_minute: 5, tokens_per_minute: 100000}", ""),
        2,
    );
    for want in (0..5).rev() {
        let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-ratelimit-limit-requests"), Some("5"));
        assert_eq!(
            r.header("x-ratelimit-remaining-requests"),
            Some(want.to_string().as_str())
        );
        assert!(r
            .header("x-ratelimit-reset-requests")
            .unwrap()
            .ends_with('s'));
        assert_eq!(r.header("x-ratelimit-limit-tokens"), Some("100000"));
        let left = r.header_u64("x-ratelimit-remaining-tokens");
        assert!(left < 100000);
    }
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
    assert_openai_error(&r, 429, "rate_limit_exceeded");
    assert_eq!(r.header("x-ratelimit-remaining-requests"), Some("0"));
}

/// Sequential requests until the token limit refuses; returns how many passed.
fn spend_tokens(s: &Stack, stream: bool) -> u64 {
    let mut n = 0;
    loop {
        let mut body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]});
        if stream {
            body["stream"] = json!(true);
        }
        let r = s.chat(DEMO_KEY, &body.to_string());
        if r.status == 429 {
            assert_openai_error(&r, 429, "rate_limit_exceeded");
            return n;
        }
        assert_eq!(r.status, 200, "{}", r.body);
        if stream {
            assert!(
                !r.body.contains("\"usage\""),
                "usage chunk not asked for by the client"
            );
        }
        n += 1;
        assert!(n < 100, "token limit never refused");
    }
}

#[test]
fn token_limit_ends_within_one_reservation_of_the_limit_plain_and_streamed() {
    for stream in [false, true] {
        let s = Stack::start(&plugin("{tokens_per_minute: 1000}", ""), 2);
        s.primary
            .default_step(json!({"usage": {"prompt_tokens": 10, "completion_tokens": 20}}));
        let n = spend_tokens(&s, stream);
        let used = n * 30;
        eprintln!("stream {stream}: {n} requests admitted, {used} tokens used of 1000");
        // Each request reserves ~22 (prompt estimate) + 100 and settles to 30.
        // The bucket also refills 1000/min while the test runs (slack 100).
        assert!(
            used <= 1000 + 100 && used + 125 >= 1000,
            "stream {stream}: {n} requests used {used} of 1000"
        );
        assert_eq!(s.primary.hits(), n);
    }
}

#[test]
fn a_failed_request_gives_its_token_reservation_back() {
    let s = Stack::start(&plugin("{tokens_per_minute: 1000}", ""), 1);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    let reservation = (body.len() as u64).div_ceil(4) + 100;
    // Both providers fail: 502, and the reservation must come back.
    s.primary.script(json!([{"status": 500}]));
    s.backup.script(json!([{"status": 500}]));
    assert_openai_error(&s.chat(DEMO_KEY, &body), 502, "upstream_failed");
    let r = s.chat(DEMO_KEY, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    // The remaining count is taken right after this request's reservation:
    // had the failed one kept its reservation, it would be one more lower.
    let left = r.header_u64("x-ratelimit-remaining-tokens");
    assert!(
        left >= 1000 - reservation - 1 && left < 1000 - reservation + 50,
        "remaining {left}, reservation {reservation}"
    );
}

#[test]
fn concurrency_cap_holds_and_frees_slots() {
    let s = Stack::start(&plugin("{max_concurrent: 3}", ""), 2);
    s.primary.default_step(json!({"delay_ms": 1500}));
    let rs = burst(&s, 10, &chat_body("gpt-4o-mini", "slow"));
    assert_eq!((count(&rs, 200), count(&rs, 429)), (3, 7));
    for r in rs.iter().filter(|r| r.status == 429) {
        assert_openai_error(r, 429, "concurrency_limit_exceeded");
    }
    s.primary.default_step(json!({}));
    assert_eq!(
        s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "again")).status,
        200,
        "slots were freed"
    );
}

#[test]
fn budget_holds_under_a_concurrent_burst_and_settles_with_real_usage() {
    // 1000 USD per 1M tokens = 1000 micro-USD a token; budget 0.1 USD.
    let shipped = "  gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}\n";
    let p = plugin("{budget_usd_per_day: 0.1}", "");
    assert!(
        p.contains(shipped),
        "envoy/plugin.yaml prices changed; update this test"
    );
    let s = Stack::start(
        &p.replace(shipped, "  gpt-4o-mini: {input: 1000, output: 1000}\n"),
        2,
    );
    s.primary.default_step(
        json!({"delay_ms": 500, "usage": {"prompt_tokens": 10, "completion_tokens": 20}}),
    );
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10, "messages": [{"role": "user", "content": "hi"}]}).to_string();
    // Reservation: (body/4 ≈ 21 + 10 tokens) ≈ 31_000 micro-USD; 3 fit in 100_000.
    let rs = burst(&s, 10, &body);
    let ok = count(&rs, 200);
    assert_eq!(ok, 3, "concurrent reservations never overshoot the cap");
    for r in rs.iter().filter(|r| r.status == 429) {
        assert_openai_error(r, 429, "budget_exceeded");
    }
    // Settled: 3 x 30 tokens = 90_000 spent; one more reservation does not fit.
    assert_openai_error(&s.chat(DEMO_KEY, &body), 429, "budget_exceeded");
    assert_eq!(s.primary.hits(), 3);
}

#[test]
fn reload_raising_a_limit_applies_without_resetting_counters() {
    let s = Stack::start(&plugin("{requests_per_minute: 2}", ""), 2);
    for _ in 0..2 {
        assert_eq!(
            s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi")).status,
            200
        );
    }
    assert_eq!(
        s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi")).status,
        429
    );
    let reloads = s
        .envoy
        .stat("extension_config_discovery.http_filter.portcullis.config_reload")
        .unwrap_or(0);
    s.envoy.reload(&plugin("{requests_per_minute: 6000}", ""));
    poll_until(Duration::from_secs(20), "the reload", || {
        (s.envoy
            .stat("extension_config_discovery.http_filter.portcullis.config_reload")
            .unwrap_or(0)
            > reloads)
            .then_some(())
    });
    let r = poll_until(
        Duration::from_secs(10),
        "a request admitted under the new limit",
        || {
            let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
            (r.status == 200).then_some(r)
        },
    );
    assert_eq!(r.header("x-ratelimit-limit-requests"), Some("6000"));
    // What was used stays used (docs/limits.md): the two requests before
    // and this one are counted against the new 6000, not forgotten (a
    // reset gives 5999); the raise itself is there at once.
    let left = r.header_u64("x-ratelimit-remaining-requests");
    assert!(
        (5990..=5997).contains(&left),
        "the raise adds its difference to what was left (remaining {left})"
    );
}

fn experiment_plugin(n_keys: usize, weights: (u32, u32)) -> String {
    let mut p = test_plugin();
    for i in 0..n_keys {
        p = p.replace(
            "clients:\n",
            &format!(
                "clients:\n  - name: key-{i}\n    key_sha256: {}\n",
                key_hash(&format!("sk-exp-{i}"))
            ),
        );
    }
    p + &format!(
        "experiments:\n  - name: ab\n    salt: ab-2026\n    applies_to: [gpt-4o-mini]\n    arms:\n      - {{name: control, weight: {}, model: gpt-4o-mini}}\n      - {{name: treatment, weight: {}, model: gpt-4o}}\n",
        weights.0, weights.1
    )
}

fn arm_of(s: &Stack, i: usize) -> (String, String) {
    let r = s.chat(
        &format!("sk-exp-{i}"),
        &chat_body("gpt-4o-mini", "which arm?"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    (
        r.header("x-portcullis-experiment").unwrap().to_string(),
        r.header("x-portcullis-model").unwrap().to_string(),
    )
}

#[test]
fn experiment_arms_are_sticky_per_key_across_workers_and_reloads_and_follow_weights() {
    let n = 200;
    let s = Stack::start(&experiment_plugin(n, (50, 50)), 2);
    let mut arms = Vec::new();
    let mut treatment = 0;
    for i in 0..n {
        let (exp, model) = arm_of(&s, i);
        match exp.as_str() {
            "ab/control" => assert_eq!(model, "gpt-4o-mini"),
            "ab/treatment" => {
                // The explicit model was overridden by the experiment.
                assert_eq!(model, "gpt-4o");
                treatment += 1;
            }
            other => panic!("unexpected arm {other}"),
        }
        arms.push(exp);
    }
    // 100 expected, sd 7.1: 5 sd.
    assert!(
        (65..=135).contains(&treatment),
        "{treatment} of {n} in treatment"
    );
    assert!(s
        .primary
        .requests()
        .iter()
        .any(|r| r["body"]["model"] == "gpt-4o-2024-08-06"));
    // Same key, same arm: new connections land on both workers.
    for (i, arm) in arms.iter().enumerate().take(10) {
        for _ in 0..6 {
            assert_eq!(&arm_of(&s, i).0, arm);
        }
    }
    // A reload (even with new weights) keeps every key whose bucket did not
    // change arms: with 50/50 -> 60/40 only treatment keys may move.
    let reloads = s
        .envoy
        .stat("extension_config_discovery.http_filter.portcullis.config_reload")
        .unwrap_or(0);
    s.envoy.reload(&experiment_plugin(n, (60, 40)));
    poll_until(Duration::from_secs(20), "the reload", || {
        (s.envoy
            .stat("extension_config_discovery.http_filter.portcullis.config_reload")
            .unwrap_or(0)
            > reloads)
            .then_some(())
    });
    // The arm is a pure function of salt and client name, so exactly the
    // keys whose bucket left treatment's range move, and only those.
    let arm_name = |i: usize, weights: &[u32]| {
        let b = portcullis_core::routing::experiment::bucket("ab-2026", &format!("key-{i}"));
        match portcullis_core::routing::experiment::arm_for(b, weights) {
            Some(0) => "ab/control",
            _ => "ab/treatment",
        }
    };
    let mut moved = 0;
    for (i, before) in arms.iter().enumerate().take(60) {
        assert_eq!(before, arm_name(i, &[50, 50]), "key-{i} before the reload");
        let after = arm_of(&s, i).0;
        assert_eq!(after, arm_name(i, &[60, 40]), "key-{i} after the reload");
        if &after != before {
            assert_eq!(
                (before.as_str(), after.as_str()),
                ("ab/treatment", "ab/control")
            );
            moved += 1;
        }
    }
    // 10% of the buckets changed arms: 6 of 60 expected.
    assert!((1..30).contains(&moved), "{moved} of 60 keys moved");
}
