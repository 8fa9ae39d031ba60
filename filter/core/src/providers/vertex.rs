//! Google Cloud's Vertex AI as a provider format: the publisher models'
//! paths (`/v1/projects/{project}/locations/{region}/publishers/{publisher}/models/{id}:{method}`),
//! an OAuth access token as `Authorization: Bearer` (the host obtains it
//! from the provider's token source and keeps it in shared data), and the
//! two publishers' bodies:
//!
//! - `google` (Gemini on Vertex): Gemini's translation as it is
//!   (`generateContent`, `streamGenerateContent?alt=sse`, `countTokens`).
//! - `anthropic` (Claude on Vertex): Anthropic's Messages body without
//!   `model` (the path names it) and with `anthropic_version:
//!   vertex-2023-10-16`, to `rawPredict` / `streamRawPredict`; answers
//!   and streams are Anthropic's. A Messages request goes with the client's
//!   body rewritten so; chat completions are translated as for Anthropic.

use crate::api::Api;
use crate::config::{Provider, Publisher, Schema};
use crate::error::GatewayError;
use crate::request::ChatRequest;
use crate::wire::borrowed::Obj;

/// The `anthropic_version` Claude on Vertex takes in the body.
pub const ANTHROPIC_VERSION: &str = "vertex-2023-10-16";

/// The metadata server's token endpoint (GCE, GKE with workload identity,
/// Cloud Run): the default token source.
pub const METADATA_HOST: &str = "metadata.google.internal";
pub const METADATA_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// Gemini on Vertex.
pub struct VertexGemini;
/// Claude on Vertex.
pub struct VertexAnthropic;

fn model_path(p: &Provider, publisher: &str, model_id: &str, method: &str) -> String {
    let (project, region) = match &p.schema {
        Schema::Vertex {
            project, region, ..
        } => (project.as_str(), region.as_str()),
        _ => ("", ""),
    };
    format!(
        "{}/v1/projects/{}/locations/{}/publishers/{publisher}/models/{}:{method}",
        super::base(p),
        super::path_segment(project),
        super::path_segment(region),
        super::path_segment(model_id)
    )
}

/// The access token as Vertex takes it.
fn bearer(token: &str) -> (&'static str, String) {
    ("authorization", format!("Bearer {token}"))
}

fn drop_unsupported(p: &Provider) -> bool {
    matches!(&p.schema, Schema::Vertex { options, .. } if options.drop_unsupported)
}

impl super::Format for VertexGemini {
    fn path(&self, p: &Provider, api: Api, model_id: &str, stream: bool) -> String {
        let method = match (api, stream) {
            (Api::CountTokens, _) => "countTokens",
            (_, true) => "streamGenerateContent?alt=sse",
            (_, false) => "generateContent",
        };
        model_path(p, "google", model_id, method)
    }

    fn translate_request(
        &self,
        p: &Provider,
        chat: &ChatRequest,
        model_id: &str,
    ) -> Result<super::Prepared, GatewayError> {
        if chat.api == Api::CountTokens {
            return Ok(super::Prepared {
                body: Some(super::gemini::count::request(chat.body(), model_id)?),
                dropped: Vec::new(),
            });
        }
        let (body, dropped) = super::gemini::request(chat.body(), drop_unsupported(p))?;
        Ok(super::Prepared {
            body: Some(body),
            dropped,
        })
    }

    fn credential(&self, token: &str) -> (&'static str, String) {
        bearer(token)
    }

    fn answer(&self, body: &[u8], created: u64) -> Option<Vec<u8>> {
        super::gemini::answer(body, created)
    }

    fn error(&self, body: &[u8], status: u16) -> Vec<u8> {
        super::gemini::error(body, status)
    }

    fn stream(&self, created: u64, emit_usage: bool) -> Option<super::FormatStream> {
        Some(super::FormatStream::Gemini(super::gemini::Stream::new(
            created, emit_usage,
        )))
    }
}

impl super::Format for VertexAnthropic {
    fn path(&self, p: &Provider, _api: Api, model_id: &str, stream: bool) -> String {
        let method = if stream {
            "streamRawPredict"
        } else {
            "rawPredict"
        };
        model_path(p, "anthropic", model_id, method)
    }

    fn translate_request(
        &self,
        p: &Provider,
        chat: &ChatRequest,
        model_id: &str,
    ) -> Result<super::Prepared, GatewayError> {
        if chat.api == Api::Messages {
            // The client's Messages body, as Vertex takes it.
            return Ok(super::Prepared {
                body: Some(for_vertex(chat.body())?),
                dropped: Vec::new(),
            });
        }
        let Schema::Vertex { options, .. } = &p.schema else {
            return Err(GatewayError::internal(
                "a Vertex provider without its options",
            ));
        };
        let (body, dropped) = super::anthropic::request(chat.body(), model_id, options)?;
        Ok(super::Prepared {
            body: Some(for_vertex(&body)?),
            dropped,
        })
    }

    fn credential(&self, token: &str) -> (&'static str, String) {
        bearer(token)
    }

    fn answer(&self, body: &[u8], created: u64) -> Option<Vec<u8>> {
        super::anthropic::answer(body, created)
    }

    fn error(&self, body: &[u8], status: u16) -> Vec<u8> {
        super::anthropic::error(body, status)
    }

    fn stream(&self, created: u64, emit_usage: bool) -> Option<super::FormatStream> {
        Some(super::FormatStream::Anthropic(
            super::anthropic::Stream::new(created, emit_usage),
        ))
    }
}

/// A Messages body for Claude on Vertex: `anthropic_version` first, then
/// every member but `model` and a client's own `anthropic_version`, as
/// they were.
pub fn for_vertex(body: &[u8]) -> Result<Vec<u8>, GatewayError> {
    let doc = Obj::parse_bytes(body)
        .ok_or_else(|| GatewayError::internal("vertex: a Messages body that does not read"))?;
    let mut out = Vec::with_capacity(body.len().saturating_add(48));
    out.extend_from_slice(br#"{"anthropic_version":""#);
    out.extend_from_slice(ANTHROPIC_VERSION.as_bytes());
    out.push(b'"');
    for (k, v) in doc.members() {
        if k == "model" || k == "anthropic_version" {
            continue;
        }
        out.push(b',');
        serde_json::to_writer(&mut out, k)
            .map_err(|e| GatewayError::internal(format!("vertex: {e}")))?;
        out.push(b':');
        out.extend_from_slice(v.get().as_bytes());
    }
    out.push(b'}');
    Ok(out)
}

/// The format of a Vertex provider, by its publisher.
pub fn format(publisher: Publisher) -> &'static dyn super::Format {
    match publisher {
        Publisher::Google => &VertexGemini,
        Publisher::Anthropic => &VertexAnthropic,
    }
}

/// A token source's answer (`{"access_token", "expires_in", "token_type"}`,
/// the metadata server's and OAuth's shape): the token and its lifetime in
/// seconds; `None` when it does not read or has no token.
pub fn token_answer(body: &[u8]) -> Option<(String, u64)> {
    #[derive(serde::Deserialize)]
    struct Token {
        access_token: String,
        #[serde(default)]
        expires_in: Option<u64>,
    }
    let t: Token = serde_json::from_slice(body).ok()?;
    let token = t.access_token.trim().to_string();
    // A header value: no control characters, no spaces.
    if token.is_empty() || token.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return None;
    }
    Some((token, t.expires_in.unwrap_or(3600)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_messages_body_loses_its_model_and_gains_vertexs_version() {
        let body = json!({"model": "claude-sonnet", "anthropic_version": "x", "max_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}], "stream": true});
        let out: Value =
            serde_json::from_slice(&for_vertex(body.to_string().as_bytes()).unwrap()).unwrap();
        assert_eq!(
            out,
            json!({"anthropic_version": "vertex-2023-10-16", "max_tokens": 5,
                "messages": [{"role": "user", "content": "hi"}], "stream": true})
        );
    }

    #[test]
    fn token_answers_read_as_the_metadata_server_gives_them() {
        assert_eq!(
            token_answer(br#"{"access_token":"ya29.abc","expires_in":3599,"token_type":"Bearer"}"#),
            Some(("ya29.abc".into(), 3599))
        );
        assert_eq!(
            token_answer(br#"{"access_token":"t"}"#),
            Some(("t".into(), 3600))
        );
        for bad in [
            &b"{}"[..],
            b"not json",
            br#"{"access_token":""}"#,
            br#"{"access_token":"a\nb"}"#,
        ] {
            assert_eq!(token_answer(bad), None);
        }
    }
}
