//! Images, audio, moderations and rerank in real Envoy (#48): the official
//! OpenAI SDK against the mock's OpenAI endpoints through the gateway
//! (multipart uploads, speech streamed to a file), rerank over plain HTTP
//! in Jina's and Cohere's v2 shapes, each priced by its unit into the
//! record; limits and a budget on them; bad bodies refused in OpenAI's
//! shape while the worker keeps serving.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::io::{Read, Write};
use std::time::Duration;

/// The test config's primary serves one model of each endpoint family,
/// narrowed to its endpoints by `apis`.
fn plugin() -> String {
    let p = test_plugin().replace(
        "        apis: [embeddings]      # served on /v1/embeddings only (a chat request is a 404)\n",
        &[
            "        apis: [embeddings]      # served on /v1/embeddings only (a chat request is a 404)",
            "      - {name: dall-e-3, weight: 0, apis: [images_generations]}",
            "      - {name: gpt-image-1, weight: 0, apis: [images_generations, images_edits], price: {input: 5, output: 40}}",
            "      - {name: whisper-1, weight: 0, apis: [audio_transcriptions, audio_translations]}",
            "      - {name: tts-1, weight: 0, apis: [audio_speech]}",
            "      - {name: omni-moderation-latest, weight: 0, apis: [moderations]}",
            "      - {name: rerank-v3.5, weight: 0, apis: [rerank], price: {per_thousand_searches: 2.0}}",
            "",
        ]
        .join("\n"),
    );
    // Cohere's v2 API: an OpenAI-compatible provider whose base path is `/v2`.
    let p = p.replace(
        "  - name: backup\n",
        "  - name: cohere\n    cluster: primary\n    host: primary.mock\n    base_path: /v2\n    api_key_env: OPENAI_API_KEY\n    models:\n      - {name: rerank-cohere, id: rerank-v3.5, weight: 0, apis: [rerank], price: {per_thousand_searches: 2.0}}\n  - name: backup\n",
    );
    let p = p.replace(
        "  chain: [primary, backup",
        "  chain: [primary, cohere, backup",
    );
    assert!(
        p.contains("rerank-v3.5") && p.contains("[primary, cohere,"),
        "the test config changed"
    );
    p
}

const BUDGET_KEY: &str = "sk-endpoints-budget";
const RATE_KEY: &str = "sk-endpoints-rate";

fn with_clients(p: &str) -> String {
    // The backup serves whisper-1 too (a fallback), and prompts are checked.
    let p = p.replace(
        "      - name: llama-3.1-8b\n",
        "      - name: llama-3.1-8b\n      - {name: whisper-1, id: whisper-large, apis: [audio_transcriptions]}\n",
    ) + "guardrails:\n  input:\n    - {name: email, pii: [email], action: redact}\n    - {name: secrets, regex: '(?i)password\\s*[:=]', action: deny}\n";
    assert!(p.contains("whisper-large"), "the test config changed");
    p.replace(
        "clients:\n",
        &format!(
            "clients:\n  - name: images-budget\n    key_sha256: {}\n    limits: {{budget_usd_per_day: 0.25}}\n  - name: rerank-rate\n    key_sha256: {}\n    limits: {{requests_per_minute: 2}}\n",
            key_hash(BUDGET_KEY),
            key_hash(RATE_KEY)
        ),
    )
}

fn post_json(s: &Stack, key: &str, path: &str, body: &Value) -> Resp {
    post(
        &s.envoy.url(path),
        &[
            ("authorization", &format!("Bearer {key}")),
            ("content-type", "application/json"),
        ],
        &body.to_string(),
    )
}

/// One HTTP/1.1 request of raw bytes; the status and body of the answer.
fn raw(port: u16, head: &str, body: &[u8]) -> (u16, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(head.as_bytes()).unwrap();
    s.write_all(body).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn multipart_head(port: u16, path: &str, len: usize, boundary: &str) -> String {
    format!(
        "POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\nauthorization: Bearer {DEMO_KEY}\r\ncontent-type: multipart/form-data; boundary={boundary}\r\ncontent-length: {len}\r\n\r\n"
    )
}

#[test]
fn the_openai_sdk_reaches_images_audio_and_moderations_and_each_is_priced_by_its_unit() {
    let dir = TempDir::new("endpoints-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        2,
        false,
        c.grpc_port,
    );
    let work = TempDir::new("endpoints-sdk");
    let v = sdk_script(
        "endpoints_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, work.0.to_str().unwrap()],
    );
    assert_eq!(v["dalle"]["n"], 1, "{v}");
    assert_eq!(
        v["gpt_image"],
        json!({"n": 2, "b64": [96, 96], "output_tokens": 544})
    );
    assert_eq!(v["edit"]["n"], 1);
    assert_eq!(v["transcription"]["text"], "mock transcript of 3.0 seconds");
    assert_eq!(v["translation"]["text"], "mock transcript of 3.0 seconds");
    assert_eq!(v["transcription_text"], "mock transcript of 3.0 seconds");
    // 11 characters, 64 bytes each, after a 6-byte head; streamed to a file.
    assert_eq!(v["speech"], json!({"bytes": 6 + 11 * 64, "head": "ID3"}));
    assert_eq!(v["speech_headers"]["content-type"], "audio/mpeg");
    assert_eq!(v["speech_headers"]["x-portcullis-provider"], "primary");
    assert_eq!(
        v["moderation"],
        json!({"flagged": [true, false], "model": "omni-moderation-latest"})
    );
    assert_eq!(
        v["too_many"],
        json!({"class": "BadRequestError", "status": 400, "code": "invalid_n"})
    );
    assert_eq!(v["missing_model"]["status"], 404);
    assert_eq!(v["not_served"]["status"], 404);
    // What the provider got: its own key, the multipart body whole (the
    // file's bytes as sent), the client's fields.
    let sent = s.primary.requests();
    let by_path = |p: &str| -> Vec<Value> {
        sent.iter()
            .filter(|r| r["path"] == p)
            .cloned()
            .collect::<Vec<_>>()
    };
    let t = &by_path("/v1/audio/transcriptions")[0];
    assert_eq!(
        t["headers"]["authorization"],
        format!("Bearer {PRIMARY_KEY}")
    );
    assert_eq!(t["body"]["model"], "whisper-1");
    assert_eq!(t["body"]["file"]["bytes"], v["wav_bytes"]);
    assert_eq!(t["body"]["file"]["filename"], "speech.wav");
    let e = &by_path("/v1/images/edits")[0];
    assert_eq!(e["body"]["prompt"], "make it green");
    assert_eq!(e["body"]["image"]["bytes"], 70);
    assert_eq!(
        by_path("/v1/images/generations").len(),
        2,
        "n=11 never left the gateway"
    );
    // Rerank over plain HTTP: Jina's shape at /v1, Cohere's at /v2.
    let docs = json!(["a red fox", "the blue sea", "foxes are red"]);
    let r = post_json(
        &s,
        DEMO_KEY,
        "/v1/rerank",
        &json!({"model": "rerank-v3.5", "query": "red fox", "documents": docs, "top_n": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["results"][0]["index"], 0);
    assert_eq!(body["results"].as_array().map(Vec::len), Some(2));
    let r = post_json(
        &s,
        DEMO_KEY,
        "/v2/rerank",
        &json!({"model": "rerank-cohere", "query": "sea", "documents": docs}),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let body: Value = serde_json::from_str(&r.body).unwrap();
    assert_eq!(body["meta"]["billed_units"]["search_units"], 1, "{body}");
    assert_eq!(body["results"][0]["index"], 1);
    // Each reached its provider at that provider's base path, the model id
    // as the provider names it.
    let sent = s.primary.requests();
    let v2: Vec<&Value> = sent.iter().filter(|r| r["path"] == "/v2/rerank").collect();
    assert_eq!(v2.len(), 1);
    assert_eq!(v2[0]["body"]["model"], "rerank-v3.5");
    assert_eq!(sent.iter().filter(|r| r["path"] == "/v1/rerank").count(), 1);
    // `/v1/models` says which endpoints each model serves.
    let models: Value = get(
        &s.envoy.url("/v1/models"),
        &[("authorization", &format!("Bearer {DEMO_KEY}"))],
    )
    .json();
    let whisper = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["id"] == "whisper-1")
        .unwrap()
        .clone();
    assert_eq!(
        whisper["endpoints"],
        json!(["/v1/audio/transcriptions", "/v1/audio/translations"])
    );
    // The records: each priced by its unit (default prices: dall-e-3 hd
    // 1024x1792 $0.12; whisper-1 $0.006 a minute; tts-1 $15 per 1M
    // characters; the config's $2 per 1,000 searches; gpt-image-1 by its
    // tokens).
    let rows = poll_until(Duration::from_secs(15), "the endpoints' records", || {
        let r = c.recent(50);
        (r.iter().filter(|x| x["status"] == 200).count() >= 10).then_some(r)
    });
    let cost = |model: &str, api: &str| -> Vec<i64> {
        rows.iter()
            .filter(|x| x["model"] == model && x["api"] == api && x["status"] == 200)
            .map(|x| (x["cost_usd"].as_f64().unwrap_or(-1.0) * 1e6).round() as i64)
            .collect()
    };
    assert_eq!(cost("dall-e-3", "images_generations"), vec![120_000]);
    // 3 seconds: from the answer's `usage.seconds`, and for the plain-text
    // answer and the translation (whose answers carry no usage) from the
    // WAV's header.
    assert_eq!(cost("whisper-1", "audio_transcriptions"), vec![300, 300]);
    assert_eq!(cost("whisper-1", "audio_translations"), vec![300]);
    assert_eq!(cost("tts-1", "audio_speech"), vec![165]);
    assert_eq!(cost("rerank-v3.5", "rerank"), vec![2_000]);
    assert_eq!(cost("rerank-cohere", "rerank"), vec![2_000]);
    // "two blue cats": 3 input tokens at $5, 544 output at $40 per 1M.
    assert_eq!(cost("gpt-image-1", "images_generations"), vec![15 + 21_760]);
    assert_eq!(cost("omni-moderation-latest", "moderations"), vec![0]);
    let speech = rows
        .iter()
        .find(|x| x["api"] == "audio_speech" && x["status"] == 200)
        .unwrap();
    assert_eq!(speech["provider"], "primary", "{speech}");
}

#[test]
fn limits_budgets_and_bad_bodies_on_the_new_endpoints() {
    let s = Stack::start(&with_clients(&plugin()), 1);
    let port = s.envoy.port;
    // A daily budget of $0.25: two hd images at $0.12 fit, the third would
    // not; nothing reaches the provider for it.
    let image = |key: &str| {
        post(
            &s.envoy.url("/v1/images/generations"),
            &[
                ("authorization", &format!("Bearer {key}")),
                ("content-type", "application/json"),
            ],
            &json!({"model": "dall-e-3", "prompt": "a fox", "size": "1024x1792", "quality": "hd"})
                .to_string(),
        )
    };
    assert_eq!(image(BUDGET_KEY).status, 200);
    assert_eq!(image(BUDGET_KEY).status, 200);
    let before = s.primary.hits();
    let third = image(BUDGET_KEY);
    assert_eq!(third.status, 429, "{}", third.body);
    let e: Value = serde_json::from_str(&third.body).unwrap();
    assert_eq!(e["error"]["code"], "budget_exceeded", "{e}");
    assert!(
        e["error"]["message"].as_str().unwrap().contains("$0.1200"),
        "{e}"
    );
    assert_eq!(s.primary.hits(), before);
    // Two reranks a minute.
    let body = json!({"model": "rerank-v3.5", "query": "q", "documents": ["d"]});
    assert_eq!(post_json(&s, RATE_KEY, "/v1/rerank", &body).status, 200);
    assert_eq!(post_json(&s, RATE_KEY, "/v2/rerank", &body).status, 200);
    let r = post_json(&s, RATE_KEY, "/v1/rerank", &body);
    assert_eq!(r.status, 429, "{}", r.body);
    assert!(r.header("retry-after").is_some());

    // Bad bodies: each a 400 (or 413) in OpenAI's shape, none reaching the
    // provider, none a 500.
    let hits = s.primary.hits();
    let b = "BoUnDaRy42";
    let whole = format!(
        "--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF....\r\n--{b}--\r\n"
    );
    let cut = &whole.as_bytes()[..whole.len() - 20];
    let never_ends = format!(
        "--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\n{}",
        "x".repeat(100_000)
    );
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("truncated", cut.to_vec(), "invalid_multipart"),
        ("no closing boundary", never_ends.into_bytes(), "invalid_multipart"),
        (
            "no file",
            format!("--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{b}--\r\n").into_bytes(),
            "missing_file",
        ),
        (
            "no model",
            format!("--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a\"\r\n\r\nx\r\n--{b}--\r\n").into_bytes(),
            "missing_model",
        ),
    ];
    for (what, body, code) in cases {
        let (status, text) = raw(
            port,
            &multipart_head(port, "/v1/audio/transcriptions", body.len(), b),
            &body,
        );
        assert_eq!(status, 400, "{what}: {text}");
        let e: Value = serde_json::from_str(&text).unwrap_or_else(|_| panic!("{what}: {text}"));
        assert_eq!(e["error"]["code"], code, "{what}: {e}");
    }
    // JSON where multipart is due, and no boundary.
    let (status, text) = raw(
        port,
        &format!("POST /v1/audio/transcriptions HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {DEMO_KEY}\r\ncontent-type: application/json\r\ncontent-length: 21\r\n\r\n"),
        br#"{"model":"whisper-1"}"#,
    );
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("invalid_multipart"), "{text}");
    // A declared 2 GiB body: refused at its headers, nothing read.
    let (status, text) = raw(
        port,
        &format!("POST /v1/images/edits HTTP/1.1\r\nhost: x\r\nconnection: close\r\nauthorization: Bearer {DEMO_KEY}\r\ncontent-type: multipart/form-data; boundary={b}\r\ncontent-length: 2147483648\r\n\r\n"),
        b"",
    );
    assert_eq!(status, 413, "{text}");
    assert!(text.contains("request_too_large"), "{text}");
    // JSON bodies missing what each endpoint needs.
    for (path, body, code) in [
        (
            "/v1/images/generations",
            json!({"model": "dall-e-3"}),
            "missing_prompt",
        ),
        (
            "/v1/images/generations",
            json!({"model": "dall-e-3", "prompt": "x", "n": 0}),
            "invalid_n",
        ),
        (
            "/v1/audio/speech",
            json!({"model": "tts-1", "input": "hi"}),
            "missing_voice",
        ),
        (
            "/v1/audio/speech",
            json!({"model": "tts-1", "voice": "alloy", "input": ""}),
            "invalid_input",
        ),
        (
            "/v1/rerank",
            json!({"model": "rerank-v3.5", "query": "q"}),
            "missing_documents",
        ),
        (
            "/v1/rerank",
            json!({"model": "rerank-v3.5", "query": "q", "documents": []}),
            "invalid_documents",
        ),
        (
            "/v1/moderations",
            json!({"model": "omni-moderation-latest"}),
            "missing_input",
        ),
        (
            "/v1/images/generations",
            json!({"prompt": "x"}),
            "missing_model",
        ),
    ] {
        let r = post_json(&s, DEMO_KEY, path, &body);
        assert_eq!(r.status, 400, "{path} {body}: {}", r.body);
        let e: Value = serde_json::from_str(&r.body).unwrap();
        assert_eq!(e["error"]["code"], code, "{path} {body}: {e}");
    }
    assert_eq!(s.primary.hits(), hits, "no bad body reached the provider");
    // The worker still serves, chat and the new endpoints alike.
    let ok = post_json(
        &s,
        DEMO_KEY,
        "/v1/moderations",
        &json!({"model": "omni-moderation-latest", "input": "hello"}),
    );
    assert_eq!(ok.status, 200, "{}", ok.body);
    let chat = post(
        &s.envoy.url("/v1/chat/completions"),
        &[
            ("authorization", &format!("Bearer {DEMO_KEY}")),
            ("content-type", "application/json"),
        ],
        &json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    assert_eq!(chat.status, 200, "{}", chat.body);

    // A transcription falls back to the backup when the primary fails: the
    // same multipart body, the backup's model id and key; the prompt's
    // e-mail address redacted inside the multipart body, the file intact.
    s.primary.script(json!([{"status": 500}]));
    let wav = {
        let data = vec![0u8; 16_000];
        let mut w = b"RIFF".to_vec();
        w.extend_from_slice(&(36 + data.len() as u32).to_le_bytes());
        w.extend_from_slice(b"WAVEfmt ");
        w.extend_from_slice(&16u32.to_le_bytes());
        w.extend_from_slice(&[1, 0, 1, 0]);
        w.extend_from_slice(&8000u32.to_le_bytes());
        w.extend_from_slice(&16000u32.to_le_bytes());
        w.extend_from_slice(&[2, 0, 16, 0]);
        w.extend_from_slice(b"data");
        w.extend_from_slice(&(data.len() as u32).to_le_bytes());
        w.extend_from_slice(&data);
        w
    };
    let mut body = format!("--{b}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\nContent-Type: audio/wav\r\n\r\n").into_bytes();
    body.extend_from_slice(&wav);
    body.extend_from_slice(format!("\r\n--{b}\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--{b}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nnames: ann@example.com\r\n--{b}--\r\n").as_bytes());
    let (status, text) = raw(
        port,
        &multipart_head(port, "/v1/audio/transcriptions", body.len(), b),
        &body,
    );
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap()["text"],
        "mock transcript of 1.0 seconds"
    );
    let sent = s.backup.requests();
    let t = sent
        .iter()
        .rev()
        .find(|r| r["path"] == "/v1/audio/transcriptions")
        .expect("the backup's call");
    assert_eq!(
        t["headers"]["authorization"],
        format!("Bearer {BACKUP_KEY}")
    );
    assert_eq!(t["body"]["model"], "whisper-large");
    assert_eq!(t["body"]["file"]["bytes"], wav.len());
    let prompt = t["body"]["prompt"].as_str().unwrap();
    assert!(
        !prompt.contains("ann@example.com") && prompt.starts_with("names: "),
        "{prompt}"
    );
    // A denied prompt never leaves.
    let before = s.primary.hits() + s.backup.hits();
    let r = post_json(
        &s,
        DEMO_KEY,
        "/v1/images/generations",
        &json!({"model": "dall-e-3", "prompt": "the password: hunter2"}),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(s.primary.hits() + s.backup.hits(), before);
}
