//! OpenAI's Realtime API (and Azure OpenAI's): `GET /v1/realtime?model=...`
//! upgraded to a WebSocket, then JSON events both ways in text messages
//! ([`crate::wire::websocket`] reads the frames). The gateway reads the events
//! it counts and checks: the server's `response.done` (its usage), its
//! text deltas (output guardrails), the client's text items and
//! instructions (input guardrails); every other event passes unread.
//! Served by OpenAI-compatible and Azure OpenAI providers.

// Usage comes from the provider: every sum saturates.
#![deny(clippy::arithmetic_side_effects)]

use crate::error::GatewayError;
use crate::usage::Usage;
use serde::Deserialize;
use serde_json::{json, Value};

pub const PATH: &str = "/v1/realtime";

/// The model a session asks for: the query's `model` (Azure's clients
/// name a `deployment`), percent-decoded.
pub fn model_of(query: &str) -> Option<String> {
    let q = query.strip_prefix('?').unwrap_or(query);
    let mut found = None;
    for pair in q.split('&') {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        if k == "model" || (k == "deployment" && found.is_none()) {
            found = Some(percent_decode(v));
        }
    }
    found.filter(|m| !m.is_empty())
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0usize;
    while let Some(&c) = b.get(i) {
        let hex = |j: usize| {
            b.get(j)
                .and_then(|h| char::from(*h).to_digit(16))
                .and_then(|d| u8::try_from(d).ok())
        };
        match (c, hex(i.saturating_add(1)), hex(i.saturating_add(2))) {
            (b'%', Some(h), Some(l)) => {
                out.push(h.saturating_mul(16).saturating_add(l));
                i = i.saturating_add(3);
            }
            (b'+', _, _) => {
                out.push(b' ');
                i = i.saturating_add(1);
            }
            _ => {
                out.push(c);
                i = i.saturating_add(1);
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The prefix of a browser client's key, sent as a WebSocket subprotocol
/// (browsers cannot set `Authorization` on a WebSocket).
const KEY_PROTOCOL: &str = "openai-insecure-api-key.";

/// `Sec-WebSocket-Protocol` read for a key: the key, and the header
/// without it (`None`: nothing else was offered).
pub fn key_in_protocols(header: &str) -> (Option<String>, Option<String>) {
    let mut key = None;
    let mut rest = Vec::new();
    for p in header.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match p.strip_prefix(KEY_PROTOCOL) {
            Some(k) => key = Some(k.to_string()),
            None => rest.push(p),
        }
    }
    let rest = (!rest.is_empty()).then(|| rest.join(", "));
    (key, rest)
}

/// An event's `type`, read without parsing the event when it is a member
/// of the top object before any nested value (as OpenAI and its SDKs
/// write events) or its last member (as writers that sort keys do), else
/// by parsing the event.
pub fn event_type(payload: &[u8]) -> Option<String> {
    if let Some(t) = type_at_head(payload).or_else(|| type_at_end(payload)) {
        return Some(t.to_string());
    }
    #[derive(Deserialize)]
    struct Typed {
        #[serde(rename = "type")]
        kind: String,
    }
    serde_json::from_slice::<Typed>(payload)
        .ok()
        .map(|t| t.kind)
}

/// `"type"` among the top object's first members (no `{` or `[` before it).
fn type_at_head(payload: &[u8]) -> Option<&str> {
    static FINDER: std::sync::LazyLock<memchr::memmem::Finder<'static>> =
        std::sync::LazyLock::new(|| memchr::memmem::Finder::new(b"\"type\""));
    let at = FINDER.find(payload)?;
    let before = payload.get(..at)?;
    if before.first() != Some(&b'{')
        || memchr::memchr2(b'{', b'[', before.get(1..).unwrap_or_default()).is_some()
    {
        return None;
    }
    let rest = payload.get(at.saturating_add(6)..)?;
    let rest = trim_start(rest).strip_prefix(b":")?;
    let rest = trim_start(rest).strip_prefix(b"\"")?;
    let end = memchr::memchr2(b'"', b'\\', rest)?;
    if rest.get(end) != Some(&b'"') {
        return None;
    }
    std::str::from_utf8(rest.get(..end)?).ok()
}

/// `"type"` as the top object's last member: `..., "type": "v"}` at the
/// payload's end (the last `}` closes the top object).
fn type_at_end(payload: &[u8]) -> Option<&str> {
    let t = trim_end(payload).strip_suffix(b"}")?;
    let t = trim_end(t).strip_suffix(b"\"")?;
    let open = memchr::memrchr(b'"', t)?;
    let value = t.get(open.saturating_add(1)..)?;
    if memchr::memchr(b'\\', value).is_some() {
        return None;
    }
    let key = trim_end(t.get(..open)?).strip_suffix(b":")?;
    let key = trim_end(key).strip_suffix(b"\"type\"")?;
    if !matches!(trim_end(key).last(), Some(b',' | b'{')) {
        return None;
    }
    std::str::from_utf8(value).ok()
}

fn trim_end(b: &[u8]) -> &[u8] {
    let n = b
        .iter()
        .rev()
        .take_while(|c| c.is_ascii_whitespace())
        .count();
    b.get(..b.len().saturating_sub(n)).unwrap_or_default()
}

fn trim_start(b: &[u8]) -> &[u8] {
    let n = b.iter().take_while(|c| c.is_ascii_whitespace()).count();
    b.get(n..).unwrap_or_default()
}

/// What the gateway reads of a server event.
#[derive(Debug, Clone, PartialEq)]
pub enum ServerEvent {
    /// `response.done`: the response's usage (`None` when it has none),
    /// its id and status.
    Done {
        usage: Option<Usage>,
        id: String,
        status: String,
    },
    /// A piece of the response's text (or of its audio's transcript).
    Text { item: String, delta: String },
    /// `error`: its code.
    Error { code: String },
    /// Anything else, passed unread.
    Other,
}

/// The server events that carry a response's text.
pub const TEXT_DELTAS: &[&str] = &[
    "response.output_text.delta",
    "response.text.delta",
    "response.output_audio_transcript.delta",
    "response.audio_transcript.delta",
];

#[derive(Deserialize)]
struct RtUsage {
    #[serde(default)]
    input_tokens: u64,
    #[serde(default)]
    output_tokens: u64,
    #[serde(default)]
    input_token_details: Option<RtDetail>,
    #[serde(default)]
    output_token_details: Option<RtDetail>,
}

#[derive(Deserialize)]
struct RtDetail {
    #[serde(default)]
    cached_tokens: u64,
    #[serde(default)]
    audio_tokens: u64,
}

impl From<RtUsage> for Usage {
    fn from(u: RtUsage) -> Usage {
        let (cached, audio_in) = u
            .input_token_details
            .map_or((0, 0), |d| (d.cached_tokens, d.audio_tokens));
        Usage {
            prompt: u.input_tokens,
            completion: u.output_tokens,
            cached: cached.min(u.input_tokens),
            audio_prompt: audio_in.min(u.input_tokens),
            audio_completion: u
                .output_token_details
                .map_or(0, |d| d.audio_tokens)
                .min(u.output_tokens),
            ..Usage::default()
        }
    }
}

/// A `response.done` read for its usage, id and status; `None` for any
/// other event, read no further (the host's hot path: a text delta or an
/// audio chunk is not parsed for nothing).
pub fn response_done(payload: &[u8]) -> Option<ServerEvent> {
    if event_type(payload)? != "response.done" {
        return None;
    }
    done_of(payload)
}

fn done_of(payload: &[u8]) -> Option<ServerEvent> {
    #[derive(Deserialize)]
    struct Done {
        response: Resp,
    }
    #[derive(Deserialize)]
    struct Resp {
        #[serde(default)]
        id: String,
        #[serde(default)]
        status: String,
        #[serde(default)]
        usage: Option<RtUsage>,
    }
    let d = serde_json::from_slice::<Done>(payload).ok()?;
    Some(ServerEvent::Done {
        usage: d.response.usage.map(Usage::from),
        id: d.response.id,
        status: d.response.status,
    })
}

/// A server event read for what the gateway counts and checks.
pub fn server_event(payload: &[u8]) -> ServerEvent {
    let Some(kind) = event_type(payload) else {
        return ServerEvent::Other;
    };
    match kind.as_str() {
        "response.done" => done_of(payload).unwrap_or(ServerEvent::Other),
        "error" => {
            #[derive(Deserialize)]
            struct Err {
                error: Inner,
            }
            #[derive(Deserialize)]
            struct Inner {
                #[serde(default)]
                code: Option<String>,
                #[serde(default, rename = "type")]
                kind: Option<String>,
            }
            serde_json::from_slice::<Err>(payload).map_or(ServerEvent::Other, |e| {
                ServerEvent::Error {
                    code: e.error.code.or(e.error.kind).unwrap_or_default(),
                }
            })
        }
        k if TEXT_DELTAS.contains(&k) => {
            #[derive(Deserialize)]
            struct Delta {
                #[serde(default)]
                item_id: String,
                #[serde(default)]
                delta: String,
            }
            serde_json::from_slice::<Delta>(payload).map_or(ServerEvent::Other, |d| {
                ServerEvent::Text {
                    item: d.item_id,
                    delta: d.delta,
                }
            })
        }
        _ => ServerEvent::Other,
    }
}

/// The server events that end a response's text or transcript (their
/// whole text in `text` or `transcript`).
const TEXT_DONES: &[&str] = &[
    "response.output_text.done",
    "response.text.done",
    "response.output_audio_transcript.done",
    "response.audio_transcript.done",
];

/// Server events that carry a response's whole texts (items' content).
const WHOLE_TEXTS: &[&str] = &[
    "response.content_part.done",
    "response.output_item.done",
    "response.done",
    "conversation.item.done",
    "conversation.item.added",
    "conversation.item.created",
];

/// The bytes of a response's text the output checks hold back before the
/// client gets them, so that a match across deltas is whole when checked
/// (a match longer than this may pass in part before it is seen).
pub const HOLD: usize = 64;

/// Output checks over a session's server events as they pass: each text
/// delta joins what is held and all but the last [`HOLD`] bytes go on
/// (redacted), the rest when the text ends; whole texts (`*.done`,
/// `response.done`) are checked and redacted in place.
#[derive(Debug, Default)]
pub struct OutputChecks {
    /// The item whose text is held, its held text, and its last delta
    /// event (a copy carries the held text out).
    item: String,
    held: String,
    last: Option<Value>,
}

/// What output checks make of a server event.
#[derive(Debug, PartialEq)]
pub enum Checked {
    Pass,
    /// Sent as these events instead (none: dropped).
    Events(Vec<Vec<u8>>),
    Denied(GatewayError),
}

impl OutputChecks {
    pub fn event(
        &mut self,
        g: &crate::guard::Guardrails,
        active: &[usize],
        payload: &[u8],
        verdicts: &mut Vec<crate::guard::Verdict>,
    ) -> Checked {
        let Some(kind) = event_type(payload) else {
            return Checked::Pass;
        };
        let kind = kind.as_str();
        let delta = TEXT_DELTAS.contains(&kind);
        let done = TEXT_DONES.contains(&kind);
        if !delta && !done && !WHOLE_TEXTS.contains(&kind) {
            return Checked::Pass;
        }
        let Ok(mut v) = serde_json::from_slice::<Value>(payload) else {
            return Checked::Pass;
        };
        let mut check = |texts: Vec<&mut String>| {
            let out = crate::guard::check_strings(g, crate::guard::Stage::Output, active, texts);
            verdicts.extend(out.verdicts);
            (out.denied, out.changed)
        };
        if delta {
            let item = v.get("item_id").and_then(Value::as_str).unwrap_or_default();
            if item != self.item {
                self.item = item.to_string();
                self.held.clear();
            }
            let piece = v.get("delta").and_then(Value::as_str).unwrap_or_default();
            let mut text = std::mem::take(&mut self.held);
            text.push_str(piece);
            let (denied, _) = check(vec![&mut text]);
            if let Some(e) = denied {
                return Checked::Denied(e);
            }
            let mut cut = text.len().saturating_sub(HOLD);
            while !text.is_char_boundary(cut) {
                cut = cut.saturating_sub(1);
            }
            self.held = text.split_off(cut);
            if let Some(d) = v.get_mut("delta") {
                *d = Value::String(text.clone());
            }
            self.last = Some(v.clone());
            return Checked::Events(if text.is_empty() {
                Vec::new()
            } else {
                vec![v.to_string().into_bytes()]
            });
        }
        let mut out = Vec::new();
        if done && !self.held.is_empty() {
            // The text's end: what was held goes first, as one more delta.
            if let Some(mut last) = self.last.take() {
                if let Some(d) = last.get_mut("delta") {
                    *d = Value::String(std::mem::take(&mut self.held));
                }
                out.push(last.to_string().into_bytes());
            }
            self.held.clear();
        }
        let (denied, changed) = check(whole_texts(&mut v));
        if let Some(e) = denied {
            return Checked::Denied(e);
        }
        if out.is_empty() && !changed {
            return Checked::Pass;
        }
        out.push(if changed {
            v.to_string().into_bytes()
        } else {
            payload.to_vec()
        });
        Checked::Events(out)
    }
}

/// The whole texts a server event carries, in place: a text's or
/// transcript's end, a content part, an item's content, a response's
/// output items.
fn whole_texts(v: &mut Value) -> Vec<&mut String> {
    let mut out = Vec::new();
    let Some(o) = v.as_object_mut() else {
        return out;
    };
    for (k, x) in o.iter_mut() {
        match (k.as_str(), x) {
            ("text" | "transcript", Value::String(s)) => out.push(s),
            ("part", Value::Object(p)) => part_texts(p, &mut out),
            ("item", item) => item_whole_texts(item, &mut out),
            ("response", Value::Object(r)) => {
                if let Some(Value::Array(items)) = r.get_mut("output") {
                    for item in items {
                        item_whole_texts(item, &mut out);
                    }
                }
            }
            _ => {}
        }
    }
    out
}

fn part_texts<'v>(p: &'v mut serde_json::Map<String, Value>, out: &mut Vec<&'v mut String>) {
    for (k, x) in p.iter_mut() {
        if let ("text" | "transcript", Value::String(s)) = (k.as_str(), x) {
            out.push(s);
        }
    }
}

fn item_whole_texts<'v>(item: &'v mut Value, out: &mut Vec<&'v mut String>) {
    let Some(Value::Array(parts)) = item.get_mut("content") else {
        return;
    };
    for part in parts {
        if let Some(p) = part.as_object_mut() {
            part_texts(p, out);
        }
    }
}

/// The client events whose texts input checks read.
pub const CLIENT_TEXT_EVENTS: &[&str] = &[
    "conversation.item.create",
    "session.update",
    "response.create",
];

/// A client event's texts, in place: a created item's text parts
/// (`input_text`, `text`), a session's or a response's `instructions`,
/// the text parts of a response's own `input` items.
pub fn client_texts(doc: &mut Value) -> Vec<&mut String> {
    let mut out = Vec::new();
    let Some(obj) = doc.as_object_mut() else {
        return out;
    };
    let kind = obj.get("type").and_then(Value::as_str).unwrap_or_default();
    let kind = kind.to_string();
    match kind.as_str() {
        "conversation.item.create" => {
            if let Some(item) = obj.get_mut("item") {
                item_texts(item, &mut out);
            }
        }
        "session.update" | "response.create" => {
            let key = if kind == "session.update" {
                "session"
            } else {
                "response"
            };
            if let Some(Value::Object(o)) = obj.get_mut(key) {
                for (k, v) in o.iter_mut() {
                    match (k.as_str(), v) {
                        ("instructions", Value::String(s)) => out.push(s),
                        ("input", Value::Array(items)) => {
                            for item in items {
                                item_texts(item, &mut out);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// An item's text parts.
fn item_texts<'v>(item: &'v mut Value, out: &mut Vec<&'v mut String>) {
    let Some(Value::Array(parts)) = item.get_mut("content") else {
        return;
    };
    for part in parts {
        let Some(o) = part.as_object_mut() else {
            continue;
        };
        let is_text = matches!(
            o.get("type").and_then(Value::as_str),
            Some("input_text" | "text" | "output_text")
        );
        if let (true, Some(Value::String(s))) = (is_text, o.get_mut("text")) {
            out.push(s);
        }
    }
}

/// A client event through input checks: `None` when it carries no text
/// the checks read; else their outcome, and the event rewritten when a
/// check redacted.
pub fn check_client_event(
    g: &crate::guard::Guardrails,
    active: &[usize],
    payload: &[u8],
) -> Option<(crate::guard::Outcome, Option<Vec<u8>>)> {
    let kind = event_type(payload)?;
    if !CLIENT_TEXT_EVENTS.contains(&kind.as_str()) {
        return None;
    }
    let mut doc = serde_json::from_slice::<Value>(payload).ok()?;
    let out = crate::guard::check_strings(
        g,
        crate::guard::Stage::Input,
        active,
        client_texts(&mut doc),
    );
    let rewritten = (out.changed && out.denied.is_none()).then(|| doc.to_string().into_bytes());
    Some((out, rewritten))
}

/// A text delta event with another delta (a redacted one).
pub fn with_delta(payload: &[u8], delta: String) -> Option<Vec<u8>> {
    let mut v = serde_json::from_slice::<Value>(payload).ok()?;
    let slot = v.as_object_mut()?.get_mut("delta")?;
    *slot = Value::String(delta);
    Some(v.to_string().into_bytes())
}

/// The `error` event the gateway sends before it ends a session (OpenAI's
/// shape: `error.type`, `code`, `message`).
pub fn error_event(err: &GatewayError, n: u64) -> Vec<u8> {
    json!({
        "type": "error",
        "event_id": format!("event_portcullis_{n}"),
        "error": {
            "type": err.kind,
            "code": err.code,
            "message": err.message,
            "param": null,
            "event_id": null,
        }
    })
    .to_string()
    .into_bytes()
}

/// The upgrade's own checks: a `GET` with `Upgrade: websocket` and a model.
pub fn not_an_upgrade() -> GatewayError {
    GatewayError::bad_request(
        "invalid_request",
        "The Realtime API takes a WebSocket: `GET /v1/realtime?model=...` with `Upgrade: websocket`.",
    )
}

/// No provider of the model serves sessions.
pub fn no_provider(model: &str) -> GatewayError {
    GatewayError::new(
        404,
        "invalid_request_error",
        "model_not_found",
        format!(
            "The model `{model}` has no provider that serves {PATH} (OpenAI-compatible and Azure OpenAI providers do; the model's `apis` in the gateway's config may narrow them)."
        ),
    )
}

pub fn missing_model() -> GatewayError {
    GatewayError::bad_request(
        "missing_model",
        "Missing required parameter: `model` (GET /v1/realtime?model=...).",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_model_and_a_browsers_key_are_read_from_the_upgrade() {
        assert_eq!(
            model_of("?model=gpt-realtime&x=1").as_deref(),
            Some("gpt-realtime")
        );
        assert_eq!(model_of("deployment=my%2Fdep").as_deref(), Some("my/dep"));
        assert_eq!(model_of("?model=&y"), None);
        let (key, rest) =
            key_in_protocols("realtime, openai-insecure-api-key.sk-1, openai-beta.realtime-v1");
        assert_eq!(key.as_deref(), Some("sk-1"));
        assert_eq!(rest.as_deref(), Some("realtime, openai-beta.realtime-v1"));
        assert_eq!(key_in_protocols("openai-insecure-api-key.k").1, None);
    }

    #[test]
    fn an_events_type_is_read_from_its_head_or_by_parsing() {
        assert_eq!(
            event_type(br#"{"type":"response.done","x":1}"#).as_deref(),
            Some("response.done")
        );
        assert_eq!(
            event_type(br#"{"event_id":"e", "type" : "error"}"#).as_deref(),
            Some("error")
        );
        // A nested `type` first: the event is parsed.
        assert_eq!(
            event_type(br#"{"item":{"type":"message"},"type":"conversation.item.create"}"#)
                .as_deref(),
            Some("conversation.item.create")
        );
        assert_eq!(event_type(br#"{"type":"a\"b"}"#).as_deref(), Some("a\"b"));
        assert_eq!(event_type(b"not json"), None);
        // Sorted keys: `type` last, read at the end.
        let sorted = br#"{"event_id":"e","item":{"type":"message","text":"x"},"type":"conversation.item.added"}"#;
        assert_eq!(type_at_end(sorted), Some("conversation.item.added"));
        assert_eq!(
            event_type(sorted).as_deref(),
            Some("conversation.item.added")
        );
        // Not a top member: inside a string, or an escaped quote.
        assert_eq!(type_at_end(br#"{"a":"x\",\"type\":\"y"}"#), None);
        assert_eq!(type_at_end(br#"{"a":{"type":"inner"}}"#), None);
        assert_eq!(type_at_end(br#"{"type":"a\"b"}"#), None);
        assert_eq!(event_type(br#"{"a":"x\",\"type\":\"y"}"#), None);
    }

    #[test]
    fn response_done_gives_its_usage_with_audio_and_cached_tokens() {
        let e = br#"{"type":"response.done","event_id":"e1","response":{"id":"resp_1","status":"completed","output":[],"usage":{"total_tokens":253,"input_tokens":132,"output_tokens":121,"input_token_details":{"text_tokens":119,"audio_tokens":13,"cached_tokens":64},"output_token_details":{"text_tokens":30,"audio_tokens":91}}}}"#;
        let ServerEvent::Done {
            usage: Some(u),
            id,
            status,
        } = server_event(e)
        else {
            panic!("not read");
        };
        assert_eq!((id.as_str(), status.as_str()), ("resp_1", "completed"));
        assert_eq!(
            (
                u.prompt,
                u.completion,
                u.cached,
                u.audio_prompt,
                u.audio_completion
            ),
            (132, 121, 64, 13, 91)
        );
        // The host's read: a `response.done` only, nothing else parsed.
        assert!(matches!(response_done(e), Some(ServerEvent::Done { .. })));
        assert_eq!(
            response_done(br#"{"type":"response.output_text.delta","delta":"x"}"#),
            None
        );
        let d =
            server_event(br#"{"type":"response.output_text.delta","item_id":"i","delta":"Hel"}"#);
        assert_eq!(
            d,
            ServerEvent::Text {
                item: "i".into(),
                delta: "Hel".into()
            }
        );
        assert_eq!(
            server_event(
                br#"{"type":"error","error":{"type":"invalid_request_error","code":"bad"}}"#
            ),
            ServerEvent::Error { code: "bad".into() }
        );
        assert_eq!(
            server_event(br#"{"type":"response.done","response":7}"#),
            ServerEvent::Other
        );
    }

    #[test]
    fn a_client_events_texts_are_found_in_place() {
        let mut v: Value = serde_json::from_str(r#"{"type":"conversation.item.create","item":{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_audio","audio":"AAA"},{"type":"input_text","text":"b"}]}}"#).unwrap();
        let texts: Vec<String> = client_texts(&mut v)
            .into_iter()
            .map(|s| s.clone())
            .collect();
        assert_eq!(texts, vec!["a", "b"]);
        let mut v: Value = serde_json::from_str(
            r#"{"type":"session.update","session":{"instructions":"be brief"}}"#,
        )
        .unwrap();
        for s in client_texts(&mut v) {
            *s = "X".into();
        }
        assert_eq!(v["session"]["instructions"], "X");
        let mut v: Value = serde_json::from_str(r#"{"type":"response.create","response":{"instructions":"i","input":[{"type":"message","content":[{"type":"input_text","text":"t"}]}]}}"#).unwrap();
        assert_eq!(client_texts(&mut v).len(), 2);
        let mut v: Value =
            serde_json::from_str(r#"{"type":"input_audio_buffer.append","audio":"AAA"}"#).unwrap();
        assert!(client_texts(&mut v).is_empty());
    }

    fn guardrails() -> crate::guard::Guardrails {
        let gw = crate::compile::compile(
            br#"
providers: [{name: p, cluster: c, host: h, base_path: /v1, models: [{name: m}]}]
clients: [{name: c, key_sha256: "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3"}]
guardrails:
  output:
    - {name: codes, regex: 'SECRET-[0-9]+', action: redact}
    - {name: stop, regex: 'FORBIDDEN', action: deny}
"#,
        )
        .unwrap();
        gw.guardrails.unwrap()
    }

    fn delta(d: &str) -> Vec<u8> {
        json!({"type": "response.output_text.delta", "item_id": "i1", "delta": d})
            .to_string()
            .into_bytes()
    }

    /// Events through the checks: the deltas the client gets, joined.
    fn through(
        c: &mut OutputChecks,
        g: &crate::guard::Guardrails,
        events: &[Vec<u8>],
    ) -> (String, Vec<Value>) {
        let active: Vec<usize> = (0..g.output.len()).collect();
        let mut text = String::new();
        let mut others = Vec::new();
        let mut verdicts = Vec::new();
        for e in events {
            let sent = match c.event(g, &active, e, &mut verdicts) {
                Checked::Pass => vec![e.clone()],
                Checked::Events(v) => v,
                Checked::Denied(err) => {
                    others.push(json!({"denied": err.code}));
                    break;
                }
            };
            for s in sent {
                let v: Value = serde_json::from_slice(&s).unwrap();
                if v["type"] == "response.output_text.delta" {
                    text.push_str(v["delta"].as_str().unwrap());
                } else {
                    others.push(v);
                }
            }
        }
        (text, others)
    }

    #[test]
    fn a_secret_split_across_deltas_is_redacted_before_the_client_sees_it() {
        let g = guardrails();
        let answer = "the code is SECRET-4242 ok, and a long tail of text that runs past the hold";
        for size in [1usize, 3, 8, 20] {
            let chars: Vec<char> = answer.chars().collect();
            let mut events: Vec<Vec<u8>> = chars
                .chunks(size)
                .map(|c| delta(&c.iter().collect::<String>()))
                .collect();
            events.push(
                json!({"type": "response.output_text.done", "item_id": "i1", "text": answer})
                    .to_string()
                    .into_bytes(),
            );
            events.push(json!({"type": "response.done", "response": {"output": [{"content": [{"type": "text", "text": answer}]}], "usage": {"input_tokens": 1}}}).to_string().into_bytes());
            let mut c = OutputChecks::default();
            let (text, others) = through(&mut c, &g, &events);
            assert!(
                !text.contains("SECRET-4242")
                    && text.starts_with("the code is ")
                    && text.ends_with("past the hold"),
                "{size}: {text}"
            );
            assert!(
                !others.iter().any(|o| o.to_string().contains("SECRET-4242")),
                "{size}: {others:?}"
            );
            assert_eq!(others[1]["response"]["usage"]["input_tokens"], 1);
        }
        // A deny anywhere in the text stops it before it goes out.
        let mut c = OutputChecks::default();
        let (text, others) = through(&mut c, &g, &[delta("all is FORB"), delta("IDDEN here")]);
        assert!(!text.contains("FORB"), "{text}");
        assert_eq!(others, vec![json!({"denied": "guardrail_denied"})]);
    }

    #[test]
    fn the_error_event_is_openais() {
        let e = GatewayError::new(429, "tokens", "rate_limit_exceeded", "no more");
        let v: Value = serde_json::from_slice(&error_event(&e, 3)).unwrap();
        assert_eq!(v["type"], "error");
        assert_eq!(v["event_id"], "event_portcullis_3");
        assert_eq!(v["error"]["code"], "rate_limit_exceeded");
        assert_eq!(v["error"]["message"], "no more");
    }
}
