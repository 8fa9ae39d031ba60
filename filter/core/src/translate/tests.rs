use super::*;
use crate::health::breaker::BreakerConfig;
use crate::providers::anthropic::{self, Options, Stream};
use crate::providers::{credential, extra_headers};
use serde_json::{json, Value};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn provider(base_path: &str, schema: Schema) -> Provider {
    Provider {
        name: "p".into(),
        cluster: "c".into(),
        host: "h".into(),
        base_path: base_path.into(),
        api_key_env: None,
        drop_fields: Vec::new(),
        timeout_ms: 1,
        stream_timeout_ms: 1,
        breaker: BreakerConfig::default(),
        schema,
        retries: None,
        concurrency: None,
        upstream: None,
    }
}

fn anthropic_schema(drop_unsupported: bool) -> Schema {
    Schema::Anthropic {
        version: "2023-06-01".into(),
        options: Options {
            default_max_tokens: 1000,
            drop_unsupported,
        },
    }
}

/// A chat completion's body for a provider.
fn request_body_for(
    p: &Provider,
    c: &ChatRequest,
    model_id: &str,
    usage_chunk: bool,
) -> Result<Prepared, GatewayError> {
    request_body(p, Api::ChatCompletions, c, model_id, usage_chunk)
}

fn chat(v: Value) -> ChatRequest {
    ChatRequest::parse(&serde_json::to_vec(&v).unwrap()).unwrap()
}

#[test]
fn openai_is_the_identity_but_for_the_model_id_and_the_usage_request() {
    let p = provider("/v1/", Schema::OpenAi);
    assert_eq!(
        path(&p, Api::ChatCompletions, "m", false),
        "/v1/chat/completions"
    );
    let c =
        ChatRequest::parse(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#).unwrap();
    assert_eq!(
        request_body(&p, Api::ChatCompletions, &c, "m", true).unwrap(),
        Prepared::default()
    );
    let body = request_body(&p, Api::ChatCompletions, &c, "m-2024", false)
        .unwrap()
        .body
        .unwrap();
    assert_eq!(
        body,
        br#"{"model":"m-2024","messages":[{"role":"user","content":"x"}]}"#
    );
    let s =
        chat(json!({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": true}));
    let body = request_body(&p, Api::ChatCompletions, &s, "m", true)
        .unwrap()
        .body
        .unwrap();
    assert!(String::from_utf8(body)
        .unwrap()
        .contains(r#""include_usage":true"#));
    assert_eq!(
        credential(&p, "sk-1"),
        ("authorization", "Bearer sk-1".to_string())
    );
}

#[test]
fn azure_uses_deployments_api_version_and_api_key() {
    let p = provider(
        "",
        Schema::AzureOpenAi {
            api_version: "2024-10-21".into(),
        },
    );
    assert_eq!(
        path(&p, Api::ChatCompletions, "gpt 4o/mini", false),
        "/openai/deployments/gpt%204o%2Fmini/chat/completions?api-version=2024-10-21"
    );
    assert_eq!(credential(&p, "k"), ("api-key", "k".to_string()));
    assert!(extra_headers(&p).is_empty() && back(&p, Api::ChatCompletions).is_none());
}

/// Golden table: OpenAI requests and the Messages requests they become.
#[test]
fn requests_translate_to_messages() {
    let p = provider("/v1", anthropic_schema(false));
    assert_eq!(
        path(&p, Api::ChatCompletions, "claude", false),
        "/v1/messages"
    );
    assert_eq!(credential(&p, "k"), ("x-api-key", "k".to_string()));
    assert_eq!(
        extra_headers(&p),
        [("anthropic-version", "2023-06-01".to_string())]
    );
    let cases = [
        (
            json!({"model": "c", "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "developer", "content": [{"type": "text", "text": "no emoji"}]},
                {"role": "user", "content": "hi"}],
                "temperature": 0.5, "top_p": 0.9, "stop": "END", "user": "u1", "n": 1}),
            json!({"model": "claude-x", "system": "be brief\n\nno emoji",
                "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                "max_tokens": 1000, "temperature": 0.5, "top_p": 0.9, "stop_sequences": ["END"],
                "metadata": {"user_id": "u1"}}),
        ),
        (
            json!({"model": "c", "max_completion_tokens": 50, "stream": true, "stream_options": {"include_usage": true},
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                    {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}),
            json!({"model": "claude-x", "max_tokens": 50, "stream": true,
                "messages": [{"role": "user", "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"}},
                    {"type": "image", "source": {"type": "url", "url": "https://x/y.png"}}]}]}),
        ),
        (
            json!({"model": "c", "max_tokens": 10, "tool_choice": "required", "parallel_tool_calls": false,
                "tools": [{"type": "function", "function": {"name": "get", "description": "d", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}}}],
                "messages": [
                    {"role": "user", "content": "weather?"},
                    {"role": "assistant", "content": null, "tool_calls": [
                        {"id": "t1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":\"a\"}"}},
                        {"id": "t2", "type": "function", "function": {"name": "get", "arguments": "{\"q\":\"b\"}"}}]},
                    {"role": "tool", "tool_call_id": "t1", "content": "sun"},
                    {"role": "tool", "tool_call_id": "t2", "content": [{"type": "text", "text": "rain"}]}]}),
            json!({"model": "claude-x", "max_tokens": 10,
                "tools": [{"name": "get", "description": "d", "input_schema": {"type": "object", "properties": {"q": {"type": "string"}}}}],
                "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "weather?"}]},
                    {"role": "assistant", "content": [
                        {"type": "tool_use", "id": "t1", "name": "get", "input": {"q": "a"}},
                        {"type": "tool_use", "id": "t2", "name": "get", "input": {"q": "b"}}]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "t1", "content": "sun"},
                        {"type": "tool_result", "tool_use_id": "t2", "content": "rain"}]}]}),
        ),
    ];
    for (from, want) in cases {
        let got = request_body(
            &p,
            Api::ChatCompletions,
            &chat(from.clone()),
            "claude-x",
            false,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&got.body.unwrap()).unwrap();
        assert_eq!(v, want, "from {from}");
    }
    let c = chat(
        json!({"model": "c", "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "f"}}}),
    );
    let v: Value = serde_json::from_slice(
        &request_body(&p, Api::ChatCompletions, &c, "m", false)
            .unwrap()
            .body
            .unwrap(),
    )
    .unwrap();
    assert_eq!(v["tool_choice"], json!({"type": "tool", "name": "f"}));
}

#[test]
fn unsupported_fields_are_named_or_dropped_when_the_provider_says_so() {
    let c = chat(
        json!({"model": "c", "messages": [{"role": "user", "content": "x"}],
        "logprobs": true, "n": 2, "seed": 1, "response_format": {"type": "json_object"}}),
    );
    let err =
        request_body_for(&provider("/v1", anthropic_schema(false)), &c, "m", false).unwrap_err();
    assert_eq!(err.status, 400);
    for f in ["logprobs", "n", "seed", "response_format"] {
        assert!(err.message.contains(f), "{f} in {}", err.message);
    }
    let ok = request_body_for(&provider("/v1", anthropic_schema(true)), &c, "m", false).unwrap();
    assert_eq!(ok.dropped, ["logprobs", "n", "response_format", "seed"]);
    let harmless = chat(
        json!({"model": "c", "messages": [{"role": "user", "content": "x"}],
        "logprobs": false, "n": 1, "response_format": {"type": "text"}}),
    );
    assert!(request_body_for(
        &provider("/v1", anthropic_schema(false)),
        &harmless,
        "m",
        false
    )
    .is_ok());
}

/// Golden table: Messages answers and the chat completions they become.
#[test]
fn answers_translate_back() {
    let a = json!({"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x",
        "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"},
                    {"type": "tool_use", "id": "tu_1", "name": "get", "input": {"q": "a"}}],
        "stop_reason": "tool_use", "stop_sequence": null,
        "usage": {"input_tokens": 10, "output_tokens": 5, "cache_read_input_tokens": 100, "cache_creation_input_tokens": 20}});
    let out: Value =
        serde_json::from_slice(&anthropic::answer(&serde_json::to_vec(&a).unwrap(), 7).unwrap())
            .unwrap();
    assert_eq!(
        out,
        json!({"id": "msg_1", "object": "chat.completion", "created": 7, "model": "claude-x",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "logprobs": null, "message": {
            "role": "assistant", "content": "Hello there",
            "tool_calls": [{"id": "tu_1", "type": "function", "function": {"name": "get", "arguments": "{\"q\":\"a\"}"}}]}}],
        "usage": {"prompt_tokens": 130, "completion_tokens": 5, "total_tokens": 135,
            "prompt_tokens_details": {"cached_tokens": 100, "cache_creation_tokens": 20}}})
    );
    for (stop, finish) in [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("tool_use", "tool_calls"),
        ("refusal", "content_filter"),
    ] {
        assert_eq!(anthropic::finish_reason(stop), finish);
    }
    assert!(anthropic::answer(b"{\"content\": 1}", 0).is_none());
    let e: Value = serde_json::from_slice(&anthropic::error(
        br#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}"#,
        429,
    ))
    .unwrap();
    assert_eq!(
        e,
        json!({"error": {"message": "slow down", "type": "api_error", "code": "rate_limit_error", "param": null}})
    );
    let e: Value = serde_json::from_slice(&anthropic::error(b"<html>", 400)).unwrap();
    assert_eq!(e["error"]["type"], "invalid_request_error");
}

/// A recorded-shape Messages stream: text, then a tool call with its
/// arguments in two deltas, a ping, cumulative usage.
fn recorded_stream() -> String {
    let ev = |name: &str, v: Value| format!("event: {name}\ndata: {v}\n\n");
    [
        ev("message_start", json!({"type": "message_start", "message": {"id": "msg_1", "model": "claude-x", "usage": {"input_tokens": 12, "output_tokens": 1, "cache_read_input_tokens": 3}}})),
        ev("content_block_start", json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})),
        ev("ping", json!({"type": "ping"})),
        ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "Héllo"}})),
        ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": " world"}})),
        ev("content_block_stop", json!({"type": "content_block_stop", "index": 0})),
        ev("content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "tu_1", "name": "get", "input": {}}})),
        ev("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "{\"q\":"}})),
        ev("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": "\"a\"}"}})),
        ev("content_block_stop", json!({"type": "content_block_stop", "index": 1})),
        ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}})),
        ev("message_stop", json!({"type": "message_stop"})),
    ]
    .concat()
}

fn chunks(out: &[u8]) -> Vec<Value> {
    String::from_utf8(out.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(|d| {
            if d == "[DONE]" {
                json!("[DONE]")
            } else {
                serde_json::from_str(d).unwrap()
            }
        })
        .collect()
}

#[test]
fn a_stream_translates_to_chunks_the_same_at_every_split() {
    let stream = recorded_stream();
    let whole = {
        let mut s = Stream::new(5, true);
        let mut out = s.push(stream.as_bytes());
        out.extend(s.finish());
        out
    };
    let c = chunks(&whole);
    assert_eq!(
        c[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(c[1]["choices"][0]["delta"], json!({"content": "Héllo"}));
    assert_eq!(c[2]["choices"][0]["delta"], json!({"content": " world"}));
    assert_eq!(
        c[3]["choices"][0]["delta"]["tool_calls"][0],
        json!({"index": 0, "id": "tu_1", "type": "function", "function": {"name": "get", "arguments": ""}})
    );
    assert_eq!(
        c[4]["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"],
        "{\"q\":"
    );
    assert_eq!(c[5]["choices"][0]["delta"]["tool_calls"][0]["index"], 0);
    assert_eq!(c[6]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(c[7]["choices"], json!([]));
    assert_eq!(c[7]["usage"]["prompt_tokens"], 15, "input and cache reads");
    assert_eq!(
        c[7]["usage"]["completion_tokens"], 9,
        "cumulative: set, not added"
    );
    assert_eq!(c[8], json!("[DONE]"));
    assert_eq!(c.len(), 9);
    assert!(c[..7].iter().all(|x| x["id"] == "msg_1"
        && x["object"] == "chat.completion.chunk"
        && x["created"] == 5));
    for split in 1..stream.len() {
        let mut s = Stream::new(5, true);
        let (a, b) = stream.as_bytes().split_at(split);
        let mut out = s.push(a);
        out.extend(s.push(b));
        out.extend(s.finish());
        assert_eq!(out, whole, "split at {split}");
    }
    let mut s = Stream::new(5, false);
    let no_usage = chunks(&s.push(stream.as_bytes()));
    assert_eq!(no_usage.len(), 8, "no usage chunk unless asked");
}

#[test]
fn malformed_streams_end_cleanly_or_with_an_error() {
    // An error event mid-stream: an OpenAI error event, nothing after.
    let mut s = Stream::new(1, true);
    let out = s.push(b"data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\ndata: {\"type\":\"message_stop\"}\n\n");
    let c = chunks(&out);
    assert_eq!(c.last().unwrap()["error"]["code"], "overloaded_error");
    assert!(s.finish().is_empty());
    // Truncated JSON and unknown events are skipped; a cut stream ends with
    // an error event.
    let mut s = Stream::new(1, true);
    let mut out = s.push(b"data: {\"type\":\"message_st\n\nevent: future\ndata: {\"type\":\"brand_new\"}\n\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"a\"}}\n\n");
    out.extend(s.finish());
    let c = chunks(&out);
    assert_eq!(c[0]["choices"][0]["delta"]["content"], "a");
    assert_eq!(c[1]["error"]["code"], "provider_stream_error");
}

#[test]
fn embeddings_reach_openai_shaped_providers_only_at_their_endpoint() {
    let p = provider("/v1", Schema::OpenAi);
    assert_eq!(path(&p, Api::Embeddings, "e", false), "/v1/embeddings");
    let az = provider(
        "",
        Schema::AzureOpenAi {
            api_version: "2024-10-21".into(),
        },
    );
    assert_eq!(
        path(&az, Api::Embeddings, "text embed", false),
        "/openai/deployments/text%20embed/embeddings?api-version=2024-10-21"
    );
    let a = provider("/v1", anthropic_schema(false));
    assert!(serves(&p, Api::Embeddings) && serves(&az, Api::Embeddings));
    assert!(!serves(&a, Api::Embeddings));
    assert!(serves(&p, Api::Messages) && serves(&a, Api::Messages));
    assert!(back(&a, Api::ChatCompletions).is_some() && back(&a, Api::Messages).is_none());
    // Messages reach OpenAI-shaped providers through the pivot: asked at
    // their chat endpoint, answered back in Anthropic's shape.
    assert!(back(&p, Api::Messages).is_some() && back(&az, Api::Messages).is_some());
    assert_eq!(path(&p, Api::Messages, "g", false), "/v1/chat/completions");
    assert_eq!(
        path(&az, Api::Messages, "g", false),
        "/openai/deployments/g/chat/completions?api-version=2024-10-21"
    );
}

#[test]
fn drop_fields_leave_out_what_the_service_refuses_and_say_which() {
    let mut p = provider("/v1", Schema::OpenAi);
    p.drop_fields = vec!["stream_options".into(), "logit_bias".into()];
    let msgs = json!([{"role": "user", "content": "x"}]);
    // A stream whose client asked for usage: both fields out, reported, and
    // the gateway does not ask for the usage chunk itself.
    let s = chat(json!({"model": "m", "messages": msgs, "stream": true,
        "stream_options": {"include_usage": true}, "logit_bias": {"1": 2}}));
    let out = request_body(&p, Api::ChatCompletions, &s, "m-2", true).unwrap();
    let body: Value = serde_json::from_slice(&out.body.unwrap()).unwrap();
    assert_eq!(
        body,
        json!({"model": "m-2", "messages": msgs, "stream": true})
    );
    assert_eq!(out.dropped, ["stream_options", "logit_bias"]);
    // A stream that asked nothing: nothing added, nothing dropped.
    let s = chat(json!({"model": "m", "messages": msgs, "stream": true}));
    let out = request_body(&p, Api::ChatCompletions, &s, "m", true).unwrap();
    assert_eq!(out.body, None, "the client's bytes as they are, not copied");
    assert!(out.dropped.is_empty());
    // A field's name inside a message is not the field.
    let c =
        chat(json!({"model": "m", "messages": [{"role": "user", "content": "\"logit_bias\"?"}]}));
    let out = request_body(&p, Api::ChatCompletions, &c, "m", true).unwrap();
    assert_eq!(out.body, None, "the client's bytes as they are, not copied");
    assert!(out.dropped.is_empty());
    // Messages through the pivot: the pivot's own stream_options out, not
    // reported as the client's.
    let m = ChatRequest::parse_for(
        Api::Messages,
        br#"{"model":"m","max_tokens":10,"stream":true,"messages":[{"role":"user","content":"x"}]}"#,
    )
    .unwrap();
    let out = request_body(&p, Api::Messages, &m, "m", true).unwrap();
    let body: Value = serde_json::from_slice(&out.body.unwrap()).unwrap();
    assert_eq!(body.get("stream_options"), None);
    assert_eq!(body["stream"], true);
    assert!(out.dropped.is_empty(), "{:?}", out.dropped);
    // Without drop_fields the gateway asks for the usage chunk as before.
    p.drop_fields.clear();
    let out = request_body(&p, Api::Messages, &m, "m", true).unwrap();
    let body: Value = serde_json::from_slice(&out.body.unwrap()).unwrap();
    assert_eq!(body["stream_options"], json!({"include_usage": true}));
}

#[test]
fn each_format_says_how_its_requests_are_authorized() {
    use crate::providers::{auth, token_answer, Auth};
    for schema in [
        Schema::OpenAi,
        Schema::AzureOpenAi {
            api_version: "v".into(),
        },
        anthropic_schema(false),
        Schema::Gemini {
            drop_unsupported: false,
        },
    ] {
        assert_eq!(auth(&provider("", schema)), Auth::Key);
    }
    let bedrock = provider(
        "",
        Schema::Bedrock {
            region: "eu-west-3".into(),
            env_prefix: "EU_".into(),
            drop_unsupported: false,
        },
    );
    assert_eq!(
        auth(&bedrock),
        Auth::SigV4 {
            env_prefix: "EU_",
            scope: crate::credentials::sigv4::Scope {
                region: "eu-west-3",
                service: "bedrock",
            },
        }
    );
    let source = crate::config::TokenSource {
        cluster: "metadata".into(),
        host: "metadata.google.internal".into(),
        path: "/token".into(),
        timeout_ms: 100,
    };
    let vertex = provider(
        "",
        Schema::Vertex {
            project: "p".into(),
            region: "global".into(),
            publisher: crate::config::Publisher::Google,
            token: source.clone(),
            options: Options {
                default_max_tokens: 1,
                drop_unsupported: false,
            },
        },
    );
    assert_eq!(auth(&vertex), Auth::Token(&source));
    assert_eq!(
        token_answer(br#"{"access_token":"ya29.x","expires_in":3599,"token_type":"Bearer"}"#),
        Some(("ya29.x".to_string(), 3599))
    );
    assert_eq!(token_answer(b"{}"), None);
}
