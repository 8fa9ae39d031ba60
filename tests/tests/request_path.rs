//! The request path in real Envoy: routing, errors, credentials, streaming.
mod common;
use common::*;
use portcullis_tests::*;
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::time::Duration;

#[test]
fn explicit_model_is_routed_to_the_first_provider_with_its_model_id() {
    let s = Stack::shipped(1);
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", "hello"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-portcullis-model"), Some("gpt-4o"));
    assert_eq!(r.header("x-portcullis-provider"), Some("primary"));
    assert_eq!(r.json()["choices"][0]["message"]["role"], "assistant");
    let seen = s.primary.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0]["body"]["model"], "gpt-4o-2024-08-06");
    assert_eq!(seen[0]["path"], "/v1/chat/completions");
    assert_eq!(seen[0]["headers"]["host"], "primary.mock");
    assert_eq!(s.backup.hits(), 0);
}

#[test]
fn alias_and_backup_only_models_are_routed() {
    let s = Stack::shipped(1);
    let r = s.chat(DEMO_KEY, &chat_body("fast", "hello"));
    assert_eq!(
        (r.status, r.header("x-portcullis-model")),
        (200, Some("gpt-4o-mini"))
    );
    assert_eq!(s.primary.requests()[0]["body"]["model"], "gpt-4o-mini");

    let r = s.chat(DEMO_KEY, &chat_body("llama-3.1-8b", "hello"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-portcullis-provider"), Some("backup"));
    let seen = s.backup.requests();
    assert_eq!(seen[0]["body"]["model"], "llama-3.1-8b");
    assert_eq!(seen[0]["headers"]["host"], "backup.mock");
}

#[test]
fn provider_key_is_injected_and_client_key_and_gateway_headers_never_reach_the_provider() {
    let s = Stack::shipped(1);
    let auth = format!("Bearer {DEMO_KEY}");
    let r = post(
        &s.envoy.url("/v1/chat/completions"),
        &[
            ("authorization", &auth),
            ("x-portcullis-cluster", "backup"),
            ("x-portcullis-model", "evil"),
        ],
        &chat_body("gpt-4o-mini", "hello"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-portcullis-provider"), Some("primary"));
    let seen = &s.primary.requests()[0]["headers"];
    assert_eq!(seen["authorization"], format!("Bearer {PRIMARY_KEY}"));
    let all = seen.to_string();
    assert!(!all.contains(DEMO_KEY), "client key leaked upstream: {all}");
    assert!(
        !all.contains("evil"),
        "client x-portcullis-* header leaked: {all}"
    );
    assert_eq!(s.backup.hits(), 0);
}

#[test]
fn auto_follows_the_model_weights_of_the_first_provider() {
    // envoy/plugin.yaml: primary has gpt-4o-mini weight 3, gpt-4o weight 1.
    let s = Stack::shipped(2);
    let n = 400;
    let mut mini = 0;
    for _ in 0..n {
        let r = s.chat(DEMO_KEY, &chat_body("auto", "hi"));
        assert_eq!(r.status, 200, "{}", r.body);
        assert_eq!(r.header("x-portcullis-provider"), Some("primary"));
        match r.header("x-portcullis-model") {
            Some("gpt-4o-mini") => mini += 1,
            Some("gpt-4o") => {}
            other => panic!("auto picked {other:?}"),
        }
    }
    // Expected 300 of 400 (sd 8.7); tolerance is 5 sd.
    assert!(
        (257..=343).contains(&mini),
        "gpt-4o-mini picked {mini} of {n}, expected 300 +- 43"
    );
}

#[test]
fn every_client_error_has_its_status_and_an_openai_body_and_reaches_no_provider() {
    let s = Stack::shipped(1);
    let url = s.envoy.url("/v1/chat/completions");
    let good = chat_body("gpt-4o-mini", "hi");
    assert_openai_error(&post(&url, &[], &good), 401, "invalid_api_key");
    assert_openai_error(&s.chat("sk-wrong", &good), 401, "invalid_api_key");
    assert_openai_error(
        &post(&url, &[("authorization", "Basic abc")], &good),
        401,
        "invalid_api_key",
    );
    assert_openai_error(&s.chat(DEMO_KEY, "{not json"), 400, "invalid_json");
    assert_openai_error(&s.chat(DEMO_KEY, ""), 400, "invalid_json");
    assert_openai_error(
        &s.chat(DEMO_KEY, r#"{"messages":[{"role":"user","content":"x"}]}"#),
        400,
        "missing_model",
    );
    assert_openai_error(
        &s.chat(DEMO_KEY, r#"{"model":"gpt-4o"}"#),
        400,
        "missing_messages",
    );
    assert_openai_error(
        &s.chat(DEMO_KEY, &chat_body("gpt-9", "hi")),
        404,
        "model_not_found",
    );
    assert_openai_error(
        &s.chat(MINI_KEY, &chat_body("gpt-4o", "hi")),
        403,
        "model_not_allowed",
    );
    let auth = format!("Bearer {DEMO_KEY}");
    assert_openai_error(
        &get(&s.envoy.url("/v1/embeddings"), &[("authorization", &auth)]),
        404,
        "unknown_url",
    );
    assert_eq!(s.primary.hits() + s.backup.hits(), 0);
    // The worker is still healthy after all of that.
    assert_eq!(s.chat(MINI_KEY, &good).status, 200);
}

#[test]
fn models_endpoint_lists_what_the_client_may_use() {
    let s = Stack::shipped(1);
    let ids = |key: &str| -> Vec<String> {
        let r = get(
            &s.envoy.url("/v1/models"),
            &[("authorization", &format!("Bearer {key}"))],
        );
        assert_eq!(r.status, 200, "{}", r.body);
        let v = r.json();
        assert_eq!(v["object"], "list");
        v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(ids(MINI_KEY), ["gpt-4o-mini", "mini", "fast", "auto"]);
    let all = ids(DEMO_KEY);
    for m in ["gpt-4o-mini", "gpt-4o", "llama-3.1-8b", "mini", "auto"] {
        assert!(all.iter().any(|x| x == m), "{m} missing from {all:?}");
    }
    assert_openai_error(
        &get(&s.envoy.url("/v1/models"), &[]),
        401,
        "invalid_api_key",
    );
}

#[test]
fn streamed_completion_reaches_the_client_before_the_provider_finishes() {
    let s = Stack::shipped(1);
    // The mock sends its first chunk, then holds the stream until released.
    s.primary
        .script(serde_json::json!([{"hold": true, "content": "one two three"}]));
    let body = serde_json::json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "count"}]})
    .to_string();
    let mut sock = TcpStream::connect(("127.0.0.1", s.envoy.port)).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(
        sock,
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\nauthorization: Bearer {DEMO_KEY}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reader = BufReader::new(sock);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .expect("response headers while the provider holds the stream");
        if line == "\r\n" {
            break;
        }
        head.push_str(&line.to_ascii_lowercase());
    }
    assert!(head.starts_with("http/1.1 200"), "{head}");
    assert!(head.contains("content-type: text/event-stream"), "{head}");
    assert!(head.contains("x-portcullis-provider: primary"), "{head}");
    // Read until the first SSE event arrives; the provider is still holding.
    let mut got = String::new();
    while !got.contains("data: {") {
        let mut line = String::new();
        reader
            .read_line(&mut line)
            .expect("first SSE chunk before the provider finished");
        got.push_str(&line);
    }
    assert!(!got.contains("[DONE]"));
    s.primary.release();
    let mut rest = String::new();
    while !rest.contains("data: [DONE]") {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        rest.push_str(&line);
    }
    assert!(rest.contains("\"content\":\"three\""), "{rest}");
    assert!(rest.contains("data: [DONE]"), "{rest}");
}

#[test]
fn body_over_the_configured_limit_is_413() {
    let plugin = test_plugin().replace("max_body_bytes: 1048576", "max_body_bytes: 2048");
    let s = Stack::start(&plugin, 1);
    let big = chat_body("gpt-4o-mini", &"x".repeat(8_000));
    assert_openai_error(&s.chat(DEMO_KEY, &big), 413, "request_too_large");
    assert_eq!(
        s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", &"x".repeat(1_500)))
            .status,
        200
    );
    assert_eq!(s.primary.hits(), 1);
}
