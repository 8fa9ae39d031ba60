//! The mock's Anthropic mode: `POST <prefix>/messages` checks what
//! Anthropic's API checks (the table in `tests/MOCK.md`: the key in
//! `x-api-key`, a known `anthropic-version`, known top-level fields,
//! `max_tokens` of at least 1, roles, block shapes, non-empty text, every
//! `tool_use` with an id and a name and answered by a `tool_result` in the
//! next turn, every `tool_result` answering one) and answers with real-shaped messages,
//! streams (message_start, content blocks with text and input_json deltas,
//! ping, message_delta with cumulative usage, message_stop), usage and
//! errors (`{"type":"error","error":{...}}`).

use super::{json_response, Body, State, Step};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn error(status: u16, kind: &str, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

/// The top-level fields the Messages API accepts ("Extra inputs are not
/// permitted" for any other).
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "top_k",
    "tools",
    "tool_choice",
    "thinking",
    "service_tier",
    "container",
    "mcp_servers",
    "context_management",
];

/// The refusal of a request without the key or without a version (as the
/// Messages API answers them).
pub(crate) fn refused(state: &State, key: Option<&str>, version: bool) -> Option<Response<Body>> {
    if state
        .api_key
        .as_ref()
        .is_some_and(|k| key != Some(k.as_str()))
    {
        return Some(error(401, "authentication_error", "invalid x-api-key"));
    }
    (!version).then(|| {
        error(
            400,
            "invalid_request_error",
            "anthropic-version: header is required",
        )
    })
}

/// The `anthropic-version` values the API knows.
const VERSIONS: &[&str] = &["2023-06-01", "2023-01-01"];

/// What a real Messages endpoint would refuse, in its words (`Value::Null`:
/// the body was not JSON).
fn check(req: &Value) -> Result<(), String> {
    check_as(req, true)
}

/// `counting`: a token count's body (no `max_tokens`, fewer fields).
pub(crate) fn check_as(req: &Value, completion: bool) -> Result<(), String> {
    let Some(fields) = req.as_object() else {
        return Err(
            "There was an error parsing the body of your request: not a JSON object".into(),
        );
    };
    let allowed = |k: &str| {
        FIELDS.contains(&k)
            && (completion
                || !matches!(
                    k,
                    "max_tokens"
                        | "stream"
                        | "stop_sequences"
                        | "temperature"
                        | "top_p"
                        | "top_k"
                        | "metadata"
                        | "service_tier"
                        | "container"
                ))
    };
    if let Some(extra) = fields.keys().find(|k| !allowed(k)) {
        return Err(format!("{extra}: Extra inputs are not permitted"));
    }
    if !req.get("model").is_some_and(Value::is_string) {
        return Err("model: Field required".into());
    }
    match req
        .get("max_tokens")
        .map(Value::as_u64)
        .filter(|_| completion)
    {
        None if !completion => {}
        None => return Err("max_tokens: Field required".into()),
        Some(None) => return Err("max_tokens: Input should be a valid integer".into()),
        Some(Some(0)) => {
            return Err("max_tokens: Input should be greater than or equal to 1".into())
        }
        Some(Some(_)) => {}
    }
    let msgs = req
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("messages: at least one message is required")?;
    if let Some(s) = req.get("system") {
        if !s.is_string() && !s.is_array() {
            return Err("system: Input should be a valid string or list".into());
        }
    }
    let mut tool_uses: Vec<String> = Vec::new();
    for (i, m) in msgs.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if role != "user" && role != "assistant" {
            return Err(format!(
                "messages.{i}.role: Input should be 'user' or 'assistant'"
            ));
        }
        let blocks: Vec<Value> = match m.get("content") {
            Some(Value::String(_)) => Vec::new(),
            Some(Value::Array(b)) => b.clone(),
            _ => return Err(format!("messages.{i}.content: Field required")),
        };
        if m.get("content").and_then(Value::as_str) == Some("") {
            return Err(format!(
                "messages.{i}: text content blocks must be non-empty"
            ));
        }
        let mut uses_here = Vec::new();
        let mut answered = Vec::new();
        for (j, b) in blocks.iter().enumerate() {
            let at = format!("messages.{i}.content.{j}");
            match b.get("type").and_then(Value::as_str) {
                Some("text") if b.get("text").and_then(Value::as_str) == Some("") => {
                    return Err(format!("{at}: text content blocks must be non-empty"));
                }
                Some("text") if b.get("text").is_some_and(Value::is_string) => {}
                Some("image") => {
                    let kind = b.pointer("/source/type").and_then(Value::as_str);
                    if !matches!(kind, Some("base64" | "url")) {
                        return Err(format!("{at}.source: invalid image source"));
                    }
                }
                Some("tool_use") if role == "assistant" => {
                    if !b.get("input").is_some_and(Value::is_object) {
                        return Err(format!("{at}.input: Input should be a valid dictionary"));
                    }
                    for field in ["id", "name"] {
                        if b.get(field)
                            .and_then(Value::as_str)
                            .is_none_or(str::is_empty)
                        {
                            return Err(format!("{at}.{field}: Field required"));
                        }
                    }
                    uses_here.push(
                        b.get("id")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    );
                }
                Some("tool_result") if role == "user" => {
                    let id = b.get("tool_use_id").and_then(Value::as_str).unwrap_or("");
                    if !tool_uses.iter().any(|u| u == id) {
                        return Err(format!(
                            "{at}: unexpected `tool_use_id` found in `tool_result` blocks: {id}. Each `tool_result` block must have a corresponding `tool_use` block in the previous message."
                        ));
                    }
                    answered.push(id.to_string());
                }
                other => {
                    return Err(format!(
                        "{at}.type: unexpected block type {other:?} for role {role}"
                    ))
                }
            }
        }
        let unanswered: Vec<&str> = tool_uses
            .iter()
            .filter(|u| !answered.contains(u))
            .map(String::as_str)
            .collect();
        if !unanswered.is_empty() {
            return Err(format!(
                "messages.{i}: `tool_use` ids were found without `tool_result` blocks immediately after: {}. Each `tool_use` block must have a corresponding `tool_result` block in the next message.",
                unanswered.join(", ")
            ));
        }
        tool_uses = uses_here;
    }
    Ok(())
}

/// `POST <prefix>/messages/count_tokens`: the same checks as a message (less
/// `max_tokens`), answered with the mock's count: a token per word of the
/// texts and 3 per message.
pub async fn count_tokens(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let version = req.headers().get("anthropic-version").is_some();
    let (path, headers) = super::request_facts(&req);
    // No scripted step is used: a count is not an answer the tests script.
    let parsed = super::receive_quiet(&state, &path, headers, req.into_body()).await?;
    if let Some(refusal) = refused(&state, key.as_deref(), version) {
        return Ok(refusal);
    }
    if let Err(why) = check_as(&parsed, false) {
        return Ok(error(400, "invalid_request_error", &why));
    }
    let msgs = parsed
        .get("messages")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let words: usize = msgs
        .iter()
        .map(|m| match m.get("content") {
            Some(Value::String(s)) => s.split_whitespace().count(),
            Some(Value::Array(b)) => b
                .iter()
                .filter_map(|b| b.get("text").and_then(Value::as_str))
                .map(|t| t.split_whitespace().count())
                .sum(),
            _ => 0,
        })
        .sum();
    Ok(json_response(
        200,
        &json!({"input_tokens": words + 3 * msgs.len()}),
    ))
}

/// Claude on Vertex AI: `.../publishers/anthropic/models/<model>:rawPredict`
/// (`:streamRawPredict`) with an access token the mock's metadata
/// endpoint issued, `anthropic_version: vertex-2023-10-16` in the body and
/// no `model` (the path names it); then the Messages checks and answers.
pub async fn vertex_raw_predict(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let uri_path = req.uri().path().to_string();
    let (path, headers) = super::request_facts(&req);
    let (parsed, step) = super::receive(&state, &path, headers, req.into_body()).await?;
    if !super::live_token(&state, bearer.as_deref()) {
        return Ok(error(
            401,
            "authentication_error",
            "invalid or expired access token",
        ));
    }
    let Some((model, method)) = uri_path
        .rsplit_once("/models/")
        .and_then(|(_, rest)| rest.split_once(':'))
    else {
        return Ok(error(404, "not_found_error", "mock: no model in the path"));
    };
    if parsed.get("anthropic_version").and_then(Value::as_str) != Some("vertex-2023-10-16") {
        return Ok(error(
            400,
            "invalid_request_error",
            "anthropic_version: vertex-2023-10-16 is required in the body",
        ));
    }
    if parsed.get("model").is_some() {
        return Ok(error(
            400,
            "invalid_request_error",
            "model: Extra inputs are not permitted",
        ));
    }
    let streams = parsed
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if streams != (method == "streamRawPredict") {
        return Ok(error(
            400,
            "invalid_request_error",
            "mock: `stream` and the method disagree",
        ));
    }
    let mut body = parsed.clone();
    if let Some(o) = body.as_object_mut() {
        o.remove("anthropic_version");
        o.insert("model".into(), Value::String(model.to_string()));
    }
    if let Err(why) = check(&body) {
        return Ok(error(400, "invalid_request_error", &why));
    }
    if let Some(s) = step.status.filter(|s| *s != 200) {
        return Ok(error(s, "api_error", "mock: scripted failure"));
    }
    answer(&state, &body, &step)
}

pub async fn messages(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let version = req
        .headers()
        .get("anthropic-version")
        .map(|v| v.to_str().unwrap_or("").to_string());
    let (path, headers) = super::request_facts(&req);
    let (parsed, step) = super::receive(&state, &path, headers, req.into_body()).await?;
    if let Some(expected) = &state.api_key {
        if key.as_deref() != Some(expected.as_str()) {
            return Ok(error(401, "authentication_error", "invalid x-api-key"));
        }
    }
    match version.as_deref() {
        None => {
            return Ok(error(
                400,
                "invalid_request_error",
                "anthropic-version: header is required",
            ))
        }
        Some(v) if !VERSIONS.contains(&v) => {
            return Ok(error(
                400,
                "invalid_request_error",
                &format!("anthropic-version: invalid version {v:?}"),
            ))
        }
        Some(_) => {}
    }
    if let Err(why) = check(&parsed) {
        return Ok(error(400, "invalid_request_error", &why));
    }
    match step.status.unwrap_or(200) {
        200 => {}
        429 => return Ok(error(429, "rate_limit_error", "mock: scripted rate limit")),
        529 => return Ok(error(529, "overloaded_error", "mock: scripted overload")),
        s if s >= 500 => return Ok(error(s, "api_error", "mock: scripted failure")),
        s => {
            return Ok(error(
                s,
                "invalid_request_error",
                "mock: scripted client error",
            ))
        }
    }
    if let Some(raw) = step.body.clone() {
        let mut r = json_response(200, &Value::Null);
        *r.body_mut() = http_body_util::Full::new(Bytes::from(raw))
            .map_err(|never| match never {})
            .boxed();
        return Ok(r);
    }
    answer(&state, &parsed, &step)
}

fn answer(state: &State, req: &Value, step: &Step) -> Result<Response<Body>, io::Error> {
    let model = req
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("claude")
        .to_string();
    let text = step
        .content
        .clone()
        .unwrap_or_else(|| format!("Hello from {}! This is a mock message.", state.name));
    let tool = step
        .tool_call
        .clone()
        .filter(|_| req.get("tools").is_some_and(Value::is_array));
    let input_tokens = step.usage.map_or(10, |u| u.prompt_tokens);
    let output_tokens = step
        .usage
        .map_or(text.split_whitespace().count() as u64, |u| {
            u.completion_tokens
        });
    let id = format!("msg_mock_{}", state.hits.load(Ordering::Relaxed));
    let stop = if tool.is_some() {
        "tool_use"
    } else {
        "end_turn"
    };
    let stream = req.get("stream").and_then(Value::as_bool).unwrap_or(false);
    if !stream {
        let mut content = vec![json!({"type": "text", "text": text})];
        if let Some(t) = &tool {
            content.push(
                json!({"type": "tool_use", "id": "toolu_mock_1", "name": t.name, "input": t.input}),
            );
        }
        return Ok(json_response(
            200,
            &json!({"id": id, "type": "message", "role": "assistant", "model": model, "content": content,
                "stop_reason": stop, "stop_sequence": null,
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens,
                          "cache_read_input_tokens": step.cache_read.unwrap_or(0), "cache_creation_input_tokens": 0}}),
        ));
    }
    let ev = |name: &str, v: Value| Bytes::from(format!("event: {name}\ndata: {v}\n\n"));
    let mut events = vec![
        ev(
            "message_start",
            json!({"type": "message_start", "message": {"id": id, "type": "message", "role": "assistant",
            "model": model, "content": [], "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1, "cache_read_input_tokens": step.cache_read.unwrap_or(0), "cache_creation_input_tokens": 0}}}),
        ),
        ev(
            "content_block_start",
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
        ),
        ev("ping", json!({"type": "ping"})),
    ];
    for w in text.split_inclusive(' ') {
        events.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}})));
    }
    events.push(ev(
        "content_block_stop",
        json!({"type": "content_block_stop", "index": 0}),
    ));
    if let Some(t) = &tool {
        let args = t.input.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        events.push(ev("content_block_start", json!({"type": "content_block_start", "index": 1, "content_block": {"type": "tool_use", "id": "toolu_mock_1", "name": t.name, "input": {}}})));
        for part in [a, b] {
            events.push(ev("content_block_delta", json!({"type": "content_block_delta", "index": 1, "delta": {"type": "input_json_delta", "partial_json": part}})));
        }
        events.push(ev(
            "content_block_stop",
            json!({"type": "content_block_stop", "index": 1}),
        ));
    }
    if step.stream_error {
        events.push(ev("error", json!({"type": "error", "error": {"type": "overloaded_error", "message": "mock: overloaded mid-stream"}})));
    } else {
        events.push(ev("message_delta", json!({"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": null}, "usage": {"output_tokens": output_tokens}})));
        events.push(ev("message_stop", json!({"type": "message_stop"})));
    }
    super::event_stream(events, step, "text/event-stream; charset=utf-8")
}
