//! What the gateway reads and rewrites of the messages between a client and
//! a server: a `tools/list` answer filtered to the caller's tools, the
//! texts of a tool's arguments and of its result for the guardrails. A
//! server answers a POST as one JSON message or as an SSE stream of them
//! (progress notifications, then the answer); [`Events`] rewrites a stream
//! event by event as it passes, keeping each event's other fields (`id:`,
//! `event:`) as sent.

use crate::guard::{self, Guardrails, Stage, Verdict};
use crate::wire::sse::SseParser;
use serde_json::{Map, Value};

/// Every string in a JSON value, in document order (object members'
/// values, array items; not member names).
pub fn strings_of<'v>(v: &'v mut Value, out: &mut Vec<&'v mut String>) {
    match v {
        Value::String(s) => out.push(s),
        Value::Array(a) => a.iter_mut().for_each(|x| strings_of(x, out)),
        Value::Object(o) => o.values_mut().for_each(|x| strings_of(x, out)),
        _ => {}
    }
}

/// A tool result's texts: each `text` content block's `text`, then every
/// string of `structuredContent`.
pub fn result_strings(result: &mut Map<String, Value>) -> Vec<&mut String> {
    let mut out = Vec::new();
    let mut structured = None;
    for (k, v) in result.iter_mut() {
        match (k.as_str(), v) {
            ("content", Value::Array(blocks)) => {
                for b in blocks.iter_mut().filter_map(Value::as_object_mut) {
                    if b.get("type").and_then(Value::as_str) != Some("text") {
                        continue;
                    }
                    if let Some(Value::String(t)) = b.get_mut("text") {
                        out.push(t);
                    }
                }
            }
            ("structuredContent", v) => structured = Some(v),
            _ => {}
        }
    }
    if let Some(v) = structured {
        strings_of(v, &mut out);
    }
    out
}

/// A `tools/list` answer's tools, only those `keep` keeps (by name as
/// listed). Whether any was dropped.
pub fn keep_tools(msg: &mut Map<String, Value>, keep: &mut dyn FnMut(&str) -> bool) -> bool {
    let Some(Value::Array(tools)) = msg
        .get_mut("result")
        .and_then(Value::as_object_mut)
        .and_then(|r| r.get_mut("tools"))
    else {
        return false;
    };
    let before = tools.len();
    tools.retain(|t| {
        t.get("name")
            .and_then(Value::as_str)
            .is_some_and(&mut *keep)
    });
    tools.len() != before
}

/// One message of an answer, as a tree (a few hundred bytes to a few KB).
pub type Message = Map<String, Value>;

/// What to do with each message of an answer: `true` when it changed it.
pub type Edit<'e> = &'e mut dyn FnMut(&mut Message) -> bool;

/// One JSON message rewritten by `edit`; `None` when it is not a JSON
/// object or `edit` left it as it was (the bytes then pass as sent).
pub fn rewrite_json(body: &[u8], edit: Edit<'_>) -> Option<Vec<u8>> {
    let mut msg: Map<String, Value> = serde_json::from_slice(body).ok()?;
    if !edit(&mut msg) {
        return None;
    }
    serde_json::to_vec(&msg).ok()
}

/// An SSE answer rewritten event by event as its chunks pass.
#[derive(Debug, Default)]
pub struct Events {
    parser: SseParser,
}

impl Events {
    /// A chunk in, the complete events so far out (each rewritten by
    /// `edit` when it holds a message it changes); a partial event waits.
    pub fn chunk(&mut self, bytes: &[u8], edit: Edit<'_>) -> Vec<u8> {
        self.parser.push(bytes);
        if self.parser.overflowed {
            // An event past the parser's bound passes untouched from here.
            let mut out = self.parser.take_rest();
            out.extend_from_slice(bytes);
            return out;
        }
        let mut out = Vec::with_capacity(bytes.len());
        while let Some((raw, data)) = self.parser.next_event() {
            match data.and_then(|d| rewrite_json(d.as_bytes(), edit)) {
                Some(json) => with_data(&raw, &json, &mut out),
                None => out.extend_from_slice(&raw),
            }
        }
        out
    }

    /// The end of the answer: what is left of an unfinished event, as it
    /// came.
    pub fn finish(&mut self) -> Vec<u8> {
        self.parser.take_rest()
    }
}

/// An event with its data replaced by `json` (one `data:` line where the
/// first was), its other lines as sent.
fn with_data(raw: &[u8], json: &[u8], out: &mut Vec<u8>) {
    let text = String::from_utf8_lossy(raw);
    let mut wrote = false;
    for line in text.lines() {
        if line.starts_with("data:") {
            if !wrote {
                out.extend_from_slice(b"data: ");
                out.extend_from_slice(json);
                out.push(b'\n');
                wrote = true;
            }
        } else if !line.is_empty() {
            out.extend_from_slice(line.as_bytes());
            out.push(b'\n');
        }
    }
    out.push(b'\n');
}

/// What the gateway does to the answer of one request: the request's id
/// (JSON text, as sent), then a `tools/list`'s filter or a tool result's
/// output checks.
pub struct Policy<'p> {
    pub id: Option<&'p str>,
    /// A `tools/list`: whether the caller may call a tool, by its name as
    /// listed.
    pub list: Option<&'p dyn Fn(&str) -> bool>,
    /// A `tools/call`: the output checks over its result.
    pub output: Option<(&'p Guardrails, &'p [usize])>,
}

impl Policy<'_> {
    /// Apply to one message of the answer: only the answer to the request
    /// (its id, with a `result`) is touched; the verdicts are added to
    /// `verdicts`. A denied result becomes the check's JSON-RPC error.
    pub fn edit(&self, msg: &mut Map<String, Value>, verdicts: &mut Vec<Verdict>) -> bool {
        let id = msg.get("id").and_then(|v| serde_json::to_string(v).ok());
        if id.as_deref() != self.id || !msg.contains_key("result") {
            return false;
        }
        if let Some(keep) = self.list {
            return keep_tools(msg, &mut |n| keep(n));
        }
        let Some((g, active)) = self.output else {
            return false;
        };
        let out = match msg.get_mut("result").and_then(Value::as_object_mut) {
            Some(r) => guard::check_strings(g, Stage::Output, active, result_strings(r)),
            None => return false,
        };
        verdicts.extend(out.verdicts);
        if let Some(e) = out.denied {
            msg.remove("result");
            let err = serde_json::from_slice::<Value>(&super::message::error_body(None, &e))
                .ok()
                .and_then(|v| v.get("error").cloned())
                .unwrap_or(Value::Null);
            msg.insert("error".into(), err);
            return true;
        }
        out.changed
    }
}

/// A `tools/call` request's arguments through the input checks: what they
/// found, and the body rewritten when a check redacted (`None`: as sent).
pub fn check_arguments(
    g: &Guardrails,
    active: &[usize],
    body: &[u8],
) -> (guard::Outcome, Option<Vec<u8>>) {
    let Ok(mut doc) = serde_json::from_slice::<Map<String, Value>>(body) else {
        return (guard::Outcome::default(), None);
    };
    let out = {
        let mut strings = Vec::new();
        if let Some(args) = doc.get_mut("params").and_then(|p| p.get_mut("arguments")) {
            strings_of(args, &mut strings);
        }
        guard::check_strings(g, Stage::Input, active, strings)
    };
    if !out.changed || out.denied.is_some() {
        return (out, None);
    }
    let body = serde_json::to_vec(&doc).ok();
    (out, body)
}
