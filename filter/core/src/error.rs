//! Errors the gateway returns to clients, in OpenAI's shape:
//! `{"error": {"message", "type", "code"}}` with the status the OpenAI SDKs map
//! to the matching exception class.

use serde::Serialize;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayError {
    pub status: u16,
    pub kind: &'static str,
    pub code: &'static str,
    pub message: String,
    /// Seconds for `retry-after`, when waiting helps.
    pub retry_after_s: Option<u64>,
}

#[derive(Serialize)]
struct Body<'a> {
    error: Inner<'a>,
}

#[derive(Serialize)]
struct Inner<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    code: &'a str,
    param: Option<&'a str>,
}

impl GatewayError {
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            kind,
            code,
            message: message.into(),
            retry_after_s: None,
        }
    }

    pub fn missing_key() -> Self {
        Self::new(
            401,
            "invalid_request_error",
            "invalid_api_key",
            "Missing API key: send it as `Authorization: Bearer <key>`.",
        )
    }

    pub fn unknown_key() -> Self {
        Self::new(
            401,
            "invalid_request_error",
            "invalid_api_key",
            "Incorrect API key provided. Ask the gateway operator for a valid key.",
        )
    }

    /// A body over the limit that applies: the gateway's, or the
    /// client's own (`own`), named with the config key that sets it.
    pub fn body_too_large(limit: usize, own: bool) -> Self {
        let (whose, key) = if own {
            ("your key's", "clients[].limits.max_body_bytes")
        } else {
            ("the gateway", "limits.max_body_bytes")
        };
        Self::new(
            413,
            "invalid_request_error",
            "request_too_large",
            format!("Request body exceeds {whose} limit of {limit} bytes (`{key}` in the gateway's plugin config; ask its operator to raise it)."),
        )
    }

    /// A body over the limit of the model it asks for.
    pub fn body_too_large_for_model(limit: usize, model: &str) -> Self {
        Self::new(
            413,
            "invalid_request_error",
            "request_too_large",
            format!("Request body exceeds the limit of {limit} bytes for the model `{model}` (`providers[].models[].max_body_bytes` in the gateway's plugin config; ask its operator to raise it, or use another model)."),
        )
    }

    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", code, message)
    }

    pub fn model_not_found(model: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{model}` does not exist on this gateway. GET /v1/models lists the models you may use."),
        )
    }

    pub fn model_not_allowed(model: &str) -> Self {
        Self::new(
            403,
            "invalid_request_error",
            "model_not_allowed",
            format!("Your key is not allowed to use the model `{model}`. GET /v1/models lists the models you may use."),
        )
    }

    /// `served`: the paths the gateway answers (the inbound APIs'), named
    /// in the message.
    pub fn not_found_path(method: &str, path: &str, served: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            "unknown_url",
            format!(
                "Unrecognized request URL ({method} {path}). This gateway serves {served}, GET /v1/models/{{model}}."
            ),
        )
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "api_error", "gateway_error", message)
    }

    pub fn with_retry_after(mut self, seconds: u64) -> Self {
        self.retry_after_s = Some(seconds);
        self
    }

    /// The body for a client of Anthropic's Messages API
    /// (`{"type":"error","error":{"type","message"}}`), so its SDK raises
    /// the matching class.
    pub fn anthropic_body(&self) -> Vec<u8> {
        let kind = match self.status {
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            413 => "request_too_large",
            429 => "rate_limit_error",
            529 => "overloaded_error",
            400..=499 => "invalid_request_error",
            _ => "api_error",
        };
        serde_json::to_vec(&serde_json::json!({
            "type": "error",
            "error": {"type": kind, "message": self.message},
        }))
        .unwrap_or_default()
    }

    /// The JSON body sent to the client.
    pub fn body(&self) -> Vec<u8> {
        let body = Body {
            error: Inner {
                message: &self.message,
                kind: self.kind,
                code: self.code,
                param: None,
            },
        };
        // Serializing plain strings cannot fail; fall back to a fixed body anyway.
        serde_json::to_vec(&body).unwrap_or_else(|_| {
            br#"{"error":{"message":"gateway error","type":"api_error","code":"gateway_error","param":null}}"#.to_vec()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn error_body_has_openai_shape() {
        let e = GatewayError::model_not_found("gpt-9");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "model_not_found");
        assert!(v["error"]["message"].as_str().unwrap().contains("gpt-9"));
        assert_eq!(e.status, 404);
    }

    #[test]
    fn messages_are_escaped_as_json() {
        let e = GatewayError::bad_request("invalid_json", "quote \" and newline \n");
        let v: serde_json::Value = serde_json::from_slice(&e.body()).unwrap();
        assert_eq!(v["error"]["message"], "quote \" and newline \n");
    }
}
