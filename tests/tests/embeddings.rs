//! `POST /v1/embeddings` in real Envoy: the official OpenAI SDK (floats,
//! base64 decoded by the SDK, several inputs, token arrays, an unknown
//! model), usage into the record and the token limit, the exact cache
//! (apart from chat completions), only providers whose format serves
//! embeddings, Azure's deployment path, Gemini's `batchEmbedContents`, and
//! the body checks.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

const MODEL: &str = "text-embedding-3-small";

fn embed(s: &Stack, key: &str, body: &Value) -> Resp {
    post(
        &s.envoy.url("/v1/embeddings"),
        &[
            ("authorization", &format!("Bearer {key}")),
            ("content-type", "application/json"),
        ],
        &body.to_string(),
    )
}

#[test]
fn the_openai_sdk_embeds_through_the_gateway_and_the_record_has_the_usage() {
    let dir = TempDir::new("embeddings-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &test_plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        2,
        false,
        c.grpc_port,
    );
    let v = sdk_script(
        "embeddings_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, MODEL],
    );
    assert_eq!(
        v["default"],
        json!({"model": MODEL, "lengths": [8], "indexes": [0], "prompt_tokens": 3, "total_tokens": 3})
    );
    assert_eq!(
        v["float"],
        json!({"model": MODEL, "lengths": [4, 4], "indexes": [0, 1], "prompt_tokens": 3, "total_tokens": 3})
    );
    assert_eq!(v["tokens"]["prompt_tokens"], 5);
    assert_eq!(v["tokens"]["lengths"], json!([8, 8]));
    assert_eq!(
        v["headers"],
        json!({"x-portcullis-model": MODEL, "x-portcullis-provider": "primary", "x-portcullis-cache": "off"})
    );
    assert_eq!(
        v["missing"],
        json!({"class": "NotFoundError", "status": 404})
    );
    // What the provider saw: the client's body, untouched but for nothing.
    let sent = s.primary.requests();
    let first = sent.iter().find(|r| r["path"] == "/v1/embeddings").unwrap();
    assert_eq!(first["body"]["input"], "hello there world");
    assert_eq!(
        first["headers"]["authorization"],
        format!("Bearer {PRIMARY_KEY}")
    );
    // The records: prompt tokens from the answer, no completion, the
    // input price (0.02 per 1M tokens).
    let rows = poll_until(Duration::from_secs(10), "the embeddings records", || {
        let r = c.recent(20);
        (r.iter()
            .filter(|x| x["model"] == MODEL && x["status"] == 200)
            .count()
            >= 4)
            .then_some(r)
    });
    let rec = rows
        .iter()
        .find(|x| x["model"] == MODEL && x["prompt_tokens"] == 5)
        .expect("the token-array record");
    assert_eq!(rec["completion_tokens"], 0);
    assert_eq!(rec["provider"], "primary");
}

#[test]
fn the_openai_sdk_embeds_with_a_gemini_backed_model() {
    // The backup speaks Gemini's API; its embedding model is served by
    // `batchEmbedContents` (#26).
    let plugin = test_plugin()
        .replace(
            "    host: backup.mock\n    base_path: /v1\n",
            "    host: backup.mock\n    base_path: /v1beta\n    schema: gemini\n",
        )
        .replace(
            "      - name: llama-3.1-8b\n",
            "      - name: llama-3.1-8b\n      - {name: gemini-embed, id: gemini-embedding-001, apis: [embeddings]}\n",
        );
    assert!(plugin.contains("schema: gemini") && plugin.contains("gemini-embed"));
    let s = Stack::start(&plugin, 1);
    let v = sdk_script(
        "embeddings_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, "gemini-embed"],
    );
    // "hello there world": 17 characters, 5 tokens estimated (Gemini
    // reports none); "one" and "two words": 1 + 3.
    assert_eq!(
        v["default"],
        json!({"model": "gemini-embed", "lengths": [8], "indexes": [0], "prompt_tokens": 5, "total_tokens": 5})
    );
    assert_eq!(
        v["float"],
        json!({"model": "gemini-embed", "lengths": [4, 4], "indexes": [0, 1], "prompt_tokens": 4, "total_tokens": 4})
    );
    assert_eq!(v["base64_equals_float"], true, "{v}");
    assert_eq!(v["tokens"]["status"], 400, "{v}");
    assert!(
        v["tokens"]["message"]
            .as_str()
            .unwrap_or("")
            .contains("token arrays"),
        "{v}"
    );
    assert_eq!(v["headers"]["x-portcullis-provider"], "backup");
    assert_eq!(v["missing"]["status"], 404);
    // What Gemini got: its path, its key header, one request per input
    // naming the path's model.
    let sent = s.backup.requests();
    let first = sent
        .iter()
        .find(|r| r["path"] == "/v1beta/models/gemini-embedding-001:batchEmbedContents")
        .unwrap_or_else(|| panic!("no batchEmbedContents call in {sent:?}"));
    assert_eq!(first["headers"]["x-goog-api-key"], BACKUP_KEY);
    assert_eq!(first["headers"].get("authorization"), None);
    assert_eq!(
        first["body"],
        json!({"requests": [{"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "hello there world"}]}}]})
    );
    let dims = sent
        .iter()
        .find(|r| r["body"]["requests"][0]["outputDimensionality"] == 4)
        .expect("the call with dimensions");
    assert_eq!(dims["body"]["requests"].as_array().map(Vec::len), Some(2));
    assert_eq!(
        s.primary.hits(),
        0,
        "the Gemini model is served by the backup only"
    );
}

#[test]
fn embeddings_are_cached_apart_from_chat_and_count_against_the_token_limit() {
    let plugin = test_plugin()
        .replace("cache:\n  enabled: false", "cache:\n  enabled: true")
        .replace(
            "    key_sha256: 1e86ab7249d3de11c180b35d55c86a81d03828ccc12ec8993545ae305c280a55   # key: sk-portcullis-mini\n    models: [gpt-4o-mini]\n",
            "    key_sha256: 1e86ab7249d3de11c180b35d55c86a81d03828ccc12ec8993545ae305c280a55   # key: sk-portcullis-mini\n    models: [gpt-4o-mini, text-embedding-3-small]\n    limits: {tokens_per_minute: 30}\n",
        );
    let s = Stack::start(&plugin, 1);
    let body = json!({"model": MODEL, "input": "one two three four"});
    let r = embed(&s, DEMO_KEY, &body);
    assert_eq!(
        (r.status, r.header("x-portcullis-cache")),
        (200, Some("miss")),
        "{}",
        r.body
    );
    let again = embed(&s, DEMO_KEY, &body);
    assert_eq!(again.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(again.json()["data"], r.json()["data"], "the stored vectors");
    assert_eq!(s.primary.hits(), 1);
    // The same body as a chat completion is not answered from embeddings.
    let chat = json!({"model": MODEL, "input": "one two three four", "messages": [{"role": "user", "content": "x"}]});
    let r = s.chat(DEMO_KEY, &chat.to_string());
    assert_ne!(r.header("x-portcullis-cache"), Some("hit"), "{}", r.body);

    // 30 tokens a minute: each request reserves its estimate (14 tokens:
    // the body's bytes / 4, no completion) and settles at the 4 it used, so
    // five pass where two would without the settlement; then a refusal.
    let mut statuses = Vec::new();
    for i in 0..8 {
        let b = json!({"model": MODEL, "input": format!("w{i} x y z")});
        statuses.push(embed(&s, MINI_KEY, &b).status);
    }
    assert_eq!(&statuses[..4], &[200, 200, 200, 200], "{statuses:?}");
    assert!(
        statuses.contains(&429),
        "the token limit never refused: {statuses:?}"
    );
}

#[test]
fn embeddings_reach_only_providers_that_serve_them_and_bodies_are_checked() {
    // The backup speaks Anthropic's API: it cannot serve embeddings.
    let plugin = test_plugin()
        .replace(
            "    host: backup.mock\n",
            "    host: backup.mock\n    schema: anthropic\n",
        )
        .replace(
            "      - name: llama-3.1-8b\n",
            "      - name: llama-3.1-8b\n      - name: claude-embed\n",
        );
    let s = Stack::start(&plugin, 1);
    let r = embed(
        &s,
        DEMO_KEY,
        &json!({"model": "claude-embed", "input": "x"}),
    );
    assert_openai_error(&r, 404, "model_not_found");
    assert!(r.body.contains("/v1/embeddings"), "{}", r.body);
    assert_eq!(s.backup.hits(), 0);
    // The shipped embedding model is served on /v1/embeddings only (its
    // `apis`): a chat request for it never reaches a provider.
    let before = s.primary.hits();
    let r = s.chat(DEMO_KEY, &chat_body(MODEL, "hi"));
    assert_openai_error(&r, 404, "model_not_found");
    assert!(
        r.body.contains("/v1/chat/completions") && r.body.contains("`apis`"),
        "{}",
        r.body
    );
    assert_eq!(s.primary.hits(), before);
    for (body, code) in [
        (json!({"model": MODEL}), "missing_input"),
        (json!({"model": MODEL, "input": []}), "invalid_input"),
        (
            json!({"model": MODEL, "input": "x", "stream": true}),
            "invalid_stream",
        ),
        (json!({"input": "x"}), "missing_model"),
    ] {
        assert_openai_error(&embed(&s, DEMO_KEY, &body), 400, code);
    }
    // The primary fails: no fallback to a provider that cannot serve it.
    s.primary.script(json!([{"status": 503}]));
    let r = embed(&s, DEMO_KEY, &json!({"model": MODEL, "input": "x"}));
    assert_openai_error(&r, 502, "upstream_failed");
    assert!(r.body.contains("primary: HTTP 503"), "{}", r.body);
    assert_eq!(s.backup.hits(), 0);
}

#[test]
fn azure_embeddings_go_to_the_deployment_path() {
    let plugin = test_plugin().replace(
        "    host: primary.mock          # :authority sent upstream\n    base_path: /v1\n",
        "    host: primary.mock          # :authority sent upstream\n    base_path: \"\"\n    schema: azure_openai\n    api_version: 2024-10-21\n",
    );
    let s = Stack::start(&plugin, 1);
    let r = embed(&s, DEMO_KEY, &json!({"model": MODEL, "input": ["a", "b"]}));
    assert_eq!(r.status, 200, "{}", r.body);
    let sent = s.primary.requests();
    let last = sent.last().unwrap();
    assert_eq!(
        last["path"],
        "/openai/deployments/text-embedding-3-small/embeddings?api-version=2024-10-21"
    );
    assert_eq!(last["headers"]["api-key"], PRIMARY_KEY);
}
