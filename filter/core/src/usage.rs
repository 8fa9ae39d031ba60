//! Token usage as providers report it.

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
}

#[derive(Deserialize)]
struct Detail {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    pub prompt: u64,
    pub completion: u64,
    pub cached: u64,
    pub reasoning: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.prompt + self.completion
    }

    /// From a `usage` object.
    pub fn from_usage(u: &Value) -> Option<Usage> {
        let n = |v: Option<&Value>| v.and_then(Value::as_u64).unwrap_or(0);
        if !u.is_object() {
            return None;
        }
        Some(Usage {
            prompt: n(u.get("prompt_tokens")),
            completion: n(u.get("completion_tokens")),
            cached: n(u.pointer("/prompt_tokens_details/cached_tokens")),
            reasoning: n(u.pointer("/completion_tokens_details/reasoning_tokens")),
        })
    }

    /// From a whole (non-streamed) completion body.
    pub fn from_body(body: &[u8]) -> Option<Usage> {
        let c = serde_json::from_slice::<Body>(body).ok()?.usage?;
        Some(Usage {
            prompt: c.prompt_tokens.unwrap_or(0),
            completion: c.completion_tokens.unwrap_or(0),
            cached: c
                .prompt_tokens_details
                .and_then(|d| d.cached_tokens)
                .unwrap_or(0),
            reasoning: c
                .completion_tokens_details
                .and_then(|d| d.reasoning_tokens)
                .unwrap_or(0),
        })
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
                reasoning: 2
            })
        );
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
                reasoning: 0
            })
        );
        assert_eq!(Usage::from_body(b"not json"), None);
    }
}
