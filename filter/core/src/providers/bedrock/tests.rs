use super::*;
use crate::wire::eventstream::encode;
use serde_json::{json, Value};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn translate(req: Value) -> Value {
    let (body, dropped) = request(req.to_string().as_bytes(), false).unwrap();
    assert!(dropped.is_empty());
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn a_chat_request_becomes_a_converse_request() {
    let got = translate(json!({
        "model": "claude", "max_tokens": 100, "temperature": 0.5, "top_p": 0.9, "stop": "END",
        "stream": true, "stream_options": {"include_usage": true}, "user": "u1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "developer", "content": [{"type": "text", "text": "Use tools."}]},
            {"role": "user", "content": [
                {"type": "text", "text": "What is in this image, and the weather?"},
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}]},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "tooluse_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}},
                {"id": "tooluse_2", "type": "function", "function": {"name": "weather", "arguments": ""}}]},
            {"role": "tool", "tool_call_id": "tooluse_1", "content": "{\"temp\": 21}"},
            {"role": "tool", "tool_call_id": "tooluse_2", "content": "sunny"},
            {"role": "user", "content": "Thanks"}
        ],
        "tools": [
            {"type": "function", "function": {"name": "weather", "description": "Weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}},
            {"type": "function", "function": {"name": "time"}}],
        "tool_choice": "required"
    }));
    assert_eq!(
        got,
        json!({
            "messages": [
                {"role": "user", "content": [
                    {"text": "What is in this image, and the weather?"},
                    {"image": {"format": "png", "source": {"bytes": "iVBORw0KGgo="}}}]},
                {"role": "assistant", "content": [
                    {"toolUse": {"toolUseId": "tooluse_1", "name": "weather", "input": {"city": "Paris"}}},
                    {"toolUse": {"toolUseId": "tooluse_2", "name": "weather", "input": {}}}]},
                {"role": "user", "content": [
                    {"toolResult": {"toolUseId": "tooluse_1", "content": [{"json": {"temp": 21}}]}},
                    {"toolResult": {"toolUseId": "tooluse_2", "content": [{"text": "sunny"}]}},
                    {"text": "Thanks"}]}
            ],
            "system": [{"text": "Be brief."}, {"text": "Use tools."}],
            "inferenceConfig": {"maxTokens": 100, "temperature": 0.5, "topP": 0.9, "stopSequences": ["END"]},
            "toolConfig": {
                "tools": [
                    {"toolSpec": {"name": "weather", "description": "Weather",
                        "inputSchema": {"json": {"type": "object", "properties": {"city": {"type": "string"}}}}}},
                    {"toolSpec": {"name": "time", "inputSchema": {"json": {"type": "object", "properties": {}}}}}],
                "toolChoice": {"any": {}}
            }
        })
    );
}

#[test]
fn tool_choices_translate_and_none_leaves_the_tools_out() {
    let tools =
        json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]);
    let with = |choice: Value| {
        translate(
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": tools, "tool_choice": choice}),
        )
    };
    assert_eq!(
        with(json!("auto"))["toolConfig"]["toolChoice"],
        json!({"auto": {}})
    );
    assert_eq!(
        with(json!({"type": "function", "function": {"name": "f"}}))["toolConfig"]["toolChoice"],
        json!({"tool": {"name": "f"}})
    );
    assert!(with(json!("none")).get("toolConfig").is_none());
    // With tool blocks in the conversation, the tools stay, unforced.
    let got = translate(
        json!({"model": "m", "tools": tools, "tool_choice": "none", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "ok"}]}),
    );
    assert!(got["toolConfig"]["tools"].is_array());
    assert!(got["toolConfig"].get("toolChoice").is_none());
}

#[test]
fn what_converse_cannot_honour_is_refused_or_dropped() {
    let req = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "seed": 1, "n": 2, "response_format": {"type": "json_object"}, "logprobs": false});
    let e = request(req.to_string().as_bytes(), false).unwrap_err();
    assert_eq!(e.status, 400);
    assert!(
        e.message.contains("n, response_format, seed"),
        "{}",
        e.message
    );
    let (body, dropped) = request(req.to_string().as_bytes(), true).unwrap();
    assert_eq!(dropped, ["n", "response_format", "seed"]);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body,
        json!({"messages": [{"role": "user", "content": [{"text": "hi"}]}]})
    );
    // An image by URL, a tool history without tools, only a system message.
    for (bad, says) in [
        (
            json!([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]),
            "inline only",
        ),
        (
            json!([{"role": "user", "content": "a"}, {"role": "assistant", "tool_calls": [{"id": "t", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]),
            "`tools` declared",
        ),
        (
            json!([{"role": "system", "content": "a"}]),
            "at least one user",
        ),
    ] {
        let e = request(
            json!({"model": "m", "messages": bad})
                .to_string()
                .as_bytes(),
            false,
        )
        .unwrap_err();
        assert!(e.message.contains(says), "{}", e.message);
    }
}

#[test]
fn a_whole_answer_becomes_a_chat_completion() {
    let body = json!({
        "output": {"message": {"role": "assistant", "content": [
            {"reasoningContent": {"reasoningText": {"text": "thinking", "signature": "s"}}},
            {"text": "Let me check."},
            {"toolUse": {"toolUseId": "tooluse_abc", "name": "weather", "input": {"city": "Paris"}}}]}},
        "stopReason": "tool_use",
        "usage": {"inputTokens": 10, "outputTokens": 5, "totalTokens": 35, "cacheReadInputTokens": 20, "cacheWriteInputTokens": 0},
        "metrics": {"latencyMs": 100}
    });
    let out: Value = serde_json::from_slice(
        &answer(body.to_string().as_bytes(), 1_700_000_000, "claude").unwrap(),
    )
    .unwrap();
    assert!(out["id"].as_str().unwrap().starts_with("chatcmpl-bedrock-"));
    assert_eq!(out["model"], "claude");
    assert_eq!(out["object"], "chat.completion");
    let choice = &out["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls");
    assert_eq!(choice["message"]["content"], "Let me check.");
    assert_eq!(
        choice["message"]["tool_calls"],
        json!([{"id": "tooluse_abc", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Paris\"}"}}])
    );
    assert_eq!(out["usage"]["prompt_tokens"], 30);
    assert_eq!(out["usage"]["completion_tokens"], 5);
    assert_eq!(out["usage"]["prompt_tokens_details"]["cached_tokens"], 20);
    for (reason, finish) in [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("stop_sequence", "stop"),
        ("guardrail_intervened", "content_filter"),
    ] {
        let b = json!({"output": {"message": {"content": [{"text": "x"}]}}, "stopReason": reason});
        let out: Value =
            serde_json::from_slice(&answer(b.to_string().as_bytes(), 1, "m").unwrap()).unwrap();
        assert_eq!(out["choices"][0]["finish_reason"], finish, "{reason}");
    }
    assert!(answer(b"not json", 1, "m").is_none());
    assert!(answer(b"{}", 1, "m").is_none(), "no output message");
}

#[test]
fn errors_take_openai_shape() {
    let out: Value =
        serde_json::from_slice(&error(br#"{"message":"Malformed input request"}"#, 400)).unwrap();
    assert_eq!(
        out,
        json!({"error": {"message": "Malformed input request", "type": "invalid_request_error", "code": "ValidationException", "param": null}})
    );
    let out: Value = serde_json::from_slice(&error(b"<html>", 503)).unwrap();
    assert_eq!(out["error"]["code"], "ServiceUnavailableException");
    assert_eq!(out["error"]["type"], "api_error");
}

fn event(kind: &str, payload: Value) -> Vec<u8> {
    encode(
        &[
            (":event-type", kind),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

fn recorded() -> Vec<u8> {
    let mut s = Vec::new();
    s.extend(event(
        "messageStart",
        json!({"role": "assistant", "p": "abc"}),
    ));
    s.extend(event(
        "contentBlockDelta",
        json!({"contentBlockIndex": 0, "delta": {"text": "Hel"}}),
    ));
    s.extend(event(
        "contentBlockDelta",
        json!({"contentBlockIndex": 0, "delta": {"text": "lo"}}),
    ));
    s.extend(event("contentBlockStop", json!({"contentBlockIndex": 0})));
    s.extend(event("contentBlockStart", json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": "tooluse_x", "name": "weather"}}})));
    s.extend(event(
        "contentBlockDelta",
        json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "{\"city\":"}}}),
    ));
    s.extend(event(
        "contentBlockDelta",
        json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": "\"Paris\"}"}}}),
    ));
    s.extend(event("contentBlockStop", json!({"contentBlockIndex": 1})));
    s.extend(event("messageStop", json!({"stopReason": "tool_use"})));
    s.extend(event("metadata", json!({"usage": {"inputTokens": 12, "outputTokens": 7, "totalTokens": 19}, "metrics": {"latencyMs": 5}})));
    s
}

fn data_events(out: &[u8]) -> Vec<String> {
    String::from_utf8(out.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_stream_becomes_chat_chunks_at_every_split_point() {
    let bytes = recorded();
    let whole = {
        let mut s = Stream::new(7, true, "claude");
        let mut out = s.push(&bytes);
        out.extend(s.finish());
        out
    };
    let events = data_events(&whole);
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect();
    assert_eq!(
        chunks[0]["choices"][0]["delta"],
        json!({"role": "assistant", "content": ""})
    );
    assert_eq!(chunks[0]["model"], "claude");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    assert_eq!(text, "Hello");
    let args: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"].as_str())
        .collect();
    assert_eq!(args, "{\"city\":\"Paris\"}");
    let first_call = chunks
        .iter()
        .find(|c| c["choices"][0]["delta"]["tool_calls"].is_array())
        .unwrap();
    assert_eq!(
        first_call["choices"][0]["delta"]["tool_calls"][0],
        json!({"index": 0, "id": "tooluse_x", "type": "function", "function": {"name": "weather", "arguments": ""}})
    );
    let finish: Vec<&str> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["finish_reason"].as_str())
        .collect();
    assert_eq!(finish, ["tool_calls"]);
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        (
            usage["prompt_tokens"].as_u64(),
            usage["completion_tokens"].as_u64()
        ),
        (Some(12), Some(7))
    );
    for at in 0..=bytes.len() {
        let mut s = Stream::new(7, true, "claude");
        let mut out = s.push(&bytes[..at]);
        out.extend(s.push(&bytes[at..]));
        out.extend(s.finish());
        assert_eq!(out, whole, "split at {at}");
    }
    // Without the usage asked, no usage chunk.
    let mut s = Stream::new(7, false, "claude");
    let mut out = s.push(&bytes);
    out.extend(s.finish());
    assert!(!String::from_utf8(out).unwrap().contains("\"usage\""));
}

#[test]
fn a_bad_frame_an_exception_or_an_early_end_ends_with_an_error_event() {
    let mut bytes = recorded();
    bytes[30] ^= 0x40;
    let mut s = Stream::new(1, true, "m");
    let mut out = s.push(&bytes);
    out.extend(s.finish());
    let events = data_events(&out);
    assert_eq!(events.len(), 1, "{events:?}");
    let e: Value = serde_json::from_str(&events[0]).unwrap();
    assert!(
        e["error"]["message"].as_str().unwrap().contains("CRC"),
        "{e}"
    );

    let mut bytes = event("messageStart", json!({"role": "assistant"}));
    bytes.extend(encode(
        &[
            (":exception-type", "throttlingException"),
            (":content-type", "application/json"),
            (":message-type", "exception"),
        ],
        br#"{"message":"Too many requests"}"#,
    ));
    let mut s = Stream::new(1, true, "m");
    let mut out = s.push(&bytes);
    out.extend(s.finish());
    let events = data_events(&out);
    let e: Value = serde_json::from_str(events.last().unwrap()).unwrap();
    assert_eq!(e["error"]["code"], "ThrottlingException");
    assert_eq!(e["error"]["message"], "Too many requests");
    assert!(!events.iter().any(|e| e == "[DONE]"));

    // Cut before messageStop, or mid-frame.
    let bytes = recorded();
    for cut in [bytes.len() / 2, bytes.len() - 3] {
        let mut s = Stream::new(1, true, "m");
        let mut out = s.push(&bytes[..cut]);
        out.extend(s.finish());
        let last = data_events(&out).pop().unwrap();
        assert!(last.contains("provider_stream_error"), "{last}");
    }
}
