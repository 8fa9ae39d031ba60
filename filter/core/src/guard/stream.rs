//! Output checks on a streamed answer, as it passes.
//!
//! Each choice's text is held back by a bounded look-behind (`lookbehind`
//! bytes): what is older than that is checked, redacted and sent on in the
//! event it came in; the tail waits for the next event, so a match split
//! across chunks (up to `lookbehind` bytes long) is still found before any
//! of it is sent. A `deny` match ends the stream with an OpenAI-shaped
//! `error` event (the OpenAI SDKs raise it); what the client already has
//! stays with it: everything up to `lookbehind` bytes before the match.
//! Word bounds and the JSON schema need the whole text: they are checked at
//! the end of each choice, where a deny replaces `data: [DONE]`.

use super::{check_texts, Act, Check, Guardrails, Kind, Span, Stage, Verdict};
use crate::error::GatewayError;
use crate::sse::SseParser;
use serde_json::{json, Value};

/// Choices followed at most (`n` above this passes unread).
const MAX_CHOICES: usize = 128;
/// Whole text kept per choice for the end-of-answer checks.
const MAX_WHOLE_BYTES: usize = 1 << 20;

#[derive(Debug, Default)]
struct Choice {
    /// Text not sent yet.
    held: String,
    /// All of the text, when an end-of-answer check needs it.
    whole: String,
    ended: bool,
}

#[derive(Debug)]
pub struct StreamGuard {
    parser: SseParser,
    choices: Vec<Choice>,
    active: Vec<usize>,
    json_wanted: bool,
    /// An end-of-answer check (bounds, schema) is active.
    keep_whole: bool,
    /// `id`, `created`, `model` of the stream, for events the guard makes.
    template: Option<(Value, Value, Value)>,
    pub verdicts: Vec<Verdict>,
    pub denied: Option<GatewayError>,
    /// Some text was redacted.
    pub changed: bool,
    /// The error event of an end-of-answer deny, sent after the event that
    /// ended the choice.
    late: Option<Vec<u8>>,
}

impl StreamGuard {
    pub fn new(g: &Guardrails, active: Vec<usize>, json_wanted: bool) -> Self {
        let keep_whole = active.iter().filter_map(|&i| g.output.get(i)).any(|c| {
            matches!(c.kind, Kind::Bounds(_)) || (json_wanted && matches!(c.kind, Kind::Schema(_)))
        });
        Self {
            parser: SseParser::default(),
            choices: Vec::new(),
            active,
            json_wanted,
            keep_whole,
            template: None,
            verdicts: Vec::new(),
            denied: None,
            changed: false,
            late: None,
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
            match serde_json::from_str::<Value>(&d) {
                Ok(mut v) if v.get("choices").is_some_and(Value::is_array) => {
                    let step = self.event(g, &mut v).map(|rewritten| {
                        Some(if rewritten {
                            format!("data: {v}\n\n").into_bytes()
                        } else {
                            raw
                        })
                    });
                    if self.emit(&mut out, step) {
                        return out;
                    }
                }
                _ => out.extend_from_slice(&raw),
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

    fn deny(&mut self, err: GatewayError) -> Vec<u8> {
        let mut out = b"data: ".to_vec();
        out.extend(err.body());
        out.extend_from_slice(b"\n\n");
        self.denied = Some(err);
        out
    }

    /// One chunk event: its contents go through the choices' windows.
    /// `Ok(true)`: the event was rewritten; `Err`: the error event.
    fn event(&mut self, g: &Guardrails, v: &mut Value) -> Result<bool, Vec<u8>> {
        if self.template.is_none() {
            let field = |k: &str| v.get(k).cloned().unwrap_or(Value::Null);
            self.template = Some((field("id"), field("created"), field("model")));
        }
        let mut touched = false;
        let Some(choices) = v.get_mut("choices").and_then(Value::as_array_mut) else {
            return Ok(false);
        };
        for c in choices {
            let idx = c.get("index").and_then(Value::as_u64).unwrap_or(0);
            let Some(idx) = usize::try_from(idx).ok().filter(|&i| i < MAX_CHOICES) else {
                continue;
            };
            let ends = c.get("finish_reason").is_some_and(|f| !f.is_null());
            let content = c.pointer_mut("/delta/content").and_then(|x| match x {
                Value::String(s) => Some(std::mem::take(s)),
                _ => None,
            });
            if content.is_none() && !ends {
                continue;
            }
            let released = self.release(g, idx, content.as_deref().unwrap_or_default(), ends)?;
            if content.is_some() || !released.is_empty() {
                if let Some(delta) = c.get_mut("delta").and_then(Value::as_object_mut) {
                    delta.insert("content".into(), Value::String(released));
                } else if let Some(obj) = c.as_object_mut() {
                    obj.insert("delta".into(), json!({ "content": released }));
                }
            }
            touched = true;
        }
        Ok(touched)
    }

    /// Add text to a choice's window; check it; return what can be sent.
    fn release(
        &mut self,
        g: &Guardrails,
        idx: usize,
        text: &str,
        ends: bool,
    ) -> Result<String, Vec<u8>> {
        if self.choices.len() <= idx {
            self.choices
                .resize_with(idx.saturating_add(1), Choice::default);
        }
        let keep_whole = self.keep_whole;
        let Some(choice) = self.choices.get_mut(idx) else {
            return Ok(text.to_string());
        };
        if choice.ended {
            return Ok(text.to_string());
        }
        choice.held.push_str(text);
        if keep_whole && choice.whole.len() < MAX_WHOLE_BYTES {
            choice.whole.push_str(text);
        }
        let held = std::mem::take(&mut choice.held);
        let mut found: Vec<(usize, Span<'_>)> = Vec::new();
        let mut spans = Vec::new();
        for (n, &i) in self.active.iter().enumerate() {
            let Some(check) = g.output.get(i) else {
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
        if let Some(choice) = self.choices.get_mut(idx) {
            choice.held = rest;
            if ends {
                choice.ended = true;
            }
        }
        if ends {
            self.end_checks(g, idx);
        }
        Ok(sent)
    }

    /// Bounds and the schema, on a choice's whole text (a deny is sent
    /// after the event that ended the choice).
    fn end_checks(&mut self, g: &Guardrails, idx: usize) {
        if !self.keep_whole {
            return;
        }
        let whole = self
            .choices
            .get_mut(idx)
            .map(|c| std::mem::take(&mut c.whole))
            .unwrap_or_default();
        let end_only: Vec<usize> = self
            .active
            .iter()
            .copied()
            .filter(|&i| {
                g.output
                    .get(i)
                    .is_some_and(|c| matches!(c.kind, Kind::Bounds(_) | Kind::Schema(_)))
            })
            .collect();
        let outcome = check_texts(g, &end_only, self.json_wanted, &[whole.as_str()]);
        self.verdicts.extend(outcome.verdicts);
        if let Some(err) = outcome.denied {
            let event = self.deny(err);
            self.late = Some(event);
        }
    }

    /// Send what every choice still holds (at `[DONE]` or the end).
    fn flush_all(&mut self, g: &Guardrails) -> Vec<u8> {
        let mut out = Vec::new();
        for idx in 0..self.choices.len() {
            if self.choices.get(idx).is_none_or(|c| c.ended) {
                continue;
            }
            let step = self.release(g, idx, "", true).map(|text| {
                (!text.is_empty()).then(|| {
                    let (id, created, model) = self.template.clone().unwrap_or_default();
                    let v = json!({"id": id, "object": "chat.completion.chunk", "created": created, "model": model,
                        "choices": [{"index": idx, "delta": {"content": text}, "finish_reason": null}]});
                    format!("data: {v}\n\n").into_bytes()
                })
            });
            if self.emit(&mut out, step) {
                return out;
            }
        }
        out
    }

    /// Add a step's bytes (or its error event) to `out`, then a late
    /// error; `true` when the stream ended.
    fn emit(&mut self, out: &mut Vec<u8>, step: Result<Option<Vec<u8>>, Vec<u8>>) -> bool {
        match step {
            Ok(bytes) => out.extend(bytes.unwrap_or_default()),
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
        match self.verdicts.iter_mut().find(|v| v.check == check.name) {
            Some(v) => {
                v.hits = v.hits.saturating_add(hits);
                v.matched.extend(matched);
            }
            None => self.verdicts.push(Verdict {
                stage: Stage::Output,
                check: check.name.clone(),
                action: check.act,
                hits,
                matched,
                reason,
            }),
        }
    }
}

fn floor_boundary(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i = i.saturating_sub(1);
    }
    i
}
