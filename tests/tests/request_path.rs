//! The request path in real Envoy: routing, errors, credentials, streaming.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::Value;
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
    assert!(
        !all.contains("x-portcullis-"),
        "no gateway header, not even the routing one, reaches a provider: {all}"
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
    let plugin = test_plugin().replace("max_body_bytes: 33554432", "max_body_bytes: 2048");
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

/// A client's own body limit (#29) overrides the gateway's, both ways:
/// lower for the demo key (refused, naming its key's limit and where it is
/// set), higher for the mini key than the gateway's 2 KB.
#[test]
fn a_clients_own_body_limit_overrides_the_gateways() {
    let plugin = test_plugin()
        .replace("max_body_bytes: 33554432", "max_body_bytes: 2048")
        .replacen(
            "    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8\n",
            "    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8\n    limits: {max_body_bytes: 1024}\n",
            1,
        )
        .replacen(
            "    models: [gpt-4o-mini]\n",
            "    models: [gpt-4o-mini]\n    limits: {max_body_bytes: 16384}\n",
            1,
        );
    assert!(plugin.contains("max_body_bytes: 1024") && plugin.contains("max_body_bytes: 16384"));
    let s = Stack::start(&plugin, 1);
    let mid = chat_body("gpt-4o-mini", &"x".repeat(1_500));
    let r = s.chat(DEMO_KEY, &mid);
    assert_openai_error(&r, 413, "request_too_large");
    let message = r.json()["error"]["message"]
        .as_str()
        .unwrap_or("")
        .to_string();
    assert!(
        message.contains("your key's limit of 1024 bytes")
            && message.contains("clients[].limits.max_body_bytes"),
        "{message}"
    );
    let big = chat_body("gpt-4o-mini", &"x".repeat(8_000));
    assert_eq!(
        s.chat(MINI_KEY, &big).status,
        200,
        "the mini key's own 16 KiB"
    );
    let r = s.chat(MINI_KEY, &chat_body("gpt-4o-mini", &"x".repeat(20_000)));
    assert_openai_error(&r, 413, "request_too_large");
    assert!(r.body.contains("16384 bytes"), "{}", r.body);
    assert_eq!(s.primary.hits(), 1);
}

/// A model's own body limit lowers the key's and the gateway's for requests
/// to that model (the smallest its providers set), and names the model.
#[test]
fn a_models_own_body_limit_applies_to_requests_for_it() {
    let plugin = test_plugin().replacen(
        "      - name: gpt-4o\n",
        "      - name: gpt-4o\n        max_body_bytes: 4096\n",
        1,
    );
    assert!(plugin.contains("max_body_bytes: 4096"));
    let s = Stack::start(&plugin, 1);
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", &"x".repeat(6_000)));
    let msg = openai_error_message(&r, 413, "request_too_large");
    assert!(
        msg.contains("limit of 4096 bytes for the model `gpt-4o`")
            && msg.contains("providers[].models[].max_body_bytes"),
        "{msg}"
    );
    // Another model, the same body: the gateway's 32 MiB.
    assert_eq!(
        s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", &"x".repeat(6_000)))
            .status,
        200
    );
    assert_eq!(s.chat(DEMO_KEY, &chat_body("gpt-4o", "small")).status, 200);
    assert_eq!(s.primary.hits(), 2);
}

/// Every body past the shipped 32 MiB limit gets the gateway's
/// OpenAI-shaped 413, never Envoy's plain-text one (#46 item 4): sizes
/// just past the limit, just under and past Envoy's listener buffer
/// (33 MiB), far past it; sent with a `content-length` in one write, and
/// chunked in 64 KiB chunks and in one chunk written at once (Envoy then
/// reads it in pieces as large as its buffer).
#[test]
fn every_body_over_the_limit_gets_the_gateway_413_not_envoys() {
    const LIMIT: usize = 33_554_432;
    let s = Stack::shipped(1);
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\n\
        content-type: application/json\r\nconnection: close\r\n";
    let auth = format!("authorization: Bearer {DEMO_KEY}\r\n");
    let mut wrong = Vec::new();
    for size in [
        LIMIT + 1,
        34_603_007,
        34_603_009,
        34_754_432,
        35_651_584,
        40 << 20,
    ] {
        let prefix = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":""#;
        let suffix = r#""}]}"#;
        let mut body = prefix.as_bytes().to_vec();
        body.resize(size - suffix.len(), b'x');
        body.extend_from_slice(suffix.as_bytes());
        assert_eq!(body.len(), size);
        for framing in ["content-length", "chunked 64 KiB", "chunked whole"] {
            let mut first = format!("{head}{auth}").into_bytes();
            let pieces: Vec<Vec<u8>> = match framing {
                "content-length" => {
                    first.extend(format!("content-length: {size}\r\n\r\n").into_bytes());
                    first.extend_from_slice(&body);
                    vec![first]
                }
                _ => {
                    first.extend_from_slice(b"transfer-encoding: chunked\r\n\r\n");
                    let size = if framing == "chunked whole" {
                        body.len()
                    } else {
                        64 * 1024
                    };
                    let mut out = vec![first];
                    out.extend(body.chunks(size).map(|piece| {
                        let mut framed = format!("{:x}\r\n", piece.len()).into_bytes();
                        framed.extend_from_slice(piece);
                        framed.extend_from_slice(b"\r\n");
                        framed
                    }));
                    out.push(b"0\r\n\r\n".to_vec());
                    out
                }
            };
            let answer = raw_exchange(&s, pieces);
            let text = String::from_utf8_lossy(&answer);
            let body = text.split_once("\r\n\r\n").map_or("", |(_, b)| b);
            let error = serde_json::from_str::<Value>(body).unwrap_or_default()["error"].clone();
            let shaped = text.starts_with("HTTP/1.1 413")
                && text
                    .to_ascii_lowercase()
                    .contains("content-type: application/json")
                && error["code"] == "request_too_large"
                && error["type"] == "invalid_request_error"
                && error["message"]
                    .as_str()
                    .is_some_and(|m| m.contains("limits.max_body_bytes"));
            if !shaped {
                wrong.push(format!(
                    "{size} bytes, {framing}: {}",
                    text.lines().next().unwrap_or("(no answer)")
                ));
                wrong.push(format!(
                    "  {}",
                    body.get(..body.len().min(300)).unwrap_or_default()
                ));
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "not the gateway's 413:\n{}",
        wrong.join("\n")
    );
    assert_eq!(s.primary.hits(), 0);
}

/// Envoy's own 413 (its buffer full before the filter saw the body past
/// its limit: here a plugin limit above Envoy's 33 MiB buffer, so every
/// chunked body past 33 MiB gets it) reaches the client in its API's shape
/// through `local_reply_config`, OpenAI's and Anthropic's (#46 item 4).
#[test]
fn envoys_own_413_is_rewritten_in_the_clients_api_shape() {
    let plugin = shipped_plugin().replace("max_body_bytes: 33554432", "max_body_bytes: 67108864");
    assert!(plugin.contains("67108864"));
    let s = Stack::start(&plugin, 1);
    for (path, extra) in [
        (
            "/v1/chat/completions",
            format!("authorization: Bearer {DEMO_KEY}\r\n"),
        ),
        (
            "/v1/messages",
            format!("x-api-key: {DEMO_KEY}\r\nanthropic-version: 2023-06-01\r\n"),
        ),
    ] {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: gateway\r\n{extra}content-type: application/json\r\n\
             transfer-encoding: chunked\r\nconnection: close\r\n\r\n"
        );
        let body = vec![b'x'; 40 << 20];
        let chunks = body.chunks(1 << 20).map(|piece| {
            let mut framed = format!("{:x}\r\n", piece.len()).into_bytes();
            framed.extend_from_slice(piece);
            framed.extend_from_slice(b"\r\n");
            framed
        });
        let pieces = std::iter::once(head.into_bytes())
            .chain(chunks)
            .chain(std::iter::once(b"0\r\n\r\n".to_vec()));
        let answer = raw_exchange(&s, pieces);
        let text = String::from_utf8_lossy(&answer);
        assert!(text.starts_with("HTTP/1.1 413"), "{path}: {text}");
        assert!(
            text.to_ascii_lowercase()
                .contains("content-type: application/json"),
            "{path}: {text}"
        );
        let v: Value = serde_json::from_str(text.split_once("\r\n\r\n").unwrap().1).unwrap();
        if path == "/v1/messages" {
            assert_eq!(
                (&v["type"], &v["error"]["type"]),
                (&Value::from("error"), &Value::from("request_too_large")),
                "{v}"
            );
        } else {
            assert_eq!(
                (&v["error"]["code"], &v["error"]["type"]),
                (
                    &Value::from("request_too_large"),
                    &Value::from("invalid_request_error")
                ),
                "{v}"
            );
            assert!(v["error"]["param"].is_null(), "{v}");
        }
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("Envoy's buffer"),
            "{v}"
        );
    }
    assert_eq!(s.primary.hits(), 0);
}

/// Agent-sized requests under the shipped limit are served (#29): a 30 MiB
/// conversation (whole and streamed), and a request with a 10 MB image (as base64, in a `data:`
/// URL), each reaching the provider whole.
#[test]
fn agent_sized_requests_are_served_up_to_the_shipped_limit() {
    let s = Stack::shipped(1);
    let text = "The quarterly report covers revenue, churn and the roadmap. "
        .repeat(30 * 1024 * 1024 / 60);
    let big = chat_body("gpt-4o-mini", &text);
    assert!(
        big.len() > 30 << 20 && big.len() < 32 << 20,
        "{}",
        big.len()
    );
    let r = s.chat(DEMO_KEY, &big);
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(400)]);
    let image = format!("data:image/png;base64,{}", "iVBO".repeat(10_000_000 / 4));
    let with_image =
        serde_json::json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in this screenshot?"},
        {"type": "image_url", "image_url": {"url": image}}]}]})
        .to_string();
    let r = s.chat(DEMO_KEY, &with_image);
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(400)]);
    // The same 30 MiB conversation asking for a stream.
    let streamed = big.replacen('{', r#"{"stream":true,"#, 1);
    let r = s.chat(DEMO_KEY, &streamed);
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(400)]);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(r.body.trim_end().ends_with("data: [DONE]"), "{}", r.body);
    let sent = s.primary.requests();
    assert_eq!(sent.len(), 3);
    assert_eq!(sent[2]["body"]["stream"], true);
    assert_eq!(
        sent[2]["body"]["messages"][0]["content"]
            .as_str()
            .map(str::len),
        Some(text.len()),
        "the streamed request reached the provider whole"
    );
    assert_eq!(
        sent[0]["body"]["messages"][0]["content"]
            .as_str()
            .map(str::len),
        Some(text.len()),
        "the conversation reached the provider whole"
    );
    assert_eq!(
        sent[1]["body"]["messages"][0]["content"][1]["image_url"]["url"]
            .as_str()
            .map(str::len),
        Some(image.len())
    );
}

/// Send these bytes on a raw socket to the gateway and read until it closes.
/// Envoy may answer and close before everything is sent: a failed write
/// ends the sending, and the test judges what came back.
fn raw_exchange(s: &Stack, pieces: impl IntoIterator<Item = Vec<u8>>) -> Vec<u8> {
    let mut conn = TcpStream::connect(("127.0.0.1", s.envoy.port)).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    for piece in pieces {
        if conn.write_all(&piece).is_err() {
            break;
        }
    }
    let mut answer = Vec::new();
    let _ = std::io::Read::read_to_end(&mut conn, &mut answer);
    answer
}

/// One HTTP/1.1 exchange on a raw socket (header bytes that are not UTF-8
/// cannot be sent with the usual client). Returns the status and the head.
fn raw_chat(s: &Stack, extra_header: &[u8]) -> (u16, Vec<u8>) {
    let body = chat_body("gpt-4o-mini", "bytes");
    let mut req = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\nauthorization: Bearer {DEMO_KEY}\r\n\
         content-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(extra_header);
    req.extend_from_slice(b"\r\n\r\n");
    req.extend_from_slice(body.as_bytes());
    let answer = raw_exchange(s, [req]);
    let end = answer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or(answer.len());
    let head = answer[..end].to_vec();
    let status = String::from_utf8_lossy(&head)
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head)
}

fn has_line(head: &[u8], line: &[u8]) -> bool {
    head.split(|&b| b == b'\n').any(|l| {
        l.strip_suffix(b"\r")
            .unwrap_or(l)
            .eq_ignore_ascii_case(line)
    })
}

/// HTTP allows header values that are not UTF-8. Such a value once panicked
/// the SDK's header reader and trapped the VM (every later request: 503).
/// Now it passes through both ways, untouched, and the worker keeps serving.
#[test]
fn header_values_that_are_not_utf8_pass_through_and_break_nothing() {
    let s = Stack::shipped(1);
    // From the client to the provider.
    let (status, _) = raw_chat(&s, b"x-note: caf\xe9");
    assert_eq!(status, 200);
    let seen = s.primary.requests();
    assert_eq!(
        seen[0]["headers"]["x-note"],
        serde_json::json!([99, 97, 102, 233])
    );
    // From the provider to the client, proxied, and by a fallback (the
    // answer the filter sends itself).
    let note = serde_json::json!([{"note_latin1": "déjà"}]);
    for (provider, line) in [
        ("primary", &b"x-portcullis-provider: primary"[..]),
        ("backup", b"x-portcullis-provider: backup"),
    ] {
        if provider == "backup" {
            s.primary.script(serde_json::json!([{"status": 500}]));
            s.backup.script(note.clone());
        } else {
            s.primary.script(note.clone());
        }
        let (status, head) = raw_chat(&s, b"x-any: 1");
        assert_eq!(status, 200);
        assert!(
            has_line(&head, b"x-provider-note: d\xe9j\xe0"),
            "{provider}: {}",
            String::from_utf8_lossy(&head)
        );
        assert!(has_line(&head, line), "{provider}");
    }
    // The same worker still serves.
    for _ in 0..3 {
        let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "after"));
        assert_eq!(r.status, 200, "{}", r.body);
    }
}

/// Without the control plane (#46 item 8), a provider's cluster is a file in
/// a directory of cluster files (`envoy/clusters/`), rendered into the CDS
/// file `envoy/envoy.yaml` reads (`envoy/render-cds.sh`): the provider
/// serves with the shipped bootstrap unedited, and a new file handed over
/// while Envoy runs adds one more.
#[test]
fn a_provider_cluster_from_a_cluster_file_serves_with_the_bootstrap_unedited() {
    let primary = common::mock("primary", Some(PRIMARY_KEY));
    let backup = common::mock("backup", Some(BACKUP_KEY));
    let third = common::mock("third", Some(PRIMARY_KEY));
    let fourth = common::mock("fourth", Some(PRIMARY_KEY));
    let clusters = TempDir::new("clusters");
    let file = |name: &str, port: u16| {
        format!(
            "# A provider's cluster.\nname: {name}\ntype: STATIC\nconnect_timeout: 2s\nload_assignment:\n  cluster_name: {name}\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}\n"
        )
    };
    std::fs::write(
        clusters.0.join("third.yaml"),
        file("third_file", third.port),
    )
    .unwrap();
    let provider = |name: &str, cluster: &str, model: &str| {
        format!("  - name: {name}\n    cluster: {cluster}\n    host: {name}.mock\n    base_path: /v1\n    api_key_env: OPENAI_API_KEY\n    models: [{{name: {model}}}]\n")
    };
    let base = test_plugin();
    let chain = base
        .lines()
        .find(|l| l.starts_with("  chain: ["))
        .unwrap()
        .to_string();
    let plugin = base
        .replacen(
            "providers:\n",
            &format!(
                "providers:\n{}{}",
                provider("third", "third_file", "third-model"),
                provider("fourth", "fourth_file", "fourth-model")
            ),
            1,
        )
        .replace(&chain, &chain.replace(']', ", third, fourth]"));
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 1,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("BACKUP_API_KEY", BACKUP_KEY),
        ],
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: Some(&clusters.0),
    });
    let auth = format!("Bearer {DEMO_KEY}");
    let chat = |model: &str| {
        post(
            &envoy.url("/v1/chat/completions"),
            &[("authorization", &auth)],
            &chat_body(model, "hello"),
        )
    };
    let r = chat("third-model");
    assert_eq!(
        (r.status, r.header("x-portcullis-provider")),
        (200, Some("third")),
        "{}",
        r.body
    );
    assert_eq!(third.hits(), 1);
    // The fourth's cluster is not there yet: Envoy has no such cluster.
    assert_ne!(chat("fourth-model").status, 200);
    // A file more, handed over as `make reload` does.
    std::fs::write(
        clusters.0.join("fourth.yaml"),
        file("fourth_file", fourth.port),
    )
    .unwrap();
    let status = std::process::Command::new("bash")
        .arg(repo_root().join("envoy/render-cds.sh"))
        .arg(&clusters.0)
        .arg(envoy.dir.0.join("ecds/cds.yaml"))
        .status()
        .unwrap();
    assert!(status.success());
    poll_until(Duration::from_secs(10), "the fourth provider", || {
        (chat("fourth-model").status == 200).then_some(())
    });
    assert_eq!(fourth.hits(), 1);
}
