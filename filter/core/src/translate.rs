//! One seam per provider API (`schema`): what the request to a provider
//! looks like (path, body, credential header). OpenAI's API is the identity:
//! every OpenAI-compatible server takes the client's request as it is, with
//! the provider's model id spliced in. A schema that differs (Anthropic's
//! Messages, Azure's deployments) implements this trait, and its answer side
//! (answer, stream, error) plugs into the answer path's begin/chunk/end.

use crate::config::Provider;
use crate::error::GatewayError;
use crate::request::ChatRequest;

pub trait Translator {
    /// The provider's chat endpoint.
    fn chat_path(&self, provider: &Provider) -> String;
    /// The body for the provider, or `None` when the client's bytes go as
    /// they are. `usage_chunk`: ask a streaming provider for its final usage
    /// chunk (the gateway reads it; the client gets it only if it asked).
    fn request_body(
        &self,
        chat: &ChatRequest,
        model_id: &str,
        usage_chunk: bool,
    ) -> Result<Option<Vec<u8>>, GatewayError>;
    /// The credential header for a provider key.
    fn credential(&self, key: &str) -> (&'static str, String);
}

/// OpenAI's chat-completions API and every server compatible with it.
pub struct OpenAi;

impl Translator for OpenAi {
    fn chat_path(&self, provider: &Provider) -> String {
        format!(
            "{}/chat/completions",
            provider.base_path.trim_end_matches('/')
        )
    }

    fn request_body(
        &self,
        chat: &ChatRequest,
        model_id: &str,
        usage_chunk: bool,
    ) -> Result<Option<Vec<u8>>, GatewayError> {
        if model_id == chat.model && !(usage_chunk && chat.needs_usage_request()) {
            return Ok(None);
        }
        chat.body_for_with(model_id, usage_chunk).map(Some)
    }

    fn credential(&self, key: &str) -> (&'static str, String) {
        ("authorization", format!("Bearer {key}"))
    }
}

/// The translator for a provider's schema.
pub fn for_provider(_provider: &Provider) -> &'static dyn Translator {
    &OpenAi
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::breaker::BreakerConfig;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn provider(base_path: &str) -> Provider {
        Provider {
            name: "p".into(),
            cluster: "c".into(),
            host: "h".into(),
            base_path: base_path.into(),
            api_key_env: None,
            timeout_ms: 1,
            breaker: BreakerConfig::default(),
        }
    }

    #[test]
    fn openai_is_the_identity_but_for_the_model_id_and_the_usage_request() {
        let t = for_provider(&provider("/v1/"));
        assert_eq!(t.chat_path(&provider("/v1/")), "/v1/chat/completions");
        let chat =
            ChatRequest::parse(br#"{"model":"m","messages":[{"role":"user","content":"x"}]}"#)
                .unwrap();
        assert_eq!(
            t.request_body(&chat, "m", true).unwrap(),
            None,
            "nothing to change"
        );
        let body = t.request_body(&chat, "m-2024", false).unwrap().unwrap();
        assert_eq!(
            body,
            br#"{"model":"m-2024","messages":[{"role":"user","content":"x"}]}"#
        );
        let stream = ChatRequest::parse(
            br#"{"model":"m","messages":[{"role":"user","content":"x"}],"stream":true}"#,
        )
        .unwrap();
        let body = t.request_body(&stream, "m", true).unwrap().unwrap();
        assert!(String::from_utf8(body)
            .unwrap()
            .contains(r#""include_usage":true"#));
        assert_eq!(
            t.credential("sk-1"),
            ("authorization", "Bearer sk-1".to_string())
        );
    }
}
