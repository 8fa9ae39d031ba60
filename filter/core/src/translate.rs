//! One seam per provider API (`schema`): what the request to a provider
//! looks like (path, body, credential and version headers), and how its
//! answer comes back to the client in OpenAI's shape. OpenAI's API is the
//! identity: every OpenAI-compatible server takes the client's request as
//! it is, with the provider's model id spliced in. Azure OpenAI differs in
//! its path and credential header only; Anthropic's Messages API is
//! translated both ways ([`anthropic`]).

pub mod anthropic;

use crate::config::{Provider, Schema};
use crate::error::GatewayError;
use crate::request::ChatRequest;

/// A provider's request, ready to send.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Prepared {
    /// The body for the provider; `None`: the client's bytes as they are.
    pub body: Option<Vec<u8>>,
    /// Fields dropped because the provider cannot honour them (told to the
    /// client in a response header).
    pub dropped: Vec<String>,
}

/// The provider's chat endpoint.
pub fn chat_path(p: &Provider, model_id: &str) -> String {
    let base = p.base_path.trim_end_matches('/');
    match &p.schema {
        Schema::OpenAi => format!("{base}/chat/completions"),
        Schema::AzureOpenAi { api_version } => format!(
            "{base}/openai/deployments/{}/chat/completions?api-version={}",
            path_segment(model_id),
            path_segment(api_version)
        ),
        Schema::Anthropic { .. } => format!("{base}/messages"),
    }
}

/// A model id or version inside a path: anything but unreserved
/// characters percent-encoded.
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The body for a provider. `usage_chunk`: ask a streaming OpenAI-shaped
/// provider for its final usage chunk (the gateway reads it; the client gets
/// it only if it asked).
pub fn request_body(
    p: &Provider,
    chat: &ChatRequest,
    model_id: &str,
    usage_chunk: bool,
) -> Result<Prepared, GatewayError> {
    match &p.schema {
        Schema::OpenAi | Schema::AzureOpenAi { .. } => {
            if model_id == chat.model && !(usage_chunk && chat.needs_usage_request()) {
                return Ok(Prepared::default());
            }
            Ok(Prepared {
                body: Some(chat.body_for_with(model_id, usage_chunk)?),
                dropped: Vec::new(),
            })
        }
        Schema::Anthropic { options, .. } => {
            let (body, dropped) = anthropic::request(chat.document()?, model_id, options)?;
            Ok(Prepared {
                body: Some(body),
                dropped,
            })
        }
    }
}

/// The credential header for a provider key.
pub fn credential(p: &Provider, key: &str) -> (&'static str, String) {
    match &p.schema {
        Schema::OpenAi => ("authorization", format!("Bearer {key}")),
        Schema::AzureOpenAi { .. } => ("api-key", key.to_string()),
        Schema::Anthropic { .. } => ("x-api-key", key.to_string()),
    }
}

/// Headers the provider's API requires besides the credential.
pub fn extra_headers(p: &Provider) -> Vec<(&'static str, String)> {
    match &p.schema {
        Schema::Anthropic { version, .. } => vec![("anthropic-version", version.clone())],
        _ => Vec::new(),
    }
}

/// Whether the provider's answers are translated to OpenAI's shape.
pub fn translates_answers(p: &Provider) -> bool {
    matches!(p.schema, Schema::Anthropic { .. })
}

#[cfg(test)]
mod tests;
