//! Anthropic's token count (`POST /v1/messages/count_tokens`) for a
//! Gemini-backed model, counted by Gemini itself: the request through the
//! pivot (Messages to chat) and the chat translation into a
//! `generateContent` request, sent as `models/{id}:countTokens`'s
//! `generateContentRequest` (so the system instruction and the tools are
//! counted too); the answer's `totalTokens` back as `input_tokens`.

use crate::error::GatewayError;
use serde::{Deserialize, Serialize};

/// The `countTokens` body for a count request's body.
pub fn request(body: &[u8], model_id: &str) -> Result<Vec<u8>, GatewayError> {
    let (chat, _) = crate::api::messages::to_chat(body, model_id)?;
    // Counting ignores what generation could not honour.
    let (inner, _) = super::request(&chat, true)?;
    let model = serde_json::to_string(&format!("models/{model_id}"))
        .map_err(|e| GatewayError::internal(format!("count request: {e}")))?;
    let fields = inner
        .strip_prefix(b"{")
        .ok_or_else(|| GatewayError::internal("count request: the translation is not an object"))?;
    let mut out = Vec::with_capacity(inner.len().saturating_add(64));
    out.extend_from_slice(br#"{"generateContentRequest":{"model":"#);
    out.extend_from_slice(model.as_bytes());
    out.push(b',');
    out.extend_from_slice(fields);
    out.push(b'}');
    Ok(out)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Counted {
    total_tokens: u64,
}

#[derive(Serialize)]
struct InputTokens {
    input_tokens: u64,
}

/// Gemini's count as Anthropic's; `None` when it does not read.
pub fn answer(body: &[u8]) -> Option<Vec<u8>> {
    let c: Counted = serde_json::from_slice(body).ok()?;
    serde_json::to_vec(&InputTokens {
        input_tokens: c.total_tokens,
    })
    .ok()
}

/// A Gemini error in Anthropic's shape (same status).
pub fn error(body: &[u8], status: u16) -> Vec<u8> {
    crate::api::messages::error_from_chat(&super::error(body, status), status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_count_request_becomes_count_tokens_with_the_whole_request() {
        let body = json!({"model": "m", "system": "Be brief.", "messages": [{"role": "user", "content": "Hello there"}],
            "tools": [{"name": "f", "description": "d", "input_schema": {"type": "object"}}]});
        let got: Value = serde_json::from_slice(
            &request(body.to_string().as_bytes(), "gemini-2.5-flash").unwrap(),
        )
        .unwrap();
        let inner = &got["generateContentRequest"];
        assert_eq!(inner["model"], "models/gemini-2.5-flash");
        assert_eq!(
            inner["contents"],
            json!([{"role": "user", "parts": [{"text": "Hello there"}]}])
        );
        assert_eq!(inner["systemInstruction"]["parts"][0]["text"], "Be brief.");
        assert_eq!(inner["tools"][0]["functionDeclarations"][0]["name"], "f");
        assert_eq!(got.as_object().map(|o| o.len()), Some(1));
    }

    #[test]
    fn the_count_comes_back_as_input_tokens() {
        let out: Value = serde_json::from_slice(
            &answer(br#"{"totalTokens": 31, "promptTokensDetails": []}"#).unwrap(),
        )
        .unwrap();
        assert_eq!(out, json!({"input_tokens": 31}));
        assert!(answer(b"{}").is_none());
        let e: Value = serde_json::from_slice(&error(
            br#"{"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}"#,
            400,
        ))
        .unwrap();
        assert_eq!(e["type"], "error");
        assert_eq!(e["error"]["message"], "bad");
    }
}
