//! Guardrails: checks on the prompt (input, before the cache and any
//! provider) and on the answer (output), each with an action: `deny`
//! (refused with an OpenAI-shaped error, code `guardrail_denied`), `redact`
//! (the matched text replaced by `[REDACTED:<label>]` before it goes on) or
//! `log` (the verdict recorded only).
//!
//! Everything here is pure: the host layer hands over the request document
//! or the answer bytes and gets back verdicts and rewritten text. The
//! stream side (a look-behind window over a streamed answer) is in
//! [`stream`], the built-in PII scanners in [`pii`], the JSON Schema subset
//! in [`schema`], the external guard's JSON contract in [`external`].

pub mod external;
pub mod pii;
pub mod schema;
pub mod stream;
#[cfg(test)]
mod tests;

use crate::error::GatewayError;
use serde::Serialize;
use serde_json::{Map, Value};

/// What a check does when it finds something.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Act {
    Deny,
    Redact,
    Log,
}

impl Act {
    pub fn parse(s: &str) -> Option<Act> {
        match s {
            "deny" => Some(Act::Deny),
            "redact" => Some(Act::Redact),
            "log" => Some(Act::Log),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Stage {
    Input,
    Output,
}

/// Word and token-estimate bounds on a text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bounds {
    pub min_words: Option<u64>,
    pub max_words: Option<u64>,
    /// Estimated as characters / 4, rounded up.
    pub max_tokens: Option<u64>,
}

/// An external guard: an Envoy cluster that answers the JSON contract of
/// [`external`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct External {
    pub cluster: String,
    pub path: String,
    pub authority: String,
    pub timeout_ms: u64,
    /// When the guard fails or is late: refuse (503) instead of admitting.
    pub deny_on_failure: bool,
}

#[derive(Debug, Clone)]
pub enum Kind {
    Regex(regex::Regex),
    Pii(Vec<pii::Pii>),
    Bounds(Bounds),
    /// Models a client may (`allow`) or may not (`deny`) use, by index.
    Models {
        allow: Option<Vec<usize>>,
        deny: Vec<usize>,
    },
    /// The answer's JSON, when the client asked for JSON.
    Schema(schema::Schema),
    External(External),
}

#[derive(Debug, Clone)]
pub struct Check {
    pub name: String,
    pub kind: Kind,
    pub act: Act,
    /// Client names it applies to (`None`: every client).
    pub clients: Option<Vec<String>>,
    /// Model indexes it applies to (`None`: every model).
    pub models: Option<Vec<usize>>,
}

impl Check {
    pub fn applies(&self, client: &str, model: usize) -> bool {
        self.clients
            .as_ref()
            .is_none_or(|c| c.iter().any(|n| n == client))
            && self.models.as_ref().is_none_or(|m| m.contains(&model))
    }

    /// Spans of this check in a text, each with the label its redaction
    /// shows (regex and PII checks; other kinds find none).
    pub fn spans<'c>(&'c self, text: &str, out: &mut Vec<Span<'c>>) {
        match &self.kind {
            Kind::Regex(re) => {
                out.extend(re.find_iter(text).filter(|m| !m.is_empty()).map(|m| Span {
                    start: m.start(),
                    end: m.end(),
                    label: &self.name,
                }));
            }
            Kind::Pii(kinds) => {
                let mut found = Vec::new();
                for p in kinds {
                    found.clear();
                    p.find(text, &mut found);
                    out.extend(found.iter().map(|&(start, end)| Span {
                        start,
                        end,
                        label: p.name(),
                    }));
                }
            }
            _ => {}
        }
    }

    fn scans_text(&self) -> bool {
        matches!(self.kind, Kind::Regex(_) | Kind::Pii(_))
    }
}

/// A match: byte range and the label of its redaction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Span<'c> {
    pub start: usize,
    pub end: usize,
    pub label: &'c str,
}

/// The `guardrails` section, compiled.
#[derive(Debug, Clone)]
pub struct Guardrails {
    pub input: Vec<Check>,
    pub output: Vec<Check>,
    pub deny_status: u16,
    /// Streams: bytes of answer text held back so a match split across
    /// chunks is still found (and redacted before it is sent).
    pub lookbehind: usize,
    /// Records carry the matched text.
    pub include_content: bool,
}

pub const DEFAULT_DENY_STATUS: u16 = 400;
pub const DEFAULT_LOOKBEHIND: usize = 256;

impl Guardrails {
    /// Indexes of the checks of a stage that apply to a request.
    pub fn active(&self, stage: Stage, client: &str, model: usize) -> Vec<usize> {
        let list = match stage {
            Stage::Input => &self.input,
            Stage::Output => &self.output,
        };
        list.iter()
            .enumerate()
            .filter(|(_, c)| c.applies(client, model))
            .map(|(i, _)| i)
            .collect()
    }

    pub fn checks(&self, stage: Stage) -> &[Check] {
        match stage {
            Stage::Input => &self.input,
            Stage::Output => &self.output,
        }
    }

    /// The error a client gets when a check denies.
    pub fn denial(&self, check: &str, why: &str) -> GatewayError {
        GatewayError::new(
            self.deny_status,
            "invalid_request_error",
            "guardrail_denied",
            format!("Refused by guardrail `{check}`: {why}."),
        )
    }
}

/// What one check did to one request or answer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    pub stage: Stage,
    pub check: String,
    pub action: Act,
    pub hits: u32,
    /// The matched texts, only when `include_content` is on.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub matched: Vec<String>,
    /// Why a deny or a guard error happened (never the matched text).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
}

/// The verdicts of a request, as the record's JSON (empty when none).
pub fn record_json(verdicts: &[Verdict]) -> String {
    if verdicts.is_empty() {
        return String::new();
    }
    serde_json::to_string(verdicts).unwrap_or_default()
}

/// The result of running a stage's local checks.
#[derive(Debug, Default)]
pub struct Outcome {
    pub verdicts: Vec<Verdict>,
    /// The first deny (the request or answer is refused).
    pub denied: Option<GatewayError>,
    /// Some text was rewritten.
    pub changed: bool,
}

impl Outcome {
    /// Record what a check found; `true` when it denies (the stage stops).
    fn found(
        &mut self,
        g: &Guardrails,
        stage: Stage,
        check: &Check,
        hits: u32,
        matched: Vec<String>,
        reason: String,
    ) -> bool {
        if check.act == Act::Redact {
            self.changed = true;
        }
        let deny = check.act == Act::Deny;
        if deny {
            let what = match stage {
                Stage::Input => "prompt",
                Stage::Output => "answer",
            };
            let why = if reason.is_empty() {
                format!("the {what} matched it {hits} time(s)")
            } else {
                reason.clone()
            };
            self.denied = Some(g.denial(&check.name, &why));
        }
        self.push(stage, check, hits, matched, reason);
        deny
    }

    fn push(
        &mut self,
        stage: Stage,
        check: &Check,
        hits: u32,
        matched: Vec<String>,
        reason: String,
    ) {
        self.verdicts.push(Verdict {
            stage,
            check: check.name.clone(),
            action: check.act,
            hits,
            matched,
            reason,
        });
    }
}

/// Replace spans (sorted by start; overlaps merged into the first) by their
/// labels. Returns the rewritten text.
pub fn redact(text: &str, spans: &mut [Span<'_>]) -> String {
    spans.sort_by_key(|s| (s.start, std::cmp::Reverse(s.end)));
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for s in spans.iter() {
        if s.start < at {
            // Overlaps the previous span: it is replaced with that one.
            at = at.max(s.end);
            continue;
        }
        out.push_str(text.get(at..s.start).unwrap_or_default());
        out.push_str("[REDACTED:");
        out.push_str(s.label);
        out.push(']');
        at = s.end;
    }
    out.push_str(text.get(at..).unwrap_or_default());
    out
}

/// Every text of a request the checks read: message contents, as strings or
/// as `text` parts.
pub fn request_texts(doc: &mut Map<String, Value>) -> Vec<&mut String> {
    let mut out = Vec::new();
    if let Some(Value::Array(msgs)) = doc.get_mut("messages") {
        for m in msgs {
            match m.get_mut("content") {
                Some(Value::String(s)) => out.push(s),
                Some(Value::Array(parts)) => {
                    for p in parts {
                        if p.get("type").and_then(Value::as_str) != Some("text") {
                            continue;
                        }
                        if let Some(Value::String(s)) = p.get_mut("text") {
                            out.push(s);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    out
}

/// Every text of a chat completion the checks read: each choice's content.
pub fn answer_texts(doc: &mut Value) -> Vec<&mut String> {
    let mut out = Vec::new();
    if let Some(Value::Array(choices)) = doc.get_mut("choices") {
        for c in choices {
            if let Some(Value::String(s)) = c.pointer_mut("/message/content") {
                out.push(s);
            }
        }
    }
    out
}

/// Words and the token estimate of some texts.
fn measure(texts: &[&mut String]) -> (u64, u64) {
    let words = texts
        .iter()
        .map(|t| t.split_whitespace().count() as u64)
        .sum();
    let chars: u64 = texts.iter().map(|t| t.chars().count() as u64).sum();
    (words, chars.div_ceil(4))
}

/// Why bounds are broken, if they are.
fn broken_bounds(b: &Bounds, texts: &[&mut String], what: &str) -> Option<String> {
    let (words, tokens) = measure(texts);
    if let Some(m) = b.max_words.filter(|&m| words > m) {
        return Some(format!(
            "the {what} has {words} words, above the limit of {m}"
        ));
    }
    if let Some(m) = b.min_words.filter(|&m| words < m) {
        return Some(format!(
            "the {what} has {words} words, below the minimum of {m}"
        ));
    }
    if let Some(m) = b.max_tokens.filter(|&m| tokens > m) {
        return Some(format!(
            "the {what} has about {tokens} tokens, above the limit of {m}"
        ));
    }
    None
}

/// Run one text-scanning check over texts: redact in place, or count.
/// Returns (hits, matched texts when kept).
fn scan(check: &Check, texts: &mut [&mut String], keep: bool) -> (u32, Vec<String>) {
    let mut hits: u32 = 0;
    let mut matched = Vec::new();
    let mut spans = Vec::new();
    for t in texts.iter_mut() {
        spans.clear();
        check.spans(t, &mut spans);
        if spans.is_empty() {
            continue;
        }
        hits = hits.saturating_add(u32::try_from(spans.len()).unwrap_or(u32::MAX));
        if keep {
            matched.extend(
                spans
                    .iter()
                    .filter_map(|s| t.get(s.start..s.end))
                    .map(String::from),
            );
        }
        if check.act == Act::Redact {
            **t = redact(t, &mut spans);
        }
    }
    (hits, matched)
}

/// A request's local input checks (the `active` indexes, in order), over
/// the request document; redactions rewrite it. External checks are left
/// to the caller (see [`external`]).
pub fn check_input(
    g: &Guardrails,
    active: &[usize],
    model: usize,
    doc: &mut Map<String, Value>,
) -> Outcome {
    let mut out = Outcome::default();
    for &i in active {
        let Some(check) = g.input.get(i) else {
            continue;
        };
        let found = match &check.kind {
            Kind::Regex(_) | Kind::Pii(_) => {
                let mut texts = request_texts(doc);
                let (hits, matched) = scan(check, &mut texts, g.include_content);
                (hits > 0).then(|| (hits, matched, String::new()))
            }
            Kind::Bounds(b) => {
                broken_bounds(b, &request_texts(doc), "prompt").map(|why| (1, Vec::new(), why))
            }
            Kind::Models { allow, deny } => {
                let refused =
                    deny.contains(&model) || allow.as_ref().is_some_and(|a| !a.contains(&model));
                refused.then(|| {
                    (
                        1,
                        Vec::new(),
                        "this model is not allowed for this client".to_string(),
                    )
                })
            }
            Kind::Schema(_) | Kind::External(_) => None,
        };
        let Some((hits, matched, reason)) = found else {
            continue;
        };
        if out.found(g, Stage::Input, check, hits, matched, reason) {
            return out;
        }
    }
    out
}

/// Whether a request asked for a JSON answer (`response_format`).
pub fn wants_json(doc: &Map<String, Value>) -> bool {
    matches!(
        doc.get("response_format")
            .and_then(|r| r.get("type"))
            .and_then(Value::as_str),
        Some("json_object" | "json_schema")
    )
}

/// Output checks over the texts of an answer (a chat completion's contents,
/// or a stream's assembled text): redactions rewrite `texts`.
pub fn check_texts(
    g: &Guardrails,
    active: &[usize],
    json_wanted: bool,
    texts: &mut [&mut String],
) -> Outcome {
    let mut out = Outcome::default();
    for &i in active {
        let Some(check) = g.output.get(i) else {
            continue;
        };
        let found = match &check.kind {
            Kind::Regex(_) | Kind::Pii(_) => {
                let (hits, matched) = scan(check, texts, g.include_content);
                (hits > 0).then(|| (hits, matched, String::new()))
            }
            Kind::Bounds(b) => broken_bounds(b, texts, "answer").map(|why| (1, Vec::new(), why)),
            Kind::Schema(s) if json_wanted => texts.iter().find_map(|t| {
                let why = match serde_json::from_str::<Value>(t) {
                    Ok(v) => s.violation(&v)?,
                    Err(_) => "the answer is not valid JSON".to_string(),
                };
                Some((
                    1,
                    Vec::new(),
                    format!("the answer does not match the schema ({why})"),
                ))
            }),
            _ => None,
        };
        let Some((hits, matched, reason)) = found else {
            continue;
        };
        if out.found(g, Stage::Output, check, hits, matched, reason) {
            return out;
        }
    }
    out
}

/// Output checks on a whole chat completion: the verdicts, and the answer
/// rewritten when a check redacted. An answer that is not a JSON object is
/// passed as it is (nothing to read).
pub fn check_answer(
    g: &Guardrails,
    active: &[usize],
    json_wanted: bool,
    body: &[u8],
) -> (Outcome, Option<Vec<u8>>) {
    let Ok(mut doc) = serde_json::from_slice::<Value>(body) else {
        return (Outcome::default(), None);
    };
    let mut texts = answer_texts(&mut doc);
    let out = check_texts(g, active, json_wanted, &mut texts);
    let rewritten = (out.changed && out.denied.is_none())
        .then(|| serde_json::to_vec(&doc).ok())
        .flatten();
    (out, rewritten)
}

/// Whether any active check of a stage reads text (so the text must be
/// read at all).
pub fn any_text_check(g: &Guardrails, stage: Stage, active: &[usize]) -> bool {
    let list = g.checks(stage);
    active
        .iter()
        .filter_map(|&i| list.get(i))
        .any(|c| c.scans_text() || matches!(c.kind, Kind::Bounds(_) | Kind::Schema(_)))
}
