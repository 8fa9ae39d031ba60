//! Defects found by a security review, each pinned against the real parts:
//! Envoy with the release `.wasm`, the mock providers, the collector binary.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;
use std::time::Duration;

/// The test plugin with the prompt cache on (shared between clients) and
/// `limits` (inline YAML) on the demo client.
fn plugin(limits: Option<&str>) -> String {
    let mut p = test_plugin().replace("cache:\n  enabled: false", "cache:\n  enabled: true");
    if let Some(limits) = limits {
        let demo = format!("  - name: demo\n    key_sha256: {}\n", key_hash(DEMO_KEY));
        assert!(p.contains(&demo));
        p = p.replace(&demo, &format!("{demo}    limits: {limits}\n"));
    }
    assert!(p.contains("scope: shared"));
    p
}

/// Bodies a lenient skim accepts but a whole read does not: a number out of
/// range, lone surrogates, nesting past serde's depth limit.
fn unreadable_bodies(text: &str) -> Vec<String> {
    let msgs = format!(r#"[{{"role":"user","content":"{text}"}}]"#);
    vec![
        format!(r#"{{"model":"gpt-4o-mini","messages":{msgs},"seed":1e400}}"#),
        format!(r#"{{"model":"gpt-4o-mini","messages":{msgs},"stream":true,"seed":-1e400}}"#),
        format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{text} \ud800"}}]}}"#
        ),
        format!(
            r#"{{"model":"gpt-4o-mini","messages":{msgs},"metadata":{}0{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        ),
    ]
}

/// A body whose cache key could not be built was keyed by its route alone, so
/// another client's different question on the same model got the first
/// client's answer. Such bodies are now refused before any step sees them,
/// and never reach a provider or the cache.
#[test]
fn a_body_that_cannot_be_read_whole_is_refused_and_never_shares_a_cache_entry() {
    let s = Stack::start(&plugin(None), 2);
    for body in unreadable_bodies("client A's secret question") {
        let r = s.chat(DEMO_KEY, &body);
        assert_openai_error(&r, 400, "invalid_json");
        assert!(
            r.json()["error"]["message"]
                .as_str()
                .unwrap()
                .contains("line 1"),
            "the message says where: {}",
            r.body
        );
    }
    assert_eq!(s.primary.hits(), 0, "nothing unreadable went upstream");
    let other = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "client B asks something else"}]});
    let r = s.chat(MINI_KEY, &other.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    assert!(!r.body.contains("secret"), "{}", r.body);
    let again = s.chat(MINI_KEY, &other.to_string());
    assert_eq!(again.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(s.primary.hits(), 1);
}

/// A streamed body with `"seed": 1e400` reached the provider without its
/// messages (the usage rewrite worked from an empty tree) and the client got
/// JSON instead of a stream. Streamed requests that can be read keep every
/// field through that rewrite.
#[test]
fn the_usage_rewrite_of_a_stream_keeps_the_messages() {
    let s = Stack::start(&plugin(None), 1);
    let unreadable = r#"{"model":"gpt-4o-mini","stream":true,"seed":1e400,"messages":[{"role":"user","content":"keep my words"}]}"#;
    assert_openai_error(&s.chat(DEMO_KEY, unreadable), 400, "invalid_json");
    assert_eq!(s.primary.hits(), 0, "refused before it went upstream");
    let body = r#"{"model":"gpt-4o-mini","stream":true,"seed":12345678901234567890,"messages":[{"role":"user","content":"keep my words"}]}"#;
    let r = s.chat(DEMO_KEY, body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("data: [DONE]"), "a stream: {}", r.body);
    let seen = &s.primary.requests()[0]["body"];
    assert_eq!(seen["messages"][0]["content"], "keep my words", "{seen}");
    assert_eq!(seen["stream_options"]["include_usage"], true, "{seen}");
    assert_eq!(seen["stream"], true, "{seen}");
}

/// `max_tokens` of 2^63 wrapped the key's token bucket (every later request
/// got 429); 2^64-1 wrapped the reservation to a few tokens. Both are now a
/// 429 naming the size, the bucket untouched, and the key keeps working.
#[test]
fn huge_max_tokens_are_refused_by_name_and_never_wrap_a_bucket_or_budget() {
    let s = Stack::start(
        &plugin(Some("{tokens_per_minute: 100000, budget_usd_per_day: 10}")),
        2,
    );
    for (field, n) in [
        ("max_tokens", "9223372036854775808"),
        ("max_tokens", "18446744073709551615"),
        ("max_completion_tokens", "9223372036854775807"),
        ("max_completion_tokens", "18446744073709551615"),
    ] {
        let body = format!(
            r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}],"{field}":{n}}}"#
        );
        let r = s.chat(DEMO_KEY, &body);
        assert_openai_error(&r, 429, "rate_limit_exceeded");
        let msg = r.json()["error"]["message"].as_str().unwrap().to_string();
        assert!(msg.contains("Request too large"), "{msg}");
        assert!(msg.contains("limit 100000"), "{msg}");
    }
    assert_eq!(s.primary.hits(), 0);
    for i in 0..3 {
        let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", &format!("small {i}")));
        assert_eq!(r.status, 200, "the key still works: {}", r.body);
        let left = r.header_u64("x-ratelimit-remaining-tokens");
        assert!(
            (90_000..100_000).contains(&left),
            "the bucket holds what small requests took, no more: {left}"
        );
    }
}

/// `?since=%C3%A9` split a two-byte character and aborted the collector.
/// Bad query values are a 400 in the API's JSON shape, and it keeps serving.
#[test]
fn bad_query_values_are_a_json_400_and_the_collector_keeps_serving() {
    let dir = TempDir::new("hardening-query");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    for q in [
        "/v1/metrics/summary?since=%C3%A9",
        "/v1/metrics/summary?since=1%C3%A9",
        "/v1/metrics/summary?since=99999999999999999d",
        "/v1/metrics/summary?since=%FF",
        "/v1/requests/recent?limit=%C3%A9",
        "/v1/requests/recent?limit=99999999999999999999999",
    ] {
        let r = get(&c.url(q), &[]);
        assert_eq!(r.status, 400, "{q}: {}", r.body);
        assert!(r.json()["error"]["message"].is_string(), "{q}: {}", r.body);
    }
    assert_eq!(get(&c.url("/healthz"), &[]).status, 200);
    assert_eq!(get(&c.url("/v1/metrics/summary?since=1h"), &[]).status, 200);
}

/// A client that sends one fixed `x-request-id` must not slow the log for
/// everyone or lose requests: 1,500 records under one id are all kept, at
/// the collector binary, and sending them again adds nothing.
#[test]
fn a_reused_request_id_keeps_every_request_and_a_resend_adds_none() {
    use portcullis_collector::proto::{
        collector_client::CollectorClient, RecordBatch, RequestRecord,
    };
    let dir = TempDir::new("hardening-reuse");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let records: Vec<RequestRecord> = (0..1_500u64)
        .map(|i| RequestRecord {
            request_id: "fixed-id".into(),
            time_ms: 1_700_000_000_000 + i,
            client: "demo".into(),
            model: "gpt-4o-mini".into(),
            status: 200,
            ..Default::default()
        })
        .collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut client = CollectorClient::connect(format!("http://127.0.0.1:{}", c.grpc_port))
            .await
            .unwrap();
        for _ in 0..2 {
            for chunk in records.chunks(500) {
                client
                    .ingest(RecordBatch {
                        records: chunk.to_vec(),
                    })
                    .await
                    .unwrap();
            }
        }
    });
    let metrics = get(&c.url("/metrics"), &[]).body;
    let value = |name: &str| -> u64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("{name} in {metrics}"))
    };
    assert_eq!(value("portcullis_collector_ingested_total"), 1_500);
    assert_eq!(value("portcullis_collector_duplicates_total"), 1_500);
}

/// `make run` keeps the collector running (scripts/keep-running.sh): killed,
/// it comes back on its ports with its database, and nothing else stops.
#[test]
fn the_collector_is_restarted_when_it_dies() {
    let dir = TempDir::new("hardening-supervise");
    let (grpc, http) = (dead_port(), dead_port());
    let guard = Supervised(
        std::process::Command::new("bash")
            .arg(repo_root().join("scripts/keep-running.sh"))
            .arg("collector")
            .arg(collector_bin())
            .args([
                "--grpc",
                &format!("127.0.0.1:{grpc}"),
                "--http",
                &format!("127.0.0.1:{http}"),
                "--db",
            ])
            .arg(dir.0.join("log.db"))
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );
    let health = format!("http://127.0.0.1:{http}/healthz");
    let child = || -> Option<u32> {
        let pid = guard.0.id();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let first = poll_until(Duration::from_secs(20), "collector up", || {
        try_get(&health).filter(|r| r.status == 200)?;
        child()
    });
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let second = poll_until(Duration::from_secs(20), "collector restarted", || {
        try_get(&health).filter(|r| r.status == 200)?;
        child().filter(|&p| p != first)
    });
    assert_ne!(first, second);
}

/// The supervisor, stopped the way Ctrl-C stops it (SIGTERM: it stops its
/// child first), also when the test fails; SIGKILL if it does not go.
struct Supervised(std::process::Child);

impl Drop for Supervised {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::park_timeout(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
