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
//!
//! May use: `error`, `wire`, `credentials`.

pub mod external;
pub mod pii;
mod read;
pub mod schema;
pub mod stream;
#[cfg(test)]
mod stream_tests;
#[cfg(test)]
mod tests;
pub mod texts;
pub mod vendor;

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
#[derive(Debug, Clone, PartialEq)]
pub struct External {
    pub cluster: String,
    pub path: String,
    pub authority: String,
    pub timeout_ms: u64,
    /// When the guard fails or is late: refuse (503) instead of admitting.
    pub deny_on_failure: bool,
    /// A content-safety vendor's API instead of our JSON contract.
    pub vendor: Option<vendor::Vendor>,
    /// The environment variable with the vendor's key (or, for Bedrock,
    /// the prefix of the AWS variables), read at configure time.
    pub credential_env: Option<String>,
    /// The check's name and settings, hashed: the kept verdicts' key.
    pub fingerprint: u64,
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
    /// Client names it never applies to (a team's own action is a copy of
    /// the check for them: `teams[].guardrails`).
    pub except: Vec<String>,
    /// Model indexes it applies to (`None`: every model).
    pub models: Option<Vec<usize>>,
}

impl Check {
    pub fn applies(&self, client: &str, model: usize) -> bool {
        self.for_client(client) && self.models.as_ref().is_none_or(|m| m.contains(&model))
    }

    /// Whether it applies to a client's requests.
    pub fn for_client(&self, client: &str) -> bool {
        self.clients
            .as_ref()
            .is_none_or(|c| c.iter().any(|n| n == client))
            && !self.except.iter().any(|n| n == client)
    }

    /// Whether this check can find anything in a text with `bytes` (a
    /// regular expression is assumed to; its engine has its own prefilter).
    pub fn may_match(&self, bytes: pii::Bytes) -> bool {
        match &self.kind {
            Kind::Pii(kinds) => kinds.iter().any(|p| p.may_occur(bytes)),
            _ => true,
        }
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
    /// How long a vendor's verdict on one message is kept (0: not kept).
    pub verdict_ttl_ms: u64,
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
        let mut out = Vec::with_capacity(list.len());
        out.extend(
            list.iter()
                .enumerate()
                .filter(|(_, c)| c.applies(client, model))
                .map(|(i, _)| i),
        );
        out
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
    /// A vendor check's vendor (`guard::vendor`), what it flagged (its own
    /// names) and how long its calls took.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vendor: Option<VendorFacts>,
}

/// What a vendor check's verdict adds to the record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct VendorFacts {
    pub vendor: &'static str,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub categories: Vec<String>,
    pub latency_ms: u64,
    /// Texts sent to the vendor, and texts whose kept verdict was used.
    pub sent: u32,
    pub kept: u32,
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
    /// The request document with the redactions (input, when changed).
    pub rewritten: Option<Map<String, Value>>,
}

impl Outcome {
    /// Record what a check found; `true` when it denies (the stage stops).
    fn found(&mut self, g: &Guardrails, stage: Stage, check: &Check, hit: Hit) -> bool {
        if check.act == Act::Redact {
            self.changed = true;
        }
        let deny = check.act == Act::Deny;
        if deny {
            let what = match stage {
                Stage::Input => "prompt",
                Stage::Output => "answer",
            };
            let why = if hit.reason.is_empty() {
                format!("the {what} matched it {} time(s)", hit.hits)
            } else {
                hit.reason.clone()
            };
            self.denied = Some(g.denial(&check.name, &why));
        }
        self.verdicts.push(Verdict {
            stage,
            check: check.name.clone(),
            action: check.act,
            hits: hit.hits,
            matched: hit.matched,
            reason: hit.reason,
            vendor: None,
        });
        deny
    }
}

/// What one check found.
struct Hit {
    hits: u32,
    matched: Vec<String>,
    reason: String,
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

/// Words: runs of bytes between ASCII whitespace (a byte scan; Unicode
/// spaces beyond ASCII are rare in prompts and only make it an estimate).
fn word_count(t: &str) -> u64 {
    let mut n: u64 = 0;
    let mut in_word = false;
    for &c in t.as_bytes() {
        let space = c.is_ascii_whitespace();
        if !space && !in_word {
            n = n.saturating_add(1);
        }
        in_word = !space;
    }
    n
}

/// Why bounds are broken, if they are.
fn broken_bounds(b: &Bounds, texts: &[&str], what: &str) -> Option<String> {
    let words: u64 = texts.iter().map(|t| word_count(t)).sum();
    let chars: u64 = texts.iter().map(|t| t.chars().count() as u64).sum();
    let tokens = chars.div_ceil(4);
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

/// One text-scanning check over texts, read only: hits and (when kept)
/// the matched texts.
fn scan(
    check: &Check,
    texts: &[&str],
    seams: &[Vec<usize>],
    bytes: &[pii::Bytes],
    keep: bool,
) -> (u32, Vec<String>) {
    let mut hits: u32 = 0;
    let mut matched = Vec::new();
    let mut spans = Vec::new();
    for (i, t) in texts.iter().enumerate() {
        // A text that cannot hold a match is not read (every part and
        // every run of parts is inside it).
        if bytes.get(i).is_some_and(|b| !check.may_match(*b)) {
            continue;
        }
        spans.clear();
        match seams.get(i).filter(|s| !s.is_empty()) {
            Some(s) => texts::joined_spans(t, s, &mut |x, o| check.spans(x, o), &mut spans),
            None => check.spans(t, &mut spans),
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
    }
    (hits, matched)
}

/// What the checks of a stage know of a request.
struct Facts {
    model: usize,
    json_wanted: bool,
    /// How many of the texts, first, are the prompt's or answer's own
    /// (length bounds and the JSON schema read only those; tool-call
    /// arguments after them are scanned, not measured).
    content: usize,
}

/// Run a stage's active checks in order over texts, read only: the
/// verdicts, the first deny, and the redacting checks that found something
/// (the caller rewrites with them).
fn run<'g>(
    g: &'g Guardrails,
    stage: Stage,
    active: &[usize],
    facts: &Facts,
    texts: &[&str],
    seams: &[Vec<usize>],
) -> (Outcome, Vec<&'g Check>) {
    let mut out = Outcome::default();
    let mut redactors = Vec::new();
    let what = match stage {
        Stage::Input => "prompt",
        Stage::Output => "answer",
    };
    let own = texts
        .get(..facts.content.min(texts.len()))
        .unwrap_or_default();
    // What the texts hold that the PII scanners need, read once for every
    // check, when a PII check is active.
    let mut bytes: Vec<pii::Bytes> = Vec::new();
    for &i in active {
        let Some(check) = g.checks(stage).get(i) else {
            continue;
        };
        let plain = |reason: String| Hit {
            hits: 1,
            matched: Vec::new(),
            reason,
        };
        let found = match &check.kind {
            Kind::Regex(_) | Kind::Pii(_) => {
                if matches!(check.kind, Kind::Pii(_)) && bytes.len() != texts.len() {
                    bytes = texts.iter().map(|t| pii::Bytes::of(t)).collect();
                }
                let (hits, matched) = scan(check, texts, seams, &bytes, g.include_content);
                (hits > 0).then_some(Hit {
                    hits,
                    matched,
                    reason: String::new(),
                })
            }
            Kind::Bounds(b) => broken_bounds(b, own, what).map(plain),
            Kind::Models { allow, deny } => {
                let m = facts.model;
                let refused = deny.contains(&m) || allow.as_ref().is_some_and(|a| !a.contains(&m));
                refused.then(|| plain("this model is not allowed for this client".into()))
            }
            Kind::Schema(s) if facts.json_wanted && stage == Stage::Output => {
                own.iter().find_map(|t| {
                    let why = match serde_json::from_str::<Value>(t) {
                        Ok(v) => s.violation(&v)?,
                        Err(_) => "the answer is not valid JSON".to_string(),
                    };
                    Some(plain(format!(
                        "the answer does not match the schema ({why})"
                    )))
                })
            }
            Kind::Schema(_) | Kind::External(_) => None,
        };
        let Some(hit) = found else { continue };
        if check.act == Act::Redact {
            redactors.push(check);
        }
        if out.found(g, stage, check, hit) {
            break;
        }
    }
    (out, redactors)
}

/// A request's local input checks (the `active` indexes, in order), over
/// the request body (already accepted by the parser). A redaction yields
/// the rewritten document in `rewritten`. External checks are left to the
/// caller (see [`external`]).
pub fn check_input(g: &Guardrails, active: &[usize], model: usize, body: &[u8]) -> Outcome {
    // Most requests' texts are read without a tree; the tree is built when
    // their shape needs it or a check redacts (the rewrite's reader).
    if let Some((texts, seams)) = read::request_texts(body) {
        let borrowed: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        let facts = Facts {
            model,
            json_wanted: false,
            content: usize::MAX,
        };
        let (out, _) = run(g, Stage::Input, active, &facts, &borrowed, &seams);
        if !out.changed || out.denied.is_some() {
            return out;
        }
    }
    check_input_doc(
        g,
        active,
        model,
        serde_json::from_slice::<Map<String, Value>>(body).ok(),
    )
}

/// The same over a request already read as a document (a multipart body's
/// text fields); `None`: no texts.
pub fn check_input_doc(
    g: &Guardrails,
    active: &[usize],
    model: usize,
    doc: Option<Map<String, Value>>,
) -> Outcome {
    let facts = Facts {
        model,
        json_wanted: false,
        content: usize::MAX,
    };
    // The one reader of a request's texts (`texts`): what the checks read
    // is what the rewrite redacts.
    let Some(mut doc) = doc else {
        return run(g, Stage::Input, active, &facts, &[], &[]).0;
    };
    let mut slots = texts::request_slots(&mut doc);
    let (mut out, redactors) = {
        let texts = texts::texts(&slots);
        let borrowed: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        run(
            g,
            Stage::Input,
            active,
            &facts,
            &borrowed,
            &texts::seams(&slots),
        )
    };
    if out.changed && out.denied.is_none() {
        texts::rewrite(&mut slots, &mut |t, spans| {
            for c in &redactors {
                c.spans(t, spans);
            }
        });
        drop(slots);
        out.rewritten = Some(doc);
    }
    out
}

/// Whether a request asked for a JSON answer (chat `response_format`,
/// Responses `text.format`).
pub fn wants_json(doc: &Map<String, Value>) -> bool {
    let format = doc
        .get("response_format")
        .or_else(|| doc.get("text").and_then(|t| t.get("format")));
    matches!(
        format.and_then(|r| r.get("type")).and_then(Value::as_str),
        Some("json_object" | "json_schema")
    )
}

/// Output checks over texts already assembled (a stream's whole text at
/// its end), read only.
pub fn check_texts(g: &Guardrails, active: &[usize], json_wanted: bool, texts: &[&str]) -> Outcome {
    let facts = Facts {
        model: 0,
        json_wanted,
        content: usize::MAX,
    };
    run(g, Stage::Output, active, &facts, texts, &[]).0
}

/// Output checks over an answer's text slots (the first `content` the
/// answer's own text), the slots rewritten when a check redacted.
pub fn check_slots(
    g: &Guardrails,
    active: &[usize],
    json_wanted: bool,
    slots: &mut [texts::Slot<'_>],
    content: usize,
) -> Outcome {
    let facts = Facts {
        model: 0,
        json_wanted,
        content,
    };
    let (out, redactors) = {
        let texts = texts::texts(slots);
        let borrowed: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        run(
            g,
            Stage::Output,
            active,
            &facts,
            &borrowed,
            &texts::seams(slots),
        )
    };
    if out.changed && out.denied.is_none() {
        texts::rewrite(slots, &mut |t, spans| {
            for c in &redactors {
                c.spans(t, spans);
            }
        });
    }
    out
}

/// The checks of a stage that read texts a tool call carries (#47): the
/// text-scanning and bounds checks that apply to the client and to every
/// model (a model's checks, the model lists, the JSON schema and external
/// guards are about LLM calls).
pub fn active_for_tools(g: &Guardrails, stage: Stage, client: &str) -> Vec<usize> {
    g.checks(stage)
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.models.is_none()
                && c.for_client(client)
                && matches!(c.kind, Kind::Regex(_) | Kind::Pii(_) | Kind::Bounds(_))
        })
        .map(|(i, _)| i)
        .collect()
}

/// A stage's checks over loose strings (an MCP tool's arguments, a tool's
/// result), each read alone; the strings rewritten in place when a check
/// redacted.
pub fn check_strings(
    g: &Guardrails,
    stage: Stage,
    active: &[usize],
    strings: Vec<&mut String>,
) -> Outcome {
    let facts = Facts {
        model: 0,
        json_wanted: false,
        content: usize::MAX,
    };
    let mut slots: Vec<texts::Slot<'_>> = strings.into_iter().map(texts::Slot::One).collect();
    let (out, redactors) = {
        let texts = texts::texts(&slots);
        let borrowed: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        run(g, stage, active, &facts, &borrowed, &[])
    };
    if out.changed && out.denied.is_none() {
        texts::rewrite(&mut slots, &mut |t, spans| {
            for c in &redactors {
                c.spans(t, spans);
            }
        });
    }
    out
}

/// Output checks on a whole answer in a shape (the texts of
/// [`texts::answer_slots`]): the verdicts, and the answer rewritten when a
/// check redacted. A chat completion is read without a tree first
/// ([`read`]); an answer that does not read passes as it is.
pub fn check_answer_of(
    shape: texts::Shape,
    g: &Guardrails,
    active: &[usize],
    json_wanted: bool,
    body: &[u8],
) -> (Outcome, Option<Vec<u8>>) {
    if shape == texts::Shape::Chat {
        let Some((texts, content)) = read::answer_texts(body) else {
            return (Outcome::default(), None);
        };
        let borrowed: Vec<&str> = texts.iter().map(AsRef::as_ref).collect();
        let facts = Facts {
            model: 0,
            json_wanted,
            content,
        };
        let (out, _) = run(g, Stage::Output, active, &facts, &borrowed, &[]);
        if !out.changed || out.denied.is_some() {
            return (out, None);
        }
    }
    let Ok(mut doc) = serde_json::from_slice::<Value>(body) else {
        return (Outcome::default(), None);
    };
    let out = {
        let (mut slots, content) = texts::answer_slots(shape, &mut doc);
        check_slots(g, active, json_wanted, &mut slots, content)
    };
    if !out.changed || out.denied.is_some() {
        return (out, None);
    }
    (out, serde_json::to_vec(&doc).ok())
}

/// Output checks on a whole chat completion ([`check_answer_of`]).
pub fn check_answer(
    g: &Guardrails,
    active: &[usize],
    json_wanted: bool,
    body: &[u8],
) -> (Outcome, Option<Vec<u8>>) {
    check_answer_of(texts::Shape::Chat, g, active, json_wanted, body)
}
