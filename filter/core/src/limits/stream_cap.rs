//! A stream's completion held to the cap its limits set. The gateway sends
//! the provider the cap (`max_tokens_mode: clamp`), and a provider that
//! honours it never reaches this; one that ignores it is ended cleanly once
//! its streamed output passes the cap: a last event that says the answer
//! stopped at its length (`finish_reason: "length"`, Anthropic's
//! `stop_reason: "max_tokens"`) with the usage counted so far, then the
//! stream's end marker, in the client's API shape — never a cut
//! connection. Nothing after it reaches the client.
//!
//! Output is counted as the bytes of streamed text and tool-call arguments,
//! four to a token (rounded up). Tokenizers differ, so a stream is ended
//! only past the cap with an eighth of it and 8 tokens to spare: a provider
//! that honours the cap is never cut short.
// Untrusted numbers (a provider's stream) meet here.
#![deny(clippy::arithmetic_side_effects)]

use crate::wire::sse::SseParser;
use serde_json::{json, Value};

/// The client's stream format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// Chat completion chunks, ending with `data: [DONE]`.
    Chat,
    /// Anthropic's Messages events, ending with `message_stop`.
    Messages,
}

#[derive(Debug)]
pub struct StreamCap {
    shape: Shape,
    /// Estimated tokens past which the stream ends.
    limit: u64,
    prompt_est: u64,
    /// Whether the client asked for the usage chunk (chat).
    include_usage: bool,
    parser: SseParser,
    bytes: u64,
    /// The stream was ended here; later bytes are dropped.
    pub ended: bool,
    /// The first chunk's id, model and creation time (chat).
    id: String,
    model: String,
    created: u64,
    /// The Messages content block left open, if any.
    open_block: Option<u64>,
}

/// The most a stream capped at `cap` tokens delivers before it is ended:
/// the cap, an eighth of it and 8 tokens to spare.
pub fn allowance(cap: u64) -> u64 {
    cap.saturating_add(cap / 8).saturating_add(8)
}

/// The largest cap whose stream, allowance included, fits in `room`
/// tokens: a clamped stream never passes its limit, whatever the provider
/// does (0: none fits).
pub fn cap_within(room: u64) -> u64 {
    // Exact in 128 bits: `allowance` saturates, which would read as fitting.
    let fits = |n: u128| {
        n.saturating_add(n / 8)
            .saturating_add(8)
            .le(&u128::from(room))
    };
    let Some(r) = room.checked_sub(8) else {
        return 0;
    };
    // n + n/8 <= r: start just below 8r/9 and step up while it fits (at
    // most twice).
    let mut n = u128::from(r).saturating_mul(8) / 9;
    while fits(n.saturating_add(1)) {
        n = n.saturating_add(1);
    }
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl StreamCap {
    /// A cap of `cap` completion tokens on a stream of `shape`.
    pub fn new(shape: Shape, cap: u64, prompt_est: u64, include_usage: bool) -> StreamCap {
        StreamCap {
            shape,
            limit: allowance(cap),
            prompt_est,
            include_usage,
            parser: SseParser::default(),
            bytes: 0,
            ended: false,
            id: String::new(),
            model: String::new(),
            created: 0,
            open_block: None,
        }
    }

    /// Completion tokens streamed to the client, estimated.
    pub fn counted(&self) -> u64 {
        self.bytes.div_ceil(4)
    }

    /// What the client gets of these bytes.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        self.parser.push(bytes);
        if self.parser.overflowed {
            // An event too large to follow: stop counting, pass it on.
            self.ended = true;
            return bytes.to_vec();
        }
        let mut out = Vec::new();
        while let Some((raw, data)) = self.parser.next_event() {
            let output = data.as_deref().map_or(0, |d| self.read(d));
            let after = self.bytes.saturating_add(output);
            if after.div_ceil(4) > self.limit {
                out.extend(self.end());
                return out;
            }
            self.bytes = after;
            out.extend_from_slice(&raw);
        }
        out
    }

    /// The end of the provider's stream: what is still unfinished.
    pub fn finish(&mut self) -> Vec<u8> {
        if self.ended {
            return Vec::new();
        }
        self.parser.take_rest()
    }

    /// One event's output bytes; notes the ids and open blocks the ending
    /// needs.
    fn read(&mut self, data: &str) -> u64 {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            return 0;
        };
        let len = |v: Option<&Value>| v.and_then(Value::as_str).map_or(0, |s| s.len() as u64);
        match self.shape {
            Shape::Chat => {
                if self.id.is_empty() {
                    self.id = v.get("id").and_then(Value::as_str).unwrap_or("").into();
                    self.model = v.get("model").and_then(Value::as_str).unwrap_or("").into();
                    self.created = v.get("created").and_then(Value::as_u64).unwrap_or(0);
                }
                let Some(delta) = v.pointer("/choices/0/delta") else {
                    return 0;
                };
                let calls = delta
                    .get("tool_calls")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|c| len(c.pointer("/function/arguments")))
                    .fold(0u64, u64::saturating_add);
                len(delta.get("content"))
                    .saturating_add(len(delta.get("reasoning_content")))
                    .saturating_add(calls)
            }
            Shape::Messages => match v.get("type").and_then(Value::as_str) {
                Some("content_block_start") => {
                    self.open_block = v.get("index").and_then(Value::as_u64);
                    0
                }
                Some("content_block_stop") => {
                    self.open_block = None;
                    0
                }
                Some("content_block_delta") => {
                    let d = v.get("delta");
                    len(d.and_then(|d| d.get("text")))
                        .saturating_add(len(d.and_then(|d| d.get("partial_json"))))
                        .saturating_add(len(d.and_then(|d| d.get("thinking"))))
                }
                _ => 0,
            },
        }
    }

    /// The last events: stopped at the length, the usage so far, the end.
    fn end(&mut self) -> Vec<u8> {
        self.ended = true;
        let completion = self.counted();
        let mut out = String::new();
        match self.shape {
            Shape::Chat => {
                let chunk = |choices: Value, usage: Option<Value>| {
                    let mut c = json!({"id": self.id, "object": "chat.completion.chunk",
                        "created": self.created, "model": self.model, "choices": choices});
                    if let (Some(u), Some(o)) = (usage, c.as_object_mut()) {
                        o.insert("usage".into(), u);
                    }
                    format!("data: {c}\n\n")
                };
                out.push_str(&chunk(
                    json!([{"index": 0, "delta": {}, "finish_reason": "length"}]),
                    None,
                ));
                if self.include_usage {
                    let usage = json!({"prompt_tokens": self.prompt_est,
                        "completion_tokens": completion,
                        "total_tokens": self.prompt_est.saturating_add(completion)});
                    out.push_str(&chunk(json!([]), Some(usage)));
                }
                out.push_str("data: [DONE]\n\n");
            }
            Shape::Messages => {
                let event = |name: &str, data: Value| format!("event: {name}\ndata: {data}\n\n");
                if let Some(i) = self.open_block.take() {
                    out.push_str(&event(
                        "content_block_stop",
                        json!({"type": "content_block_stop", "index": i}),
                    ));
                }
                out.push_str(&event(
                    "message_delta",
                    json!({"type": "message_delta",
                        "delta": {"stop_reason": "max_tokens", "stop_sequence": null},
                        "usage": {"output_tokens": completion}}),
                ));
                out.push_str(&event("message_stop", json!({"type": "message_stop"})));
            }
        }
        out.into_bytes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn chat_chunk(text: &str) -> String {
        format!(
            "data: {}\n\n",
            json!({"id": "c1", "object": "chat.completion.chunk", "created": 7, "model": "m",
                "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": null}]})
        )
    }

    fn events(out: &[u8]) -> Vec<String> {
        String::from_utf8_lossy(out)
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn the_cap_within_a_room_keeps_the_allowance_inside_it() {
        for room in (0..2000).chain([u64::MAX - 1, u64::MAX]) {
            let n = cap_within(room);
            if room >= 8 {
                assert!(allowance(n) <= room, "room {room}: cap {n}");
                let next = u128::from(n) + 1;
                assert!(
                    next + next / 8 + 8 > u128::from(room),
                    "room {room}: {n} is not the largest"
                );
            } else {
                assert_eq!(n, 0);
            }
        }
        assert_eq!(cap_within(170), 144);
        assert_eq!(allowance(144), 170);
    }

    #[test]
    fn a_stream_within_its_cap_passes_unchanged() {
        // 100 tokens of 4 bytes under a cap of 100: nothing changes.
        let mut cap = StreamCap::new(Shape::Chat, 100, 10, false);
        let mut stream: String = (0..100).map(|_| chat_chunk("abcd")).collect();
        stream.push_str("data: [DONE]\n\n");
        let (a, b) = stream.as_bytes().split_at(777);
        let mut out = cap.push(a);
        out.extend(cap.push(b));
        out.extend(cap.finish());
        assert_eq!(out, stream.as_bytes());
        assert!(!cap.ended);
        assert_eq!(cap.counted(), 100);
    }

    #[test]
    fn a_provider_past_its_cap_is_ended_with_length_and_usage() {
        let mut cap = StreamCap::new(Shape::Chat, 40, 12, true);
        let stream: String = (0..200).map(|_| chat_chunk("abcd")).collect();
        let out = cap.push(stream.as_bytes());
        assert!(cap.ended);
        // 40 + 5 + 8 = 53 tokens pass, then the ending.
        assert_eq!(cap.counted(), 53);
        let ev = events(&out);
        assert_eq!(ev.len(), 53 + 3);
        let last: Value = serde_json::from_str(ev[53].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(
            (last["id"].as_str(), last["model"].as_str()),
            (Some("c1"), Some("m"))
        );
        let usage: Value = serde_json::from_str(ev[54].strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(usage["usage"]["completion_tokens"], 53);
        assert_eq!(usage["usage"]["prompt_tokens"], 12);
        assert_eq!(ev[55], "data: [DONE]");
        // Whatever follows is dropped.
        assert!(cap.push(chat_chunk("more").as_bytes()).is_empty());
        assert!(cap.finish().is_empty());
    }

    #[test]
    fn a_messages_stream_is_ended_with_its_block_closed() {
        let mut cap = StreamCap::new(Shape::Messages, 10, 5, false);
        let mut s = String::from("event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n");
        s.push_str("event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n");
        for _ in 0..50 {
            s.push_str("event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"abcdabcd\"}}\n\n");
        }
        let out = cap.push(s.as_bytes());
        assert!(cap.ended);
        let ev = events(&out);
        let tail: Vec<&str> = ev.iter().rev().take(3).map(String::as_str).collect();
        assert!(
            tail[2].starts_with("event: content_block_stop") && tail[2].contains("\"index\":0")
        );
        assert!(
            tail[1].contains("\"stop_reason\":\"max_tokens\"") && tail[1].contains("output_tokens")
        );
        assert!(tail[0].starts_with("event: message_stop"));
        // 10 + 1 + 8 = 19 tokens: 9 deltas of 2 tokens pass (18).
        assert_eq!(cap.counted(), 18);
    }
}
