//! The Messages API's stream from the pivot: a chat completions stream
//! translated into Anthropic's events ([`FromChatStream`]).

use super::{message_id, stop_reason, usage};
use crate::wire::sse::SseParser;
use serde_json::{json, Value};

/// A chat completions stream as Messages events, chunk by chunk (an event
/// split across network chunks at any byte reads the same).
#[derive(Debug, Default)]
pub struct FromChatStream {
    parser: SseParser,
    started: bool,
    /// The open content block: its index and whether it is text.
    open: Option<(u64, bool)>,
    next_index: u64,
    /// Chat tool index -> its content block index.
    tools: Vec<(u64, u64)>,
    stop: Option<&'static str>,
    usage: Option<Value>,
    ended: bool,
}

fn event(name: &str, v: &Value) -> Vec<u8> {
    format!("event: {name}\ndata: {v}\n\n").into_bytes()
}

impl FromChatStream {
    pub fn new() -> Self {
        Self::default()
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
        event(
            "error",
            &json!({"type": "error", "error": {"type": "api_error", "message": message}}),
        )
    }

    /// The open block if it is of this kind (text), else a new one; its index.
    fn block(&mut self, text: bool, call: Option<&Value>, out: &mut Vec<u8>) -> u64 {
        if let Some((i, true)) = self.open.filter(|_| text) {
            return i;
        }
        out.extend(self.close());
        let index = self.next_index;
        self.next_index = self.next_index.saturating_add(1);
        let block = match call {
            Some(c) => {
                json!({"type": "tool_use", "id": c.get("id").cloned().unwrap_or(Value::Null),
                "name": c.pointer("/function/name").cloned().unwrap_or(Value::Null), "input": {}})
            }
            None => json!({"type": "text", "text": ""}),
        };
        out.extend(event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": block}),
        ));
        self.open = Some((index, text));
        index
    }

    fn close(&mut self) -> Vec<u8> {
        match self.open.take() {
            Some((i, _)) => event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": i}),
            ),
            None => Vec::new(),
        }
    }

    /// `message_delta` with the stop reason and the usage, `message_stop`.
    fn on_end(&mut self) -> Vec<u8> {
        if !self.started {
            return self.fail_with("The provider's stream ended without an answer.");
        }
        self.ended = true;
        let mut out = self.close();
        let u = usage(self.usage.as_ref());
        out.extend(event(
            "message_delta",
            &json!({"type": "message_delta",
            "delta": {"stop_reason": self.stop.unwrap_or("end_turn"), "stop_sequence": null},
            "usage": u}),
        ));
        out.extend(event("message_stop", &json!({"type": "message_stop"})));
        out
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
        self.stop.is_some()
    }
    fn start(&mut self, c: &Value) -> Vec<u8> {
        self.started = true;
        let start = json!({"type": "message_start", "message": {
            "id": message_id(c.get("id").and_then(Value::as_str)), "type": "message", "role": "assistant",
            "model": c.get("model").cloned().unwrap_or(Value::Null), "content": [],
            "stop_reason": null, "stop_sequence": null,
            "usage": {"input_tokens": 0, "output_tokens": 0}}});
        event("message_start", &start)
    }
    fn usage(&mut self, u: &Value) {
        self.usage = Some(u.clone());
    }
    fn text(&mut self, t: &str) -> Vec<u8> {
        let mut out = Vec::new();
        let index = self.block(true, None, &mut out);
        out.extend(event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": index,
            "delta": {"type": "text_delta", "text": t}}),
        ));
        out
    }
    fn call(&mut self, call: &Value) -> Vec<u8> {
        let mut out = Vec::new();
        let tool = call.get("index").and_then(Value::as_u64).unwrap_or(0);
        let index = match self.tools.iter().find(|(t, _)| *t == tool) {
            Some((_, i)) => *i,
            None => {
                let i = self.block(false, Some(call), &mut out);
                self.tools.push((tool, i));
                i
            }
        };
        if let Some(args) = call
            .pointer("/function/arguments")
            .and_then(Value::as_str)
            .filter(|a| !a.is_empty())
        {
            out.extend(event(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index,
                "delta": {"type": "input_json_delta", "partial_json": args}}),
            ));
        }
        out
    }
    fn finish_reason(&mut self, reason: &str) -> Vec<u8> {
        self.stop = Some(stop_reason(reason));
        self.close()
    }
    fn end(&mut self) -> Vec<u8> {
        self.on_end()
    }
    fn fail(&mut self, message: &str) -> Vec<u8> {
        self.fail_with(message)
    }
}
