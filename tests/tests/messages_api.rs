//! `POST /v1/messages` (Anthropic's API shape) in real Envoy: the official
//! Anthropic SDK (create, stream, tool use plain and streamed, errors as its
//! exception classes), the key in `x-api-key`, fallback between Anthropic
//! providers, the cache (apart from chat completions), and token counts in
//! the records from Anthropic's usage.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

/// Both providers speak Anthropic's API and serve `claude-sonnet`.
fn plugin(base: &str) -> String {
    let mut p = base.to_string();
    for (name, line) in [
        (
            "primary",
            "    host: primary.mock          # :authority sent upstream\n",
        ),
        ("backup", "    host: backup.mock\n"),
    ] {
        assert!(
            p.contains(line),
            "envoy/plugin.yaml: provider {name} changed"
        );
        p = p.replacen(line, &format!("{line}    schema: anthropic\n"), 1);
    }
    // An Anthropic provider cannot serve embeddings: the shipped embedding
    // model keeps no `apis` here (listing one its format cannot serve is a
    // config error).
    let apis = "        apis: [embeddings]";
    assert!(
        p.contains(apis),
        "envoy/plugin.yaml: the embedding model's apis changed"
    );
    p = p
        .lines()
        .filter(|l| !l.starts_with(apis))
        .map(|l| format!("{l}\n"))
        .collect();
    let primary_models = "        aliases: [mini, fast]\n      - name: gpt-4o\n";
    assert!(p.contains(primary_models));
    p = p.replacen(
        primary_models,
        "        aliases: [mini, fast]\n      - name: claude-sonnet\n        id: claude-sonnet-4-5\n      - name: gpt-4o\n",
        1,
    );
    p.replace(
        "      - name: llama-3.1-8b\n",
        "      - name: llama-3.1-8b\n      - name: claude-sonnet\n        id: claude-sonnet-4-5-backup\n",
    )
    .replace("  gpt-4o: {input: 2.50", "  claude-sonnet: {input: 3.0, output: 15.0, cached_input: 0.3, cache_write: 3.75}\n  gpt-4o: {input: 2.50")
}

fn messages(s: &Stack, key: &str, body: &Value) -> Resp {
    post(
        &s.envoy.url("/v1/messages"),
        &[("x-api-key", key), ("anthropic-version", "2023-06-01")],
        &body.to_string(),
    )
}

#[test]
fn the_anthropic_sdk_works_through_the_gateway() {
    let dir = TempDir::new("messages-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &plugin(&test_plugin()).replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        2,
        false,
        c.grpc_port,
    );
    let tool = json!({"name": "get_weather", "input": {"city": "Paris"}});
    s.primary.script(json!([
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "cache_read": 100},
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "chunk_delay_ms": 5},
        {"content": "Checking.", "tool_call": tool},
        {"content": "Checking.", "tool_call": tool},
        {"status": 400}
    ]));
    let v = sdk_script(
        "anthropic_sdk_check.py",
        &[&s.envoy.url(""), DEMO_KEY, "claude-sonnet"],
    );
    assert_eq!(
        v["create"],
        json!({"text": "Hi there friend", "stop": "end_turn", "input": 9, "output": 3, "type": "message"})
    );
    assert_eq!(
        v["stream"],
        json!({"text": "Hi there friend", "output": 3, "stop": "end_turn"})
    );
    assert_eq!(
        v["tool"],
        json!({"name": "get_weather", "input": {"city": "Paris"}, "stop": "tool_use"})
    );
    assert_eq!(
        v["tool_stream"],
        json!({"name": "get_weather", "input": {"city": "Paris"}, "stop": "tool_use"})
    );
    // count_tokens passes to the Anthropic provider, which counts (the
    // mock: a token a word and 3 a message).
    assert_eq!(v["count"], json!({"input_tokens": 5, "estimated": null}));
    let e = &v["errors"];
    assert_eq!(e["provider_400"]["class"], "BadRequestError");
    assert_eq!(e["provider_400"]["type"], "invalid_request_error");
    assert_eq!(e["bad_key"]["class"], "AuthenticationError");
    assert_eq!(e["bad_key"]["type"], "authentication_error");
    assert_eq!(e["unknown_model"]["class"], "NotFoundError");
    // The provider got the client's body with its own model id and key.
    let first = &s.primary.requests()[0];
    assert_eq!(first["path"], "/v1/messages");
    assert_eq!(first["body"]["model"], "claude-sonnet-4-5");
    assert_eq!(first["body"]["system"], "Be brief.");
    assert_eq!(first["headers"]["x-api-key"], PRIMARY_KEY);
    assert_eq!(s.backup.hits(), 0);
    // Records carry Anthropic's usage: cache reads in the prompt, priced.
    let records = poll_until(Duration::from_secs(30), "the records", || {
        let r = c.recent(50);
        (r.iter().filter(|x| x["provider"] == "primary").count() >= 5).then_some(r)
    });
    let mut ok: Vec<&Value> = records.iter().filter(|x| x["status"] == 200).collect();
    ok.sort_by_key(|x| x["time_ms"].as_i64());
    assert_eq!(ok[0]["prompt_tokens"], 109);
    assert_eq!(ok[0]["cached_tokens"], 100);
    assert_eq!(ok[0]["completion_tokens"], 3);
    // 9 x 3.0 + 100 x 0.3 + 3 x 15.0 micro-USD.
    assert!(
        (ok[0]["cost_usd"].as_f64().unwrap() - 0.000102).abs() < 1e-9,
        "{}",
        ok[0]
    );
    assert_eq!(
        ok[1]["completion_tokens"], 3,
        "the stream's cumulative usage"
    );
    assert_eq!(ok[1]["stream"], true);
}

#[test]
fn messages_fall_back_between_anthropic_providers_and_are_cached_apart() {
    let s = Stack::start(&plugin(&shipped_plugin()), 1);
    s.primary.script(json!([{"status": 529}]));
    s.backup.default_step(json!({"content": "from the backup"}));
    let body = json!({"model": "claude-sonnet", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]});
    let r = messages(&s, DEMO_KEY, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");
    assert_eq!(r.json()["content"][0]["text"], "from the backup");
    assert_eq!(r.header("x-portcullis-attempts"), Some("2"));
    assert_eq!(r.header("x-portcullis-provider"), Some("backup"));
    assert_eq!(
        s.backup.requests()[0]["body"]["model"],
        "claude-sonnet-4-5-backup"
    );
    // Stored in Anthropic's shape, for /v1/messages only.
    let r = messages(&s, DEMO_KEY, &body);
    assert_eq!(
        r.header("x-portcullis-cache"),
        Some("hit-local"),
        "{}",
        r.body
    );
    assert_eq!(r.json()["content"][0]["text"], "from the backup");
    let r = s.chat(DEMO_KEY, &body.to_string());
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    assert_eq!(r.json()["object"], "chat.completion");
    // No key, or a wrong one: Anthropic's error shape.
    let r = post(&s.envoy.url("/v1/messages"), &[], &body.to_string());
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "authentication_error");
}

/// Claude Code and Anthropic-SDK applications reach any model: `gpt-4o-mini`
/// is served by OpenAI-compatible providers only, so `/v1/messages` goes
/// through the pivot (a chat completion to the provider, the answer and the
/// stream translated back into Anthropic's shape).
#[test]
fn the_anthropic_sdk_uses_an_openai_backed_model_without_noticing() {
    let dir = TempDir::new("messages-pivot-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &test_plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        2,
        false,
        c.grpc_port,
    );
    let tool = json!({"name": "get_weather", "input": {"city": "Paris"}});
    s.primary.script(json!([
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}},
        {"content": "Hi there friend", "usage": {"prompt_tokens": 9, "completion_tokens": 3}, "chunk_delay_ms": 5},
        {"content": "Checking.", "tool_call": tool},
        {"content": "Checking.", "tool_call": tool},
        {"status": 400}
    ]));
    let v = sdk_script(
        "anthropic_sdk_check.py",
        &[&s.envoy.url(""), DEMO_KEY, "gpt-4o-mini"],
    );
    assert_eq!(
        v["create"],
        json!({"text": "Hi there friend", "stop": "end_turn", "input": 9, "output": 3, "type": "message"})
    );
    assert_eq!(
        v["stream"],
        json!({"text": "Hi there friend", "output": 3, "stop": "end_turn"})
    );
    for k in ["tool", "tool_stream"] {
        assert_eq!(
            v[k],
            json!({"name": "get_weather", "input": {"city": "Paris"}, "stop": "tool_use"}),
            "{k}"
        );
    }
    // No provider of this model counts: the gateway estimates ("Be brief."
    // and "Say hi": 15 characters, 4 tokens, and 3 for the message).
    assert_eq!(v["count"], json!({"input_tokens": 7, "estimated": "true"}));
    let e = &v["errors"];
    assert_eq!(
        (&e["provider_400"]["class"], &e["provider_400"]["type"]),
        (&json!("BadRequestError"), &json!("invalid_request_error"))
    );
    assert_eq!(e["bad_key"]["class"], "AuthenticationError");
    assert_eq!(e["unknown_model"]["class"], "NotFoundError");
    // The provider got a chat completion: system first, its model id, the
    // tools as functions, a stream asking for its usage chunk.
    let reqs = s.primary.requests();
    let first = &reqs[0];
    assert_eq!(first["path"], "/v1/chat/completions");
    assert_eq!(
        first["body"]["messages"][0],
        json!({"role": "system", "content": "Be brief."})
    );
    assert_eq!(first["body"]["max_tokens"], 100);
    assert_eq!(
        first["headers"]["authorization"],
        format!("Bearer {PRIMARY_KEY}")
    );
    assert_eq!(
        reqs[1]["body"]["stream_options"],
        json!({"include_usage": true})
    );
    assert_eq!(
        reqs[2]["body"]["tools"][0]["function"]["name"],
        "get_weather"
    );
    // Records: the usage read from the translated answers and stream.
    let records = poll_until(Duration::from_secs(30), "the records", || {
        let r = c.recent(50);
        (r.iter().filter(|x| x["status"] == 200).count() >= 4).then_some(r)
    });
    let mut ok: Vec<&Value> = records.iter().filter(|x| x["status"] == 200).collect();
    ok.sort_by_key(|x| x["time_ms"].as_i64());
    assert_eq!(
        (&ok[0]["prompt_tokens"], &ok[0]["completion_tokens"]),
        (&json!(9), &json!(3))
    );
    assert_eq!(
        (&ok[1]["prompt_tokens"], &ok[1]["completion_tokens"]),
        (&json!(9), &json!(3))
    );
    assert_eq!(ok[1]["stream"], true);
}

/// A tool result turn through the pivot, a cut stream, and an unknown path
/// under /v1/messages answered in Anthropic's shape.
#[test]
fn messages_through_the_pivot_carry_tool_results_and_end_cut_streams_clearly() {
    let s = Stack::start(&test_plugin(), 1);
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 20, "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}]}]});
    let r = messages(&s, DEMO_KEY, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");
    let sent = &s.primary.requests()[0]["body"]["messages"];
    assert_eq!(sent[1]["tool_calls"][0]["id"], "toolu_1");
    assert_eq!(
        sent[2],
        json!({"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"})
    );

    // A stream that ends before its finish reason.
    let cut = "data: {\"id\":\"c1\",\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"},\"finish_reason\":null}]}\n\n";
    s.primary.script(json!([{ "body": cut }]));
    let mut streamed = body.clone();
    streamed["stream"] = json!(true);
    let r = messages(&s, DEMO_KEY, &streamed);
    assert_eq!(r.status, 200);
    assert!(r.body.contains("event: message_start"), "{}", r.body);
    assert!(r.body.contains("\"text\":\"Hi\""), "{}", r.body);
    assert!(r.body.contains("event: error"), "{}", r.body);
    assert!(!r.body.contains("message_stop"), "{}", r.body);

    let r = post(
        &s.envoy.url("/v1/messages/nope"),
        &[("x-api-key", DEMO_KEY)],
        "{}",
    );
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["type"], "error");
    assert_eq!(r.json()["error"]["type"], "not_found_error");
}

/// A token count is free (Anthropic does not bill it): it takes nothing of
/// the client's token limit, whether the provider counts or the gateway
/// estimates, while a message still reserves and settles.
#[test]
fn token_counts_take_nothing_of_the_token_limit() {
    let demo = "    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8\n";
    let p = shipped_plugin();
    assert!(
        p.contains(demo),
        "envoy/plugin.yaml: the demo client changed"
    );
    // 60 tokens a minute: were counts reserved like requests (the body's
    // estimate, about 30 tokens, kept: a count reports no usage to settle
    // with), the third of ten would be refused.
    let s = Stack::start(
        &p.replacen(
            demo,
            &format!("{demo}    limits: {{tokens_per_minute: 60}}\n"),
            1,
        ),
        1,
    );
    let count = |model: &str| {
        post(
            &s.envoy.url("/v1/messages/count_tokens"),
            &[("x-api-key", DEMO_KEY), ("anthropic-version", "2023-06-01")],
            &json!({"model": model, "messages": [{"role": "user", "content": "how many tokens is this"}]}).to_string(),
        )
    };
    for _ in 0..5 {
        for model in ["claude-sonnet", "gpt-4o-mini"] {
            let r = count(model);
            assert_eq!(r.status, 200, "{model}: {}", r.body);
            assert!(r.json()["input_tokens"].as_u64().is_some_and(|n| n > 0));
        }
    }
    let r = messages(
        &s,
        DEMO_KEY,
        &json!({"model": "claude-sonnet", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 200, "the bucket is whole: {}", r.body);
    let r = messages(
        &s,
        DEMO_KEY,
        &json!({"model": "claude-sonnet", "max_tokens": 500, "messages": [{"role": "user", "content": "hi"}]}),
    );
    assert_eq!(r.status, 429, "a message still reserves: {}", r.body);
}
