//! The provider formats, one module each behind one trait ([`Format`]):
//! the upstream path for an inbound API and model, the request for that
//! provider (the credential step last, given the final body, so request
//! signing fits), and the answers translated to the pivot (whole, stream,
//! error). OpenAI's chat completions are the pivot: OpenAI-compatible
//! servers take the client's request as it is with the provider's model id
//! spliced in; Azure OpenAI differs in its path and credential header only;
//! Anthropic's Messages API, Google's Gemini API (and Vertex AI) and AWS
//! Bedrock's Converse are translated both ways from chat completions, their
//! shapes in [`crate::wire`].
//!
//! Which inbound API reaches which format, and how, is the matrix above
//! this module ([`crate::translate`]). Adding a provider format: its wire
//! schema in [`crate::wire`] if it has its own, a module here implementing
//! [`Format`], its line in [`format`], a `Schema` variant for its config,
//! its row in [`crate::translate::reach`], a mock mode and its tests.
//!
//! May use: `api`, `config`, `credentials`, `error`, `request`, `usage`, `wire`.

pub mod anthropic;
pub mod azure_openai;
pub mod bedrock;
pub mod gemini;
pub mod openai;
pub mod vertex;

use crate::api::Api;
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

/// A provider format.
pub trait Format: Sync {
    /// The provider's endpoint for an API, model id and whether the
    /// client asked for a stream.
    fn path(&self, p: &Provider, api: Api, model_id: &str, stream: bool) -> String;

    /// The body for a request that reaches this format [`Reach::Translated`]
    /// (a chat request in the pivot's shape).
    fn translate_request(
        &self,
        _p: &Provider,
        _chat: &ChatRequest,
        _model_id: &str,
    ) -> Result<Prepared, GatewayError> {
        Err(GatewayError::internal(
            "this provider format translates nothing",
        ))
    }

    /// The credential header for the provider's key.
    fn credential(&self, key: &str) -> (&'static str, String);

    /// Headers the provider's API requires besides the credential.
    fn extra_headers(&self, _p: &Provider) -> Vec<(&'static str, String)> {
        Vec::new()
    }

    /// A whole translated answer in the pivot's shape; `None` when it does
    /// not read.
    fn answer(&self, body: &[u8], _created: u64) -> Option<Vec<u8>> {
        Some(body.to_vec())
    }

    /// A translated error in the pivot's shape (same status).
    fn error(&self, body: &[u8], _status: u16) -> Vec<u8> {
        body.to_vec()
    }

    /// A translated stream, event by event.
    fn stream(&self, _created: u64, _emit_usage: bool) -> Option<FormatStream> {
        None
    }
}

/// A provider format's stream being translated to the pivot's chunks.
#[derive(Debug)]
pub enum FormatStream {
    Anthropic(anthropic::Stream),
    Gemini(gemini::Stream),
    Bedrock(bedrock::Stream),
}

impl FormatStream {
    /// The pivot's chunks for these bytes of the provider's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        match self {
            FormatStream::Anthropic(s) => s.push(bytes),
            FormatStream::Gemini(s) => s.push(bytes),
            FormatStream::Bedrock(s) => s.push(bytes),
        }
    }

    /// What is left at the stream's end.
    pub fn finish(&mut self) -> Vec<u8> {
        match self {
            FormatStream::Anthropic(s) => s.finish(),
            FormatStream::Gemini(s) => s.finish(),
            FormatStream::Bedrock(s) => s.finish(),
        }
    }
}

/// The format of a provider: the registry.
pub fn format(schema: &Schema) -> &'static dyn Format {
    match schema {
        Schema::OpenAi => &openai::OpenAi,
        Schema::AzureOpenAi { .. } => &azure_openai::AzureOpenAi,
        Schema::Anthropic { .. } => &anthropic::Anthropic,
        Schema::Gemini { .. } => &gemini::Gemini,
        Schema::Bedrock { .. } => &bedrock::Bedrock,
        Schema::Vertex { publisher, .. } => vertex::format(*publisher),
    }
}

/// How a provider's requests are authorized, as data: the host carries out
/// one of three generic mechanisms and never names a provider format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth<'a> {
    /// A header ([`credential`]) made from the key in the VM environment's
    /// `api_key_env`, if it has one.
    Key,
    /// Each request signed with AWS SigV4 over its final body, with the
    /// keys read from the environment under `env_prefix`
    /// ([`crate::credentials::sigv4::keys_from_env`]); the signature's `authorization`
    /// is the credential, its other headers go with it.
    SigV4 {
        env_prefix: &'a str,
        scope: crate::credentials::sigv4::Scope<'a>,
    },
    /// An access token fetched from a token source ([`token_answer`] reads
    /// its answer) and kept until it expires, sent as [`credential`].
    Token(&'a crate::config::TokenSource),
}

/// What a provider's requests need to be authorized.
pub fn auth(p: &Provider) -> Auth<'_> {
    match &p.schema {
        Schema::Bedrock {
            region, env_prefix, ..
        } => Auth::SigV4 {
            env_prefix,
            scope: crate::credentials::sigv4::Scope {
                region,
                service: bedrock::SIGNING_SERVICE,
            },
        },
        Schema::Vertex { token, .. } => Auth::Token(token),
        Schema::OpenAi
        | Schema::AzureOpenAi { .. }
        | Schema::Anthropic { .. }
        | Schema::Gemini { .. } => Auth::Key,
    }
}

/// A token source's answer (`{"access_token", "expires_in", "token_type"}`,
/// the metadata server's and OAuth's shape): the token and its lifetime in
/// seconds; `None` when it does not read or has no token.
pub fn token_answer(body: &[u8]) -> Option<(String, u64)> {
    vertex::token_answer(body)
}

/// The credential header for a provider key.
pub fn credential(p: &Provider, key: &str) -> (&'static str, String) {
    format(&p.schema).credential(key)
}

/// Headers the provider's API requires besides the credential.
pub fn extra_headers(p: &Provider) -> Vec<(&'static str, String)> {
    format(&p.schema).extra_headers(p)
}

/// Base path without its trailing `/`.
fn base(p: &Provider) -> &str {
    p.base_path.trim_end_matches('/')
}

/// A model id or version inside a path: anything but unreserved
/// characters percent-encoded.
fn path_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len().saturating_add(8));
    crate::credentials::sigv4::uri_encode(s, &mut out);
    out
}

/// The last path segment of an API (`/v1/chat/completions` ->
/// `chat/completions`), as OpenAI-shaped providers name their endpoints.
fn endpoint(api: Api) -> &'static str {
    api.path().strip_prefix("/v1/").unwrap_or(api.path())
}
