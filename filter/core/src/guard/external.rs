//! The external guard's contract: one JSON request per check, one JSON
//! verdict back.
//!
//! Request (`POST <path>` to the guard's cluster, `content-type:
//! application/json`):
//! `{"stage":"input","check":"<name>","client":"<name>","model":"<name>","text":"<the prompt's texts joined by newlines>"}`
//!
//! Answer (status 200): `{"verdict":"allow"}`, `{"verdict":"deny","reason":"..."}`
//! or `{"verdict":"redact","redact":["text to replace", ...]}` (each listed
//! text is replaced by `[REDACTED:<check>]` wherever it occurs). Any other
//! status, a body that does not read, or no answer within the check's
//! `timeout_ms` is a guard failure: its `failure_mode` decides.

use super::texts::{self, request_slots};
use super::Span;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

#[derive(Serialize)]
struct Request<'a> {
    stage: &'a str,
    check: &'a str,
    client: &'a str,
    model: &'a str,
    text: &'a str,
}

/// The body sent to the guard.
pub fn request(stage: &str, check: &str, client: &str, model: &str, text: &str) -> Vec<u8> {
    serde_json::to_vec(&Request {
        stage,
        check,
        client,
        model,
        text,
    })
    .unwrap_or_default()
}

/// The prompt's texts as one text for the guard.
pub fn joined_text(doc: &mut Map<String, Value>) -> String {
    let slots = request_slots(doc);
    let texts = texts::texts(&slots);
    let mut out = String::new();
    for (i, t) in texts.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(t);
    }
    out
}

/// What the guard said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Allow,
    Deny(String),
    Redact(Vec<String>),
}

#[derive(Deserialize)]
struct Raw {
    verdict: String,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    redact: Vec<String>,
}

/// Most characters of a guard's reason passed on to the client.
const MAX_REASON_CHARS: usize = 200;

/// Read the guard's answer; `Err` says why it is a failure.
pub fn answer(status: Option<u16>, body: &[u8]) -> Result<Answer, String> {
    match status {
        Some(200) => {}
        Some(s) => return Err(format!("the guard answered {s}")),
        None => return Err("no answer from the guard".into()),
    }
    let raw: Raw = serde_json::from_slice(body)
        .map_err(|e| format!("the guard's answer does not read: {e}"))?;
    match raw.verdict.as_str() {
        "allow" => Ok(Answer::Allow),
        "deny" => {
            let reason: String = raw
                .reason
                .unwrap_or_else(|| "the guard service denied it".into())
                .chars()
                .take(MAX_REASON_CHARS)
                .collect();
            Ok(Answer::Deny(reason))
        }
        "redact" => Ok(Answer::Redact(
            raw.redact.into_iter().filter(|t| !t.is_empty()).collect(),
        )),
        other => Err(format!(
            "the guard's verdict `{other}` is not allow, deny or redact"
        )),
    }
}

/// Replace every listed text in the prompt's texts; the number replaced.
pub fn apply_redactions(doc: &mut Map<String, Value>, label: &str, targets: &[String]) -> u32 {
    let mut slots = request_slots(doc);
    texts::rewrite(&mut slots, &mut |t: &str, spans: &mut Vec<Span<'_>>| {
        for target in targets {
            spans.extend(t.match_indices(target.as_str()).map(|(start, m)| Span {
                start,
                end: start.saturating_add(m.len()),
                label,
            }));
        }
    })
}
