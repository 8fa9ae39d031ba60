//! Provider APIs beyond OpenAI's, in real Envoy: a model served by an
//! Anthropic provider through the official OpenAI SDK (plain, streamed with
//! usage, tool calls plain and streamed, errors), fallback across schemas
//! both ways (plain and streamed), malformed Anthropic answers, the cache
//! storing translated answers, Azure OpenAI's path and key, and a model
//! served by Google's Gemini API through the OpenAI and Anthropic shapes.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;

/// The test plugin with the backup speaking Anthropic's API and serving
/// `claude-sonnet` too; `chain`: the routing chain.
fn anthropic_plugin(base: &str, chain: &str) -> String {
    let backup = "  - name: backup\n    cluster: backup\n    host: backup.mock\n    base_path: /v1\n    api_key_env: BACKUP_API_KEY\n";
    assert!(
        base.contains(backup),
        "envoy/plugin.yaml: backup provider changed"
    );
    let p = base.replace(
        backup,
        &format!("{backup}    schema: anthropic\n    default_max_tokens: 512\n"),
    );
    let p = p.replace(
        "      - name: llama-3.1-8b\n",
        "      - name: llama-3.1-8b\n      - name: claude-sonnet\n        id: claude-sonnet-4-5\n",
    );
    p.replace("  chain: [primary, backup]", &format!("  chain: {chain}"))
}

#[test]
fn the_openai_sdk_uses_an_anthropic_backed_model_without_noticing() {
    let s = Stack::start(&anthropic_plugin(&test_plugin(), "[primary, backup]"), 2);
    s.backup.script(backed_sdk_script());
    let v = sdk_script(
        "anthropic_backed_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, "claude-sonnet"],
    );
    assert_backed_sdk_run(&v, 13, "invalid_request_error");
    // What the provider got: a Messages request with its headers.
    let reqs = s.backup.requests();
    let first = &reqs[0];
    assert_eq!(first["path"], "/v1/messages");
    assert_eq!(first["headers"]["x-api-key"], BACKUP_KEY);
    assert_eq!(first["headers"]["anthropic-version"], "2023-06-01");
    assert!(first["headers"].get("authorization").is_none());
    assert_eq!(first["body"]["model"], "claude-sonnet-4-5");
    assert_eq!(first["body"]["system"], "Be brief.");
    assert_eq!(first["body"]["max_tokens"], 50);
    let turn = &reqs[4]["body"]["messages"];
    assert_eq!(turn[2]["content"][0]["type"], "tool_result");
    assert_eq!(s.primary.hits(), 0);
    // /v1/messages reaches an OpenAI-backed model too, through the pivot.
    let r = post(
        &s.envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY)],
        &json!({"model": "gpt-4o", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");
    assert_eq!(s.primary.hits(), 1);
}

/// The test plugin with the backup speaking Google's Gemini API and
/// serving `gemini-flash` too.
fn gemini_plugin(base: &str) -> String {
    let backup = "  - name: backup\n    cluster: backup\n    host: backup.mock\n    base_path: /v1\n    api_key_env: BACKUP_API_KEY\n";
    assert!(
        base.contains(backup),
        "envoy/plugin.yaml: backup provider changed"
    );
    let p = base.replace(
        backup,
        &backup.replace(
            "base_path: /v1\n",
            "base_path: /v1beta\n    schema: gemini\n",
        ),
    );
    p.replace(
        "      - name: llama-3.1-8b\n",
        "      - name: llama-3.1-8b\n      - name: gemini-flash\n        id: gemini-2.5-flash\n",
    )
}

#[test]
fn the_openai_and_anthropic_sdks_use_a_gemini_backed_model_without_noticing() {
    let s = Stack::start(&gemini_plugin(&test_plugin()), 2);
    s.backup.script(backed_sdk_script());
    let v = sdk_script(
        "anthropic_backed_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, "gemini-flash"],
    );
    // Gemini's prompt count holds its cached content already.
    assert_backed_sdk_run(&v, 9, "INVALID_ARGUMENT");
    // What the provider got: generateContent with the key in its header.
    let reqs = s.backup.requests();
    let first = &reqs[0];
    assert_eq!(
        first["path"],
        "/v1beta/models/gemini-2.5-flash:generateContent"
    );
    assert_eq!(first["headers"]["x-goog-api-key"], BACKUP_KEY);
    assert!(first["headers"].get("authorization").is_none());
    assert_eq!(
        first["body"]["systemInstruction"]["parts"][0]["text"],
        "Be brief."
    );
    assert_eq!(first["body"]["generationConfig"]["maxOutputTokens"], 50);
    assert_eq!(
        reqs[1]["path"],
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    let turn = &reqs[4]["body"]["contents"];
    assert_eq!(turn[1]["parts"][0]["functionCall"]["name"], "get_weather");
    assert!(
        turn[1]["parts"][0]["thoughtSignature"]
            .as_str()
            .is_some_and(|s| s.starts_with("bW9jay1zaWc")),
        "the call's thought signature went back with it: {}",
        turn[1]
    );
    assert_eq!(
        turn[2]["parts"][0]["functionResponse"],
        json!({"name": "get_weather", "response": {"content": "sunny"}})
    );
    assert_eq!(s.primary.hits(), 0);
    // /v1/messages reaches it through the pivot, in Anthropic's shape.
    s.backup
        .script(json!([{"content": "Hello."}, {"content": "Hello."}]));
    let r = post(
        &s.envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY)],
        &json!({"model": "gemini-flash", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");
    assert_eq!(r.json()["content"][0]["text"], "Hello.");
    let r = post(
        &s.envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY)],
        &json!({"model": "gemini-flash", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("event: message_start")
            && r.body.contains("\"text\":\"Hello.\"")
            && r.body.contains("event: message_stop"),
        "{}",
        r.body
    );
    // A token count is Gemini's own (countTokens), not the estimate: one
    // token a word in the mock, the system instruction's included.
    let r = post(
        &s.envoy.url("/v1/messages/count_tokens"),
        &[("x-api-key", DEMO_KEY), ("anthropic-version", "2023-06-01")],
        &json!({"model": "gemini-flash", "system": "Be brief.", "messages": [{"role": "user", "content": "Say hi there"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json(), json!({"input_tokens": 5}));
    assert_eq!(r.header("x-portcullis-estimated"), None);
    let counted = s
        .backup
        .requests()
        .into_iter()
        .find(|q| q["path"] == "/v1beta/models/gemini-2.5-flash:countTokens")
        .expect("a countTokens call");
    assert_eq!(
        counted["body"]["generateContentRequest"]["model"],
        "models/gemini-2.5-flash"
    );
    assert_eq!(counted["headers"]["x-goog-api-key"], BACKUP_KEY);
}

#[test]
fn fallback_crosses_schemas_both_ways_plain_and_streamed() {
    for chain in ["[primary, backup]", "[backup, primary]"] {
        let s = Stack::start(&anthropic_plugin(&test_plugin(), chain), 1);
        let (failing, answering) = if chain.starts_with("[primary") {
            (&s.primary, &s.backup)
        } else {
            (&s.backup, &s.primary)
        };
        failing.default_step(json!({"status": 503}));
        answering.default_step(json!({"content": "from the other schema"}));
        let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi"));
        assert_eq!(r.status, 200, "{chain}: {}", r.body);
        assert_eq!(
            r.json()["choices"][0]["message"]["content"],
            "from the other schema"
        );
        assert_eq!(r.header("x-portcullis-attempts"), Some("2"));
        let body = json!({"model": "gpt-4o-mini", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]});
        let r = s.chat(DEMO_KEY, &body.to_string());
        assert_eq!(r.status, 200, "{chain}: {}", r.body);
        let (text, error, usage) = stream_text(&r.body);
        assert_eq!(text, "from the other schema", "{chain}");
        assert!(error.is_none(), "{chain}: {}", r.body);
        assert!(
            usage.is_some_and(|u| u["total_tokens"].as_u64().unwrap_or(0) > 0),
            "{chain}: {}",
            r.body
        );
        assert!(r.body.ends_with("data: [DONE]\n\n"));
    }
}

#[test]
fn malformed_anthropic_answers_give_a_clear_error_or_a_clean_end() {
    let s = Stack::start(&anthropic_plugin(&test_plugin(), "[primary, backup]"), 1);
    let stream = |text: &str| {
        json!({"model": "claude-sonnet", "stream": true, "messages": [{"role": "user", "content": text}]}).to_string()
    };
    s.backup.script(json!([
        {"body": "{\"truncated\": "},
        {"content": "one two three", "stream_error": true},
        {"content": "one two three", "cut_after": 4}
    ]));
    let r = s.chat(DEMO_KEY, &chat_body("claude-sonnet", "hi"));
    assert_openai_error(&r, 502, "provider_bad_answer");
    let r = s.chat(DEMO_KEY, &stream("hi"));
    let (text, error, _) = stream_text(&r.body);
    assert_eq!(text, "one two three");
    assert_eq!(error.unwrap()["error"]["code"], "overloaded_error");
    let r = s.chat(DEMO_KEY, &stream("hi"));
    let (_, error, _) = stream_text(&r.body);
    assert_eq!(error.unwrap()["error"]["code"], "provider_stream_error");
    assert!(!r.body.contains("[DONE]"));
    // The filter kept serving.
    let r = s.chat(DEMO_KEY, &chat_body("claude-sonnet", "hi"));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn translated_answers_are_cached_in_the_clients_shape_and_replayed_as_streams() {
    let s = Stack::start(&anthropic_plugin(&shipped_plugin(), "[primary, backup]"), 1);
    s.backup
        .default_step(json!({"content": "cached words here"}));
    let r = s.chat(DEMO_KEY, &chat_body("claude-sonnet", "cache me"));
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    let r = s.chat(DEMO_KEY, &chat_body("claude-sonnet", "cache me"));
    assert_eq!(r.header("x-portcullis-cache"), Some("hit-local"));
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "cached words here"
    );
    let body = json!({"model": "claude-sonnet", "stream": true, "messages": [{"role": "user", "content": "cache me"}]});
    let r = s.chat(DEMO_KEY, &body.to_string());
    assert_eq!(r.header("x-portcullis-cache"), Some("hit-local"));
    assert_eq!(stream_text(&r.body).0, "cached words here");
    assert_eq!(s.backup.hits(), 1);
}

#[test]
fn azure_gets_its_deployment_path_api_version_and_api_key() {
    let base = test_plugin();
    let primary =
        "    host: primary.mock          # :authority sent upstream\n    base_path: /v1\n";
    assert!(
        base.contains(primary),
        "envoy/plugin.yaml: primary provider changed"
    );
    let p = base.replace(
        primary,
        "    host: primary.mock\n    base_path: \"\"\n    schema: azure_openai\n    api_version: 2024-10-21\n",
    );
    let s = Stack::start(&p, 1);
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", "hi"));
    assert_eq!(
        r.status,
        200,
        "{} {:?}\n{}",
        r.body,
        r.headers,
        s.envoy.log()
    );
    let req = &s.primary.requests()[0];
    assert_eq!(
        req["path"],
        "/openai/deployments/gpt-4o-2024-08-06/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(req["headers"]["api-key"], PRIMARY_KEY);
    assert!(req["headers"].get("authorization").is_none());
}

/// Gemini to Anthropic and back: one model served by both formats, the
/// first failing (503), plain and streamed (the fallback's answer arrives
/// whole by callout and is translated as a stream).
#[test]
fn fallback_crosses_between_gemini_and_anthropic_both_ways() {
    for chain in ["[gemini, claude]", "[claude, gemini]"] {
        let anthropic = mock("anthropic", Some(PRIMARY_KEY));
        let gemini = mock("gemini", Some(BACKUP_KEY));
        let plugin = format!(
            "providers:
  - {{name: claude, cluster: primary, host: primary.mock, base_path: /v1, schema: anthropic, api_key_env: ANTHROPIC_API_KEY, models: [{{name: both, id: claude-sonnet-4-5}}]}}
  - {{name: gemini, cluster: backup, host: backup.mock, base_path: /v1beta, schema: gemini, api_key_env: BACKUP_API_KEY, models: [{{name: both, id: gemini-2.5-flash}}]}}
routing:
  chain: {chain}
clients:
  - name: demo
    key_sha256: {}
",
            key_hash(DEMO_KEY)
        );
        let envoy = Envoy::start(EnvoyOpts {
            plugin_yaml: &plugin,
            primary_port: anthropic.port,
            backup_port: gemini.port,
            collector_port: dead_port(),
            ratelimit_port: dead_port(),
            workers: 1,
            env: vec![
                ("ANTHROPIC_API_KEY", PRIMARY_KEY),
                ("BACKUP_API_KEY", BACKUP_KEY),
            ],
            side_tls: None,
            bootstrap_patch: Vec::new(),
            control: None,
            clusters: None,
        });
        let (failing, answering) = if chain.starts_with("[gemini") {
            (&gemini, &anthropic)
        } else {
            (&anthropic, &gemini)
        };
        failing.default_step(json!({"status": 503}));
        answering.default_step(json!({"content": "from the other format"}));
        let auth = format!("Bearer {DEMO_KEY}");
        let chat = |body: serde_json::Value| {
            post(
                &envoy.url("/v1/chat/completions"),
                &[("authorization", &auth)],
                &body.to_string(),
            )
        };
        let r = chat(json!({"model": "both", "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(r.status, 200, "{chain}: {}", r.body);
        assert_eq!(
            r.json()["choices"][0]["message"]["content"],
            "from the other format"
        );
        assert_eq!(r.header("x-portcullis-attempts"), Some("2"), "{chain}");
        let r = chat(
            json!({"model": "both", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(r.status, 200, "{chain}: {}", r.body);
        let (text, error, usage) = stream_text(&r.body);
        assert_eq!(text, "from the other format", "{chain}");
        assert!(error.is_none(), "{chain}: {}", r.body);
        assert!(usage.is_some(), "{chain}: {}", r.body);
        assert!(r.body.ends_with("data: [DONE]\n\n"), "{chain}");
    }
}
