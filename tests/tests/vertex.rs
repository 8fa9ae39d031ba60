//! Vertex AI (#26) in real Envoy: Gemini on Vertex with an OAuth access
//! token the filter obtains itself from a token source (the mock plays the
//! GCE metadata server: `Metadata-Flavor: Google`, tokens with a lifetime,
//! and refuses an unknown or expired token as Vertex does). One fetch for
//! many concurrent requests across workers; a token refreshed before it
//! expires, so no request fails with it.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

const PATH: &str =
    "/v1/projects/my-project/locations/us-east5/publishers/google/models/gemini-2.5-flash";

fn plugin(log: bool) -> String {
    let log = if log {
        "log:\n  collector_cluster: portcullis_collector\n"
    } else {
        ""
    };
    format!(
        "providers:
  - name: openai
    cluster: primary
    host: primary.mock
    api_key_env: OPENAI_API_KEY
    models:
      - {{name: gpt-4o-mini}}
  - name: vertex
    cluster: backup
    schema: vertex
    project: my-project
    region: us-east5
    token_cluster: backup
    models:
      - {{name: gemini-vertex, id: gemini-2.5-flash}}
  - name: claude-vertex
    cluster: backup
    schema: vertex
    publisher: anthropic
    project: my-project
    region: us-east5
    token_cluster: backup
    models:
      - {{name: claude-on-vertex, id: \"claude-sonnet-4-5@20250929\"}}
clients:
  - name: demo
    key_sha256: {}
{log}",
        key_hash(DEMO_KEY)
    )
}

struct Vx {
    vertex: Mock,
    envoy: Envoy,
    _openai: Mock,
}

fn start(token_ttl_s: &str) -> Vx {
    start_logging(token_ttl_s, None)
}

/// With the request log to a collector at `collector` (its gRPC port).
fn start_logging(token_ttl_s: &str, collector: Option<u16>) -> Vx {
    let openai = mock("openai", Some(PRIMARY_KEY));
    let vertex = Mock::start_with_args(
        env!("CARGO_BIN_EXE_portcullis-mock"),
        "vertex",
        None,
        &["--token-ttl", token_ttl_s],
    );
    let plugin = plugin(collector.is_some());
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: openai.port,
        backup_port: vertex.port,
        collector_port: collector.unwrap_or_else(dead_port),
        ratelimit_port: dead_port(),
        workers: 2,
        env: vec![("OPENAI_API_KEY", PRIMARY_KEY)],
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
    });
    Vx {
        vertex,
        envoy,
        _openai: openai,
    }
}

fn issued(m: &Mock) -> u64 {
    get(&m.url("/__mock/tokens"), &[]).json()["issued"]
        .as_u64()
        .unwrap_or(0)
}

fn chat(v: &Vx, text: &str) -> Resp {
    let auth = format!("Bearer {DEMO_KEY}");
    post(
        &v.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        &json!({"model": "gemini-vertex", "messages": [{"role": "user", "content": text}]})
            .to_string(),
    )
}

#[test]
fn the_openai_sdk_uses_gemini_on_vertex_with_a_token_the_filter_fetched() {
    let v = start("3600");
    v.vertex.script(backed_sdk_script());
    let out = sdk_script(
        "anthropic_backed_check.py",
        &[&v.envoy.url("/v1"), DEMO_KEY, "gemini-vertex"],
    );
    assert_backed_sdk_run(&out, 9, "INVALID_ARGUMENT");
    let reqs: Vec<Value> = v
        .vertex
        .requests()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/v1/projects/"))
        })
        .collect();
    assert_eq!(reqs.len(), 6, "{reqs:?}");
    assert_eq!(reqs[0]["path"], format!("{PATH}:generateContent"));
    assert_eq!(
        reqs[0]["headers"]["host"],
        "us-east5-aiplatform.googleapis.com"
    );
    assert_eq!(reqs[0]["headers"]["authorization"], "Bearer ya29.mock-1");
    assert!(reqs[0]["headers"].get("x-goog-api-key").is_none());
    assert_eq!(
        reqs[1]["path"],
        format!("{PATH}:streamGenerateContent?alt=sse")
    );
    assert_eq!(issued(&v.vertex), 1, "one token for every request");
    // Messages through the pivot, and a count by Vertex's countTokens.
    v.vertex.script(json!([{"content": "Hello."}]));
    let r = post(
        &v.envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY)],
        &json!({"model": "gemini-vertex", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"][0]["text"], "Hello.");
    let r = post(
        &v.envoy.url("/v1/messages/count_tokens"),
        &[("x-api-key", DEMO_KEY), ("anthropic-version", "2023-06-01")],
        &json!({"model": "gemini-vertex", "messages": [{"role": "user", "content": "one two three"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"input_tokens": 3}));
    assert_eq!(issued(&v.vertex), 1);
}

#[test]
fn fifty_concurrent_requests_make_one_metadata_call() {
    // With the request log on: the workers' ticks that wake requests also
    // ship the records, which must all arrive.
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let v = start_logging("3600", Some(c.grpc_port));
    let answers: Vec<Resp> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..50)
            .map(|i| {
                let v = &v;
                s.spawn(move || chat(v, &format!("request {i}")))
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for r in &answers {
        assert_eq!(r.status, 200, "{}", r.body);
    }
    assert_eq!(issued(&v.vertex), 1, "exactly one metadata call");
    // Counters reach Envoy at the filter's next tick: waited for, then
    // exactly one.
    v.envoy.wait_stat("wasmcustom.portcullis.token_fetches", 1);
    let records = poll_until(
        Duration::from_secs(15),
        "50 records in the collector",
        || {
            let r = c.recent(1000);
            (r.len() >= 50).then_some(r)
        },
    );
    assert!(records.iter().all(|r| r["status"] == 200), "{records:?}");
}

#[test]
fn a_token_is_refreshed_before_it_expires_and_no_request_fails_with_it() {
    // Two-second tokens: the filter uses one until a quarter of its life
    // before it expires, then fetches the next; the mock refuses expired
    // ones with Vertex's 401.
    let v = start("2");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let mut sent = 0;
    while issued(&v.vertex) < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "no third token after {sent} requests"
        );
        let r = chat(&v, "keep going");
        assert_eq!(r.status, 200, "request {sent}: {}", r.body);
        sent += 1;
        // Paced by the round trip itself, not a sleep.
    }
    assert!(sent >= 3, "{sent}");
}

#[test]
fn claude_on_vertex_takes_messages_as_they_are_and_chat_translated() {
    let v = start("3600");
    v.vertex.script(json!([{"content": "Hi from Claude."}, {"content": "Hi from Claude."}, {"content": "Hi from Claude."}]));
    let messages = |stream: bool| {
        post(
            &v.envoy.url("/v1/messages"),
            &[("x-api-key", DEMO_KEY), ("anthropic-version", "2023-06-01")],
            &json!({"model": "claude-on-vertex", "max_tokens": 20, "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
        )
    };
    let r = messages(false);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["content"][0]["text"], "Hi from Claude.");
    let r = messages(true);
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("event: message_stop"), "{}", r.body);
    let auth = format!("Bearer {DEMO_KEY}");
    let r = post(
        &v.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        &json!({"model": "claude-on-vertex", "messages": [{"role": "user", "content": "hello"}]})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "Hi from Claude."
    );
    let reqs: Vec<Value> = v
        .vertex
        .requests()
        .into_iter()
        .filter(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.contains("/publishers/anthropic/"))
        })
        .collect();
    let base = "/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5%4020250929";
    assert_eq!(reqs[0]["path"], format!("{base}:rawPredict"));
    assert_eq!(reqs[0]["body"]["anthropic_version"], "vertex-2023-10-16");
    assert!(reqs[0]["body"].get("model").is_none());
    assert_eq!(reqs[1]["path"], format!("{base}:streamRawPredict"));
    assert!(reqs[0]["headers"]["authorization"]
        .as_str()
        .unwrap()
        .starts_with("Bearer ya29.mock-"));
    assert!(reqs[0]["headers"].get("x-api-key").is_none());
    assert_eq!(issued(&v.vertex), 1, "one fetch for the three requests");
}

#[test]
fn the_anthropic_sdk_uses_gemini_and_claude_on_vertex() {
    let v = start("3600");
    for model in ["gemini-vertex", "claude-on-vertex"] {
        let mut script = anthropic_sdk_script();
        if model == "gemini-vertex" {
            // Vertex counts (the script counts twice): each count takes a
            // step before the 400.
            if let Some(steps) = script.as_array_mut() {
                steps.insert(4, json!({}));
                steps.insert(4, json!({}));
            }
        }
        v.vertex.script(script);
        let out = sdk_script(
            "anthropic_sdk_check.py",
            &[&v.envoy.url(""), DEMO_KEY, model],
        );
        assert_anthropic_sdk_run(&out);
        // Gemini counts on Vertex (a token a word in the mock: "Be brief."
        // and "Say hi"); Claude on Vertex's count is the gateway's estimate.
        match model {
            "gemini-vertex" => {
                assert_eq!(out["count"], json!({"input_tokens": 4, "estimated": null}))
            }
            _ => assert_eq!(out["count"]["estimated"], "true", "{out}"),
        }
    }
    assert_eq!(issued(&v.vertex), 2, "one token per provider");
}

#[test]
fn the_openai_sdk_uses_responses_with_gemini_on_vertex() {
    let v = start("3600");
    v.vertex.script(responses_script());
    let out = sdk_script(
        "responses_check.py",
        &[&v.envoy.url("/v1"), DEMO_KEY, "gemini-vertex", "0"],
    );
    assert_responses_run(&out);
    // The structured request as Gemini's response schema.
    let last = v
        .vertex
        .requests()
        .into_iter()
        .rev()
        .find(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with(":generateContent"))
        })
        .expect("generateContent calls");
    assert_eq!(
        last["body"]["generationConfig"]["responseMimeType"],
        "application/json"
    );
}
