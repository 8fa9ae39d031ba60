//! Token usage as providers report it.
// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

use serde::Deserialize;
use serde_json::Value;

/// Only `usage` is read from a completion; serde skips everything else
/// without building it (a tree of the whole answer cost ~10x more).
#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    usage: Option<Counts>,
}

#[derive(Deserialize)]
struct Counts {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<Detail>,
    #[serde(default)]
    completion_tokens_details: Option<Detail>,
    // Anthropic's names (a Messages answer, or its stream's events).
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    cache_read_input_tokens: Option<u64>,
    #[serde(default)]
    cache_creation_input_tokens: Option<u64>,
    // The Responses API's details (its counts are `input_tokens` and
    // `output_tokens`, cached tokens included in the input).
    #[serde(default)]
    input_tokens_details: Option<Detail>,
    #[serde(default)]
    output_tokens_details: Option<Detail>,
    /// A transcription's seconds of audio (`{"type": "duration",
    /// "seconds": 9}`).
    #[serde(default)]
    seconds: Option<f64>,
}

#[derive(Deserialize)]
struct Detail {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
    /// Cache writes, as the Anthropic translation reports them.
    #[serde(default)]
    cache_creation_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
    pub reasoning: u64,
    /// Prompt tokens written to the provider's cache (part of `prompt`).
    pub cache_write: u64,
    /// The API's units besides tokens ([`crate::api::Units`]): images,
    /// characters, searches from the request; seconds of audio from a
    /// transcription's `usage.seconds`.
    pub units: u64,
    /// Audio tokens among the prompt's and the completion's (the Realtime
    /// API's; priced apart when the price names an audio price).
    pub audio_prompt: u64,
    pub audio_completion: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt.saturating_add(self.completion)
    }

    /// From a `usage` object (read as in a whole body).
    pub fn from_usage(u: &Value) -> Option<Usage> {
        Counts::deserialize(u).ok().map(Usage::from)
    }

    /// From a whole (non-streamed) completion body.
    pub fn from_body(body: &[u8]) -> Option<Usage> {
        Some(serde_json::from_slice::<Body>(body).ok()?.usage?.into())
    }

    /// From the end of a completion body too large to keep whole: the last
    /// `"usage":` object in it. Inside JSON strings quotes are escaped, so
    /// that text cannot come from the completion's content.
    pub fn from_tail(tail: &[u8]) -> Option<Usage> {
        const NEEDLE: &[u8] = b"\"usage\"";
        // memchr's searcher: a byte-by-byte window compare over a 4 KB tail
        // cost ~37k instructions a request (callgrind, #48's speech).
        let at = memchr::memmem::rfind(tail, NEEDLE)?;
        let rest = tail.get(at.checked_add(NEEDLE.len())?..)?;
        let colon = rest.iter().position(|b| !b.is_ascii_whitespace())?;
        if rest.get(colon) != Some(&b':') {
            return None;
        }
        let value = rest.get(colon.checked_add(1)?..)?;
        let counts = serde_json::Deserializer::from_slice(value)
            .into_iter::<Counts>()
            .next()?
            .ok()?;
        Some(counts.into())
    }
}

impl From<Counts> for Usage {
    fn from(c: Counts) -> Usage {
        let units = c
            .seconds
            .filter(|s| s.is_finite() && *s > 0.0)
            .map_or(0, |s| s.ceil().min(u64::MAX as f64) as u64);
        Usage {
            units,
            ..Usage::tokens(c)
        }
    }
}

impl Usage {
    fn tokens(c: Counts) -> Usage {
        if c.prompt_tokens.is_none() && (c.input_tokens.is_some() || c.output_tokens.is_some()) {
            if let Some(d) = c.input_tokens_details {
                // Responses: the input already counts its cached tokens.
                return Usage {
                    prompt: c.input_tokens.unwrap_or(0),
                    completion: c.output_tokens.unwrap_or(0),
                    cached: d.cached_tokens.unwrap_or(0),
                    reasoning: c
                        .output_tokens_details
                        .and_then(|d| d.reasoning_tokens)
                        .unwrap_or(0),
                    cache_write: d.cache_creation_tokens.unwrap_or(0),
                    ..Usage::default()
                };
            }
            let read = c.cache_read_input_tokens.unwrap_or(0);
            let write = c.cache_creation_input_tokens.unwrap_or(0);
            return Usage {
                prompt: c
                    .input_tokens
                    .unwrap_or(0)
                    .saturating_add(read)
                    .saturating_add(write),
                completion: c.output_tokens.unwrap_or(0),
                cached: read,
                reasoning: 0,
                cache_write: write,
                ..Usage::default()
            };
        }
        let details = c.prompt_tokens_details;
        Usage {
            prompt: c.prompt_tokens.unwrap_or(0),
            completion: c.completion_tokens.unwrap_or(0),
            cache_write: details
                .as_ref()
                .and_then(|d| d.cache_creation_tokens)
                .unwrap_or(0),
            cached: details.and_then(|d| d.cached_tokens).unwrap_or(0),
            reasoning: c
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
            ..Usage::default()
        }
    }
}

/// What an answer says of itself, for the record's trace attributes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AnswerFacts {
    pub id: String,
    pub model: String,
    pub finish_reasons: Vec<String>,
}

#[derive(Deserialize)]
struct Head {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    choices: Vec<Choice>,
    /// Anthropic's Messages.
    #[serde(default)]
    stop_reason: Option<String>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    finish_reason: Option<String>,
}

impl AnswerFacts {
    /// From a whole answer (Chat Completions' or Messages' shape, or any
    /// with `id` and `model`); empty when it does not read.
    pub fn from_body(body: &[u8]) -> AnswerFacts {
        let Ok(h) = serde_json::from_slice::<Head>(body) else {
            return AnswerFacts::default();
        };
        let mut finish_reasons: Vec<String> = h
            .choices
            .into_iter()
            .filter_map(|c| c.finish_reason)
            .collect();
        finish_reasons.extend(h.stop_reason);
        AnswerFacts {
            id: h.id.unwrap_or_default(),
            model: h.model.unwrap_or_default(),
            finish_reasons,
        }
    }
}

/// A copy of an answer taken as it passes to the client (Envoy never holds
/// it, so its buffer limit never applies): whole up to `keep` bytes, past
/// that only its last [`TAIL`] bytes, enough to find `usage`.
#[derive(Debug)]
pub struct AnswerCopy {
    bytes: Vec<u8>,
    keep: usize,
    whole: bool,
    /// Whether anyone wants the answer whole (`keep` > 0): when not, only
    /// its usage is read, from the tail, without parsing the rest.
    wanted: bool,
}

/// Bytes kept from the end of an answer too large to keep whole.
pub const TAIL: usize = 4096;

impl AnswerCopy {
    pub fn new(keep: usize) -> Self {
        Self {
            bytes: Vec::new(),
            keep: keep.max(TAIL),
            whole: true,
            wanted: keep > 0,
        }
    }

    pub fn push(&mut self, chunk: &[u8]) {
        if self.whole && self.bytes.len().saturating_add(chunk.len()) <= self.keep {
            self.bytes.extend_from_slice(chunk);
            return;
        }
        self.whole = false;
        self.bytes.extend_from_slice(chunk);
        let excess = self.bytes.len().saturating_sub(TAIL);
        self.bytes.drain(..excess);
    }

    /// The usage it reports, and the whole answer if it was kept whole
    /// (wanted, or without usage: the gateway counts its text then).
    pub fn finish(self) -> (Option<Usage>, Option<Vec<u8>>) {
        if self.whole && self.wanted {
            return (Usage::from_body(&self.bytes), Some(self.bytes));
        }
        let usage = Usage::from_tail(&self.bytes);
        let whole = (self.whole && usage.is_none()).then_some(self.bytes);
        (usage, whole)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn reads_openai_usage_with_details() {
        let b = br#"{"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15,
            "prompt_tokens_details":{"cached_tokens":4},"completion_tokens_details":{"reasoning_tokens":2}}}"#;
        assert_eq!(
            Usage::from_body(b),
            Some(Usage {
                prompt: 10,
                completion: 5,
                cached: 4,
                reasoning: 2,
                cache_write: 0,
                ..Default::default()
            })
        );
        let v: Value = serde_json::from_slice(b).unwrap();
        assert_eq!(
            Usage::from_usage(&v["usage"]),
            Usage::from_body(b),
            "stream and body agree"
        );
        assert_eq!(Usage::from_usage(&Value::Null), None);
        assert_eq!(Usage::from_body(b"{}"), None);
        assert_eq!(Usage::from_body(br#"{"usage":null}"#), None);
        let sparse = br#"{"choices":[{"message":{"content":"x"}}],"usage":{"prompt_tokens":3,
            "completion_tokens":1,"prompt_tokens_details":null,"extra":{"a":[1]}}}"#;
        assert_eq!(
            Usage::from_body(sparse),
            Some(Usage {
                prompt: 3,
                completion: 1,
                cached: 0,
                reasoning: 0,
                cache_write: 0,
                ..Default::default()
            })
        );
        assert_eq!(Usage::from_body(b"not json"), None);
    }

    #[test]
    fn reads_anthropic_usage_with_cache_reads_and_writes() {
        let b = br#"{"type":"message","content":[],"usage":{"input_tokens":10,"output_tokens":5,
            "cache_read_input_tokens":100,"cache_creation_input_tokens":20}}"#;
        let usage = Usage {
            prompt: 130,
            completion: 5,
            cached: 100,
            reasoning: 0,
            cache_write: 20,
            ..Default::default()
        };
        let want = Some(usage);
        assert_eq!(Usage::from_body(b), want);
        assert_eq!(Usage::from_tail(b), want);
        let translated = crate::providers::anthropic::usage(
            &serde_json::from_slice::<Value>(b).unwrap()["usage"],
        );
        assert_eq!(
            Usage::from_usage(&translated),
            want,
            "the translation keeps the split"
        );
        let p = crate::limits::ratelimit::Price {
            input: 3.0,
            output: 15.0,
            cached_input: 0.3,
            cache_write: 3.75,
            reasoning: 15.0,
            ..Default::default()
        };
        assert_eq!(p.usage_cost(&usage), 30 + 30 + 75 + 75);
    }

    const ANSWER: &str = r#"{"id":"c","choices":[{"message":{"content":"say \"usage\": {\"prompt_tokens\":99}"}}],
        "usage":{"prompt_tokens":10,"completion_tokens":5,"completion_tokens_details":{"reasoning_tokens":2}},"system_fingerprint":"fp"}"#;

    #[test]
    fn usage_from_the_tail_of_an_answer_ignores_the_word_in_its_content() {
        let want = Some(Usage {
            prompt: 10,
            completion: 5,
            cached: 0,
            reasoning: 2,
            cache_write: 0,
            ..Default::default()
        });
        assert_eq!(Usage::from_tail(ANSWER.as_bytes()), want);
        let at = ANSWER.find("\"usage\":{").unwrap();
        assert_eq!(Usage::from_tail(&ANSWER.as_bytes()[at - 3..]), want);
        assert_eq!(Usage::from_tail(&ANSWER.as_bytes()[at + 1..]), None);
        assert_eq!(
            Usage::from_tail(b"{\"usage\" : {\"prompt_tokens\":1}}").map(|u| u.prompt),
            Some(1)
        );
        assert_eq!(Usage::from_tail(b"{\"usage\":null}"), None);
    }

    #[test]
    fn an_answer_copy_is_whole_up_to_its_limit_then_keeps_the_tail_with_usage() {
        let mut small = AnswerCopy::new(TAIL * 4);
        for chunk in ANSWER.as_bytes().chunks(7) {
            small.push(chunk);
        }
        let (usage, whole) = small.finish();
        assert_eq!(usage.map(|u| u.total()), Some(15));
        assert_eq!(whole.as_deref(), Some(ANSWER.as_bytes()));

        let big = ANSWER.replace("say", &"x".repeat(3 * TAIL * 4));
        let mut copy = AnswerCopy::new(TAIL * 4);
        for chunk in big.as_bytes().chunks(1000) {
            copy.push(chunk);
            assert!(copy.bytes.len() <= TAIL * 4 + 1000);
        }
        let (usage, whole) = copy.finish();
        assert_eq!(usage.map(|u| u.total()), Some(15));
        assert_eq!(whole, None, "too large to keep whole");
    }

    #[test]
    fn an_answer_nobody_keeps_is_read_for_its_usage_only() {
        let mut copy = AnswerCopy::new(0);
        for chunk in ANSWER.as_bytes().chunks(7) {
            copy.push(chunk);
        }
        let (usage, whole) = copy.finish();
        assert_eq!(usage, Usage::from_body(ANSWER.as_bytes()));
        assert_eq!(whole, None);
    }
}
