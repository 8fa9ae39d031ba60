//! Breakers and fallback in real Envoy, with scripted fake providers.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;
use std::time::Duration;

const STATE: &str = "wasmcustom.portcullis.provider.primary.breaker_state";

/// Both providers serve gpt-4o-mini (the backup as `openai/gpt-4o-mini`).
fn plugin(threshold: u32, cooldown_ms: u64, probes: u32, primary_timeout_ms: u64) -> String {
    test_plugin()
        .replacen("timeout_ms: 30000", &format!("timeout_ms: {primary_timeout_ms}"), 1)
        .replace(
            "routing:\n",
            &format!(
                "breaker:\n  consecutive_failures: {threshold}\n  cooldown_ms: {cooldown_ms}\n  half_open_probes: {probes}\nrouting:\n"
            ),
        )
}

fn ask(s: &Stack) -> Resp {
    s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hello"))
}

fn assert_served_by(r: &Resp, provider: &str, attempts: &str) {
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.header("x-portcullis-provider"),
        Some(provider),
        "{:?}",
        r.headers
    );
    assert_eq!(
        r.header("x-portcullis-attempts"),
        Some(attempts),
        "{:?}",
        r.headers
    );
    assert_eq!(r.header("x-portcullis-model"), Some("gpt-4o-mini"));
}

#[test]
fn primary_500_falls_back_to_the_backup_with_its_model_id_and_key() {
    let s = Stack::start(&plugin(5, 10_000, 1, 30_000), 1);
    s.primary.script(json!([{"status": 500}]));
    let r = ask(&s);
    assert_served_by(&r, "backup", "2");
    assert!(r.json()["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .contains("backup"));
    assert_eq!((s.primary.hits(), s.backup.hits()), (1, 1));
    let seen = &s.backup.requests()[0];
    assert_eq!(seen["body"]["model"], "openai/gpt-4o-mini");
    assert_eq!(
        seen["headers"]["authorization"],
        format!("Bearer {BACKUP_KEY}")
    );
    assert_eq!(seen["headers"]["host"], "backup.mock");
    // The next request goes to the primary again: one failure does not open it.
    assert_served_by(&ask(&s), "primary", "1");
}

#[test]
fn primary_connection_refused_falls_back() {
    let s = Stack::start_with(&plugin(5, 10_000, 1, 30_000), 1, true);
    let r = ask(&s);
    assert_served_by(&r, "backup", "2");
    s.envoy
        .wait_stat("wasmcustom.portcullis.provider.primary.failure_connect", 1);
}

#[test]
fn primary_slower_than_its_timeout_falls_back() {
    let s = Stack::start(&plugin(5, 10_000, 1, 300), 1);
    s.primary.script(json!([{"delay_ms": 3000}]));
    let r = ask(&s);
    assert_served_by(&r, "backup", "2");
    s.envoy
        .wait_stat("wasmcustom.portcullis.provider.primary.failure_timeout", 1);
}

#[test]
fn client_error_passes_through_verbatim_is_not_retried_and_leaves_the_breaker_alone() {
    let s = Stack::start(&plugin(2, 60_000, 1, 30_000), 1);
    let raw = r#"{"error":{"message":"max_tokens is too large","type":"invalid_request_error","param":"max_tokens","code":null}}"#;
    s.primary.script(json!([{"status": 400, "body": raw}, {"status": 400, "body": raw}, {"status": 400, "body": raw}]));
    for _ in 0..3 {
        let r = ask(&s);
        assert_eq!(r.status, 400);
        assert_eq!(r.body, raw);
    }
    assert_eq!(s.backup.hits(), 0);
    assert_eq!(s.envoy.stat(STATE), Some(0));
    // Threshold 2 and three 400s: still closed, so the primary answers.
    assert_served_by(&ask(&s), "primary", "1");
}

#[test]
fn breaker_opens_at_the_threshold_skips_the_primary_then_a_probe_closes_it() {
    // The cooldown is long enough that the request after the third failure
    // always meets the breaker open (a few local requests take milliseconds).
    let s = Stack::start(&plugin(3, 3_000, 1, 30_000), 1);
    s.primary
        .script(json!([{"status": 500}, {"status": 502}, {"status": 503}]));
    for _ in 0..3 {
        assert_served_by(&ask(&s), "backup", "2");
    }
    assert_eq!(s.envoy.stat(STATE), Some(1), "open after 3 failures");
    assert_eq!(s.primary.hits(), 3);
    // While open, the primary is skipped without spending an attempt.
    assert_served_by(&ask(&s), "backup", "1");
    assert_eq!(s.primary.hits(), 3, "the open primary was not asked");
    // After the cooldown one probe reaches the (now healthy) primary.
    poll_until(
        Duration::from_secs(15),
        "a probe to reach the primary",
        || (ask(&s).header("x-portcullis-provider") == Some("primary")).then_some(()),
    );
    assert_eq!(s.primary.hits(), 4, "exactly one probe");
    assert_eq!(s.envoy.stat(STATE), Some(0), "probe success closes it");
    assert_served_by(&ask(&s), "primary", "1");
    s.envoy
        .wait_stat("wasmcustom.portcullis.provider.primary.breaker_to_open", 1);
    s.envoy.wait_stat(
        "wasmcustom.portcullis.provider.primary.breaker_to_closed",
        1,
    );
}

#[test]
fn all_candidates_failing_gives_502_listing_each_attempt_then_503_when_all_are_open() {
    let s = Stack::start(&plugin(1, 60_000, 1, 30_000), 1);
    s.primary.script(json!([{"status": 500}]));
    s.backup.script(json!([{"status": 429}]));
    let r = ask(&s);
    assert_openai_error(&r, 502, "upstream_failed");
    let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
    assert!(
        msg.contains("primary: HTTP 500") && msg.contains("backup: HTTP 429"),
        "{msg}"
    );

    // Threshold 1: both breakers are open now.
    let r = ask(&s);
    assert_openai_error(&r, 503, "providers_unavailable");
    let retry: u64 = r.header("retry-after").unwrap().parse().unwrap();
    assert!((50..=60).contains(&retry), "retry-after {retry}");
    assert_eq!((s.primary.hits(), s.backup.hits()), (1, 1));
}

#[test]
fn streamed_request_gets_the_fallback_answer_when_the_primary_fails_before_headers() {
    let s = Stack::start(&plugin(5, 10_000, 1, 30_000), 1);
    s.primary.script(json!([{"status": 500}]));
    s.backup.script(json!([{"content": "alpha beta gamma"}]));
    let body = json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": "x"}]});
    let r = s.chat(DEMO_KEY, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert_eq!(r.header("x-portcullis-provider"), Some("backup"));
    let text: String = r
        .body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "alpha beta gamma");
    assert!(r.body.trim_end().ends_with("data: [DONE]"));
}

#[test]
fn burst_on_two_workers_reaches_an_open_primary_at_most_probe_limit_times() {
    // Threshold 3, 2 probes, a 1 ms cooldown: right after opening, the first
    // two requests become probes, and the primary holds each for 3 s, so the
    // rest of the burst must skip it on both workers.
    let s = Stack::start(&plugin(3, 1, 2, 30_000), 2);
    s.primary
        .script(json!([{"status": 500}, {"status": 500}, {"status": 500}]));
    s.primary
        .default_step(json!({"status": 500, "delay_ms": 3000}));
    for _ in 0..3 {
        assert_served_by(&ask(&s), "backup", "2");
    }
    assert_eq!(s.primary.hits(), 3);
    let url = s.envoy.url("/v1/chat/completions");
    let auth = format!("Bearer {DEMO_KEY}");
    let body = chat_body("gpt-4o-mini", "burst");
    let statuses: Vec<u16> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..200)
            .map(|_| sc.spawn(|| post(&url, &[("authorization", &auth)], &body).status))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(statuses.iter().all(|&c| c == 200), "{statuses:?}");
    let hits = s.primary.hits();
    eprintln!("primary reached {hits} times (3 to open it, then the burst)");
    assert!(
        hits <= 3 + 2,
        "primary reached {hits} times; threshold 3 + probe limit 2 allowed"
    );
    assert!(
        hits >= 4,
        "the burst must have probed the primary at least once (hits {hits})"
    );
    assert_eq!(s.backup.hits(), 3 + 200);
}

#[test]
fn breaker_metrics_carry_a_provider_label_in_prometheus() {
    let s = Stack::start(&plugin(1, 60_000, 1, 30_000), 1);
    s.primary.script(json!([{"status": 500}]));
    assert_served_by(&ask(&s), "backup", "2");
    // Counters reach Envoy at the filter's next tick.
    s.envoy.wait_stat("wasmcustom.portcullis.fallbacks", 1);
    let prom = s.envoy.prometheus();
    let line = |needle: &str| {
        prom.lines()
            .find(|l| l.starts_with(needle))
            .map(str::to_string)
    };
    assert_eq!(
        line("portcullis_breaker_state{provider=\"primary\"}").as_deref(),
        Some("portcullis_breaker_state{provider=\"primary\"} 1"),
        "{prom}"
    );
    assert!(
        line("portcullis_breaker_state{provider=\"backup\"} 0").is_some(),
        "{prom}"
    );
    assert!(
        line("portcullis_failure_5xx{provider=\"primary\"} 1").is_some(),
        "{prom}"
    );
    assert!(
        line("portcullis_breaker_to_open{provider=\"primary\"} 1").is_some(),
        "{prom}"
    );
    assert!(line("portcullis_fallbacks{} 1").is_some(), "{prom}");
    // One request took two attempts: one sample in the attempts histogram,
    // above 1 and at most 5 (Envoy's default buckets; its sum is an
    // interpolation). Histograms reach the admin output at the stats flush.
    poll_until(
        Duration::from_secs(15),
        "the attempts histogram holding one sample of 2 attempts",
        || {
            let p = s.envoy.prometheus();
            ["count{} 1", "bucket{le=\"1\"} 0", "bucket{le=\"5\"} 1"]
                .iter()
                .all(|want| {
                    p.lines()
                        .any(|l| l == format!("portcullis_attempts_{want}"))
                })
                .then_some(())
        },
    );
}

/// The first attempt (Envoy's router) and a fallback (a callout) send the
/// same client headers: the fallback used to send only `:method`, `:path`,
/// `:authority`, `content-type` and `authorization`. The client's trace is
/// continued by both, each with a span of its own.
#[test]
fn a_fallback_sends_the_same_client_headers_as_the_first_attempt() {
    let s = Stack::start(&plugin(5, 10_000, 1, 30_000), 1);
    s.primary.script(json!([{"status": 503}]));
    let auth = format!("Bearer {DEMO_KEY}");
    let sent = [
        ("user-agent", "OpenAI/Python 3.57.0"),
        ("openai-organization", "org-portcullis"),
        ("openai-project", "proj-1"),
        ("x-request-id", "fallback-headers-1"),
        ("tracestate", "vendor=1"),
        ("x-stainless-lang", "python"),
        ("x-app", "checkout"),
    ];
    let mut headers = vec![
        ("authorization", auth.as_str()),
        ("cookie", "session=secret"),
        // Continued, not passed as is (#31): each attempt its own span.
        (
            "traceparent",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        ),
    ];
    headers.extend_from_slice(&sent);
    let r = post(
        &s.envoy.url("/v1/chat/completions"),
        &headers,
        &chat_body("gpt-4o-mini", "same headers?"),
    );
    assert_served_by(&r, "backup", "2");
    let first = &s.primary.requests()[0]["headers"];
    let fallback = &s.backup.requests()[0]["headers"];
    for (k, v) in sent {
        assert_eq!(first[k], v, "first attempt, {k}: {first}");
        assert_eq!(fallback[k], v, "fallback, {k}: {fallback}");
    }
    let parent = |seen: &serde_json::Value| {
        let tp = seen["traceparent"].as_str().unwrap_or_default().to_string();
        assert!(
            tp.starts_with("00-0af7651916cd43dd8448eb211c80319c-") && tp.ends_with("-01"),
            "{tp}"
        );
        tp
    };
    let (a, b) = (parent(first), parent(fallback));
    assert!(a != b && !a.contains("b7ad6b7169203331"), "{a} {b}");
    for (seen, key) in [(first, PRIMARY_KEY), (fallback, BACKUP_KEY)] {
        assert!(seen.get("cookie").is_none(), "{seen}");
        assert_eq!(seen["authorization"], format!("Bearer {key}"));
        assert!(seen.get("x-portcullis-cluster").is_none(), "{seen}");
    }
}
