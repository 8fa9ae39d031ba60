//! Anthropic's token count, `POST /v1/messages/count_tokens` (Claude Code
//! calls it before it sends a conversation): a Messages body without
//! `max_tokens`; the answer is `{"input_tokens": N}`. Anthropic providers
//! count it themselves (the request passes to them as it is); for a model
//! on any other provider the gateway answers with an estimate ([`estimate`])
//! and says so in `x-portcullis-estimated: true`. Free at Anthropic, so no
//! token limit or budget is taken for it, and nothing is cached.

use crate::guard::texts;
use serde_json::{json, Map, Value};

pub const PATH: &str = "/v1/messages/count_tokens";

/// The response header that marks an estimate.
pub const ESTIMATED_HEADER: &str = "x-portcullis-estimated";

/// An estimate of the input tokens of a Messages request: every text the
/// model reads (system, message contents, tool inputs and results; the
/// same reader as the guardrails), plus the tools' definitions as JSON, at
/// 4 characters a token (rounded up), plus 3 tokens a message for the
/// framing. Images are not counted.
pub fn estimate(doc: &Map<String, Value>) -> u64 {
    let mut copy = doc.clone();
    let slots = texts::request_slots(&mut copy);
    let mut chars: u64 = texts::texts(&slots)
        .iter()
        .map(|t| t.chars().count() as u64)
        .fold(0, u64::saturating_add);
    if let Some(tools) = doc.get("tools") {
        chars = chars.saturating_add(tools.to_string().chars().count() as u64);
    }
    let messages = doc
        .get("messages")
        .and_then(Value::as_array)
        .map_or(0, |m| m.len() as u64);
    chars.div_ceil(4).saturating_add(messages.saturating_mul(3))
}

/// The estimate's answer body.
pub fn answer(doc: &Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({"input_tokens": estimate(doc)})).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn the_estimate_counts_every_text_the_model_reads() {
        let doc = json!({"model": "m", "system": "12345678", "messages": [
            {"role": "user", "content": "abcd"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": "wxyz"}}]}]});
        // 8 + 4 + 4 characters: 4 tokens, and 2 messages of framing.
        assert_eq!(estimate(doc.as_object().unwrap()), 10);
        let with_tools = json!({"model": "m", "tools": [{"name": "f"}], "messages": [{"role": "user", "content": "abcd"}]});
        // 4 + 14 (`[{"name":"f"}]`) characters: 5 tokens, 1 message.
        assert_eq!(estimate(with_tools.as_object().unwrap()), 8);
        assert_eq!(
            answer(with_tools.as_object().unwrap()),
            br#"{"input_tokens":8}"#
        );
    }
}
