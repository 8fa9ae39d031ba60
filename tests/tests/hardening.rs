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
    // A provider that frames its stream by `Content-Length` (#61): the
    // gateway drops the usage chunk only it asked for, so the client must
    // not be promised the provider's length (it would wait for bytes that
    // never come, until its own timeout, on a kept-alive connection).
    s.primary
        .script(json!([{"content_length": true, "content": "framed by its length"}]));
    let body = r#"{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"a stream framed by its length"}]}"#;
    let auth = format!("Bearer {DEMO_KEY}");
    let r = post_streamed(
        &s.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        body,
        Duration::from_secs(10),
    );
    assert_eq!(r.error, None, "the stream ended: {}", r.resp.body);
    assert_eq!(r.resp.status, 200);
    assert!(r.resp.body.ends_with("data: [DONE]\n\n"), "{}", r.resp.body);
    assert!(r.resp.body.contains("framed"), "{}", r.resp.body);
    assert!(
        !r.resp.body.contains("\"choices\":[]"),
        "the usage chunk only the gateway asked for is gone: {}",
        r.resp.body
    );
    if let Some(n) = r.resp.header("content-length") {
        assert_eq!(n.parse::<usize>().unwrap(), r.resp.body.len());
    }
    let seen = s.primary.requests().last().unwrap()["body"].clone();
    assert_eq!(seen["stream_options"]["include_usage"], true, "{seen}");
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

/// Run `cmd` under `make run`'s supervisor (scripts/keep-running.sh), wait
/// until `up` says it serves, SIGKILL it, and wait until a new process
/// serves again; the supervisor's log says it restarted it.
fn restarted_after_kill(
    name: &str,
    cmd: &std::path::Path,
    args: &[std::ffi::OsString],
    up: &dyn Fn() -> bool,
) {
    let dir = TempDir::new("hardening-supervise");
    let log = dir.0.join("supervisor.log");
    let guard = Supervised(
        std::process::Command::new("bash")
            .arg(repo_root().join("scripts/keep-running.sh"))
            .arg(name)
            .arg(cmd)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let child = || -> Option<u32> {
        let pid = guard.0.id();
        std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let first = poll_until(Duration::from_secs(20), &format!("{name} up"), || {
        up().then_some(())?;
        child()
    });
    let killed = std::process::Command::new("kill")
        .args(["-KILL", &first.to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let second = poll_until(
        Duration::from_secs(20),
        &format!("{name} restarted"),
        || {
            up().then_some(())?;
            child().filter(|&p| p != first)
        },
    );
    assert_ne!(first, second);
    let said = std::fs::read_to_string(&log).unwrap();
    assert!(
        said.contains(&format!("{name} exited")) && said.contains("starting it again"),
        "{said}"
    );
}

fn serves(url: &str) -> bool {
    try_get(url).is_some_and(|r| r.status == 200)
}

fn listens(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// `make run` keeps the collector running (scripts/keep-running.sh): killed,
/// it comes back on its ports with its database, and nothing else stops.
#[test]
fn the_collector_is_restarted_when_it_dies() {
    let dir = TempDir::new("hardening-collector");
    let (grpc, http) = (dead_port(), dead_port());
    let args: Vec<std::ffi::OsString> = vec![
        "--grpc".into(),
        format!("127.0.0.1:{grpc}").into(),
        "--http".into(),
        format!("127.0.0.1:{http}").into(),
        "--db".into(),
        dir.0.join("log.db").into(),
    ];
    let health = format!("http://127.0.0.1:{http}/healthz");
    restarted_after_kill("collector", &collector_bin(), &args, &|| serves(&health));
}

/// Every other part `make run` starts is kept the same way (#46: stopping
/// the control plane once ended the whole demo): the mock providers, Redis,
/// the limiter, and the control plane, which comes back on its database
/// with the keys made through its API.
#[test]
fn every_side_service_of_make_run_is_restarted_when_it_dies() {
    let mock = std::path::PathBuf::from(env!("CARGO_BIN_EXE_portcullis-mock"));
    let port = dead_port();
    let hits = format!("http://127.0.0.1:{port}/__mock/hits");
    restarted_after_kill(
        "primary",
        &mock,
        &[
            "--port".into(),
            port.to_string().into(),
            "--name".into(),
            "primary".into(),
        ],
        &|| serves(&hits),
    );

    let redis = std::path::PathBuf::from(
        std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into()),
    );
    let redis_port = dead_port();
    let args: Vec<std::ffi::OsString> = [
        "--port",
        &redis_port.to_string(),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(Into::into)
    .collect();
    restarted_after_kill("redis", &redis, &args, &|| listens(redis_port));

    let limiter_port = dead_port();
    let args: Vec<std::ffi::OsString> = [
        "--listen".to_string(),
        format!("127.0.0.1:{limiter_port}"),
        "--redis".to_string(),
        format!("redis://127.0.0.1:{}", dead_port()),
    ]
    .iter()
    .map(Into::into)
    .collect();
    restarted_after_kill("limiter", &limiter_bin(), &args, &|| listens(limiter_port));

    // The control plane: a key made before the kill is there after it.
    let c = Control::start(&test_plugin());
    c.write("POST", "/v1/keys", r#"{"name":"kept"}"#);
    let mut c = c;
    c.stop();
    let (admin, xds) = (dead_port(), dead_port());
    let args: Vec<std::ffi::OsString> = vec![
        "serve".into(),
        "--db".into(),
        c.db.clone(),
        "--admin".into(),
        format!("127.0.0.1:{admin}").into(),
        "--xds".into(),
        format!("127.0.0.1:{xds}").into(),
    ];
    let read = c.read_token.clone();
    let keys = format!("http://127.0.0.1:{admin}/v1/keys/kept");
    restarted_after_kill("control", &control_bin(), &args, &|| {
        try_get_with(&keys, &[("authorization", &format!("Bearer {read}"))])
            .is_some_and(|r| r.status == 200)
    });
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
