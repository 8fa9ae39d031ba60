//! Anthropic's Messages API, `POST /v1/messages`: the key may come in
//! `x-api-key`; the body needs `model` and a non-empty `messages`; errors
//! are Anthropic's `{"type":"error","error":{...}}`.
//!
//! Anthropic providers get the client's body as it is (the model id spliced
//! in); their streams pass through, read only for their usage. Every other
//! provider is reached through the pivot: the request is translated to a
//! chat completion ([`to_chat`]) and the answer back ([`answer_from_chat`],
//! [`error_from_chat`], [`FromChatStream`] for streams, event by event).

use crate::error::GatewayError;
use serde_json::{json, Value};

pub const PATH: &str = "/v1/messages";

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_error", message)
}

/// Chat's `finish_reason` as Anthropic's `stop_reason`.
pub fn stop_reason(finish: &str) -> &'static str {
    match finish {
        "length" => "max_tokens",
        "tool_calls" | "function_call" => "tool_use",
        "content_filter" => "refusal",
        _ => "end_turn",
    }
}

/// Anthropic's usage from chat's: input tokens without the cached ones,
/// which are cache reads.
pub(super) fn usage(u: Option<&Value>) -> Value {
    let n = |p: &str| {
        u.and_then(|u| u.pointer(p))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let usage = crate::wire::anthropic::AnthropicUsage::new(
        n("/prompt_tokens"),
        n("/completion_tokens"),
        n("/prompt_tokens_details/cached_tokens"),
    );
    serde_json::to_value(usage).unwrap_or(Value::Null)
}

/// `msg_` and the chat completion's id.
pub(super) fn message_id(id: Option<&str>) -> String {
    format!("msg_{}", id.unwrap_or("gateway"))
}

/// Anthropic's error type for a status.
pub fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        _ => "api_error",
    }
}

/// A chat provider's error body in Anthropic's shape (same status).
pub fn error_from_chat(body: &[u8], status: u16) -> Vec<u8> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map_or_else(|| format!("The provider answered {status}."), String::from);
    serde_json::to_vec(
        &json!({"type": "error", "error": {"type": error_type(status), "message": message}}),
    )
    .unwrap_or_default()
}

mod body;
mod stream;
pub use body::{answer_from_chat, to_chat};
pub use stream::FromChatStream;

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chat_of(v: Value) -> Value {
        let (body, _) = to_chat(&serde_json::to_vec(&v).unwrap(), "gpt-x").unwrap();
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn a_messages_request_becomes_a_chat_completion() {
        let c = chat_of(
            json!({"model": "claude", "max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}],
            "stop_sequences": ["END"], "temperature": 0.5, "metadata": {"user_id": "u1"},
            "tools": [{"name": "get_weather", "description": "w", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "AAA"}}]},
                {"role": "assistant", "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}, {"type": "text", "text": "thanks"}]}]}),
        );
        assert_eq!(
            c,
            json!({"model": "gpt-x", "max_tokens": 50, "temperature": 0.5, "stop": ["END"], "user": "u1",
            "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": {"type": "object"}}}],
            "tool_choice": "required", "parallel_tool_calls": false,
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAA"}}]},
                {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
                {"role": "user", "content": "thanks"}]})
        );
        let s = chat_of(
            json!({"model": "c", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(s["stream_options"], json!({"include_usage": true}));
    }

    #[test]
    fn fields_without_an_equivalent_are_dropped_or_refused() {
        let (_, dropped) = to_chat(
            &serde_json::to_vec(
                &json!({"model": "c", "max_tokens": 5, "top_k": 3, "thinking": {"type": "enabled"},
            "messages": [{"role": "user", "content": "hi"}]}),
            )
            .unwrap(),
            "m",
        )
        .unwrap();
        assert_eq!(dropped, ["thinking", "top_k"]);
        let e = to_chat(&serde_json::to_vec(&json!({"model": "c", "max_tokens": 5, "mcp_servers": [], "messages": [{"role": "user", "content": "hi"}]})).unwrap(), "m").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("mcp_servers"), "{}", e.message);
        let e = to_chat(&serde_json::to_vec(&json!({"model": "c", "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "messages": [{"role": "user", "content": "hi"}]})).unwrap(), "m").unwrap_err();
        assert!(e.message.contains("server tool"), "{}", e.message);
    }

    #[test]
    fn a_chat_answer_becomes_a_message() {
        let a = br#"{"id":"c1","object":"chat.completion","model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Checking.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":20,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":5}}}"#;
        let m: Value = serde_json::from_slice(&answer_from_chat(a).unwrap()).unwrap();
        assert_eq!(
            m,
            json!({"id": "msg_c1", "type": "message", "role": "assistant", "model": "gpt-x",
            "content": [{"type": "text", "text": "Checking."}, {"type": "tool_use", "id": "call_1", "name": "f", "input": {"a": 1}}],
            "stop_reason": "tool_use", "stop_sequence": null,
            "usage": {"input_tokens": 15, "output_tokens": 7, "cache_read_input_tokens": 5, "cache_creation_input_tokens": 0}})
        );
        assert!(answer_from_chat(b"{\"x\":1}").is_none());
        let e: Value = serde_json::from_slice(&error_from_chat(
            br#"{"error":{"message":"slow down"}}"#,
            429,
        ))
        .unwrap();
        assert_eq!(
            e,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        );
    }

    const STREAM: &str = "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi \"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"there\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n\
data: [DONE]\n\n";

    fn events(out: &[u8]) -> Vec<(String, Value)> {
        String::from_utf8(out.to_vec())
            .unwrap()
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                let (name, data) = e.split_once('\n').unwrap();
                (
                    name.trim_start_matches("event: ").to_string(),
                    serde_json::from_str(data.trim_start_matches("data: ")).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn a_chat_stream_becomes_messages_events_split_anywhere() {
        let mut whole = FromChatStream::new();
        let mut out = whole.push(STREAM.as_bytes());
        out.extend(whole.finish());
        let ev = events(&out);
        let names: Vec<&str> = ev.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(
            ev[5].1["content_block"],
            json!({"type": "tool_use", "id": "call_1", "name": "f", "input": {}})
        );
        assert_eq!(
            ev[7].1["delta"],
            json!({"type": "input_json_delta", "partial_json": ":1}"})
        );
        assert_eq!(ev[9].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(ev[9].1["usage"]["output_tokens"], 4);
        assert_eq!(ev[9].1["usage"]["input_tokens"], 9);
        for split in [1, 7, 100, 333, STREAM.len() - 3] {
            let mut s = FromChatStream::new();
            let (a, b) = STREAM.as_bytes().split_at(split);
            let mut o = s.push(a);
            o.extend(s.push(b));
            o.extend(s.finish());
            assert_eq!(o, out, "split at {split}");
        }
    }

    #[test]
    fn a_cut_stream_ends_with_an_error_event() {
        let mut s = FromChatStream::new();
        let cut = &STREAM[..STREAM.find("\"finish_reason\":\"tool_calls\"").unwrap()];
        let mut out = s.push(cut.as_bytes());
        out.extend(s.finish());
        let ev = events(&out);
        assert_eq!(ev.last().unwrap().0, "error");
    }
}
