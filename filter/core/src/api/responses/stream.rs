//! The Responses API's streams: a chat completions stream translated into
//! Responses events ([`FromChatStream`]), and the usage read from a
//! Responses stream as it passes ([`StreamUsage`]).

use super::{call_item, message_item, response, usage, Echo, End};
use crate::wire::sse::SseParser;
use serde_json::{json, Map, Value};

/// One output item being streamed.
#[derive(Debug)]
enum Item {
    Message {
        id: String,
        text: String,
    },
    Call {
        call_id: Value,
        name: Value,
        arguments: String,
    },
}

/// A chat completions stream as Responses events, chunk by chunk (split
/// anywhere, it reads the same).
#[derive(Debug, Default)]
pub struct FromChatStream {
    parser: SseParser,
    created: u64,
    id: String,
    model: Value,
    started: bool,
    /// Items done, and the one open.
    done: Vec<Value>,
    open: Option<Item>,
    /// Chat tool index -> output index.
    tools: Vec<(u64, usize)>,
    usage: Option<Value>,
    finish: Option<String>,
    sequence: u64,
    ended: bool,
    /// The request's settings, in every snapshot.
    echo: Map<String, Value>,
}

impl FromChatStream {
    /// A stream started at `created` (seconds), for a request with these
    /// settings.
    pub fn new(created: u64, echo: &Echo) -> Self {
        Self {
            created,
            echo: echo.map(),
            ..Self::default()
        }
    }

    fn event(&mut self, kind: &str, mut v: Value) -> Vec<u8> {
        if let Some(o) = v.as_object_mut() {
            o.insert("type".into(), json!(kind));
            o.insert("sequence_number".into(), json!(self.sequence));
        }
        self.sequence = self.sequence.saturating_add(1);
        format!("event: {kind}\ndata: {v}\n\n").into_bytes()
    }

    fn snapshot(&self, end: End<'_>, usage: Option<Value>) -> Value {
        response(
            &self.id,
            &self.model,
            self.created,
            end,
            self.done.clone(),
            usage,
            &self.echo,
        )
    }

    /// The events for these bytes of the provider's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        crate::api::push_chat(self, bytes)
    }

    /// At the stream's end: a failure event if it never finished.
    pub fn finish(&mut self) -> Vec<u8> {
        crate::api::finish_chat(self)
    }
    fn fail_with(&mut self, message: &str) -> Vec<u8> {
        self.ended = true;
        if !self.started {
            self.start_snapshot(None);
        }
        let r = self.snapshot(End::Failed(message), None);
        self.event("response.failed", json!({"response": r}))
    }

    /// The response's id and model, from the first chunk (`None`: the
    /// stream failed before one).
    fn start_snapshot(&mut self, c: Option<&Value>) {
        self.id = format!(
            "resp_{}",
            c.and_then(|c| c.get("id"))
                .and_then(Value::as_str)
                .unwrap_or("gateway")
        );
        self.model = json!(c
            .and_then(|c| c.get("model"))
            .and_then(Value::as_str)
            .unwrap_or_default());
    }

    fn on_start(&mut self, c: &Value) -> Vec<u8> {
        self.started = true;
        self.start_snapshot(Some(c));
        let r = self.snapshot(End::InProgress, None);
        let mut out = self.event("response.created", json!({"response": r}));
        let r = self.snapshot(End::InProgress, None);
        out.extend(self.event("response.in_progress", json!({"response": r})));
        out
    }

    fn on_text(&mut self, t: &str) -> Vec<u8> {
        let mut out = Vec::new();
        if !matches!(self.open, Some(Item::Message { .. })) {
            out.extend(self.close());
            let id = format!("msg_{}", self.id.trim_start_matches("resp_"));
            let index = self.done.len();
            out.extend(self.event("response.output_item.added", json!({"output_index": index,
                "item": {"type": "message", "id": id, "status": "in_progress", "role": "assistant", "content": []}})));
            out.extend(self.event("response.content_part.added", json!({"item_id": id, "output_index": index,
                "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}})));
            self.open = Some(Item::Message {
                id,
                text: String::new(),
            });
        }
        let index = self.done.len();
        let id = match self.open.as_mut() {
            Some(Item::Message { id, text }) => {
                text.push_str(t);
                id.clone()
            }
            _ => String::new(),
        };
        out.extend(self.event(
            "response.output_text.delta",
            json!({"item_id": id, "output_index": index,
            "content_index": 0, "delta": t}),
        ));
        out
    }

    fn on_call(&mut self, call: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        let tool = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        if !self.tools.iter().any(|(t, _)| *t == tool) {
            out.extend(self.close());
            let index = self.done.len();
            self.tools.push((tool, index));
            let call_id = call
                .get("id")
                .filter(|i| i.is_string())
                .cloned()
                .unwrap_or_else(|| {
                    json!(format!(
                        "call_{}_{index}",
                        self.id.trim_start_matches("resp_")
                    ))
                });
            let name = json!(call
                .pointer("/function/name")
                .and_then(Value::as_str)
                .unwrap_or_default());
            let item = call_item(&call_id, &name, "", "in_progress");
            out.extend(self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": item}),
            ));
            self.open = Some(Item::Call {
                call_id,
                name,
                arguments: String::new(),
            });
        }
        if let Some(a) = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
        {
            let index = self.done.len();
            let item_id = match self.open.as_mut() {
                Some(Item::Call {
                    call_id, arguments, ..
                }) => {
                    arguments.push_str(a);
                    format!("fc_{}", call_id.as_str().unwrap_or("call"))
                }
                _ => String::new(),
            };
            out.extend(self.event(
                "response.function_call_arguments.delta",
                json!({"item_id": item_id,
                "output_index": index, "delta": a}),
            ));
        }
        out
    }

    /// The open item's closing events; it joins the done items.
    fn close(&mut self) -> Vec<u8> {
        let index = self.done.len();
        let mut out = Vec::new();
        match self.open.take() {
            None => return out,
            Some(Item::Message { id, text }) => {
                out.extend(self.event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": index,
                    "content_index": 0, "text": text}),
                ));
                out.extend(self.event("response.content_part.done", json!({"item_id": id, "output_index": index,
                    "content_index": 0, "part": {"type": "output_text", "text": text, "annotations": []}})));
                let item = message_item(&id, &text, "completed");
                out.extend(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item.clone()}),
                ));
                self.done.push(item);
            }
            Some(Item::Call {
                call_id,
                name,
                arguments,
            }) => {
                let item = call_item(&call_id, &name, &arguments, "completed");
                let item_id = item.get("id").cloned().unwrap_or(Value::Null);
                out.extend(self.event(
                    "response.function_call_arguments.done",
                    json!({"item_id": item_id,
                    "output_index": index, "arguments": arguments}),
                ));
                out.extend(self.event(
                    "response.output_item.done",
                    json!({"output_index": index, "item": item.clone()}),
                ));
                self.done.push(item);
            }
        }
        out
    }

    fn on_end(&mut self) -> Vec<u8> {
        if !self.started {
            return self.fail_with("The provider's stream ended without an answer.");
        }
        let mut out = self.close();
        self.ended = true;
        let usage = usage(self.usage.as_ref());
        let length = self.finish.as_deref() == Some("length");
        // Completed when the stream ends; the stream knows the time it
        // started only (a translation has no clock of its own).
        let (kind, end) = if length {
            ("response.incomplete", End::Incomplete(self.created))
        } else {
            ("response.completed", End::Completed(self.created))
        };
        let r = self.snapshot(end, Some(usage));
        out.extend(self.event(kind, json!({"response": r})));
        out
    }
}

/// The usage of a Responses stream (passed through or translated): from
/// its `response.completed` (or `incomplete`, `failed`) event.
#[derive(Debug, Default)]
pub struct StreamUsage {
    parser: SseParser,
    usage: Option<crate::usage::Usage>,
}

impl StreamUsage {
    pub fn push(&mut self, bytes: &[u8]) {
        self.parser.push(bytes);
        while let Some((_, data)) = self.parser.next_event() {
            let Some(d) = data else { continue };
            let Ok(v) = serde_json::from_str::<Value>(&d) else {
                continue;
            };
            let last = matches!(
                v.get("type").and_then(Value::as_str),
                Some("response.completed" | "response.incomplete" | "response.failed")
            );
            if let Some(u) = v.pointer("/response/usage").filter(|_| last) {
                self.usage = crate::usage::Usage::from_usage(u);
            }
        }
    }

    pub fn usage(&self) -> Option<crate::usage::Usage> {
        self.usage
    }
}

impl crate::api::FromChat for FromChatStream {
    fn parser(&mut self) -> &mut SseParser {
        &mut self.parser
    }
    fn ended(&self) -> bool {
        self.ended
    }
    fn started(&self) -> bool {
        self.started
    }
    fn finished(&self) -> bool {
        self.finish.is_some()
    }
    fn start(&mut self, c: &Value) -> Vec<u8> {
        self.on_start(c)
    }
    fn usage(&mut self, u: &Value) {
        self.usage = Some(u.clone());
    }
    fn text(&mut self, t: &str) -> Vec<u8> {
        self.on_text(t)
    }
    fn call(&mut self, call: &Value) -> Vec<u8> {
        self.on_call(call)
    }
    fn finish_reason(&mut self, reason: &str) -> Vec<u8> {
        self.finish = Some(reason.to_string());
        self.close()
    }
    fn end(&mut self) -> Vec<u8> {
        self.on_end()
    }
    fn fail(&mut self, message: &str) -> Vec<u8> {
        self.fail_with(message)
    }
}
