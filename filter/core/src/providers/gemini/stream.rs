//! A `streamGenerateContent?alt=sse` stream as chat-completion chunks,
//! event by event, split anywhere across network chunks. Each of Gemini's
//! events is a whole answer object holding the parts generated since the
//! last; the one with a `finishReason` ends the answer, and the stream's
//! end then gives the usage chunk (when asked) and `[DONE]`. A stream that
//! ends without a `finishReason` ends with an error event.

use super::{call_id, finish_reason, google_error, Answer, UsageMetadata};
use crate::wire::chat::CallFunction;
use crate::wire::sse::SseParser;
use serde::Serialize;
use serde_json::value::RawValue;
use std::borrow::Cow;

#[derive(Debug, Default)]
pub struct Stream {
    parser: SseParser,
    created: u64,
    /// Emit the usage chunk before `[DONE]`.
    emit_usage: bool,
    /// Each chunk's JSON up to its `delta` (id, created, model), once the
    /// first event named them.
    head: Option<String>,
    response_id: Option<String>,
    /// Tool calls so far (the next call's index).
    calls: usize,
    finished: bool,
    /// The latest usage (Gemini's counts are cumulative: set, never added).
    usage: Option<UsageMetadata>,
    /// `modelVersion` as JSON text (`null` until an event names it).
    model: String,
    ended: bool,
}

#[derive(Serialize)]
struct CallDelta<'a> {
    tool_calls: [DeltaCall<'a>; 1],
}

#[derive(Serialize)]
struct DeltaCall<'a> {
    index: usize,
    id: String,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct TextDelta<'a> {
    content: Cow<'a, str>,
}

impl Stream {
    pub fn new(created: u64, emit_usage: bool) -> Self {
        Self {
            created,
            emit_usage,
            ..Self::default()
        }
    }

    fn id(&self) -> String {
        format!(
            "chatcmpl-{}",
            self.response_id.as_deref().unwrap_or("gemini")
        )
    }

    /// One chunk: `delta` is JSON; `finish` a finish reason or none.
    fn chunk_event(&self, delta: &str, finish: Option<&str>) -> Vec<u8> {
        crate::wire::chat::chunk_event(self.head.as_deref().unwrap_or_default(), delta, finish)
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
            return error_event(
                "The provider's stream has an event too large to read.",
                None,
            );
        }
        while let Some((_, data)) = self.parser.next_event() {
            let Some(d) = data else { continue };
            out.extend(self.event(&d));
            if self.ended {
                break;
            }
        }
        out
    }

    /// The end of the provider's stream: the usage chunk (when asked) and
    /// `[DONE]`, or an error event when no event finished the answer.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        if !self.finished {
            return error_event(
                "The provider's stream ended before its end (no finishReason).",
                None,
            );
        }
        let usage = self
            .emit_usage
            .then(|| serde_json::to_string(&self.usage.unwrap_or_default().chat()).ok())
            .flatten();
        let id = serde_json::to_string(&self.id()).unwrap_or_else(|_| "\"\"".into());
        crate::wire::chat::stream_end(&id, self.created, &self.model, usage.as_deref())
    }

    fn event(&mut self, data: &str) -> Vec<u8> {
        let Ok(ev) = serde_json::from_str::<Answer>(data) else {
            return match google_error(data) {
                Some(e) => self.failed(e.message.0, e.status.0),
                None => Vec::new(),
            };
        };
        if ev.error.is_some() {
            let e = google_error(data).unwrap_or_default();
            return self.failed(e.message.0, e.status.0);
        }
        let mut out = Vec::new();
        if self.head.is_none() {
            self.response_id = ev.response_id.0.as_deref().map(String::from);
            self.model = ev.model_version.map_or("null", RawValue::get).to_string();
            self.head = Some(format!(
                r#"data: {{"id":"{}","object":"chat.completion.chunk","created":{},"model":{},"choices":[{{"index":0,"delta":"#,
                json_escape(&self.id()),
                self.created,
                self.model,
            ));
            out.extend(self.chunk_event(r#"{"role":"assistant","content":""}"#, None));
        }
        if let Some(u) = ev.usage_metadata {
            self.usage = Some(u);
        }
        let candidate = ev.candidates.into_iter().next();
        let mut reason = None;
        if let Some(c) = candidate {
            for p in c.content.unwrap_or_default().parts {
                if let Some(call) = p.function_call {
                    let delta = CallDelta {
                        tool_calls: [DeltaCall {
                            index: self.calls,
                            id: call_id(
                                self.response_id.as_deref(),
                                self.calls,
                                p.thought_signature.0.as_deref(),
                            ),
                            kind: "function",
                            function: CallFunction::new(call.name, call.args),
                        }],
                    };
                    self.calls = self.calls.saturating_add(1);
                    if let Ok(d) = serde_json::to_string(&delta) {
                        out.extend(self.chunk_event(&d, None));
                    }
                } else if p.thought != Some(true) {
                    if let Some(text) = p.text.0.filter(|t| !t.is_empty()) {
                        if let Ok(d) = serde_json::to_string(&TextDelta { content: text }) {
                            out.extend(self.chunk_event(&d, None));
                        }
                    }
                }
            }
            reason = c.finish_reason.0;
        } else if ev.prompt_feedback.is_some() {
            // No candidate: the prompt was blocked.
            reason = Some(Cow::Borrowed("SAFETY"));
        }
        if let Some(r) = reason.filter(|_| !self.finished) {
            self.finished = true;
            out.extend(self.chunk_event("{}", Some(finish_reason(&r, self.calls > 0))));
        }
        out
    }

    /// An error event in the stream: it ends the client's stream.
    fn failed(&mut self, message: Option<Cow<str>>, status: Option<Cow<str>>) -> Vec<u8> {
        self.ended = true;
        error_event(
            message
                .as_deref()
                .unwrap_or("The provider's stream failed."),
            status.as_deref(),
        )
    }
}

fn json_escape(s: &str) -> String {
    let quoted = serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into());
    quoted
        .strip_prefix('"')
        .and_then(|q| q.strip_suffix('"'))
        .unwrap_or_default()
        .to_string()
}

/// An OpenAI error event that ends a translated stream (`code` default
/// `provider_stream_error`).
pub(crate) fn error_event(message: &str, code: Option<&str>) -> Vec<u8> {
    crate::wire::chat::error_event(message, code.unwrap_or("provider_stream_error"))
}
