use super::*;
use serde_json::{json, Value};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn translate(v: Value, drop: bool) -> Result<(Value, Vec<String>), GatewayError> {
    request(&serde_json::to_vec(&v).unwrap(), drop)
        .map(|(b, d)| (serde_json::from_slice(&b).unwrap(), d))
}

#[test]
fn a_chat_request_becomes_generate_content() {
    let (g, _) = translate(
        json!({"model": "m", "max_completion_tokens": 30, "top_p": 0.9, "seed": 7, "stop": ["A", "B"],
        "response_format": {"type": "json_schema", "json_schema": {"name": "r", "schema": {"type": "object"}}},
        "tool_choice": {"type": "function", "function": {"name": "f"}},
        "tools": [{"type": "function", "function": {"name": "f"}}],
        "messages": [
            {"role": "developer", "content": "One."},
            {"role": "system", "content": [{"type": "text", "text": "Two."}]},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Calling.", "tool_calls": [
                {"id": "a", "type": "function", "function": {"name": "f", "arguments": ""}},
                {"id": "b", "type": "function", "function": {"name": "g", "arguments": "{\"x\": 1}"}}]},
            {"role": "tool", "tool_call_id": "b", "content": "{\"ok\": true}"},
            {"role": "tool", "tool_call_id": "a", "content": "plain"}]}),
        false,
    )
    .unwrap();
    assert_eq!(
        g,
        json!({
            "systemInstruction": {"parts": [{"text": "One.\n\nTwo."}]},
            "contents": [
                {"role": "user", "parts": [{"text": "Hi"}]},
                {"role": "model", "parts": [{"text": "Calling."}, {"functionCall": {"name": "f", "args": {}}}, {"functionCall": {"name": "g", "args": {"x": 1}}}]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "g", "response": {"ok": true}}},
                    {"functionResponse": {"name": "f", "response": {"content": "plain"}}}]}],
            "tools": [{"functionDeclarations": [{"name": "f"}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["f"]}},
            "generationConfig": {"maxOutputTokens": 30, "topP": 0.9, "seed": 7, "stopSequences": ["A", "B"],
                "responseMimeType": "application/json", "responseJsonSchema": {"type": "object"}}})
    );
    let (plain, _) = translate(
        json!({"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
        false,
    )
    .unwrap();
    assert_eq!(
        plain,
        json!({"contents": [{"role": "user", "parts": [{"text": "Hi"}]}]}),
        "no generationConfig when nothing sets one"
    );
}

#[test]
fn what_gemini_cannot_take_is_refused_naming_it_or_dropped() {
    let e = translate(
        json!({"model": "m", "logprobs": true, "n": 2, "messages": [{"role": "user", "content": "Hi"}]}),
        false,
    )
    .unwrap_err();
    assert_eq!(e.status, 400);
    assert!(
        e.message.contains("logprobs, n") && e.message.contains("drop_unsupported"),
        "{}",
        e.message
    );
    let (_, dropped) = translate(
        json!({"model": "m", "logprobs": true, "n": 1, "messages": [{"role": "user", "content": "Hi"}]}),
        true,
    )
    .unwrap();
    assert_eq!(dropped, ["logprobs"]);
    for (body, says) in [
        (
            json!({"model": "m", "messages": [{"role": "tool", "tool_call_id": "zz", "content": "x"}]}),
            "answers no earlier tool call",
        ),
        (
            json!({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}]}),
            "inline only",
        ),
        (
            json!({"model": "m", "messages": [{"role": "assistant", "tool_calls": [{"id": "a", "function": {"name": "f", "arguments": "[1]"}}]}]}),
            "not a JSON object",
        ),
        (
            json!({"model": "m", "response_format": {"type": "xml"}, "messages": [{"role": "user", "content": "Hi"}]}),
            "xml",
        ),
        (
            json!({"model": "m", "tool_choice": "sometimes", "messages": [{"role": "user", "content": "Hi"}]}),
            "sometimes",
        ),
        (
            json!({"model": "m", "messages": [{"role": "critic", "content": "Hi"}]}),
            "critic",
        ),
        (
            json!({"model": "m", "messages": [{"role": "system", "content": "Only this."}]}),
            "at least one user or assistant message",
        ),
    ] {
        let e = translate(body, false).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains(says), "{}", e.message);
    }
}

#[test]
fn an_answer_becomes_a_chat_completion() {
    let a = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"text": "hidden", "thought": true}, {"text": "Hel"}, {"text": "lo"}]},
        "finishReason": "MAX_TOKENS"}],
        "usageMetadata": {"promptTokenCount": 10, "candidatesTokenCount": 4, "thoughtsTokenCount": 2, "cachedContentTokenCount": 6},
        "modelVersion": "gemini-x", "responseId": "r9"});
    let c: Value =
        serde_json::from_slice(&answer(&serde_json::to_vec(&a).unwrap(), 5).unwrap()).unwrap();
    assert_eq!(
        c,
        json!({"id": "chatcmpl-r9", "object": "chat.completion", "created": 5, "model": "gemini-x",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "Hello"}, "finish_reason": "length", "logprobs": null}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 6, "total_tokens": 16,
                "prompt_tokens_details": {"cached_tokens": 6}, "completion_tokens_details": {"reasoning_tokens": 2}}})
    );
    let blocked = br#"{"promptFeedback": {"blockReason": "SAFETY"}, "usageMetadata": {"promptTokenCount": 3}}"#;
    let c: Value = serde_json::from_slice(&answer(blocked, 5).unwrap()).unwrap();
    assert_eq!(c["choices"][0]["finish_reason"], "content_filter");
    assert_eq!(c["choices"][0]["message"]["content"], "");
    assert!(answer(b"{\"candidates\": 1}", 0).is_none());
    assert!(answer(b"not json", 0).is_none());
}

#[test]
fn errors_become_openai_errors_whole_or_listed() {
    for body in [
        &br#"{"error": {"code": 400, "message": "Bad schema", "status": "INVALID_ARGUMENT"}}"#[..],
        br#"[{"error": {"code": 400, "message": "Bad schema", "status": "INVALID_ARGUMENT"}}]"#,
    ] {
        let e: Value = serde_json::from_slice(&error(body, 400)).unwrap();
        assert_eq!(
            e,
            json!({"error": {"message": "Bad schema", "type": "invalid_request_error", "code": "INVALID_ARGUMENT", "param": null}})
        );
    }
    let e: Value = serde_json::from_slice(&error(b"<html>", 503)).unwrap();
    assert_eq!(e["error"]["message"], "The provider answered 503.");
    assert_eq!(e["error"]["type"], "api_error");
}

fn sse(events: &[Value]) -> String {
    events
        .iter()
        .map(|e| format!("data: {e}\r\n\r\n"))
        .collect()
}

fn run(stream: &str, split: usize, usage: bool) -> String {
    let mut s = Stream::new(1, usage);
    let bytes = stream.as_bytes();
    let (a, b) = bytes.split_at(split.min(bytes.len()));
    let mut out = s.push(a);
    out.extend(s.push(b));
    out.extend(s.finish());
    String::from_utf8(out).unwrap()
}

#[test]
fn a_stream_translates_the_same_split_at_any_byte() {
    let stream = sse(&[
        json!({"candidates": [{"content": {"parts": [{"text": "Hé"}]}}], "modelVersion": "g", "responseId": "r"}),
        json!({"candidates": [{"content": {"parts": [{"text": "thinking", "thought": true}, {"text": "llo"}]}}]}),
        json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": {"a": 1}}}]}, "finishReason": "STOP"}],
            "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 3, "totalTokenCount": 8}}),
    ]);
    let whole = run(&stream, 0, true);
    let events: Vec<Value> = whole
        .split("\n\n")
        .filter(|e| !e.is_empty() && *e != "data: [DONE]")
        .map(|e| serde_json::from_str(e.trim_start_matches("data: ")).unwrap())
        .collect();
    let deltas: Vec<&Value> = events
        .iter()
        .filter_map(|e| e["choices"].get(0).map(|c| &c["delta"]))
        .collect();
    assert_eq!(deltas[0], &json!({"role": "assistant", "content": ""}));
    assert_eq!(deltas[1], &json!({"content": "Hé"}));
    assert_eq!(deltas[2], &json!({"content": "llo"}));
    assert_eq!(
        deltas[3]["tool_calls"][0],
        json!({"index": 0, "id": "call_r_0", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}})
    );
    assert_eq!(events[4]["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(events[5]["usage"]["total_tokens"], 8);
    assert_eq!(events[5]["id"], "chatcmpl-r");
    assert_eq!(events[5]["model"], "g");
    assert!(whole.ends_with("data: [DONE]\n\n"));
    for split in 1..stream.len() {
        assert_eq!(run(&stream, split, true), whole, "split at {split}");
    }
    assert!(
        !run(&stream, 0, false).contains("\"usage\""),
        "no usage chunk unless asked"
    );
}

#[test]
fn a_stream_that_stops_short_or_fails_ends_with_an_error_event() {
    let cut = sse(&[json!({"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]})]);
    let out = run(&cut, 0, false);
    assert!(
        out.contains("no finishReason") && !out.contains("[DONE]"),
        "{out}"
    );
    let failed = format!(
        "{}{}",
        sse(&[json!({"candidates": [{"content": {"parts": [{"text": "Hi"}]}}]})]),
        sse(&[json!({"error": {"code": 503, "message": "Overloaded", "status": "UNAVAILABLE"}})])
    );
    let out = run(&failed, 0, false);
    assert!(
        out.contains("\"message\":\"Overloaded\"") && out.contains("\"code\":\"UNAVAILABLE\""),
        "{out}"
    );
    assert!(
        !out.contains("no finishReason"),
        "one error, not two: {out}"
    );
}

#[test]
fn a_calls_thought_signature_rides_in_its_id_and_goes_back_on_its_part() {
    let a = json!({"candidates": [{"content": {"role": "model", "parts": [
            {"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2lnLzE+PQ=="},
            {"functionCall": {"name": "g", "args": {}}}]},
        "finishReason": "STOP"}], "responseId": "r"});
    let c: Value =
        serde_json::from_slice(&answer(&serde_json::to_vec(&a).unwrap(), 1).unwrap()).unwrap();
    let calls = &c["choices"][0]["message"]["tool_calls"];
    assert_eq!(calls[0]["id"], "call_r_0~ts~c2lnLzE+PQ==");
    assert_eq!(calls[1]["id"], "call_r_1", "a call without a signature");
    let stream = sse(std::slice::from_ref(&a));
    let out = run(&stream, 0, false);
    assert!(out.contains("\"id\":\"call_r_0~ts~c2lnLzE+PQ==\""), "{out}");
    // The client sends the calls back as they came, with their results.
    let (g, _) = translate(
        json!({"model": "m", "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "tool_calls": [
                {"id": calls[0]["id"], "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}},
                {"id": calls[1]["id"], "type": "function", "function": {"name": "g", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": "one"},
            {"role": "tool", "tool_call_id": calls[1]["id"], "content": "two"}]}),
        false,
    )
    .unwrap();
    assert_eq!(
        g["contents"][1],
        json!({"role": "model", "parts": [
            {"functionCall": {"name": "f", "args": {"a": 1}}, "thoughtSignature": "c2lnLzE+PQ=="},
            {"functionCall": {"name": "g", "args": {}}}]})
    );
    assert_eq!(
        g["contents"][2]["parts"][0]["functionResponse"]["name"],
        "f"
    );
    assert_eq!(
        g["contents"][2]["parts"][1]["functionResponse"]["name"],
        "g"
    );
}
