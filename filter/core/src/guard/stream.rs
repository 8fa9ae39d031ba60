//! Output checks on a streamed answer, as it passes, in the client's API's
//! events ([`Shape`]): chat completion chunks, Anthropic Messages events,
//! Responses events.
//!
//! The answer's text is read per slot (a chat choice's content, a Messages
//! text block, a Responses output text part) through a bounded look-behind
//! (`lookbehind` bytes): what is older than that is checked, redacted and
//! sent on in the event it came in; the tail waits for the next event, so a
//! match split across events (up to `lookbehind` bytes long) is still found
//! before any of it is sent. Tool-call arguments (chat `tool_calls`
//! deltas, Messages `input_json_delta`, Responses
//! `function_call_arguments.delta`) are held whole until their call ends,
//! then checked as a JSON document (escapes decoded) and sent in one piece:
//! a client acts on a call only once it is whole.
//!
//! A `deny` match ends the stream with an error event in the API's shape
//! (the SDKs raise it); what the client already has stays with it:
//! everything up to `lookbehind` bytes before the match. Word bounds and
//! the JSON schema need the whole text: they are checked where a text
//! slot ends. Events that repeat the whole text (Responses'
//! `output_text.done`, `content_part.done`, `output_item.done`,
//! `response.completed`) are redacted the same way before they pass.

use super::texts::{self, Shape, Slot as TextSlot};
use super::{check_slots, check_texts, Act, Check, Guardrails, Kind, Span, Stage, Verdict};
use crate::error::GatewayError;
use crate::wire::sse::SseParser;
use serde_json::{json, Map, Value};

/// Slots followed at most; an answer with more is refused.
const MAX_SLOTS: usize = 1024;
/// Whole text kept per slot for the end-of-text checks, and the most of a
/// tool call's arguments held (more is refused).
const MAX_WHOLE_BYTES: usize = 1 << 20;
/// The second key of a Responses function call's arguments slot.
const ARGS: u32 = u32::MAX;

/// Where a slot is: chat (choice, 0 for the content or 1 + the tool
/// call's index), Messages (block index, 0), Responses (output index,
/// content index or [`ARGS`]).
type Key = (u32, u32);

#[derive(Debug, Default)]
struct Slot {
    key: Key,
    /// Tool-call arguments: held whole until the call ends.
    args: bool,
    /// Text not sent yet.
    held: String,
    /// All of the text, when an end-of-text check needs it.
    whole: String,
    /// Responses: the output item's id, for the events the guard makes.
    item: Option<Value>,
    ended: bool,
}

/// What becomes of one event.
enum Step {
    /// Passed as it came.
    Raw,
    /// Rewritten; `before`: events the guard sends ahead of it.
    Rewritten(Vec<u8>),
    /// Held back; `before` is sent.
    Dropped(Vec<u8>),
}

#[derive(Debug)]
pub struct StreamGuard {
    shape: Shape,
    parser: SseParser,
    slots: Vec<Slot>,
    active: Vec<usize>,
    json_wanted: bool,
    /// An end-of-text check (bounds, schema) is active.
    keep_whole: bool,
    /// Chat: `id`, `created`, `model` of the stream, for chunks the guard
    /// makes.
    template: Option<(Value, Value, Value)>,
    pub verdicts: Vec<Verdict>,
    pub denied: Option<GatewayError>,
    /// Some text was redacted.
    pub changed: bool,
    /// The error event of an end-of-text deny, sent after the event that
    /// ended the slot.
    late: Option<Vec<u8>>,
    /// Responses: the last event's `sequence_number`, which the events the
    /// guard makes carry too (the schema requires one).
    sequence: u64,
}

impl StreamGuard {
    pub fn new(g: &Guardrails, shape: Shape, active: Vec<usize>, json_wanted: bool) -> Self {
        let keep_whole = active.iter().filter_map(|&i| g.output.get(i)).any(|c| {
            matches!(c.kind, Kind::Bounds(_)) || (json_wanted && matches!(c.kind, Kind::Schema(_)))
        });
        Self {
            shape,
            parser: SseParser::default(),
            slots: Vec::new(),
            active,
            json_wanted,
            keep_whole,
            template: None,
            verdicts: Vec::new(),
            denied: None,
            changed: false,
            late: None,
            sequence: 0,
        }
    }

    /// What the client gets for these bytes of the stream.
    pub fn chunk(&mut self, g: &Guardrails, bytes: &[u8]) -> Vec<u8> {
        if self.denied.is_some() {
            return Vec::new();
        }
        self.parser.push(bytes);
        if self.parser.overflowed {
            // An event too large to read cannot be checked: refuse it.
            return self.deny(g.denial("(stream)", "an event of the answer is too large to check"));
        }
        let mut out = Vec::new();
        while let Some((raw, data)) = self.parser.next_event() {
            let Some(d) = data else {
                out.extend_from_slice(&raw);
                continue;
            };
            if d.trim() == "[DONE]" {
                out.extend(self.flush_all(g));
                if self.denied.is_some() {
                    return out;
                }
                out.extend_from_slice(&raw);
                continue;
            }
            let mut v = match serde_json::from_str::<Value>(&d) {
                Ok(v) if v.is_object() => v,
                _ => {
                    out.extend_from_slice(&raw);
                    continue;
                }
            };
            if let Some(n) = v.get("sequence_number").and_then(Value::as_u64) {
                self.sequence = n;
            }
            let step = match self.shape {
                Shape::Chat => self.chat_event(g, &mut v),
                Shape::Messages => self.messages_event(g, &mut v),
                Shape::Responses => self.responses_event(g, &mut v),
            };
            let bytes = step.map(|s| match s {
                Step::Raw => raw,
                Step::Rewritten(mut before) => {
                    before.extend(self.frame(&v));
                    before
                }
                Step::Dropped(before) => before,
            });
            if self.emit(&mut out, bytes) {
                return out;
            }
        }
        out
    }

    /// The end of the stream without `[DONE]`: what is still held.
    pub fn finish(&mut self, g: &Guardrails) -> Vec<u8> {
        if self.denied.is_some() {
            return Vec::new();
        }
        let mut out = self.flush_all(g);
        if self.denied.is_none() {
            out.extend(self.parser.take_rest());
        }
        out
    }

    /// An event in the stream's framing.
    fn frame(&self, v: &Value) -> Vec<u8> {
        match self.shape {
            Shape::Chat => format!("data: {v}\n\n"),
            Shape::Messages | Shape::Responses => {
                let kind = v.get("type").and_then(Value::as_str).unwrap_or("message");
                format!("event: {kind}\ndata: {v}\n\n")
            }
        }
        .into_bytes()
    }

    /// Refuse the rest of the stream with an error event in its shape.
    fn deny(&mut self, err: GatewayError) -> Vec<u8> {
        let out = match self.shape {
            Shape::Chat => {
                let mut out = b"data: ".to_vec();
                out.extend(err.body());
                out.extend_from_slice(b"\n\n");
                out
            }
            Shape::Messages => {
                let mut out = b"event: error\ndata: ".to_vec();
                out.extend(err.anthropic_body());
                out.extend_from_slice(b"\n\n");
                out
            }
            Shape::Responses => {
                // The Responses `error` event, with the `error` object the
                // OpenAI SDKs raise on.
                let inner = serde_json::from_slice::<Value>(&err.body())
                    .ok()
                    .and_then(|b| b.get("error").cloned())
                    .unwrap_or(Value::Null);
                let v = json!({"type": "error", "sequence_number": self.sequence,
                    "code": err.code, "message": err.message, "param": null, "error": inner});
                format!("event: error\ndata: {v}\n\n").into_bytes()
            }
        };
        self.denied = Some(err);
        out
    }

    /// The slot at `key`, made when new; `Err` when too many.
    fn slot(&mut self, g: &Guardrails, key: Key, args: bool) -> Result<usize, Vec<u8>> {
        if let Some(i) = self.slots.iter().position(|s| s.key == key) {
            return Ok(i);
        }
        if self.slots.len() >= MAX_SLOTS {
            return Err(self.deny(g.denial("(stream)", "the answer has too many parts to check")));
        }
        self.slots.push(Slot {
            key,
            args,
            ..Slot::default()
        });
        Ok(self.slots.len().saturating_sub(1))
    }

    /// One chat chunk: each choice's content through its window, tool-call
    /// arguments held; at a choice's finish reason, what its slots hold.
    fn chat_event(&mut self, g: &Guardrails, v: &mut Value) -> Result<Step, Vec<u8>> {
        if self.template.is_none() {
            let field = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
            self.template = Some((field("id"), field("created"), field("model")));
        }
        let mut touched = false;
        let Some(Value::Array(choices)) = v.get_mut("choices") else {
            return Ok(Step::Raw);
        };
        for c in choices.iter_mut() {
            let choice = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let choice = u32::try_from(choice).unwrap_or(u32::MAX);
            let ends = c.get("finish_reason").is_some_and(|f| !f.is_null());
            if let Some(Value::Array(calls)) = c.pointer_mut("/delta/tool_calls") {
                for call in calls.iter_mut() {
                    let j = call.get("index").and_then(Value::as_u64).unwrap_or(0);
                    let j = u32::try_from(j).unwrap_or(u32::MAX).saturating_add(1);
                    if let Some(Value::String(a)) = call.pointer_mut("/function/arguments") {
                        let piece = std::mem::take(a);
                        let i = self.slot(g, (choice, j), true)?;
                        self.hold(g, i, &piece)?;
                        touched = true;
                    }
                }
            }
            let content = c.pointer_mut("/delta/content").and_then(|x| match x {
                Value::String(s) => Some(std::mem::take(s)),
                _ => None,
            });
            if let Some(text) = &content {
                let i = self.slot(g, (choice, 0), false)?;
                let sent = self.release(g, i, text, false)?;
                put_at(c, "/delta", "content", sent);
                touched = true;
            }
            if !ends {
                continue;
            }
            // The choice ends: its text's tail, its calls' arguments.
            let mut ending: Vec<usize> = (0..self.slots.len())
                .filter(|&i| {
                    self.slots
                        .get(i)
                        .is_some_and(|s| s.key.0 == choice && !s.ended)
                })
                .collect();
            ending.sort_by_key(|&i| self.slots.get(i).map(|s| s.key));
            for i in ending {
                let Some((key, args)) = self.slots.get(i).map(|s| (s.key, s.args)) else {
                    continue;
                };
                let sent = self.end(g, i)?;
                if args {
                    add_call_arguments(c, key.1.saturating_sub(1), sent);
                } else if !sent.is_empty() || content.is_some() {
                    let before = c
                        .pointer("/delta/content")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    put_at(c, "/delta", "content", before + &sent);
                }
                touched = true;
            }
        }
        Ok(if touched {
            Step::Rewritten(Vec::new())
        } else {
            Step::Raw
        })
    }

    /// One Messages event: text deltas through their block's window,
    /// `input_json_delta`s held; at `content_block_stop`, what the block
    /// holds, in a delta sent ahead of the stop.
    fn messages_event(&mut self, g: &Guardrails, v: &mut Value) -> Result<Step, Vec<u8>> {
        let kind = v.get("type").and_then(Value::as_str).unwrap_or_default();
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0);
        let block = u32::try_from(index).unwrap_or(u32::MAX);
        match kind {
            "content_block_start" => {
                let tool =
                    v.pointer("/content_block/type").and_then(Value::as_str) == Some("tool_use");
                let i = self.slot(g, (block, 0), tool)?;
                // A start that carries text (Anthropic's are empty) is
                // read like a delta.
                match v.pointer_mut("/content_block/text") {
                    Some(Value::String(t)) if !t.is_empty() => {
                        let text = std::mem::take(t);
                        let sent = self.release(g, i, &text, false)?;
                        put_at(v, "/content_block", "text", sent);
                        Ok(Step::Rewritten(Vec::new()))
                    }
                    _ => Ok(Step::Raw),
                }
            }
            "content_block_delta" => match v.pointer("/delta/type").and_then(Value::as_str) {
                Some("text_delta") => {
                    let text = match v.pointer_mut("/delta/text") {
                        Some(Value::String(t)) => std::mem::take(t),
                        _ => return Ok(Step::Raw),
                    };
                    let i = self.slot(g, (block, 0), false)?;
                    let sent = self.release(g, i, &text, false)?;
                    put_at(v, "/delta", "text", sent);
                    Ok(Step::Rewritten(Vec::new()))
                }
                Some("input_json_delta") => {
                    let piece = v
                        .pointer("/delta/partial_json")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string();
                    let i = self.slot(g, (block, 0), true)?;
                    self.hold(g, i, &piece)?;
                    Ok(Step::Dropped(Vec::new()))
                }
                _ => Ok(Step::Raw),
            },
            "content_block_stop" => {
                let Some(i) = self.slots.iter().position(|s| s.key == (block, 0)) else {
                    return Ok(Step::Raw);
                };
                let before = self.tail_event(g, i)?;
                Ok(if before.is_empty() {
                    Step::Raw
                } else {
                    Step::Dropped(before.into_iter().chain(self.frame(v)).collect())
                })
            }
            "message_stop" => {
                let before = self.flush_all(g);
                if self.denied.is_some() {
                    return Err(before);
                }
                Ok(if before.is_empty() {
                    Step::Raw
                } else {
                    Step::Dropped(before.into_iter().chain(self.frame(v)).collect())
                })
            }
            _ => Ok(Step::Raw),
        }
    }

    /// One Responses event: `output_text.delta` through its part's window,
    /// `function_call_arguments.delta` held; at `.done`, what the slot
    /// holds in a delta sent ahead; events repeating the whole text
    /// redacted.
    fn responses_event(&mut self, g: &Guardrails, v: &mut Value) -> Result<Step, Vec<u8>> {
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let num = |v: &Value, k: &str| {
            let n = v.get(k).and_then(Value::as_u64).unwrap_or(0);
            u32::try_from(n).unwrap_or(u32::MAX)
        };
        let output = num(v, "output_index");
        match kind.as_str() {
            "response.output_text.delta" | "response.function_call_arguments.delta" => {
                let args = kind == "response.function_call_arguments.delta";
                let key = (output, if args { ARGS } else { num(v, "content_index") });
                let text = match v.get_mut("delta") {
                    Some(Value::String(t)) => std::mem::take(t),
                    _ => return Ok(Step::Raw),
                };
                let i = self.slot(g, key, args)?;
                if let Some(s) = self.slots.get_mut(i) {
                    if s.item.is_none() {
                        s.item = v.get("item_id").cloned();
                    }
                }
                if args {
                    self.hold(g, i, &text)?;
                    return Ok(Step::Dropped(Vec::new()));
                }
                let sent = self.release(g, i, &text, false)?;
                put_at(v, "", "delta", sent);
                Ok(Step::Rewritten(Vec::new()))
            }
            "response.output_text.done" | "response.function_call_arguments.done" => {
                let args = kind == "response.function_call_arguments.done";
                let key = (output, if args { ARGS } else { num(v, "content_index") });
                let field = if args { "arguments" } else { "text" };
                let before = match self.slots.iter().position(|s| s.key == key) {
                    Some(i) => self.tail_event(g, i)?,
                    None => Vec::new(),
                };
                // The whole text again: redacted as the deltas were.
                if let Some(Value::String(t)) = v.get_mut(field) {
                    let mut slot = if args {
                        TextSlot::Json(t)
                    } else {
                        TextSlot::One(t)
                    };
                    self.recheck(g, std::slice::from_mut(&mut slot), 1)?;
                }
                Ok(Step::Rewritten(before))
            }
            "response.content_part.added"
            | "response.content_part.done"
            | "response.output_item.added"
            | "response.output_item.done"
            | "response.created"
            | "response.in_progress"
            | "response.completed"
            | "response.incomplete"
            | "response.failed" => {
                let mut text = Vec::new();
                let mut tools = Vec::new();
                let Value::Object(o) = v else {
                    return Ok(Step::Raw);
                };
                for (k, inner) in o.iter_mut() {
                    match (k.as_str(), inner) {
                        ("part", Value::Object(p)) => {
                            if let Some(Value::String(t)) = p.get_mut("text") {
                                text.push(TextSlot::One(t));
                            }
                        }
                        ("item", item) => texts::output_item_slots(item, &mut text, &mut tools),
                        ("response", r) => {
                            if let Some(Value::Array(items)) = r.get_mut("output") {
                                for item in items.iter_mut() {
                                    texts::output_item_slots(item, &mut text, &mut tools);
                                }
                            }
                        }
                        _ => {}
                    }
                }
                if text.is_empty() && tools.is_empty() {
                    return Ok(Step::Raw);
                }
                let n = text.len();
                text.append(&mut tools);
                Ok(if self.recheck(g, &mut text, n)? {
                    Step::Rewritten(Vec::new())
                } else {
                    Step::Raw
                })
            }
            _ => Ok(Step::Raw),
        }
    }

    /// Checks over text the client has (or will have) seen in pieces,
    /// repeated whole: rewritten as the pieces were, its verdicts not
    /// counted again; a deny still ends the stream. Whether it changed.
    fn recheck(
        &mut self,
        g: &Guardrails,
        slots: &mut [TextSlot<'_>],
        content: usize,
    ) -> Result<bool, Vec<u8>> {
        let scanning = self.active_of(g, |k| matches!(k, Kind::Regex(_) | Kind::Pii(_)));
        let outcome = check_slots(g, &scanning, false, slots, content);
        if let Some(err) = outcome.denied {
            self.verdicts.extend(outcome.verdicts);
            return Err(self.deny(err));
        }
        Ok(outcome.changed)
    }

    /// Add a piece of a tool call's arguments to its slot.
    fn hold(&mut self, g: &Guardrails, i: usize, piece: &str) -> Result<(), Vec<u8>> {
        let Some(s) = self.slots.get_mut(i) else {
            return Ok(());
        };
        if s.held.len().saturating_add(piece.len()) > MAX_WHOLE_BYTES {
            return Err(
                self.deny(g.denial("(stream)", "a tool call's arguments are too large to check"))
            );
        }
        s.held.push_str(piece);
        Ok(())
    }

    /// End a slot: a text's tail, or a call's whole arguments, checked;
    /// what to send.
    fn end(&mut self, g: &Guardrails, i: usize) -> Result<String, Vec<u8>> {
        let Some(s) = self.slots.get_mut(i) else {
            return Ok(String::new());
        };
        if s.ended {
            return Ok(String::new());
        }
        if !s.args {
            return self.release(g, i, "", true);
        }
        s.ended = true;
        let mut held = std::mem::take(&mut s.held);
        if held.is_empty() {
            return Ok(held);
        }
        let active = self.active.clone();
        let outcome = {
            let mut slot = [TextSlot::Json(&mut held)];
            check_slots(g, &active, false, &mut slot, 0)
        };
        for v in outcome.verdicts {
            self.note_verdict(v);
        }
        if outcome.changed {
            self.changed = true;
        }
        if let Some(err) = outcome.denied {
            return Err(self.deny(err));
        }
        Ok(held)
    }

    /// End a slot; its last piece as an event of the stream's shape (empty
    /// when nothing is left).
    fn tail_event(&mut self, g: &Guardrails, i: usize) -> Result<Vec<u8>, Vec<u8>> {
        let sent = self.end(g, i)?;
        let Some(s) = self.slots.get(i) else {
            return Ok(Vec::new());
        };
        if sent.is_empty() {
            return Ok(Vec::new());
        }
        let (a, b) = s.key;
        let v = match (self.shape, s.args) {
            (Shape::Chat, false) => {
                let (id, created, model) = self.template.clone().unwrap_or_default();
                json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": a, "delta": {"content": sent}, "finish_reason": null}]})
            }
            (Shape::Chat, true) => {
                let (id, created, model) = self.template.clone().unwrap_or_default();
                json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                    "choices": [{"index": a, "delta": {"tool_calls": [
                        {"index": b.saturating_sub(1), "function": {"arguments": sent}}]},
                        "finish_reason": null}]})
            }
            (Shape::Messages, false) => json!({"type": "content_block_delta", "index": a,
                "delta": {"type": "text_delta", "text": sent}}),
            (Shape::Messages, true) => json!({"type": "content_block_delta", "index": a,
                "delta": {"type": "input_json_delta", "partial_json": sent}}),
            (Shape::Responses, false) => json!({"type": "response.output_text.delta",
                "sequence_number": self.sequence, "item_id": s.item, "output_index": a,
                "content_index": b, "delta": sent}),
            (Shape::Responses, true) => json!({"type": "response.function_call_arguments.delta",
                "sequence_number": self.sequence, "item_id": s.item, "output_index": a,
                "delta": sent}),
        };
        Ok(self.frame(&v))
    }

    /// Add text to a slot's window; check it; return what can be sent.
    fn release(
        &mut self,
        g: &Guardrails,
        i: usize,
        text: &str,
        ends: bool,
    ) -> Result<String, Vec<u8>> {
        let keep_whole = self.keep_whole;
        let Some(slot) = self.slots.get_mut(i) else {
            return Ok(text.to_string());
        };
        if slot.ended {
            return Ok(text.to_string());
        }
        slot.held.push_str(text);
        if keep_whole && slot.whole.len() < MAX_WHOLE_BYTES {
            slot.whole.push_str(text);
        }
        let held = std::mem::take(&mut slot.held);
        let mut found: Vec<(usize, Span<'_>)> = Vec::new();
        let mut spans = Vec::new();
        for (n, &c) in self.active.iter().enumerate() {
            let Some(check) = g.output.get(c) else {
                continue;
            };
            spans.clear();
            check.spans(&held, &mut spans);
            found.extend(spans.iter().map(|s| (n, *s)));
        }
        // A deny anywhere in the window ends the stream.
        if let Some(&(n, _)) = found
            .iter()
            .find(|(n, _)| self.act_of(g, *n) == Some(Act::Deny))
        {
            let check = self.check_of(g, n);
            let hits = found.iter().filter(|(m, _)| *m == n).count();
            let matched = self.matched(&held, &found, n, g.include_content);
            if let Some(c) = check {
                self.note(c, hits, matched, String::new());
                let err = g.denial(&c.name, "the answer matched it");
                return Err(self.deny(err));
            }
        }
        let mut boundary = if ends {
            held.len()
        } else {
            floor_boundary(&held, held.len().saturating_sub(g.lookbehind))
        };
        // A match that crosses the boundary waits whole (while the window
        // stays bounded).
        if !ends && held.len() < g.lookbehind.saturating_mul(4) {
            for (_, s) in &found {
                if s.start < boundary && s.end > boundary {
                    boundary = s.start;
                }
            }
        }
        let mut redactions = Vec::new();
        let mut counts: Vec<(usize, usize, Vec<String>)> = Vec::new();
        for (n, s) in found.iter().filter(|(_, s)| s.end <= boundary) {
            if self.act_of(g, *n) == Some(Act::Redact) {
                redactions.push(*s);
            }
            match counts.iter_mut().find(|(m, _, _)| m == n) {
                Some(c) => c.1 = c.1.saturating_add(1),
                None => counts.push((*n, 1, Vec::new())),
            }
            if g.include_content {
                if let (Some(c), Some(t)) = (
                    counts.iter_mut().find(|(m, _, _)| m == n),
                    held.get(s.start..s.end),
                ) {
                    c.2.push(t.to_string());
                }
            }
        }
        for (n, hits, matched) in counts {
            if let Some(c) = self.check_of(g, n) {
                self.note(c, hits, matched, String::new());
            }
        }
        if !redactions.is_empty() {
            self.changed = true;
        }
        let sent = super::redact(held.get(..boundary).unwrap_or_default(), &mut redactions);
        let rest = held.get(boundary..).unwrap_or_default().to_string();
        if let Some(slot) = self.slots.get_mut(i) {
            slot.held = rest;
            if ends {
                slot.ended = true;
            }
        }
        if ends {
            self.end_checks(g, i);
        }
        Ok(sent)
    }

    /// Bounds and the schema, on a slot's whole text (a deny is sent
    /// after the event that ended the slot).
    fn end_checks(&mut self, g: &Guardrails, i: usize) {
        if !self.keep_whole {
            return;
        }
        let whole = self
            .slots
            .get_mut(i)
            .map(|c| std::mem::take(&mut c.whole))
            .unwrap_or_default();
        let end_only = self.active_of(g, |k| matches!(k, Kind::Bounds(_) | Kind::Schema(_)));
        let outcome = check_texts(g, &end_only, self.json_wanted, &[whole.as_str()]);
        self.verdicts.extend(outcome.verdicts);
        if let Some(err) = outcome.denied {
            let event = self.deny(err);
            self.late = Some(event);
        }
    }

    /// Send what every slot still holds (at the stream's end), in key
    /// order.
    fn flush_all(&mut self, g: &Guardrails) -> Vec<u8> {
        let mut order: Vec<usize> = (0..self.slots.len()).collect();
        order.sort_by_key(|&i| self.slots.get(i).map(|s| s.key));
        let mut out = Vec::new();
        for i in order {
            if self.slots.get(i).is_none_or(|s| s.ended) {
                continue;
            }
            let step = self.tail_event(g, i);
            if self.emit(&mut out, step) {
                return out;
            }
        }
        out
    }

    /// Add a step's bytes (or its error event) to `out`, then a late
    /// error; `true` when the stream ended.
    fn emit(&mut self, out: &mut Vec<u8>, step: Result<Vec<u8>, Vec<u8>>) -> bool {
        match step {
            Ok(bytes) => out.extend(bytes),
            Err(err) => {
                out.extend(err);
                return true;
            }
        }
        match self.late.take() {
            Some(err) => {
                out.extend(err);
                true
            }
            None => false,
        }
    }

    /// The active checks of some kinds.
    fn active_of(&self, g: &Guardrails, kind: fn(&Kind) -> bool) -> Vec<usize> {
        self.active
            .iter()
            .copied()
            .filter(|&i| g.output.get(i).is_some_and(|c| kind(&c.kind)))
            .collect()
    }

    fn check_of<'g>(&self, g: &'g Guardrails, n: usize) -> Option<&'g Check> {
        self.active.get(n).and_then(|&i| g.output.get(i))
    }

    fn act_of(&self, g: &Guardrails, n: usize) -> Option<Act> {
        self.check_of(g, n).map(|c| c.act)
    }

    fn matched(
        &self,
        held: &str,
        found: &[(usize, Span<'_>)],
        n: usize,
        keep: bool,
    ) -> Vec<String> {
        if !keep {
            return Vec::new();
        }
        found
            .iter()
            .filter(|(m, _)| *m == n)
            .filter_map(|(_, s)| held.get(s.start..s.end).map(String::from))
            .collect()
    }

    /// Add hits to the check's verdict (one verdict per check).
    fn note(&mut self, check: &Check, hits: usize, matched: Vec<String>, reason: String) {
        let hits = u32::try_from(hits).unwrap_or(u32::MAX);
        self.note_verdict(Verdict {
            stage: Stage::Output,
            check: check.name.clone(),
            action: check.act,
            hits,
            matched,
            reason,
            vendor: None,
        });
    }

    fn note_verdict(&mut self, v: Verdict) {
        match self.verdicts.iter_mut().find(|w| w.check == v.check) {
            Some(w) => {
                w.hits = w.hits.saturating_add(v.hits);
                w.matched.extend(v.matched);
            }
            None => self.verdicts.push(v),
        }
    }
}

/// Set `key` in the object at `path` of an event ("": the event itself;
/// made when missing).
fn put_at(v: &mut Value, path: &str, key: &str, text: String) {
    let Value::Object(o) = v else { return };
    let o = match path.trim_start_matches('/') {
        "" => o,
        name => match o
            .entry(name.to_string())
            .or_insert_with(|| Value::Object(Map::new()))
        {
            Value::Object(inner) => inner,
            _ => return,
        },
    };
    o.insert(key.into(), Value::String(text));
}

/// Add a call's arguments to a finishing chat choice's delta (appended to
/// a piece of the same call in it).
fn add_call_arguments(c: &mut Value, index: u32, args: String) {
    if args.is_empty() {
        return;
    }
    let Value::Object(o) = c else { return };
    let delta = o
        .entry("delta".to_string())
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(d) = delta else { return };
    let calls = d
        .entry("tool_calls".to_string())
        .or_insert_with(|| Value::Array(Vec::new()));
    let Value::Array(calls) = calls else { return };
    let same = calls
        .iter_mut()
        .find(|call| call.get("index").and_then(Value::as_u64) == Some(u64::from(index)));
    match same {
        Some(call) => {
            if let Some(Value::String(a)) = call.pointer_mut("/function/arguments") {
                a.push_str(&args);
            } else if let Some(Value::Object(call)) = Some(call) {
                call.insert("function".into(), json!({ "arguments": args }));
            }
        }
        None => calls.push(json!({"index": index, "function": {"arguments": args}})),
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i = i.saturating_sub(1);
    }
    i
}
