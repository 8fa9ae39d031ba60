//! Server-sent events for chat completions: an incremental parser for a
//! provider's stream, assembly of a stream into one completion (for the cache
//! and for usage), and replay of a stored completion as a stream.

use serde_json::{json, Value};

/// Bytes of one unfinished event kept at most; past that the stream is not
/// assembled (it passes through untouched all the same).
const MAX_EVENT_BYTES: usize = 1 << 20;

/// Incremental SSE parser: `push` chunks as they pass, `next_data` yields the
/// `data:` payload of each complete event.
#[derive(Debug, Default)]
pub struct SseParser {
    buf: Vec<u8>,
    pub overflowed: bool,
}

impl SseParser {
    pub fn push(&mut self, chunk: &[u8]) {
        if self.overflowed {
            return;
        }
        self.buf.extend_from_slice(chunk);
        if self.buf.len() > MAX_EVENT_BYTES && find_event_end(&self.buf).is_none() {
            self.overflowed = true;
            self.buf.clear();
        }
    }

    /// The data of the next complete event (several `data:` lines joined by
    /// `\n`), skipping events without data.
    pub fn next_data(&mut self) -> Option<String> {
        loop {
            if let (_, Some(d)) = self.next_event()? {
                return Some(d);
            }
        }
    }

    /// The next complete event: its raw bytes (separator included, to pass
    /// on as they came) and its data, if it has any.
    pub fn next_event(&mut self) -> Option<(Vec<u8>, Option<String>)> {
        let (end, sep) = find_event_end(&self.buf)?;
        let raw: Vec<u8> = self.buf.drain(..end + sep).collect();
        let text = String::from_utf8_lossy(raw.get(..end).unwrap_or_default());
        let mut data = Vec::new();
        for line in text.lines() {
            if let Some(d) = line.strip_prefix("data:") {
                data.push(d.strip_prefix(' ').unwrap_or(d));
            }
        }
        let data = (!data.is_empty()).then(|| data.join("\n"));
        Some((raw, data))
    }

    /// Bytes of an unfinished event (sent on as they are at the end).
    pub fn take_rest(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.buf)
    }
}

/// The usage-only chunk a provider sends when `stream_options.include_usage`
/// is set (`"choices": []` plus `usage`): dropped for clients that did not
/// ask for it, when the gateway asked on their behalf.
pub fn is_usage_only(data: &str) -> bool {
    data.contains("\"usage\"")
        && serde_json::from_str::<Value>(data).ok().is_some_and(|v| {
            v.get("choices")
                .and_then(Value::as_array)
                .is_some_and(Vec::is_empty)
                && v.get("usage").is_some_and(Value::is_object)
        })
}

/// Events of a stream, with the usage-only chunk dropped when `strip`; also
/// feeds every event's data to `assembly`. Partial events wait for the next
/// chunk (or `finish`).
#[derive(Debug, Default)]
pub struct Relay {
    parser: SseParser,
    pub assembly: Assembly,
    pub strip_usage: bool,
}

impl Relay {
    pub fn new(strip_usage: bool) -> Self {
        Self {
            strip_usage,
            ..Self::default()
        }
    }

    /// What to send on for this chunk (when stripping; otherwise the chunk
    /// passes unchanged and the return value can be ignored).
    pub fn chunk(&mut self, bytes: &[u8]) -> Vec<u8> {
        self.parser.push(bytes);
        if self.parser.overflowed {
            // Too large to follow: stop reading, send on what came.
            return bytes.to_vec();
        }
        let mut out = Vec::new();
        while let Some((raw, data)) = self.parser.next_event() {
            if let Some(d) = data {
                self.assembly.feed(&d);
                if self.strip_usage && is_usage_only(&d) {
                    continue;
                }
            }
            out.extend_from_slice(&raw);
        }
        out
    }

    pub fn finish(&mut self) -> Vec<u8> {
        self.parser.take_rest()
    }
}

fn find_event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// A streamed completion put back together.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Assembly {
    id: Option<String>,
    model: Option<String>,
    created: Option<u64>,
    content: String,
    finish_reason: Option<String>,
    pub usage: Option<Value>,
    /// Tool calls and other deltas we do not reassemble: never cached.
    unsupported: bool,
    pub done: bool,
}

impl Assembly {
    pub fn feed(&mut self, data: &str) {
        if data.trim() == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            self.unsupported = true;
            return;
        };
        if self.id.is_none() {
            self.id = v.get("id").and_then(Value::as_str).map(str::to_string);
            self.model = v.get("model").and_then(Value::as_str).map(str::to_string);
            self.created = v.get("created").and_then(Value::as_u64);
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            self.usage = Some(u.clone());
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return;
        };
        for c in choices {
            if c.get("index").and_then(Value::as_u64).unwrap_or(0) != 0 {
                self.unsupported = true;
                continue;
            }
            if let Some(delta) = c.get("delta").and_then(Value::as_object) {
                for (k, val) in delta {
                    match (k.as_str(), val) {
                        ("content", Value::String(s)) => self.content.push_str(s),
                        ("role" | "content" | "refusal", Value::Null) | ("role", _) => {}
                        _ => self.unsupported = true,
                    }
                }
            }
            if let Some(f) = c.get("finish_reason").and_then(Value::as_str) {
                self.finish_reason = Some(f.to_string());
            }
        }
    }

    /// What the stream said of itself: its id, model and finish reason.
    pub fn facts(&self) -> crate::usage::AnswerFacts {
        crate::usage::AnswerFacts {
            id: self.id.clone().unwrap_or_default(),
            model: self.model.clone().unwrap_or_default(),
            finish_reasons: self.finish_reason.iter().cloned().collect(),
        }
    }

    /// The completion in the non-streamed format, if the stream finished
    /// cleanly and held only text.
    pub fn completion(&self) -> Option<Vec<u8>> {
        if !self.done || self.unsupported {
            return None;
        }
        let finish = self.finish_reason.as_deref()?;
        let mut doc = json!({
            "id": self.id.clone().unwrap_or_default(),
            "object": "chat.completion",
            "created": self.created.unwrap_or(0),
            "model": self.model.clone().unwrap_or_default(),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": self.content}, "finish_reason": finish, "logprobs": null}],
        });
        if let (Some(u), Some(obj)) = (&self.usage, doc.as_object_mut()) {
            obj.insert("usage".into(), u.clone());
        }
        serde_json::to_vec(&doc).ok()
    }
}

/// `choices[0].message.content` of a non-streamed completion ("" if none).
pub fn completion_text(body: &[u8]) -> String {
    serde_json::from_slice::<Value>(body)
        .ok()
        .and_then(|v| {
            v.pointer("/choices/0/message/content")
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .unwrap_or_default()
}

/// Whether a message holds nothing but its role and text: what a replay can
/// reproduce. Tool calls, audio, a refusal or annotations would be lost.
fn text_only(message: &Value) -> bool {
    let Some(m) = message.as_object() else {
        return false;
    };
    m.get("content").is_some_and(Value::is_string)
        && m.iter().all(|(k, v)| match k.as_str() {
            "role" | "content" => true,
            _ => v.is_null() || v.as_array().is_some_and(Vec::is_empty),
        })
}

/// Replay a stored completion (non-streamed format) as an SSE stream: role,
/// content in pieces, finish reason, usage when asked, `[DONE]`. `None` when
/// the stream would not say what the completion says: more than one choice,
/// a message with more than text (tool calls, ...), or logprobs.
pub fn replay(completion: &[u8], include_usage: bool) -> Option<Vec<u8>> {
    let v: Value = serde_json::from_slice(completion).ok()?;
    let choices = v.get("choices")?.as_array()?;
    let [choice] = choices.as_slice() else {
        return None;
    };
    let message = choice.get("message")?;
    if !text_only(message) || choice.get("logprobs").is_some_and(|l| !l.is_null()) {
        return None;
    }
    let content = message.get("content")?.as_str().unwrap_or("");
    let finish = choice
        .get("finish_reason")
        .cloned()
        .unwrap_or(Value::String("stop".into()));
    let head = chunk_head(&v)?;
    let mut out = Vec::with_capacity(content.len() * 2 + head.len() * (content.len() / 24 + 4));
    let mut emit = |choices: &[u8], usage: Option<&Value>| -> Option<()> {
        out.extend_from_slice(&head);
        out.extend_from_slice(choices);
        out.extend_from_slice(b"]");
        if let Some(u) = usage {
            out.extend_from_slice(b",\"usage\":");
            serde_json::to_writer(&mut out, u).ok()?;
        }
        out.extend_from_slice(b"}\n\n");
        Some(())
    };
    emit(
        br#"{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}"#,
        None,
    )?;
    let mut piece_json = Vec::with_capacity(96);
    for piece in pieces(content, 24) {
        piece_json.clear();
        piece_json.extend_from_slice(br#"{"index":0,"delta":{"content":"#);
        serde_json::to_writer(&mut piece_json, piece).ok()?;
        piece_json.extend_from_slice(br#"},"finish_reason":null}"#);
        emit(&piece_json, None)?;
    }
    piece_json.clear();
    piece_json.extend_from_slice(br#"{"index":0,"delta":{},"finish_reason":"#);
    serde_json::to_writer(&mut piece_json, &finish).ok()?;
    piece_json.extend_from_slice(b"}");
    emit(&piece_json, None)?;
    if include_usage {
        if let Some(u) = v.get("usage") {
            emit(b"", Some(u))?;
        }
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    Some(out)
}

/// What every replayed chunk repeats, serialized once:
/// `data: {"object":"chat.completion.chunk","id":..,...,"choices":[`.
fn chunk_head(v: &Value) -> Option<Vec<u8>> {
    let mut head = b"data: {\"object\":\"chat.completion.chunk\"".to_vec();
    for k in ["id", "created", "model", "system_fingerprint"] {
        if let Some(x) = v.get(k) {
            head.extend_from_slice(b",\"");
            head.extend_from_slice(k.as_bytes());
            head.extend_from_slice(b"\":");
            serde_json::to_writer(&mut head, x).ok()?;
        }
    }
    head.extend_from_slice(b",\"choices\":[");
    Some(head)
}

/// Split text into pieces of about `size` bytes on char boundaries.
fn pieces(s: &str, size: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    while start < s.len() {
        let mut end = (start + size).min(s.len());
        while !s.is_char_boundary(end) {
            end += 1;
        }
        if let Some(p) = s.get(start..end) {
            out.push(p);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests;
