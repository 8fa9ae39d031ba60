//! Every text of a request the provider's model reads, enumerated once for
//! every check (built-in and external) and for the rewrite that redacts:
//!
//! - `system` (Anthropic: a string or text blocks) and `instructions`
//!   (Responses); `prompt` (images, transcriptions), `query` and
//!   `documents` (rerank); `input` (embeddings, moderations, speech: a
//!   string or strings; Responses:
//!   message items read like messages, function calls' arguments, call
//!   outputs);
//! - each message's `content` (a string, or blocks: adjacent text parts are
//!   read joined, as the model reads them, so a value split across two
//!   parts is still one match), its `name`;
//! - assistant `tool_calls[].function.arguments` (and the legacy
//!   `function_call.arguments`): the JSON document in that string is read
//!   value by value (escapes decoded), or as plain text when it is not JSON;
//! - Anthropic `tool_use` inputs (every string inside) and `tool_result`
//!   contents (a string or blocks, read like a message's content).
//!
//! A new field the model reads is added here once.
//!
//! An answer's texts ([`answer_slots`]) are read the same way: the answer's
//! own text first (chat `message.content`, Messages `text` blocks,
//! Responses `output_text` parts), then what its tool calls carry (chat
//! `tool_calls[].function.arguments`, Messages `tool_use` inputs,
//! Responses `function_call` arguments).

use super::Span;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// One place the model reads text from.
pub enum Slot<'a> {
    /// A whole string.
    One(&'a mut String),
    /// Adjacent text parts, read joined (no separator).
    Parts(Vec<&'a mut String>),
    /// A string holding a JSON document (tool-call arguments).
    Json(&'a mut String),
}

/// Block types whose `text` the model reads.
pub const TEXT_BLOCKS: &[&str] = &["text", "input_text", "output_text"];

/// Block types other than text whose contents [`blocks_in_run`] reads
/// (`read::request_texts` leaves a request with one to it).
pub const TOOL_BLOCKS: &[&str] = &["tool_use", "tool_result"];

/// Every text slot of a request document (chat completions, messages,
/// Responses, embeddings). Texts the model reads one after the other are
/// read as one run across every boundary, as the model reads them:
/// `system`/`instructions` then each message or input item in order, a
/// string content or the text blocks of a content; a run ends at anything
/// else (an image, a tool call, a tool result). So a value split across
/// two messages or two Responses items is still one match (#46).
pub fn request_slots(doc: &mut Map<String, Value>) -> Vec<Slot<'_>> {
    let mut out = Vec::new();
    let mut run = Vec::new();
    // In reading order (the map's is alphabetical).
    let mut fields: Vec<(u8, &str, &mut Value)> = doc
        .iter_mut()
        .filter_map(|(k, v)| Some((field_rank(k)?, k.as_str(), v)))
        .collect();
    fields.sort_by_key(|(rank, _, _)| *rank);
    for (_, key, v) in fields {
        match (key, v) {
            ("system" | "instructions", v) => content_in_run(v, &mut run, &mut out),
            // Embeddings: a string or strings (token arrays are not text).
            // Images' and transcriptions' `prompt`, speech's `input`, a
            // rerank's `query`: one string.
            ("input" | "prompt" | "query", Value::String(s)) => run.push(s),
            // A rerank's documents: strings, or objects with `text`.
            ("documents", Value::Array(docs)) => {
                for d in docs.iter_mut() {
                    match d {
                        Value::String(s) => out.push(Slot::One(s)),
                        Value::Object(o) => {
                            if let Some(Value::String(s)) = o.get_mut("text") {
                                out.push(Slot::One(s));
                            }
                        }
                        _ => {}
                    }
                }
            }
            ("input", Value::Array(items)) => {
                for i in items.iter_mut() {
                    input_item_slots(i, &mut run, &mut out);
                }
            }
            ("messages", Value::Array(msgs)) => {
                for m in msgs.iter_mut() {
                    message_slots(m, &mut run, &mut out);
                }
            }
            _ => {}
        }
    }
    flush(&mut run, &mut out);
    out
}

/// A request member whose texts the model reads, and its place in the
/// reading order (`None`: no text of the member is read). The one list:
/// `read::request_texts` leaves every member named here but `system` and
/// `messages` to [`request_slots`].
pub fn field_rank(key: &str) -> Option<u8> {
    match key {
        "system" | "instructions" => Some(0),
        "input" | "messages" | "prompt" | "query" => Some(1),
        "documents" => Some(2),
        _ => None,
    }
}

/// A message's members [`request_slots`] reads (`read::request_texts`
/// reads `content` and leaves a message with any other of them to it).
pub const MESSAGE_FIELDS: &[&str] = &["content", "name", "tool_calls", "function_call"];

/// The shape of an answer and of its stream's events: the client's API's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Chat,
    Messages,
    Responses,
}

/// Every text slot of a whole answer in a shape, its own text first; the
/// number of those (length bounds and the JSON schema read only them).
pub fn answer_slots(shape: Shape, doc: &mut Value) -> (Vec<Slot<'_>>, usize) {
    let mut text = Vec::new();
    let mut tools = Vec::new();
    match shape {
        Shape::Chat => {
            if let Some(Value::Array(choices)) = doc.get_mut("choices") {
                for c in choices.iter_mut() {
                    let Some(Value::Object(m)) = c.get_mut("message") else {
                        continue;
                    };
                    for (key, v) in m.iter_mut() {
                        match (key.as_str(), v) {
                            ("content", Value::String(s)) => text.push(Slot::One(s)),
                            ("tool_calls", Value::Array(calls)) => {
                                for call in calls.iter_mut() {
                                    if let Some(Value::String(a)) =
                                        call.pointer_mut("/function/arguments")
                                    {
                                        tools.push(Slot::Json(a));
                                    }
                                }
                            }
                            ("function_call", v) => {
                                if let Some(Value::String(a)) = v.get_mut("arguments") {
                                    tools.push(Slot::Json(a));
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        Shape::Messages => {
            if let Some(Value::Array(blocks)) = doc.get_mut("content") {
                block_slots(blocks, &mut text, &mut tools);
            }
        }
        Shape::Responses => {
            if let Some(Value::Array(items)) = doc.get_mut("output") {
                for i in items.iter_mut() {
                    output_item_slots(i, &mut text, &mut tools);
                }
            }
        }
    }
    let n = text.len();
    text.append(&mut tools);
    (text, n)
}

/// One item of a response's `output`: a message's text parts, a function
/// call's arguments.
pub fn output_item_slots<'a>(
    item: &'a mut Value,
    text: &mut Vec<Slot<'a>>,
    tools: &mut Vec<Slot<'a>>,
) {
    match item.get("type").and_then(Value::as_str) {
        Some("message") => {
            if let Some(Value::Array(parts)) = item.get_mut("content") {
                block_slots(parts, text, tools);
            }
        }
        Some("function_call") => {
            if let Some(Value::String(a)) = item.get_mut("arguments") {
                tools.push(Slot::Json(a));
            }
        }
        _ => {}
    }
}

/// An item of `input`: a string (embeddings), or a Responses item: a
/// message, a function call (its arguments) or a call's output.
fn input_item_slots<'a>(
    item: &'a mut Value,
    run: &mut Vec<&'a mut String>,
    out: &mut Vec<Slot<'a>>,
) {
    let kind = match item.get("type").and_then(Value::as_str) {
        Some("function_call") => 1,
        Some("function_call_output") => 2,
        _ => 0,
    };
    match (kind, item) {
        (_, Value::String(s)) => run.push(s),
        (1, Value::Object(o)) => {
            flush(run, out);
            if let Some(Value::String(a)) = o.get_mut("arguments") {
                out.push(Slot::Json(a));
            }
        }
        (2, Value::Object(o)) => {
            flush(run, out);
            if let Some(v) = o.get_mut("output") {
                content_slots(v, out);
            }
        }
        (_, m @ Value::Object(_)) => message_slots(m, run, out),
        _ => {}
    }
}

/// A message: its content continues the run; its tool calls end it.
fn message_slots<'a>(m: &'a mut Value, run: &mut Vec<&'a mut String>, out: &mut Vec<Slot<'a>>) {
    let Value::Object(m) = m else { return };
    let mut content = None;
    let mut calls = Vec::new();
    for (key, v) in m.iter_mut() {
        match (key.as_str(), v) {
            ("content", v) => content = Some(v),
            ("name", Value::String(s)) => out.push(Slot::One(s)),
            ("tool_calls", Value::Array(cs)) => {
                for c in cs.iter_mut() {
                    if let Some(Value::String(a)) = c.pointer_mut("/function/arguments") {
                        calls.push(Slot::Json(a));
                    }
                }
            }
            ("function_call", v) => {
                if let Some(Value::String(a)) = v.get_mut("arguments") {
                    calls.push(Slot::Json(a));
                }
            }
            _ => {}
        }
    }
    // The content is read before the calls the message makes.
    if let Some(v) = content {
        content_in_run(v, run, out);
    }
    if !calls.is_empty() {
        flush(run, out);
        out.append(&mut calls);
    }
}

/// A content value read as part of the run: a string, or a list of blocks.
fn content_in_run<'a>(v: &'a mut Value, run: &mut Vec<&'a mut String>, out: &mut Vec<Slot<'a>>) {
    match v {
        Value::String(s) => run.push(s),
        Value::Array(blocks) => {
            let mut inner = Vec::new();
            blocks_in_run(blocks, run, out, &mut inner);
            out.append(&mut inner);
        }
        _ => {}
    }
}

/// A content value on its own (a tool result's): a string, or blocks.
fn content_slots<'a>(v: &'a mut Value, out: &mut Vec<Slot<'a>>) {
    let mut run = Vec::new();
    content_in_run(v, &mut run, out);
    flush(&mut run, out);
}

/// Content blocks: runs of text blocks read joined (into `text`);
/// `tool_use` inputs and `tool_result` contents into `tools` (an answer's
/// own text is its text blocks only).
fn block_slots<'a>(blocks: &'a mut [Value], text: &mut Vec<Slot<'a>>, tools: &mut Vec<Slot<'a>>) {
    let mut run = Vec::new();
    blocks_in_run(blocks, &mut run, text, tools);
    flush(&mut run, text);
}

/// Blocks in a run: text blocks join it; anything else ends it
/// (`tool_use` inputs and `tool_result` contents into `tools`).
fn blocks_in_run<'a>(
    blocks: &'a mut [Value],
    run: &mut Vec<&'a mut String>,
    text: &mut Vec<Slot<'a>>,
    tools: &mut Vec<Slot<'a>>,
) {
    for b in blocks.iter_mut() {
        let Value::Object(b) = b else {
            flush(run, text);
            continue;
        };
        let kind = b.get("type").and_then(Value::as_str).unwrap_or("");
        if TEXT_BLOCKS.contains(&kind) {
            if let Some(Value::String(t)) = b.get_mut("text") {
                run.push(t);
            }
            continue;
        }
        flush(run, text);
        // Each of TOOL_BLOCKS.
        match kind {
            "tool_use" => {
                if let Some(input) = b.get_mut("input") {
                    string_leaves(input, tools);
                }
            }
            "tool_result" => {
                if let Some(c) = b.get_mut("content") {
                    content_slots(c, tools);
                }
            }
            _ => {}
        }
    }
}

fn flush<'a>(run: &mut Vec<&'a mut String>, out: &mut Vec<Slot<'a>>) {
    match run.len() {
        0 => {}
        1 => {
            if let Some(s) = run.pop() {
                out.push(Slot::One(s));
            }
        }
        _ => out.push(Slot::Parts(std::mem::take(run))),
    }
}

/// Every string inside a JSON value (object keys are not read).
fn string_leaves<'a>(v: &'a mut Value, out: &mut Vec<Slot<'a>>) {
    match v {
        Value::String(s) => out.push(Slot::One(s)),
        Value::Array(items) => items.iter_mut().for_each(|i| string_leaves(i, out)),
        Value::Object(m) => m.values_mut().for_each(|i| string_leaves(i, out)),
        _ => {}
    }
}

/// Every string inside a JSON value, copied (object keys are not read).
pub(crate) fn strings_in<'s>(v: &Value, out: &mut Vec<Cow<'s, str>>) {
    match v {
        Value::String(s) => out.push(Cow::Owned(s.clone())),
        Value::Array(items) => items.iter().for_each(|i| strings_in(i, out)),
        Value::Object(m) => m.values().for_each(|i| strings_in(i, out)),
        _ => {}
    }
}

/// The texts the checks read, one per slot (a JSON slot: one per string
/// inside it).
pub fn texts<'s>(slots: &'s [Slot<'_>]) -> Vec<Cow<'s, str>> {
    let mut out = Vec::with_capacity(slots.len());
    for s in slots {
        match s {
            Slot::One(t) => out.push(Cow::Borrowed(t.as_str())),
            Slot::Parts(ps) => out.push(Cow::Owned(ps.iter().map(|p| p.as_str()).collect())),
            Slot::Json(t) => match serde_json::from_str::<Value>(t) {
                Ok(v) => strings_in(&v, &mut out),
                Err(_) => out.push(Cow::Borrowed(t.as_str())),
            },
        }
    }
    out
}

/// Where the texts of [`texts`] were joined: for each text, the offsets
/// in it where one part ends and the next begins (none for a text read
/// whole).
pub fn seams(slots: &[Slot<'_>]) -> Vec<Vec<usize>> {
    let mut out = Vec::with_capacity(slots.len());
    for s in slots {
        match s {
            Slot::One(_) => out.push(Vec::new()),
            Slot::Parts(ps) => {
                let mut at = 0usize;
                let mut bounds = Vec::with_capacity(ps.len());
                for p in ps.iter().take(ps.len().saturating_sub(1)) {
                    at = at.saturating_add(p.len());
                    bounds.push(at);
                }
                out.push(bounds);
            }
            Slot::Json(t) => match serde_json::from_str::<Value>(t) {
                Ok(v) => {
                    let mut n = Vec::new();
                    strings_in(&v, &mut n);
                    out.extend(n.iter().map(|_| Vec::new()));
                }
                Err(_) => out.push(Vec::new()),
            },
        }
    }
    out
}

/// The spans `find` gives for a text joined from parts at `seams`, read
/// the way the model reads them: each part alone (a value whole inside a
/// part is found as it would be alone, whatever its neighbours), and the
/// parts together (a value split across parts, or read differently in
/// its neighbour's context), where that overlaps nothing already found.
/// Offsets are the joined text's.
pub fn joined_spans<'c>(
    text: &str,
    seams: &[usize],
    find: &mut dyn FnMut(&str, &mut Vec<Span<'c>>),
    out: &mut Vec<Span<'c>>,
) {
    if seams.is_empty() {
        find(text, out);
        return;
    }
    let base = out.len();
    let mut found = Vec::new();
    let mut start = 0usize;
    for &end in seams.iter().chain(std::iter::once(&text.len())) {
        found.clear();
        find(text.get(start..end).unwrap_or_default(), &mut found);
        out.extend(found.iter().map(|s| Span {
            start: s.start.saturating_add(start),
            end: s.end.saturating_add(start),
            label: s.label,
        }));
        start = end;
    }
    // Then the parts read together: a match there counts unless it
    // overlaps one already found (a value whole in a part: `jane@example.com`
    // + `or…` is not read as one longer address; or the same match again).
    // Read in each two neighbouring parts (a match across one seam, whatever
    // follows them), then in the whole (across several).
    let bounds: Vec<usize> = std::iter::once(0)
        .chain(seams.iter().copied())
        .chain(std::iter::once(text.len()))
        .collect();
    let windows = bounds
        .windows(3)
        .filter_map(|w| Some((*w.first()?, *w.get(2)?)))
        .chain(std::iter::once((0, text.len())).filter(|_| seams.len() > 1));
    for (from, to) in windows {
        found.clear();
        find(text.get(from..to).unwrap_or_default(), &mut found);
        for s in &found {
            let (start, end) = (s.start.saturating_add(from), s.end.saturating_add(from));
            let overlaps = out
                .get(base..)
                .unwrap_or_default()
                .iter()
                .any(|a| a.start < end && start < a.end);
            if !overlaps {
                out.push(Span {
                    start,
                    end,
                    label: s.label,
                });
            }
        }
    }
}

/// Rewrite every slot with the spans `find` gives for its text (each span
/// replaced by `[REDACTED:<label>]`; a span across parts is removed from
/// each, the label left in the part where it starts). The number of spans.
pub fn rewrite<'c>(slots: &mut [Slot<'_>], find: &mut dyn FnMut(&str, &mut Vec<Span<'c>>)) -> u32 {
    let mut spans = Vec::new();
    let mut hits: u32 = 0;
    let count = |hits: &mut u32, spans: &Vec<Span<'c>>| {
        *hits = hits.saturating_add(u32::try_from(spans.len()).unwrap_or(u32::MAX));
    };
    for slot in slots.iter_mut() {
        match slot {
            Slot::One(t) => {
                spans.clear();
                find(t, &mut spans);
                count(&mut hits, &spans);
                if !spans.is_empty() {
                    **t = super::redact(t, &mut spans);
                }
            }
            Slot::Parts(parts) => {
                let joined: String = parts.iter().map(|p| p.as_str()).collect();
                let mut at = 0usize;
                let bounds: Vec<usize> = parts
                    .iter()
                    .take(parts.len().saturating_sub(1))
                    .map(|p| {
                        at = at.saturating_add(p.len());
                        at
                    })
                    .collect();
                spans.clear();
                joined_spans(&joined, &bounds, find, &mut spans);
                count(&mut hits, &spans);
                if !spans.is_empty() {
                    redact_parts(&joined, parts, &mut spans);
                }
            }
            Slot::Json(t) => {
                let Ok(mut v) = serde_json::from_str::<Value>(t) else {
                    spans.clear();
                    find(t, &mut spans);
                    count(&mut hits, &spans);
                    if !spans.is_empty() {
                        **t = super::redact(t, &mut spans);
                    }
                    continue;
                };
                let mut leaves = Vec::new();
                string_leaves(&mut v, &mut leaves);
                let n = rewrite(&mut leaves, find);
                drop(leaves);
                if n > 0 {
                    hits = hits.saturating_add(n);
                    if let Ok(s) = serde_json::to_string(&v) {
                        **t = s;
                    }
                }
            }
        }
    }
    hits
}

/// Spans found in the joined text, applied to the parts it was joined from.
fn redact_parts(joined: &str, parts: &mut [&mut String], spans: &mut [Span<'_>]) {
    spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
    // Overlapping spans merge into the first (as `redact` does).
    let mut merged: Vec<Span<'_>> = Vec::with_capacity(spans.len());
    for s in spans.iter() {
        match merged.last_mut() {
            Some(last) if s.start < last.end => last.end = last.end.max(s.end),
            _ => merged.push(*s),
        }
    }
    let mut part_start = 0usize;
    for p in parts.iter_mut() {
        let part_end = part_start.saturating_add(p.len());
        let mut out = String::with_capacity(p.len());
        let mut at = part_start;
        for s in merged
            .iter()
            .filter(|s| s.start < part_end && s.end > part_start)
        {
            let cut = s.start.max(part_start);
            out.push_str(joined.get(at..cut).unwrap_or_default());
            if s.start >= part_start {
                out.push_str("[REDACTED:");
                out.push_str(s.label);
                out.push(']');
            }
            at = s.end.min(part_end);
        }
        out.push_str(joined.get(at..part_end).unwrap_or_default());
        **p = out;
        part_start = part_end;
    }
}
