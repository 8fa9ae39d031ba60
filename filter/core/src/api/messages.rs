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
use serde_json::{json, Map, Value};

pub const PATH: &str = "/v1/messages";

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_error", message)
}

/// Fields of a Messages request the translation reads; the ones it drops
/// (no chat-completions equivalent) are listed in `x-portcullis-dropped`.
const READ: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
];
const DROPPED: &[&str] = &["top_k", "thinking", "service_tier", "context_management"];

/// A Messages request as a chat completion for `model_id`, and the fields
/// dropped. A stream asks for the usage chunk (the Messages stream ends
/// with the usage).
pub fn to_chat(
    doc: &Map<String, Value>,
    model_id: &str,
) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let mut dropped = Vec::new();
    for k in doc.keys() {
        if DROPPED.contains(&k.as_str()) {
            dropped.push(k.clone());
        } else if !READ.contains(&k.as_str()) {
            return Err(bad(format!(
                "`{k}` cannot be served by this model's provider (an OpenAI-compatible API): remove it."
            )));
        }
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model_id));
    let mut messages = Vec::new();
    if let Some(system) = doc.get("system") {
        let text = blocks_text(system)?;
        if !text.is_empty() {
            messages.push(json!({"role": "system", "content": text}));
        }
    }
    let list = doc
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be an array."))?;
    for (i, m) in list.iter().enumerate() {
        message(i, m, &mut messages)?;
    }
    out.insert("messages".into(), Value::Array(messages));
    if let Some(max) = doc.get("max_tokens") {
        out.insert("max_tokens".into(), max.clone());
    }
    for k in ["temperature", "top_p"] {
        if let Some(v) = doc.get(k) {
            out.insert(k.into(), v.clone());
        }
    }
    if let Some(stop) = doc
        .get("stop_sequences")
        .filter(|s| s.as_array().is_some_and(|a| !a.is_empty()))
    {
        out.insert("stop".into(), stop.clone());
    }
    if doc.get("stream") == Some(&Value::Bool(true)) {
        out.insert("stream".into(), Value::Bool(true));
        out.insert("stream_options".into(), json!({"include_usage": true}));
    }
    if let Some(tools) = doc
        .get("tools")
        .and_then(Value::as_array)
        .filter(|t| !t.is_empty())
    {
        out.insert(
            "tools".into(),
            Value::Array(tools.iter().map(tool).collect::<Result<_, _>>()?),
        );
    }
    if let Some(choice) = doc.get("tool_choice") {
        let (c, parallel) = tool_choice(choice)?;
        if let Some(c) = c {
            out.insert("tool_choice".into(), c);
        }
        if !parallel && out.contains_key("tools") {
            out.insert("parallel_tool_calls".into(), Value::Bool(false));
        }
    }
    if let Some(user) = doc
        .get("metadata")
        .and_then(|m| m.get("user_id"))
        .and_then(Value::as_str)
    {
        out.insert("user".into(), json!(user));
    }
    let body =
        serde_json::to_vec(&out).map_err(|e| GatewayError::internal(format!("translate: {e}")))?;
    Ok((body, dropped))
}

/// `system` (a string or text blocks) as one text.
fn blocks_text(v: &Value) -> Result<String, GatewayError> {
    match v {
        Value::String(s) => Ok(s.clone()),
        Value::Array(blocks) => Ok(blocks
            .iter()
            .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n\n")),
        _ => Err(bad("`system` must be a string or a list of text blocks.")),
    }
}

/// One Messages message as chat messages: a user turn's `tool_result`
/// blocks become `tool` messages first (they answer the assistant's calls
/// just before), then its other blocks one user message.
fn message(i: usize, m: &Value, out: &mut Vec<Value>) -> Result<(), GatewayError> {
    let role = m.get("role").and_then(Value::as_str).unwrap_or("");
    let blocks: Vec<Value> = match m.get("content") {
        Some(Value::String(s)) => vec![json!({"type": "text", "text": s})],
        Some(Value::Array(b)) => b.clone(),
        _ => {
            return Err(bad(format!(
                "messages.{i}.content must be a string or a list of blocks."
            )))
        }
    };
    match role {
        "user" => {
            let mut parts = Vec::new();
            for b in &blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("tool_result") => out.push(tool_result(b)?),
                    Some("text") => parts.push(json!({"type": "text", "text": b.get("text").cloned().unwrap_or(json!(""))})),
                    Some("image") => parts.push(image(b)?),
                    other => return Err(unsupported_block(i, other)),
                }
            }
            if !parts.is_empty() {
                let content = match parts.as_slice() {
                    [only] if only.get("type").and_then(Value::as_str) == Some("text") => {
                        only["text"].clone()
                    }
                    _ => Value::Array(parts),
                };
                out.push(json!({"role": "user", "content": content}));
            }
        }
        "assistant" => {
            let mut text = String::new();
            let mut calls = Vec::new();
            for b in &blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
                    Some("tool_use") => calls.push(json!({
                        "id": b.get("id").cloned().unwrap_or(Value::Null),
                        "type": "function",
                        "function": {
                            "name": b.get("name").cloned().unwrap_or(Value::Null),
                            "arguments": b.get("input").map_or_else(|| "{}".to_string(), Value::to_string),
                        },
                    })),
                    // The model's own reasoning is not sent to another model.
                    Some("thinking" | "redacted_thinking") => {}
                    other => return Err(unsupported_block(i, other)),
                }
            }
            let mut msg = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { json!(text) }});
            if let (false, Some(o)) = (calls.is_empty(), msg.as_object_mut()) {
                o.insert("tool_calls".into(), Value::Array(calls));
            }
            out.push(msg);
        }
        other => {
            return Err(bad(format!(
                "messages.{i}.role must be user or assistant, not `{other}`."
            )))
        }
    }
    Ok(())
}

fn unsupported_block(i: usize, kind: Option<&str>) -> GatewayError {
    bad(format!(
        "messages.{i}: content block type `{}` cannot be served by this model's provider (an OpenAI-compatible API).",
        kind.unwrap_or("?")
    ))
}

fn tool_result(b: &Value) -> Result<Value, GatewayError> {
    let id = b
        .get("tool_use_id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("A `tool_result` block needs `tool_use_id`."))?;
    let content = match b.get("content") {
        None | Some(Value::Null) => json!(""),
        Some(Value::String(s)) => json!(s),
        Some(v @ Value::Array(_)) => json!(blocks_text(v)?),
        Some(_) => {
            return Err(bad(
                "A `tool_result`'s content must be a string or text blocks.",
            ))
        }
    };
    Ok(json!({"role": "tool", "tool_call_id": id, "content": content}))
}

fn image(b: &Value) -> Result<Value, GatewayError> {
    let src = b
        .get("source")
        .ok_or_else(|| bad("An image block needs `source`."))?;
    let url = match src.get("type").and_then(Value::as_str) {
        Some("base64") => format!(
            "data:{};base64,{}",
            src.get("media_type")
                .and_then(Value::as_str)
                .unwrap_or("image/png"),
            src.get("data").and_then(Value::as_str).unwrap_or("")
        ),
        Some("url") => src
            .get("url")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string(),
        _ => return Err(bad("An image's source must be base64 or url.")),
    };
    Ok(json!({"type": "image_url", "image_url": {"url": url}}))
}

fn tool(t: &Value) -> Result<Value, GatewayError> {
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("Each tool needs a `name`."))?;
    if t.get("type")
        .and_then(Value::as_str)
        .is_some_and(|k| k != "custom")
    {
        return Err(bad(format!(
            "Tool `{name}` is a server tool, which this model's provider (an OpenAI-compatible API) cannot run."
        )));
    }
    let mut f = json!({
        "name": name,
        "parameters": t.get("input_schema").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
    });
    if let (Some(d), Some(o)) = (t.get("description"), f.as_object_mut()) {
        o.insert("description".into(), d.clone());
    }
    Ok(json!({"type": "function", "function": f}))
}

/// Anthropic's `tool_choice` as chat's, and whether parallel calls stay on.
fn tool_choice(c: &Value) -> Result<(Option<Value>, bool), GatewayError> {
    let parallel = c.get("disable_parallel_tool_use") != Some(&Value::Bool(true));
    let choice = match c.get("type").and_then(Value::as_str) {
        Some("auto") => json!("auto"),
        Some("any") => json!("required"),
        Some("none") => json!("none"),
        Some("tool") => {
            let name = c
                .get("name")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("`tool_choice` of type tool needs `name`."))?;
            json!({"type": "function", "function": {"name": name}})
        }
        _ => return Err(bad("`tool_choice.type` must be auto, any, tool or none.")),
    };
    Ok((Some(choice), parallel))
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
    let cached = n("/prompt_tokens_details/cached_tokens");
    json!({
        "input_tokens": n("/prompt_tokens").saturating_sub(cached),
        "output_tokens": n("/completion_tokens"),
        "cache_read_input_tokens": cached,
        "cache_creation_input_tokens": 0,
    })
}

/// `msg_` and the chat completion's id.
pub(super) fn message_id(id: Option<&Value>) -> String {
    format!("msg_{}", id.and_then(Value::as_str).unwrap_or("gateway"))
}

/// A whole chat completion as a Messages answer; `None` when it does not
/// read as one.
pub fn answer_from_chat(body: &[u8]) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let choice = v.get("choices")?.as_array()?.first()?;
    let msg = choice.get("message")?;
    let mut content = Vec::new();
    if let Some(t) = msg
        .get("content")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        content.push(json!({"type": "text", "text": t}));
    }
    for c in msg
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        content.extend(crate::providers::anthropic::tool_use_block(c, true));
    }
    let finish = choice
        .get("finish_reason")
        .and_then(Value::as_str)
        .unwrap_or("stop");
    let out = json!({
        "id": message_id(v.get("id")),
        "type": "message",
        "role": "assistant",
        "model": v.get("model").cloned().unwrap_or(Value::Null),
        "content": content,
        "stop_reason": stop_reason(finish),
        "stop_sequence": null,
        "usage": usage(v.get("usage")),
    });
    serde_json::to_vec(&out).ok()
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

mod stream;
pub use stream::FromChatStream;

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chat_of(v: Value) -> Value {
        let (body, _) = to_chat(v.as_object().unwrap(), "gpt-x").unwrap();
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
            json!({"model": "c", "max_tokens": 5, "top_k": 3, "thinking": {"type": "enabled"},
            "messages": [{"role": "user", "content": "hi"}]})
            .as_object()
            .unwrap(),
            "m",
        )
        .unwrap();
        assert_eq!(dropped, ["thinking", "top_k"]);
        let e = to_chat(json!({"model": "c", "max_tokens": 5, "mcp_servers": [], "messages": [{"role": "user", "content": "hi"}]}).as_object().unwrap(), "m").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("mcp_servers"), "{}", e.message);
        let e = to_chat(json!({"model": "c", "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}],
            "messages": [{"role": "user", "content": "hi"}]}).as_object().unwrap(), "m").unwrap_err();
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
