//! OpenAI chat completions to Anthropic's Messages API and back: the
//! request, a whole answer, a stream (event by event, split anywhere across
//! network chunks), and errors.

use crate::api::Api;
use crate::config::{Provider, Schema};
use crate::error::GatewayError;
use crate::request::ChatRequest;
use crate::sse::SseParser;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

/// Anthropic's Messages API as a provider format: `/v1/messages` passes
/// to it as it is, chat completions are translated both ways.
pub struct Anthropic;

impl super::Format for Anthropic {
    fn path(&self, p: &Provider, api: Api, _model_id: &str) -> String {
        match api {
            Api::CountTokens => format!("{}/messages/count_tokens", super::base(p)),
            _ => format!("{}/messages", super::base(p)),
        }
    }

    fn translate_request(
        &self,
        p: &Provider,
        chat: &ChatRequest,
        model_id: &str,
    ) -> Result<super::Prepared, GatewayError> {
        let Schema::Anthropic { options, .. } = &p.schema else {
            return Err(GatewayError::internal(
                "an Anthropic provider without its options",
            ));
        };
        let (body, dropped) = request(chat.document()?, model_id, options)?;
        Ok(super::Prepared {
            body: Some(body),
            dropped,
        })
    }

    fn credential(&self, key: &str) -> (&'static str, String) {
        ("x-api-key", key.to_string())
    }

    fn extra_headers(&self, p: &Provider) -> Vec<(&'static str, String)> {
        match &p.schema {
            Schema::Anthropic { version, .. } => vec![("anthropic-version", version.clone())],
            _ => Vec::new(),
        }
    }

    fn answer(&self, body: &[u8], created: u64) -> Option<Vec<u8>> {
        answer(body, created)
    }

    fn error(&self, body: &[u8], status: u16) -> Vec<u8> {
        error(body, status)
    }

    fn stream(&self, created: u64, emit_usage: bool) -> Option<super::Stream> {
        Some(super::Stream::Anthropic(Stream::new(created, emit_usage)))
    }
}

/// What the translation needs of the provider's config.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `max_tokens` when the client sent none (Anthropic requires it).
    pub default_max_tokens: u64,
    /// Drop fields Anthropic cannot honour instead of refusing the request.
    pub drop_unsupported: bool,
}

/// Fields of a chat request the translation reads (anything else is
/// unsupported).
const READ: [&str; 14] = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "n",
];

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

/// Fields the provider cannot honour, with their values left as the
/// client sent them: the names, in order.
fn unsupported(doc: &Map<String, Value>) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in doc {
        let harmless = match k.as_str() {
            "n" => v.as_u64() == Some(1) || v.is_null(),
            "logprobs" => v == &Value::Bool(false) || v.is_null(),
            "response_format" => v.get("type").and_then(Value::as_str) == Some("text"),
            k => READ.contains(&k),
        };
        if !harmless {
            out.push(k.clone());
        }
    }
    out
}

/// The Messages request for a chat request (`doc`), and the fields dropped
/// (only with `drop_unsupported`; otherwise they are a 400 naming them).
pub fn request(
    doc: &Map<String, Value>,
    model_id: &str,
    opts: &Options,
) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let dropped = unsupported(doc);
    if !dropped.is_empty() && !opts.drop_unsupported {
        return Err(bad(format!(
            "This model's provider (Anthropic) does not support: {}. Remove them, or ask the operator to set `drop_unsupported` on the provider.",
            dropped.join(", ")
        )));
    }
    let mut out = Map::new();
    out.insert("model".into(), json!(model_id));
    let (system, messages) = messages(doc.get("messages"))?;
    if !system.is_empty() {
        out.insert("system".into(), json!(system.join("\n\n")));
    }
    out.insert("messages".into(), Value::Array(messages));
    let max = doc
        .get("max_completion_tokens")
        .or_else(|| doc.get("max_tokens"))
        .and_then(Value::as_u64)
        .unwrap_or(opts.default_max_tokens);
    out.insert("max_tokens".into(), json!(max));
    for k in ["temperature", "top_p"] {
        if let Some(v) = doc.get(k).filter(|v| v.is_number()) {
            out.insert(k.into(), v.clone());
        }
    }
    match doc.get("stop") {
        Some(Value::String(s)) => {
            out.insert("stop_sequences".into(), json!([s]));
        }
        Some(Value::Array(a)) if !a.is_empty() => {
            out.insert("stop_sequences".into(), Value::Array(a.clone()));
        }
        _ => {}
    }
    if doc.get("stream") == Some(&Value::Bool(true)) {
        out.insert("stream".into(), Value::Bool(true));
    }
    if let Some(tools) = doc.get("tools").and_then(Value::as_array) {
        out.insert(
            "tools".into(),
            Value::Array(tools.iter().map(tool).collect::<Result<_, _>>()?),
        );
    }
    if let Some(choice) = doc.get("tool_choice") {
        let mut c = tool_choice(choice)?;
        if doc.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
            if let Some(o) = c.as_object_mut() {
                o.insert("disable_parallel_tool_use".into(), Value::Bool(true));
            }
        }
        out.insert("tool_choice".into(), c);
    } else if doc.get("parallel_tool_calls") == Some(&Value::Bool(false)) {
        out.insert(
            "tool_choice".into(),
            json!({"type": "auto", "disable_parallel_tool_use": true}),
        );
    }
    if let Some(user) = doc.get("user").and_then(Value::as_str) {
        out.insert("metadata".into(), json!({ "user_id": user }));
    }
    let body =
        serde_json::to_vec(&out).map_err(|e| GatewayError::internal(format!("translate: {e}")))?;
    Ok((
        body,
        if opts.drop_unsupported {
            dropped
        } else {
            Vec::new()
        },
    ))
}

fn tool(t: &Value) -> Result<Value, GatewayError> {
    let f = t
        .get("function")
        .filter(|_| t.get("type").and_then(Value::as_str) == Some("function"))
        .ok_or_else(|| bad("Each tool must be {\"type\": \"function\", \"function\": {...}}."))?;
    let name = f
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("A tool function needs a `name`."))?;
    let mut out = json!({
        "name": name,
        "input_schema": f.get("parameters").cloned().unwrap_or_else(|| json!({"type": "object", "properties": {}})),
    });
    if let (Some(d), Some(o)) = (f.get("description"), out.as_object_mut()) {
        o.insert("description".into(), d.clone());
    }
    Ok(out)
}

fn tool_choice(c: &Value) -> Result<Value, GatewayError> {
    match c {
        Value::String(s) => match s.as_str() {
            "auto" => Ok(json!({"type": "auto"})),
            "none" => Ok(json!({"type": "none"})),
            "required" => Ok(json!({"type": "any"})),
            other => Err(bad(format!(
                "`tool_choice` `{other}` is not auto, none or required."
            ))),
        },
        Value::Object(_) => c
            .pointer("/function/name")
            .and_then(Value::as_str)
            .map(|n| json!({"type": "tool", "name": n}))
            .ok_or_else(|| bad("`tool_choice` must name a function.")),
        _ => Err(bad("`tool_choice` must be a string or an object.")),
    }
}

/// Text of a content value (a string, or the text of its text parts).
fn text_of(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter(|p| p.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// A user message's content as Anthropic blocks.
fn user_blocks(content: Option<&Value>) -> Result<Vec<Value>, GatewayError> {
    match content {
        Some(Value::String(s)) => Ok(vec![json!({"type": "text", "text": s})]),
        Some(Value::Array(parts)) => parts.iter().map(part).collect(),
        None | Some(Value::Null) => Ok(Vec::new()),
        _ => Err(bad(
            "A message's `content` must be a string or a list of parts.",
        )),
    }
}

fn part(p: &Value) -> Result<Value, GatewayError> {
    match p.get("type").and_then(Value::as_str) {
        Some("text") => Ok(json!({"type": "text", "text": p.get("text").and_then(Value::as_str).unwrap_or("")})),
        Some("image_url") => {
            let url = p
                .pointer("/image_url/url")
                .and_then(Value::as_str)
                .ok_or_else(|| bad("An `image_url` part needs `image_url.url`."))?;
            Ok(image(url))
        }
        other => Err(bad(format!(
            "Content part type `{}` is not supported by this model's provider (Anthropic): use text or image_url.",
            other.unwrap_or("?")
        ))),
    }
}

/// An image by URL, or inline (`data:<media type>;base64,<data>`).
fn image(url: &str) -> Value {
    if let Some(rest) = url.strip_prefix("data:") {
        if let Some((media, data)) = rest.split_once(";base64,") {
            return json!({"type": "image", "source": {"type": "base64", "media_type": media, "data": data}});
        }
    }
    json!({"type": "image", "source": {"type": "url", "url": url}})
}

/// `system` texts and the Messages list.
fn messages(v: Option<&Value>) -> Result<(Vec<String>, Vec<Value>), GatewayError> {
    let list = v
        .and_then(Value::as_array)
        .ok_or_else(|| bad("`messages` must be an array."))?;
    let mut system = Vec::new();
    let mut out: Vec<Value> = Vec::new();
    for m in list {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        match role {
            "system" | "developer" => system.push(text_of(m.get("content"))),
            "user" => push(&mut out, "user", user_blocks(m.get("content"))?),
            "assistant" => {
                let mut blocks = Vec::new();
                let text = text_of(m.get("content"));
                if !text.is_empty() {
                    blocks.push(json!({"type": "text", "text": text}));
                }
                for call in m
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    blocks.push(tool_use_block(call, false).ok_or_else(|| {
                        bad("An assistant tool call's `arguments` is not a JSON object.")
                    })?);
                }
                push(&mut out, "assistant", blocks);
            }
            "tool" => {
                let id = m
                    .get("tool_call_id")
                    .and_then(Value::as_str)
                    .ok_or_else(|| bad("A `tool` message needs `tool_call_id`."))?;
                let block = json!({"type": "tool_result", "tool_use_id": id, "content": text_of(m.get("content"))});
                push(&mut out, "user", vec![block]);
            }
            other => return Err(bad(format!("Message role `{other}` is not supported."))),
        }
    }
    Ok((system, out))
}

/// Append blocks as a turn; consecutive turns of one role become one (the
/// tool results that follow a tool call share one user turn).
fn push(out: &mut Vec<Value>, role: &str, blocks: Vec<Value>) {
    if blocks.is_empty() {
        return;
    }
    if let Some(last) = out
        .last_mut()
        .filter(|l| l.get("role").and_then(Value::as_str) == Some(role))
    {
        if let Some(Value::Array(content)) = last.get_mut("content") {
            content.extend(blocks);
            return;
        }
    }
    out.push(json!({"role": role, "content": blocks}));
}

/// A chat completion's tool call as a `tool_use` block (its arguments parsed
/// into `input`, which must be a JSON object); `None` when they are not one,
/// unless `lenient` (an answer: an empty `input` then).
pub fn tool_use_block(call: &Value, lenient: bool) -> Option<Value> {
    let args = call
        .pointer("/function/arguments")
        .and_then(Value::as_str)
        .unwrap_or("{}");
    let args = if args.trim().is_empty() { "{}" } else { args };
    let input = match serde_json::from_str::<Value>(args)
        .ok()
        .filter(Value::is_object)
    {
        Some(input) => input,
        None if lenient => json!({}),
        None => return None,
    };
    Some(json!({
        "type": "tool_use",
        "id": call.get("id").and_then(Value::as_str).unwrap_or(""),
        "name": call.pointer("/function/name").and_then(Value::as_str).unwrap_or(""),
        "input": input,
    }))
}

/// Anthropic's `stop_reason` as OpenAI's `finish_reason`.
pub fn finish_reason(stop: &str) -> &'static str {
    match stop {
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// OpenAI's usage object from Anthropic's usage (`prompt_tokens` includes
/// cache reads and writes; the details split them).
pub fn usage(u: &Value) -> Value {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let (input, read, write, output) = (
        n("input_tokens"),
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
        n("output_tokens"),
    );
    let prompt = input.saturating_add(read).saturating_add(write);
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt.saturating_add(output),
        "prompt_tokens_details": {"cached_tokens": read, "cache_creation_tokens": write},
    })
}

/// A whole Messages answer as a chat completion.
pub fn answer(body: &[u8], created: u64) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(body).ok()?;
    let content = v.get("content")?.as_array()?;
    let mut text = String::new();
    let mut calls = Vec::new();
    for b in content {
        match b.get("type").and_then(Value::as_str) {
            Some("text") => text.push_str(b.get("text").and_then(Value::as_str).unwrap_or("")),
            Some("tool_use") => calls.push(json!({
                "id": b.get("id").cloned().unwrap_or(Value::Null),
                "type": "function",
                "function": {
                    "name": b.get("name").cloned().unwrap_or(Value::Null),
                    "arguments": b.get("input").map(Value::to_string).unwrap_or_else(|| "{}".into()),
                },
            })),
            _ => {}
        }
    }
    let mut message = json!({"role": "assistant", "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) }});
    if !calls.is_empty() {
        if let Some(m) = message.as_object_mut() {
            m.insert("tool_calls".into(), Value::Array(calls));
        }
    }
    let stop = v
        .get("stop_reason")
        .and_then(Value::as_str)
        .unwrap_or("end_turn");
    let out = json!({
        "id": v.get("id").cloned().unwrap_or(Value::Null),
        "object": "chat.completion",
        "created": created,
        "model": v.get("model").cloned().unwrap_or(Value::Null),
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(stop), "logprobs": null}],
        "usage": usage(v.get("usage").unwrap_or(&Value::Null)),
    });
    serde_json::to_vec(&out).ok()
}

/// An Anthropic error body in OpenAI's shape (same status).
pub fn error(body: &[u8], status: u16) -> Vec<u8> {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let kind = v
        .pointer("/error/type")
        .and_then(Value::as_str)
        .unwrap_or("api_error");
    let message = v
        .pointer("/error/message")
        .and_then(Value::as_str)
        .map_or_else(|| format!("The provider answered {status}."), String::from);
    let openai_type = match status {
        400..=499 if status != 429 => "invalid_request_error",
        _ => "api_error",
    };
    serde_json::to_vec(
        &json!({"error": {"message": message, "type": openai_type, "code": kind, "param": null}}),
    )
    .unwrap_or_default()
}

/// One event of a Messages stream: the fields the translation reads
/// (text borrowed when it has no escapes).
#[derive(Deserialize)]
struct Event<'a> {
    #[serde(rename = "type", borrow)]
    kind: Cow<'a, str>,
    #[serde(default)]
    index: u64,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(default)]
    usage: Option<Map<String, Value>>,
    #[serde(default)]
    message: Option<Value>,
    #[serde(default)]
    content_block: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[derive(Deserialize)]
struct Delta<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    partial_json: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    stop_reason: Option<Cow<'a, str>>,
}

/// A Messages stream as chat-completion chunks, event by event.
#[derive(Debug, Default)]
pub struct Stream {
    parser: SseParser,
    /// Each chunk's JSON up to its `delta` (id, created, model).
    head: String,
    id: Value,
    model: Value,
    created: u64,
    /// Emit the usage chunk before `[DONE]`.
    emit_usage: bool,
    /// Content block index -> OpenAI tool index.
    tools: Vec<(u64, usize)>,
    usage: Map<String, Value>,
    ended: bool,
}

impl Stream {
    pub fn new(created: u64, emit_usage: bool) -> Self {
        let mut s = Self {
            created,
            emit_usage,
            ..Self::default()
        };
        s.set_head();
        s
    }

    fn set_head(&mut self) {
        self.head = format!(
            r#"data: {{"id":{},"object":"chat.completion.chunk","created":{},"model":{},"choices":[{{"index":0,"delta":"#,
            self.id, self.created, self.model
        );
    }

    /// One chunk: `delta` is JSON; `finish` a finish reason or none.
    fn chunk_event(&self, delta: &str, finish: Option<&str>) -> Vec<u8> {
        let mut out = String::with_capacity(self.head.len() + delta.len() + 48);
        out.push_str(&self.head);
        out.push_str(delta);
        match finish {
            Some(f) => {
                out.push_str(r#","finish_reason":""#);
                out.push_str(f);
                out.push('"');
            }
            None => out.push_str(r#","finish_reason":null"#),
        }
        out.push_str(",\"logprobs\":null}]}\n\n");
        out.into_bytes()
    }

    /// The chunks for these bytes of the provider's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        if self.ended {
            return out;
        }
        self.parser.push(bytes);
        if self.parser.overflowed {
            self.ended = true;
            return error_event("The provider's stream has an event too large to read.");
        }
        while let Some((_, data)) = self.parser.next_event() {
            let Some(d) = data else { continue };
            let Ok(ev) = serde_json::from_str::<Event<'_>>(&d) else {
                continue;
            };
            out.extend(self.event(ev));
            if self.ended {
                break;
            }
        }
        out
    }

    /// The end of the provider's stream: a stream cut before
    /// `message_stop` ends with an error event.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        error_event("The provider's stream ended before its end (no message_stop).")
    }

    fn event(&mut self, ev: Event<'_>) -> Vec<u8> {
        let string = |s: &str| serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
        match ev.kind.as_ref() {
            "message_start" => {
                let m = ev.message.unwrap_or(Value::Null);
                self.id = m.get("id").cloned().unwrap_or(Value::Null);
                self.model = m.get("model").cloned().unwrap_or(Value::Null);
                if let Some(u) = m.get("usage").and_then(Value::as_object) {
                    self.usage.extend(u.clone());
                }
                self.set_head();
                self.chunk_event(r#"{"role":"assistant","content":""}"#, None)
            }
            "content_block_start" => {
                let block = ev.content_block.unwrap_or(Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("tool_use") => {
                        let tool = self.tools.len();
                        self.tools.push((ev.index, tool));
                        let delta = json!({"tool_calls": [{"index": tool, "id": block.get("id"), "type": "function",
                            "function": {"name": block.get("name"), "arguments": ""}}]});
                        self.chunk_event(&delta.to_string(), None)
                    }
                    Some("text") => match block.get("text").and_then(Value::as_str) {
                        Some(t) if !t.is_empty() => {
                            self.chunk_event(&format!(r#"{{"content":{}}}"#, string(t)), None)
                        }
                        _ => Vec::new(),
                    },
                    _ => Vec::new(),
                }
            }
            "content_block_delta" => {
                let Some(d) = ev.delta else {
                    return Vec::new();
                };
                match d.kind.as_deref() {
                    Some("text_delta") => {
                        let text = d.text.as_deref().unwrap_or("");
                        self.chunk_event(&format!(r#"{{"content":{}}}"#, string(text)), None)
                    }
                    Some("input_json_delta") => {
                        let Some(&(_, tool)) = self.tools.iter().find(|(i, _)| *i == ev.index)
                        else {
                            return Vec::new();
                        };
                        let part = d.partial_json.as_deref().unwrap_or("");
                        self.chunk_event(
                            &format!(
                                r#"{{"tool_calls":[{{"index":{tool},"function":{{"arguments":{}}}}}]}}"#,
                                string(part)
                            ),
                            None,
                        )
                    }
                    _ => Vec::new(),
                }
            }
            "message_delta" => {
                // Usage here is cumulative: set, never add.
                if let Some(u) = ev.usage {
                    self.usage.extend(u);
                }
                match ev.delta.and_then(|d| d.stop_reason) {
                    Some(stop) => self.chunk_event("{}", Some(finish_reason(&stop))),
                    None => Vec::new(),
                }
            }
            "message_stop" => {
                self.ended = true;
                let mut out = Vec::new();
                if self.emit_usage {
                    let v = json!({"id": self.id, "object": "chat.completion.chunk", "created": self.created, "model": self.model,
                        "choices": [], "usage": usage(&Value::Object(self.usage.clone()))});
                    out.extend(format!("data: {v}\n\n").into_bytes());
                }
                out.extend_from_slice(b"data: [DONE]\n\n");
                out
            }
            "error" => {
                self.ended = true;
                let e = ev.error.unwrap_or(Value::Null);
                let message = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("The provider's stream failed.");
                let code = e.get("type").and_then(Value::as_str).unwrap_or("api_error");
                let body = json!({"error": {"message": message, "type": "api_error", "code": code, "param": null}});
                format!("data: {body}\n\n").into_bytes()
            }
            // `ping`, `content_block_stop` and event types added later.
            _ => Vec::new(),
        }
    }
}

fn error_event(message: &str) -> Vec<u8> {
    let body = json!({"error": {"message": message, "type": "api_error", "code": "provider_stream_error", "param": null}});
    format!("data: {body}\n\n").into_bytes()
}

/// The usage of a Messages stream passed on as it is (`/v1/messages`):
/// `message_start` gives the input side, `message_delta` the cumulative
/// output (set, never added).
#[derive(Debug, Default)]
pub struct StreamUsage {
    parser: SseParser,
    usage: Map<String, Value>,
    seen: bool,
}

impl StreamUsage {
    pub fn push(&mut self, bytes: &[u8]) {
        self.parser.push(bytes);
        while let Some((_, data)) = self.parser.next_event() {
            let Some(d) = data else { continue };
            let Ok(ev) = serde_json::from_str::<Event<'_>>(&d) else {
                continue;
            };
            let usage = match ev.kind.as_ref() {
                "message_start" => ev
                    .message
                    .and_then(|m| m.get("usage").and_then(Value::as_object).cloned()),
                "message_delta" => ev.usage,
                _ => None,
            };
            if let Some(u) = usage {
                self.seen = true;
                self.usage.extend(u);
            }
        }
    }

    /// The usage as the stream reported it, if it did.
    pub fn usage(&self) -> Option<crate::usage::Usage> {
        self.seen
            .then(|| crate::usage::Usage::from_usage(&Value::Object(self.usage.clone())))
            .flatten()
    }
}
