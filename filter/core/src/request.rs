//! The chat-completions request body: validate what the gateway needs and
//! rewrite it for a provider.

use crate::error::GatewayError;
use serde_json::{Map, Value};

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    doc: Map<String, Value>,
    pub model: String,
    pub stream: bool,
}

impl ChatRequest {
    /// Parse and check the fields the gateway relies on; the rest is the
    /// provider's business and passes through untouched.
    pub fn parse(body: &[u8]) -> Result<Self, GatewayError> {
        if body.is_empty() {
            return Err(GatewayError::bad_request(
                "invalid_json",
                "Request body is empty: send a JSON object with `model` and `messages`.",
            ));
        }
        let doc: Map<String, Value> = match serde_json::from_slice(body) {
            Ok(Value::Object(m)) => m,
            Ok(_) => {
                return Err(GatewayError::bad_request(
                    "invalid_json",
                    "Request body must be a JSON object with `model` and `messages`.",
                ))
            }
            Err(e) => {
                return Err(GatewayError::bad_request(
                    "invalid_json",
                    format!("Request body is not valid JSON ({e}). Send a JSON object with `model` and `messages`."),
                ))
            }
        };
        let model = match doc.get("model") {
            Some(Value::String(s)) if !s.is_empty() => s.clone(),
            Some(Value::String(_)) | None => {
                return Err(GatewayError::bad_request("missing_model", "You must provide a model parameter (`model`)."))
            }
            Some(_) => return Err(GatewayError::bad_request("invalid_model", "`model` must be a string.")),
        };
        match doc.get("messages") {
            Some(Value::Array(a)) if !a.is_empty() => {}
            Some(Value::Array(_)) => {
                return Err(GatewayError::bad_request("missing_messages", "`messages` must contain at least one message."))
            }
            None => return Err(GatewayError::bad_request("missing_messages", "Missing required parameter: `messages`.")),
            Some(_) => return Err(GatewayError::bad_request("invalid_messages", "`messages` must be an array.")),
        }
        let stream = match doc.get("stream") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => return Err(GatewayError::bad_request("invalid_stream", "`stream` must be true or false.")),
        };
        Ok(Self { doc, model, stream })
    }

    /// The body to send to a provider: the same document with the provider's
    /// model id.
    pub fn body_for(&self, provider_model_id: &str) -> Vec<u8> {
        let mut doc = self.doc.clone();
        doc.insert("model".into(), Value::String(provider_model_id.to_string()));
        serde_json::to_vec(&doc).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn parses_model_and_stream() {
        let r = ChatRequest::parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#).unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream);
    }

    #[test]
    fn rewrite_changes_only_the_model() {
        let r = ChatRequest::parse(br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"x":{"y":[1,2]}}"#).unwrap();
        let v: Value = serde_json::from_slice(&r.body_for("provider/m")).unwrap();
        assert_eq!(v["model"], "provider/m");
        assert_eq!(v["temperature"], 0.5);
        assert_eq!(v["x"]["y"][1], 2);
        assert_eq!(v["messages"][0]["content"], "hi");
    }

    #[test]
    fn every_bad_body_is_a_400_with_a_specific_code() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "invalid_json"),
            (b"{not json", "invalid_json"),
            (b"[1,2]", "invalid_json"),
            (br#"{"messages":[{"role":"user","content":"x"}]}"#, "missing_model"),
            (br#"{"model":"","messages":[{"role":"user","content":"x"}]}"#, "missing_model"),
            (br#"{"model":3,"messages":[{"role":"user","content":"x"}]}"#, "invalid_model"),
            (br#"{"model":"m"}"#, "missing_messages"),
            (br#"{"model":"m","messages":[]}"#, "missing_messages"),
            (br#"{"model":"m","messages":"hi"}"#, "invalid_messages"),
            (br#"{"model":"m","messages":[{}],"stream":"yes"}"#, "invalid_stream"),
        ];
        for (body, code) in cases {
            let e = ChatRequest::parse(body).unwrap_err();
            assert_eq!((e.status, e.code), (400, *code), "{}", String::from_utf8_lossy(body));
        }
    }
}
