//! OpenAI chat completions to Anthropic's Messages API and back: the
//! request, a whole answer, a stream (event by event, split anywhere across
//! network chunks), and errors.

use crate::api::Api;
use crate::config::{Provider, Schema};
use crate::error::GatewayError;
use crate::request::ChatRequest;
use crate::wire::sse::SseParser;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use std::borrow::Cow;

pub(crate) use crate::wire::anthropic::READ;
pub use crate::wire::anthropic::{answer, finish_reason, request, usage};

/// Anthropic's Messages API as a provider format: `/v1/messages` passes
/// to it as it is, chat completions are translated both ways.
pub struct Anthropic;

impl super::Format for Anthropic {
    fn path(&self, p: &Provider, api: Api, _model_id: &str, _stream: bool) -> String {
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
        let (body, dropped) = request(chat.body(), model_id, options)?;
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

    fn stream(&self, created: u64, emit_usage: bool) -> Option<super::FormatStream> {
        Some(super::FormatStream::Anthropic(Stream::new(
            created, emit_usage,
        )))
    }
}

pub use crate::wire::anthropic::Options;

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
        crate::wire::chat::chunk_event(&self.head, delta, finish)
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
                let usage = self
                    .emit_usage
                    .then(|| usage(&Value::Object(self.usage.clone())).to_string());
                crate::wire::chat::stream_end(
                    &self.id.to_string(),
                    self.created,
                    &self.model.to_string(),
                    usage.as_deref(),
                )
            }
            "error" => {
                self.ended = true;
                let e = ev.error.unwrap_or(Value::Null);
                let message = e
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("The provider's stream failed.");
                let code = e.get("type").and_then(Value::as_str).unwrap_or("api_error");
                crate::wire::chat::error_event(message, code)
            }
            // `ping`, `content_block_stop` and event types added later.
            _ => Vec::new(),
        }
    }
}

fn error_event(message: &str) -> Vec<u8> {
    crate::wire::chat::error_event(message, "provider_stream_error")
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
