//! The translation matrix, above both axes: which inbound API
//! ([`crate::api`]) reaches which provider format ([`crate::providers`])
//! and how, in one table ([`reach`]), and for every cell of it the request
//! path ([`path`], [`request_body`]) and the way back (whole answers,
//! streams, errors, counts, embeddings: [`Back`]). Both axes import the
//! shared wire schemas ([`crate::wire`]) and never each other; only this
//! module knows them both.
//!
//! A cell's code in one hop from the table: `Translated` is the format's
//! [`Format::translate_request`] and [`Format::answer`] / `stream` /
//! `error`; `ViaPivot` is [`pivot`] (the API to and from chat completions)
//! chained with the format's; `Direct` and `Rewritten` pass the body with
//! the model id spliced (or the format's rewrite); `Local` is
//! [`pivot::local_answer`]; the per-request cells (Gemini's and Bedrock's
//! embeddings and counts, Bedrock's answers that name no model) are the
//! variants of [`Back`] built by [`back_for`].
//!
//! May use: `api`, `config`, `error`, `providers`, `request`, `usage`.

pub mod pivot;

use crate::api::responses::Echo;
use crate::api::Api;
use crate::config::{Provider, Schema};
use crate::error::GatewayError;
use crate::providers::{self, bedrock, gemini, Format, FormatStream, Prepared};
use crate::request::ChatRequest;

/// How a provider format serves an inbound API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// In the API's own shape (the model id spliced in).
    Direct,
    /// Translated from chat completions, answers translated back.
    Translated,
    /// Through the pivot: the inbound API's request translated to a chat
    /// completion (sent to the format as chat completions), its answers
    /// translated back into the API's shape.
    ViaPivot,
    /// In the API's own shape with the body rewritten by the format
    /// (Claude on Vertex: no `model`, its `anthropic_version`); answers
    /// passed as they are.
    Rewritten,
    /// Answered by the gateway itself (an estimate), never sent.
    Local,
    /// Not at all: such a provider is no candidate for that API.
    No,
}

/// The table: which inbound API reaches which provider format.
pub fn reach(schema: &Schema, api: Api) -> Reach {
    use Reach::*;
    if api.has_units() || api == Api::Realtime {
        return units_reach(schema, api);
    }
    match (schema, api) {
        (Schema::OpenAi | Schema::AzureOpenAi { .. }, Api::ChatCompletions | Api::Embeddings) => {
            Direct
        }
        (Schema::OpenAi | Schema::AzureOpenAi { .. }, Api::Messages) => ViaPivot,
        (Schema::Anthropic { .. }, Api::ChatCompletions) => Translated,
        (Schema::Anthropic { .. }, Api::Messages) => Direct,
        (Schema::Anthropic { .. }, Api::Embeddings) => No,
        (Schema::Anthropic { .. }, Api::CountTokens) => Direct,
        (Schema::OpenAi | Schema::AzureOpenAi { .. }, Api::CountTokens) => Local,
        (Schema::OpenAi | Schema::AzureOpenAi { .. }, Api::Responses) => Direct,
        (Schema::Anthropic { .. }, Api::Responses) => ViaPivot,
        (Schema::Gemini { .. }, Api::ChatCompletions) => Translated,
        (Schema::Gemini { .. }, Api::Messages | Api::Responses) => ViaPivot,
        (Schema::Gemini { .. }, Api::CountTokens) => Translated,
        (Schema::Gemini { .. }, Api::Embeddings) => Translated,
        (Schema::Vertex { publisher, .. }, api) => vertex_reach(*publisher, api),
        (Schema::Bedrock { .. }, Api::ChatCompletions) => Translated,
        (Schema::Bedrock { .. }, Api::Messages | Api::Responses) => ViaPivot,
        (Schema::Bedrock { .. }, Api::CountTokens) => Local,
        (Schema::Bedrock { .. }, Api::Embeddings) => Translated,
        _ => No,
    }
}

/// Images, audio, moderations and rerank: in OpenAI's own shape, by
/// OpenAI-compatible providers (rerank: Jina, vLLM, Cohere) and Azure
/// OpenAI (not rerank, which Azure OpenAI does not serve); no other format
/// has an equivalent the gateway translates to.
fn units_reach(schema: &Schema, api: Api) -> Reach {
    match (schema, api) {
        (Schema::OpenAi | Schema::AzureOpenAi { .. }, Api::Realtime) => Reach::Direct,
        (_, Api::Realtime) => Reach::No,
        (Schema::OpenAi, _) => Reach::Direct,
        (Schema::AzureOpenAi { .. }, Api::Rerank) => Reach::No,
        (Schema::AzureOpenAi { .. }, _) => Reach::Direct,
        _ => Reach::No,
    }
}

/// Vertex's table: Gemini on Vertex as Gemini (no embeddings: Vertex's
/// take another API), Claude on Vertex as Anthropic, its Messages bodies
/// rewritten for Vertex (translated, answers passed as they are) and its
/// counts estimated.
fn vertex_reach(publisher: crate::config::Publisher, api: Api) -> Reach {
    use crate::config::Publisher;
    use Reach::*;
    match (publisher, api) {
        (Publisher::Google, Api::ChatCompletions | Api::CountTokens) => Translated,
        (Publisher::Google, Api::Messages | Api::Responses) => ViaPivot,
        (Publisher::Google, Api::Embeddings) => No,
        (Publisher::Anthropic, Api::ChatCompletions) => Translated,
        (Publisher::Anthropic, Api::Messages) => Rewritten,
        (Publisher::Anthropic, Api::Responses) => ViaPivot,
        (Publisher::Anthropic, Api::CountTokens) => Local,
        (Publisher::Anthropic, Api::Embeddings) => No,
        _ => No,
    }
}

/// A stream being translated back to the client's API: a format's stream
/// to the pivot's chunks, or the pivot's chunks to an inbound API's events.
#[derive(Debug)]
pub enum Stream {
    /// A provider format's stream to the pivot.
    Format(FormatStream),
    ChatToMessages(crate::api::messages::FromChatStream),
    ChatToResponses(crate::api::responses::FromChatStream),
    /// A format's stream to the pivot, then the pivot to the API.
    Chain(Box<Stream>, Box<Stream>),
}

impl Stream {
    /// The client's events for these bytes of the provider's stream.
    pub fn push(&mut self, bytes: &[u8]) -> Vec<u8> {
        match self {
            Stream::Format(s) => s.push(bytes),
            Stream::ChatToMessages(s) => s.push(bytes),
            Stream::ChatToResponses(s) => s.push(bytes),
            Stream::Chain(first, then) => {
                let pivot = first.push(bytes);
                then.push(&pivot)
            }
        }
    }

    /// What is left at the stream's end.
    pub fn finish(&mut self) -> Vec<u8> {
        match self {
            Stream::Format(s) => s.finish(),
            Stream::ChatToMessages(s) => s.finish(),
            Stream::ChatToResponses(s) => s.finish(),
            Stream::Chain(first, then) => {
                let pivot = first.finish();
                let mut out = then.push(&pivot);
                out.extend(then.finish());
                out
            }
        }
    }
}

/// Who turns a provider's answer back into the client's API's shape.
#[derive(Clone)]
pub enum Back {
    /// The provider's format, to the pivot (the client speaks it).
    Format(&'static dyn Format),
    /// The inbound API, from the pivot; first the provider's format to the
    /// pivot when it speaks another (`None`: it speaks the pivot). The
    /// request's settings, for the answers that echo them (Responses').
    Api(Option<&'static dyn Format>, Api, Echo),
    /// Gemini's embeddings, to OpenAI's (with what the request asked).
    GeminiEmbeddings(gemini::embeddings::Answer),
    /// Bedrock's Converse, to the pivot naming the client's model (its
    /// answers name none), then to the inbound API when it is not the
    /// pivot.
    Bedrock {
        model: String,
        api: Option<Api>,
        echo: Echo,
    },
    /// Gemini's token count, to Anthropic's.
    GeminiCount,
    /// Bedrock's InvokeModel embeddings (Titan, Cohere), to OpenAI's.
    BedrockEmbeddings(gemini::embeddings::Answer),
}

impl Back {
    /// A whole answer; `None` when it does not read.
    pub fn answer(&self, body: &[u8], created: u64) -> Option<Vec<u8>> {
        match self {
            Back::Format(f) => f.answer(body, created),
            Back::Api(None, a, echo) => pivot::answer_from_pivot(*a, body, created, echo),
            Back::Api(Some(f), a, echo) => {
                pivot::answer_from_pivot(*a, &f.answer(body, created)?, created, echo)
            }
            Back::GeminiEmbeddings(a) => gemini::embeddings::answer(body, a),
            Back::Bedrock {
                model, api: None, ..
            } => bedrock::answer(body, created, model),
            Back::BedrockEmbeddings(a) => bedrock::embeddings::answer(body, a),
            Back::GeminiCount => gemini::count::answer(body),
            Back::Bedrock {
                model,
                api: Some(a),
                echo,
            } => {
                pivot::answer_from_pivot(*a, &bedrock::answer(body, created, model)?, created, echo)
            }
        }
    }

    /// An error answer (same status).
    pub fn error(&self, body: &[u8], status: u16) -> Vec<u8> {
        match self {
            Back::Format(f) => f.error(body, status),
            Back::Api(None, a, _) => pivot::error_from_pivot(*a, body, status),
            Back::Api(Some(f), a, _) => pivot::error_from_pivot(*a, &f.error(body, status), status),
            Back::GeminiEmbeddings(_) => gemini::error(body, status),
            Back::GeminiCount => gemini::count::error(body, status),
            Back::Bedrock { api: None, .. } | Back::BedrockEmbeddings(_) => {
                bedrock::error(body, status)
            }
            Back::Bedrock { api: Some(a), .. } => {
                pivot::error_from_pivot(*a, &bedrock::error(body, status), status)
            }
        }
    }

    /// A stream, event by event.
    pub fn stream(&self, created: u64, emit_usage: bool) -> Option<Stream> {
        match self {
            Back::Format(f) => f.stream(created, emit_usage).map(Stream::Format),
            Back::Api(None, a, echo) => pivot::stream_from_pivot(*a, created, echo),
            Back::Api(Some(f), a, echo) => Some(Stream::Chain(
                Box::new(Stream::Format(f.stream(created, true)?)),
                Box::new(pivot::stream_from_pivot(*a, created, echo)?),
            )),
            Back::GeminiEmbeddings(_) | Back::BedrockEmbeddings(_) | Back::GeminiCount => None,
            Back::Bedrock { model, api, echo } => {
                let s = Stream::Format(FormatStream::Bedrock(bedrock::Stream::new(
                    created,
                    emit_usage || api.is_some(),
                    model,
                )));
                match api {
                    None => Some(s),
                    Some(a) => Some(Stream::Chain(
                        Box::new(s),
                        Box::new(pivot::stream_from_pivot(*a, created, echo)?),
                    )),
                }
            }
        }
    }
}

/// Who translates a provider's answers to a request back, if anyone (what
/// the request asked that the answer's translation needs, read from it).
pub fn back_for(p: &Provider, req: &ChatRequest) -> Option<Back> {
    match (&p.schema, req.api) {
        (Schema::Gemini { .. }, Api::Embeddings) => Some(Back::GeminiEmbeddings(
            gemini::embeddings::answer_for(req.body(), &req.model),
        )),
        (Schema::Bedrock { .. }, Api::Embeddings) => Some(Back::BedrockEmbeddings(
            gemini::embeddings::answer_for(req.body(), &req.model),
        )),
        (Schema::Bedrock { .. }, api) => bedrock_back(p, api, &req.model, echo_of(req)),
        _ => match back(p, req.api) {
            Some(Back::Api(f, a, _)) => Some(Back::Api(f, a, echo_of(req))),
            other => other,
        },
    }
}

/// What a Responses request's answers echo of it (`Echo::default()`, no
/// allocation, for any other API).
fn echo_of(req: &ChatRequest) -> Echo {
    match req.api {
        Api::Responses => Echo::of(req.body()),
        _ => Echo::default(),
    }
}

/// Who translates a provider's answers to an API back, if anyone.
pub fn back(p: &Provider, api: Api) -> Option<Back> {
    if matches!((&p.schema, api), (Schema::Gemini { .. }, Api::Embeddings)) {
        return Some(Back::GeminiEmbeddings(Default::default()));
    }
    if api == Api::CountTokens && reach(&p.schema, api) == Reach::Translated {
        // Gemini's count, on the Gemini API or on Vertex.
        return Some(Back::GeminiCount);
    }
    if matches!((&p.schema, api), (Schema::Bedrock { .. }, Api::Embeddings)) {
        return Some(Back::BedrockEmbeddings(Default::default()));
    }
    if matches!(p.schema, Schema::Bedrock { .. }) {
        return bedrock_back(p, api, "", Echo::default());
    }
    match reach(&p.schema, api) {
        Reach::Translated => Some(Back::Format(providers::format(&p.schema))),
        Reach::ViaPivot => Some(Back::Api(pivot_format(p), api, Echo::default())),
        Reach::Direct | Reach::Rewritten | Reach::Local | Reach::No => None,
    }
}

/// Bedrock's way back for an API, its answers naming `model`.
fn bedrock_back(p: &Provider, api: Api, model: &str, echo: Echo) -> Option<Back> {
    let model = model.to_string();
    match reach(&p.schema, api) {
        Reach::Translated => Some(Back::Bedrock {
            model,
            api: None,
            echo,
        }),
        Reach::ViaPivot => Some(Back::Bedrock {
            model,
            api: Some(api),
            echo,
        }),
        Reach::Direct | Reach::Rewritten | Reach::Local | Reach::No => None,
    }
}

/// The provider's format when it does not speak the pivot itself (its
/// chat completions are translated).
fn pivot_format(p: &Provider) -> Option<&'static dyn Format> {
    (reach(&p.schema, Api::ChatCompletions) == Reach::Translated)
        .then(|| providers::format(&p.schema))
}

/// The API a provider is asked in for a request of `api`.
fn upstream_api(p: &Provider, api: Api) -> Api {
    match reach(&p.schema, api) {
        Reach::ViaPivot => Api::ChatCompletions,
        _ => api,
    }
}

/// Whether a provider serves an API at all.
pub fn serves(p: &Provider, api: Api) -> bool {
    reach(&p.schema, api) != Reach::No
}

/// Whether the gateway answers an API itself for this provider's models.
pub fn answered_locally(p: &Provider, api: Api) -> bool {
    reach(&p.schema, api) == Reach::Local
}

/// The provider's endpoint for an API, model id and whether the client
/// asked for a stream (a format may stream at another endpoint).
pub fn path(p: &Provider, api: Api, model_id: &str, stream: bool) -> String {
    providers::format(&p.schema).path(p, upstream_api(p, api), model_id, stream)
}

/// Where a provider keeps files and batches (`rest`: `/files`,
/// `/batches/{id}/cancel`, ...): under its base path (OpenAI-compatible),
/// under `/openai` with its `api-version` (Azure OpenAI); Message Batches
/// (`/messages/batches...`) under an Anthropic provider's base path;
/// `None` for a format that keeps none of these.
pub fn stored_path(p: &Provider, rest: &str) -> Option<String> {
    let base = p.base_path.trim_end_matches('/');
    // Anthropic's Message Batches live with Anthropic providers only.
    let messages = rest.starts_with("/messages/batches");
    match (&p.schema, messages) {
        (Schema::OpenAi, false) => Some(format!("{base}{rest}")),
        (Schema::AzureOpenAi { api_version }, false) => {
            Some(format!("{base}/openai{rest}?api-version={api_version}"))
        }
        (Schema::Anthropic { .. }, true) => Some(format!("{base}{rest}")),
        _ => None,
    }
}

/// The body for a provider. `usage_chunk`: ask a streaming OpenAI-shaped
/// provider for its final usage chunk (the gateway reads it; the client gets
/// it only if it asked).
pub fn request_body(
    p: &Provider,
    api: Api,
    req: &ChatRequest,
    model_id: &str,
    usage_chunk: bool,
) -> Result<Prepared, GatewayError> {
    match reach(&p.schema, api) {
        Reach::Translated | Reach::Rewritten => {
            providers::format(&p.schema).translate_request(p, req, model_id)
        }
        Reach::ViaPivot => {
            let (body, mut dropped) = pivot::to_pivot(api, req, model_id)?;
            let Some(f) = pivot_format(p) else {
                let body = match drop_fields(p, &body)? {
                    Some(rewritten) => {
                        // `stream_options` in the pivot is the gateway's own.
                        dropped.extend(
                            rewritten
                                .dropped
                                .into_iter()
                                .filter(|f| f != "stream_options"),
                        );
                        rewritten.body.unwrap_or(body)
                    }
                    None => body,
                };
                return Ok(Prepared {
                    body: Some(body),
                    dropped,
                });
            };
            // Two hops: the pivot's request, then the format's.
            let chat = ChatRequest::parse(&body)?;
            let mut prepared = f.translate_request(p, &chat, model_id)?;
            dropped.append(&mut prepared.dropped);
            prepared.dropped = dropped;
            Ok(prepared)
        }
        Reach::Direct => {
            // Only chat completions have the usage chunk to ask for, and
            // not from a provider that refuses `stream_options`.
            let ask = usage_chunk
                && api == Api::ChatCompletions
                && !p.drop_fields.iter().any(|f| f == "stream_options");
            let body = if model_id == req.model && !(ask && req.needs_usage_request()) {
                None
            } else {
                Some(req.body_for_with(model_id, ask)?)
            };
            Ok(
                drop_fields(p, body.as_deref().unwrap_or(req.body()))?.unwrap_or(Prepared {
                    body,
                    dropped: Vec::new(),
                }),
            )
        }
        Reach::Local | Reach::No => Err(GatewayError::internal(format!(
            "routing chose provider `{}`, which does not serve {}",
            p.name,
            api.path()
        ))),
    }
}

/// The body without the provider's `drop_fields` (top level) and which of
/// them it had; `None` when it has none of them (a body that does not name
/// one is not parsed).
fn drop_fields(p: &Provider, body: &[u8]) -> Result<Option<Prepared>, GatewayError> {
    if !body.starts_with(b"{") && !body.trim_ascii_start().starts_with(b"{") {
        // Not a JSON object (a multipart body): nothing to drop.
        return Ok(None);
    }
    let named = |f: &String| {
        let quoted = format!("\"{f}\"");
        body.windows(quoted.len()).any(|w| w == quoted.as_bytes())
    };
    if !p.drop_fields.iter().any(named) {
        return Ok(None);
    }
    let mut doc: serde_json::Map<String, serde_json::Value> = serde_json::from_slice(body)
        .map_err(|e| GatewayError::bad_request("invalid_json", format!("request body: {e}")))?;
    let dropped: Vec<String> = p
        .drop_fields
        .iter()
        .filter(|f| doc.remove(f.as_str()).is_some())
        .cloned()
        .collect();
    if dropped.is_empty() {
        return Ok(None);
    }
    let body = serde_json::to_vec(&doc)
        .map_err(|e| GatewayError::internal(format!("request rewrite: {e}")))?;
    Ok(Some(Prepared {
        body: Some(body),
        dropped,
    }))
}

/// The usage of a stream the client reads in its API's own events (not
/// the pivot's chunks), read as the events pass, unchanged.
#[derive(Debug)]
pub enum EventUsage {
    /// Anthropic's Messages events (cumulative usage, set not added).
    Messages(providers::anthropic::StreamUsage),
    /// Responses events (`response.completed` carries the usage).
    Responses(crate::api::responses::StreamUsage),
}

impl EventUsage {
    /// The reader for an API whose streams pass as its own events; `None`
    /// when the API streams the pivot's chunks (or does not stream).
    pub fn for_api(api: Api) -> Option<EventUsage> {
        if api.streams_anthropic_events() {
            Some(EventUsage::Messages(Default::default()))
        } else if api.streams_response_events() {
            Some(EventUsage::Responses(Default::default()))
        } else {
            None
        }
    }

    pub fn push(&mut self, bytes: &[u8]) {
        match self {
            EventUsage::Messages(u) => u.push(bytes),
            EventUsage::Responses(u) => u.push(bytes),
        }
    }

    /// The usage the stream reported, if it did.
    pub fn usage(&self) -> Option<crate::usage::Usage> {
        match self {
            EventUsage::Messages(u) => u.usage(),
            EventUsage::Responses(u) => u.usage(),
        }
    }
}

#[cfg(test)]
mod tests;
