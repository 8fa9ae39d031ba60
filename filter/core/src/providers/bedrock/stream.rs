//! A ConverseStream answer (AWS's binary event stream, [`crate::wire::eventstream`])
//! as chat-completion chunks, frame by frame, split anywhere across network
//! chunks. `messageStart` opens the answer, `contentBlockStart` opens a
//! tool call, `contentBlockDelta` carries text or a call's input JSON,
//! `messageStop` the stop reason and `metadata` the usage; the stream's end
//! then gives the usage chunk (when asked) and `[DONE]`. An exception
//! frame, a frame that does not decode (a CRC, a length) or a stream that
//! ends before `messageStop` ends the client's stream with an error event.

use super::{answer_id, finish_reason, ToolUse, Usage};
use crate::wire::borrowed::{Count, Str};
use crate::wire::eventstream::{Decoder, Message};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;

#[derive(Debug, Default)]
pub struct Stream {
    decoder: Decoder,
    created: u64,
    /// Emit the usage chunk before `[DONE]`.
    emit_usage: bool,
    model: String,
    /// Each chunk's JSON up to its `delta`, once the answer has started.
    head: Option<String>,
    id: String,
    /// The content block index of each tool call, in call order.
    calls: Vec<u64>,
    finished: bool,
    usage: Option<Usage>,
    ended: bool,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Event<'a> {
    #[serde(default)]
    content_block_index: Count,
    #[serde(borrow, default)]
    start: Option<Start<'a>>,
    #[serde(borrow, default)]
    delta: Option<Delta<'a>>,
    #[serde(borrow, default)]
    stop_reason: Str<'a>,
    #[serde(default)]
    usage: Option<Usage>,
    #[serde(borrow, default)]
    message: Str<'a>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Start<'a> {
    #[serde(borrow, default)]
    tool_use: Option<ToolUse<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Delta<'a> {
    #[serde(borrow, default)]
    text: Str<'a>,
    #[serde(borrow, default)]
    tool_use: Option<InputDelta<'a>>,
}

#[derive(Deserialize, Default)]
struct InputDelta<'a> {
    #[serde(borrow, default)]
    input: Str<'a>,
}

#[derive(Serialize)]
struct TextDelta<'a> {
    content: Cow<'a, str>,
}

#[derive(Serialize)]
struct CallDelta<'a> {
    tool_calls: [DeltaCall<'a>; 1],
}

#[derive(Serialize)]
struct DeltaCall<'a> {
    index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    id: Option<Cow<'a, str>>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    kind: Option<&'static str>,
    function: FunctionDelta<'a>,
}

#[derive(Serialize)]
struct FunctionDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Cow<'a, str>>,
    arguments: Cow<'a, str>,
}

impl Stream {
    pub fn new(created: u64, emit_usage: bool, model: &str) -> Self {
        Self {
            created,
            emit_usage,
            model: model.to_string(),
            ..Self::default()
        }
    }

    fn chunk(&self, delta: &str, finish: Option<&str>) -> Vec<u8> {
        crate::wire::chat::chunk_event(self.head.as_deref().unwrap_or_default(), delta, finish)
    }

    fn start(&mut self) -> Vec<u8> {
        if self.head.is_some() {
            return Vec::new();
        }
        self.id = answer_id(self.model.as_bytes(), self.created);
        let model = serde_json::to_string(&self.model).unwrap_or_else(|_| "\"\"".into());
        self.head = Some(format!(
            r#"data: {{"id":"{}","object":"chat.completion.chunk","created":{},"model":{model},"choices":[{{"index":0,"delta":"#,
            self.id, self.created,
        ));
        self.chunk(r#"{"role":"assistant","content":""}"#, None)
    }

    /// The chunks for these bytes of the provider's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        let frames = match self.decoder.push(bytes) {
            Ok(f) => f,
            Err(e) => {
                self.ended = true;
                return error_event(
                    &format!(
                        "The provider's event stream cannot be read: {}.",
                        e.describe()
                    ),
                    "provider_stream_error",
                );
            }
        };
        let mut out = Vec::new();
        for m in frames {
            out.extend(self.frame(&m));
            if self.ended {
                break;
            }
        }
        out
    }

    /// The end of the provider's stream: the usage chunk (when asked) and
    /// `[DONE]`, or an error event when the answer did not finish.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        self.ended = true;
        if !self.finished || self.decoder.pending() {
            return error_event(
                "The provider's stream ended before its end (no messageStop).",
                "provider_stream_error",
            );
        }
        let usage = self
            .emit_usage
            .then(|| serde_json::to_string(&self.usage.unwrap_or_default().chat()).ok())
            .flatten();
        let id = serde_json::to_string(&self.id).unwrap_or_else(|_| "\"\"".into());
        let model = serde_json::to_string(&self.model).unwrap_or_else(|_| "\"\"".into());
        crate::wire::chat::stream_end(&id, self.created, &model, usage.as_deref())
    }

    fn frame(&mut self, m: &Message) -> Vec<u8> {
        let text = std::str::from_utf8(&m.payload).unwrap_or("");
        let ev: Event = serde_json::from_str(text).unwrap_or_default();
        match m.header(":message-type") {
            Some("exception") => {
                self.ended = true;
                let kind = m.header(":exception-type").unwrap_or("exception");
                let message = ev
                    .message
                    .0
                    .unwrap_or(Cow::Borrowed("The provider's stream failed."));
                return error_event(&message, &exception_code(kind));
            }
            Some("error") => {
                self.ended = true;
                return error_event(
                    m.header(":error-message")
                        .unwrap_or("The provider's stream failed."),
                    m.header(":error-code").unwrap_or("provider_stream_error"),
                );
            }
            _ => {}
        }
        let mut out = self.start();
        match m.header(":event-type").unwrap_or("") {
            "contentBlockStart" => {
                if let Some(t) = ev.start.and_then(|s| s.tool_use) {
                    let index = self.calls.len();
                    self.calls.push(ev.content_block_index.0.unwrap_or(0));
                    let delta = CallDelta {
                        tool_calls: [DeltaCall {
                            index,
                            id: Some(t.tool_use_id.0.unwrap_or_default()),
                            kind: Some("function"),
                            function: FunctionDelta {
                                name: Some(t.name.0.unwrap_or_default()),
                                arguments: Cow::Borrowed(""),
                            },
                        }],
                    };
                    if let Ok(d) = serde_json::to_string(&delta) {
                        out.extend(self.chunk(&d, None));
                    }
                }
            }
            "contentBlockDelta" => {
                let Some(d) = ev.delta else { return out };
                if let Some(input) = d.tool_use.and_then(|t| t.input.0) {
                    let block = ev.content_block_index.0.unwrap_or(0);
                    let index = self
                        .calls
                        .iter()
                        .position(|b| *b == block)
                        .unwrap_or(self.calls.len().saturating_sub(1));
                    let delta = CallDelta {
                        tool_calls: [DeltaCall {
                            index,
                            id: None,
                            kind: None,
                            function: FunctionDelta {
                                name: None,
                                arguments: input,
                            },
                        }],
                    };
                    if let Ok(d) = serde_json::to_string(&delta) {
                        out.extend(self.chunk(&d, None));
                    }
                } else if let Some(t) = d.text.0.filter(|t| !t.is_empty()) {
                    if let Ok(d) = serde_json::to_string(&TextDelta { content: t }) {
                        out.extend(self.chunk(&d, None));
                    }
                }
            }
            "messageStop" if !self.finished => {
                self.finished = true;
                let reason = finish_reason(ev.stop_reason.0.as_deref().unwrap_or("end_turn"));
                out.extend(self.chunk("{}", Some(reason)));
            }
            "metadata" => {
                if let Some(u) = ev.usage {
                    self.usage = Some(u);
                }
            }
            _ => {}
        }
        out
    }
}

/// An exception's type (`throttlingException`) as an error code
/// (`ThrottlingException`), as the whole answers' errors name it.
fn exception_code(kind: &str) -> String {
    let mut c = kind.chars();
    match c.next() {
        Some(first) => first.to_ascii_uppercase().to_string() + c.as_str(),
        None => "provider_stream_error".into(),
    }
}

fn error_event(message: &str, code: &str) -> Vec<u8> {
    crate::wire::chat::error_event(message, code)
}
