//! The inbound APIs, one module each: which requests they are, what their
//! body must hold, the shape of their errors, where their cached answers
//! live apart. The API is decided once, from the request's method and path,
//! and carried as a value ([`Api`]); which provider formats serve which API
//! is one table, [`crate::translate::reach`].
//!
//! Adding an inbound API: a module here, a variant of [`Api`] and its line
//! in each `match` below, its line in the reach table.
//!
//! May use: `credentials`, `error`, `guard`, `limits`, `units`, `usage`, `wire`.

pub mod audio;
pub mod chat_completions;
pub mod count_tokens;
pub mod embeddings;
pub mod files;
pub mod images;
pub mod messages;
pub mod moderations;
pub mod realtime;
pub mod rerank;
pub mod responses;

use crate::error::GatewayError;

/// An inbound API the gateway serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum Api {
    /// `POST /v1/chat/completions` (OpenAI).
    #[default]
    ChatCompletions,
    /// `POST /v1/messages` (Anthropic).
    Messages,
    /// `POST /v1/embeddings` (OpenAI).
    Embeddings,
    /// `POST /v1/messages/count_tokens` (Anthropic).
    CountTokens,
    /// `POST /v1/responses` (OpenAI).
    Responses,
    /// `POST /v1/images/generations` (OpenAI).
    ImagesGenerations,
    /// `POST /v1/images/edits` (OpenAI, multipart).
    ImagesEdits,
    /// `POST /v1/audio/speech` (OpenAI; audio bytes back).
    AudioSpeech,
    /// `POST /v1/audio/transcriptions` (OpenAI, multipart).
    AudioTranscriptions,
    /// `POST /v1/audio/translations` (OpenAI, multipart).
    AudioTranslations,
    /// `POST /v1/moderations` (OpenAI).
    Moderations,
    /// `POST /v1/rerank` (Jina, vLLM, Cohere v1) and `POST /v2/rerank`
    /// (Cohere v2).
    Rerank,
    /// `GET /v1/realtime?model=...` upgraded to a WebSocket (OpenAI).
    Realtime,
}

/// What a request of an API is priced by besides tokens, known from its
/// body (images asked for, characters to speak, searches) or, for audio
/// seconds, from its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Units {
    pub count: u64,
    /// An image request's size and quality (its price per image).
    pub image: Option<crate::units::ImageKey>,
}

/// Whose error body a client of an API reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorShape {
    OpenAi,
    Anthropic,
}

/// Every API, for listings (the 404 for an unknown path).
pub const ALL: &[Api] = &[
    Api::ChatCompletions,
    Api::Messages,
    Api::Embeddings,
    Api::CountTokens,
    Api::Responses,
    Api::ImagesGenerations,
    Api::ImagesEdits,
    Api::AudioSpeech,
    Api::AudioTranscriptions,
    Api::AudioTranslations,
    Api::Moderations,
    Api::Rerank,
    Api::Realtime,
];

impl Api {
    /// The API a `POST` to this path (query and trailing `/` removed) is.
    pub fn of_path(path: &str) -> Option<Api> {
        if path == rerank::V2 {
            return Some(Api::Rerank);
        }
        // A session is an upgrade (a `GET`), no body to read.
        ALL.iter()
            .copied()
            .find(|a| a.path() == path && *a != Api::Realtime)
    }

    /// Its path.
    pub fn path(self) -> &'static str {
        match self {
            Api::ChatCompletions => chat_completions::PATH,
            Api::Messages => messages::PATH,
            Api::Embeddings => embeddings::PATH,
            Api::CountTokens => count_tokens::PATH,
            Api::Responses => responses::PATH,
            Api::ImagesGenerations => images::GENERATIONS,
            Api::ImagesEdits => images::EDITS,
            Api::AudioSpeech => audio::SPEECH,
            Api::AudioTranscriptions => audio::TRANSCRIPTIONS,
            Api::AudioTranslations => audio::TRANSLATIONS,
            Api::Moderations => moderations::PATH,
            Api::Rerank => rerank::PATH,
            Api::Realtime => realtime::PATH,
        }
    }

    /// A short name, for metric labels, records and messages.
    pub fn name(self) -> &'static str {
        match self {
            Api::ChatCompletions => "chat_completions",
            Api::Messages => "messages",
            Api::Embeddings => "embeddings",
            Api::CountTokens => "count_tokens",
            Api::Responses => "responses",
            Api::ImagesGenerations => "images_generations",
            Api::ImagesEdits => "images_edits",
            Api::AudioSpeech => "audio_speech",
            Api::AudioTranscriptions => "audio_transcriptions",
            Api::AudioTranslations => "audio_translations",
            Api::Moderations => "moderations",
            Api::Rerank => "rerank",
            Api::Realtime => "realtime",
        }
    }

    pub fn error_shape(self) -> ErrorShape {
        match self {
            Api::Messages | Api::CountTokens => ErrorShape::Anthropic,
            _ => ErrorShape::OpenAi,
        }
    }

    /// An error as this API's clients read it.
    pub fn error_body(self, e: &GatewayError) -> Vec<u8> {
        match self.error_shape() {
            ErrorShape::OpenAi => e.body(),
            ErrorShape::Anthropic => e.anthropic_body(),
        }
    }

    /// The body's own required field besides `model`, checked by the
    /// request parser: what it is called and what it must hold.
    pub fn required(self) -> Required {
        match self {
            Api::ChatCompletions | Api::Messages | Api::CountTokens => Required::Messages,
            Api::Embeddings | Api::Responses | Api::Moderations => Required::Input,
            Api::ImagesGenerations | Api::ImagesEdits => Required::Own(images::units),
            Api::AudioSpeech => Required::Own(audio::speech_units),
            Api::Rerank => Required::Own(rerank::units),
            Api::AudioTranscriptions | Api::AudioTranslations => Required::File,
            Api::Realtime => Required::Own(|_| Err(realtime::not_an_upgrade())),
        }
    }

    /// Whether the gateway may ask a stream of this API for its usage chunk
    /// (`stream_options.include_usage`: chat completions only; a Messages
    /// stream always carries its usage).
    pub fn asks_usage_chunk(self) -> bool {
        matches!(self, Api::ChatCompletions)
    }

    /// Whether a streamed answer is Anthropic's events passed through as
    /// they are (read for usage only), rather than OpenAI's chunks.
    pub fn streams_anthropic_events(self) -> bool {
        matches!(self, Api::Messages)
    }

    /// Whether a streamed answer is Responses events (read for usage from
    /// `response.completed`).
    pub fn streams_response_events(self) -> bool {
        matches!(self, Api::Responses)
    }

    /// Whether the providers that serve this API directly keep what they
    /// answer (a response is read back by id, and chained to).
    pub fn keeps_responses(self) -> bool {
        matches!(self, Api::Responses)
    }

    /// Whether a request of this API can ask for a stream.
    pub fn streams(self) -> bool {
        matches!(
            self,
            Api::ChatCompletions | Api::Messages | Api::Responses | Api::AudioTranscriptions
        )
    }

    /// Whether the body is `multipart/form-data` (files with text fields),
    /// read by [`crate::wire::form`]; every other API's is JSON.
    pub fn multipart(self) -> bool {
        matches!(
            self,
            Api::ImagesEdits | Api::AudioTranscriptions | Api::AudioTranslations
        )
    }

    /// Whether answers are stored in the prompt cache (not images, which
    /// differ each time, nor audio, nor rankings and verdicts kept apart).
    pub fn cached(self) -> bool {
        matches!(
            self,
            Api::ChatCompletions | Api::Messages | Api::Embeddings | Api::Responses
        )
    }

    /// Whether the answer is JSON the gateway reads for its usage and
    /// facts (speech answers audio bytes, passed as they come).
    pub fn answer_is_json(self) -> bool {
        !matches!(self, Api::AudioSpeech)
    }

    /// Whether the API has the per-request units of [`Units`] (its requests
    /// reserve nothing for a completion: they produce no tokens the
    /// client asks a cap for).
    pub fn has_units(self) -> bool {
        matches!(
            self,
            Api::ImagesGenerations
                | Api::ImagesEdits
                | Api::AudioSpeech
                | Api::AudioTranscriptions
                | Api::AudioTranslations
                | Api::Moderations
                | Api::Rerank
        )
    }

    /// Prefix of the cache's route for this API: the same body to the same
    /// provider is another answer in another API. Chat completions keep
    /// the empty prefix (their keys are as before).
    pub fn cache_namespace(self) -> &'static str {
        match self {
            Api::ChatCompletions => "",
            Api::Messages => "messages:",
            Api::Embeddings => "embeddings:",
            Api::CountTokens => "count_tokens:",
            Api::Responses => "responses:",
            // Never stored (`cached`); named for completeness.
            _ => "other:",
        }
    }

    /// Whether a stored answer of this API can be replayed as a stream
    /// (chat completions only: as OpenAI's chunks).
    pub fn replays_streams(self) -> bool {
        matches!(self, Api::ChatCompletions)
    }

    /// Whether the request is free at the provider (a count, not a
    /// completion): no token limit or budget is taken, nothing cached.
    pub fn free(self) -> bool {
        matches!(self, Api::CountTokens)
    }

    /// The shape output checks read this API's answers and streams in
    /// (chat completions, responses, messages); `None`: not read (vectors,
    /// counts).
    pub fn answer_shape(self) -> Option<crate::guard::texts::Shape> {
        use crate::guard::texts::Shape;
        match self {
            Api::ChatCompletions => Some(Shape::Chat),
            Api::Messages => Some(Shape::Messages),
            Api::Responses => Some(Shape::Responses),
            _ => None,
        }
    }
}

impl Api {
    /// The shape a stream of this API is read in when the gateway caps its
    /// output tokens (`max_tokens: cap`): chat chunks and Messages events;
    /// `None`: not capped in flight.
    pub fn capped_stream_shape(self) -> Option<crate::limits::stream_cap::Shape> {
        use crate::limits::stream_cap::Shape;
        match self {
            Api::ChatCompletions => Some(Shape::Chat),
            Api::Messages => Some(Shape::Messages),
            _ => None,
        }
    }
}

/// Answers a provider keeps, read back by id and chained to: which API
/// keeps them and how their ids are read (the Responses API's `GET` and
/// `DELETE /v1/responses/{id}`, `previous_response_id`). The host carries
/// out "to the provider that made it" without naming the API.
pub mod kept {
    use super::Api;

    /// The API whose answers are kept (the path a kept answer is read at
    /// starts with its path).
    pub const API: Api = Api::Responses;

    pub use super::responses::{by_id, previous_id, response_id as id_of_answer};
}

/// A translator of the pivot's stream (chat completion chunks) into an
/// API's events: what it does when the answer starts, with text, with a
/// tool call's piece, at the finish reason, at `[DONE]`, on a failure.
/// [`push_chat`] reads the chunks and [`finish_chat`] ends the stream the
/// same way for every API.
pub(crate) trait FromChat {
    fn parser(&mut self) -> &mut crate::wire::sse::SseParser;
    fn ended(&self) -> bool;
    fn started(&self) -> bool;
    /// A finish reason was seen (the answer is whole).
    fn finished(&self) -> bool;
    /// The first chunk (its id and model).
    fn start(&mut self, c: &serde_json::Value) -> Vec<u8>;
    fn usage(&mut self, u: &serde_json::Value);
    fn text(&mut self, t: &str) -> Vec<u8>;
    /// A piece of a tool call (`delta.tool_calls[]`).
    fn call(&mut self, call: &serde_json::Value) -> Vec<u8>;
    fn finish_reason(&mut self, reason: &str) -> Vec<u8>;
    fn end(&mut self) -> Vec<u8>;
    fn fail(&mut self, message: &str) -> Vec<u8>;
}

/// One chunk, read for what every translator needs.
fn chat_chunk<T: FromChat>(t: &mut T, c: &serde_json::Value) -> Vec<u8> {
    use serde_json::Value;
    if let Some(e) = c.get("error") {
        let message = e
            .get("message")
            .and_then(Value::as_str)
            .unwrap_or("The provider's stream failed.");
        return t.fail(message);
    }
    let mut out = if t.started() { Vec::new() } else { t.start(c) };
    if let Some(u) = c.get("usage").filter(|u| u.is_object()) {
        t.usage(u);
    }
    let Some(choice) = c
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
    else {
        return out;
    };
    let delta = choice.get("delta");
    if let Some(text) = delta
        .and_then(|d| d.get("content"))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty())
    {
        out.extend(t.text(text));
    }
    for call in delta
        .and_then(|d| d.get("tool_calls"))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        out.extend(t.call(call));
    }
    if let Some(f) = choice.get("finish_reason").and_then(Value::as_str) {
        out.extend(t.finish_reason(f));
    }
    out
}

/// The events for these bytes of the provider's stream.
pub(crate) fn push_chat<T: FromChat>(t: &mut T, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    if t.ended() {
        return out;
    }
    t.parser().push(bytes);
    if t.parser().overflowed {
        return t.fail("The provider's stream has an event too large to read.");
    }
    while let Some((_, data)) = t.parser().next_event() {
        let Some(d) = data else { continue };
        if d.trim() == "[DONE]" {
            out.extend(t.end());
            break;
        }
        let Ok(chunk) = serde_json::from_str::<serde_json::Value>(&d) else {
            continue;
        };
        out.extend(chat_chunk(t, &chunk));
        if t.ended() {
            break;
        }
    }
    out
}

/// At the stream's end: the end when the answer finished, else a failure.
pub(crate) fn finish_chat<T: FromChat>(t: &mut T) -> Vec<u8> {
    if t.ended() {
        return Vec::new();
    }
    if t.finished() {
        return t.end();
    }
    t.fail("The provider's stream ended before the answer was complete.")
}

/// The field a body must hold besides `model`.
#[derive(Debug, Clone, Copy)]
pub enum Required {
    /// `messages`: a non-empty array.
    Messages,
    /// `input`: a non-empty string or a non-empty array.
    Input,
    /// The API's own checks of its JSON body, giving its units.
    Own(fn(&serde_json::Map<String, serde_json::Value>) -> Result<Units, GatewayError>),
    /// A multipart `file` part (transcriptions and translations).
    File,
}

/// The paths the gateway answers, for the 404 of any other.
pub fn served_paths() -> String {
    let mut out = String::from("GET /v1/models");
    for a in ALL.iter().filter(|a| **a != Api::Realtime) {
        out.push_str(", POST ");
        out.push_str(a.path());
    }
    out.push_str(", POST ");
    out.push_str(rerank::V2);
    out.push_str(", GET ");
    out.push_str(realtime::PATH);
    out.push_str(" (WebSocket)");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn each_api_is_found_by_its_path_and_nothing_else_is() {
        for a in ALL.iter().filter(|a| **a != Api::Realtime) {
            assert_eq!(Api::of_path(a.path()), Some(*a));
        }
        // A session is a `GET` upgrade: no body is read for it.
        assert_eq!(Api::of_path("/v1/realtime"), None);
        assert_eq!(Api::of_path("/v1/responses/x"), None);
        assert_eq!(Api::of_path("/v1/chat/completion"), None);
        assert_eq!(
            served_paths(),
            "GET /v1/models, POST /v1/chat/completions, POST /v1/messages, POST /v1/embeddings, POST /v1/messages/count_tokens, POST /v1/responses, POST /v1/images/generations, POST /v1/images/edits, POST /v1/audio/speech, POST /v1/audio/transcriptions, POST /v1/audio/translations, POST /v1/moderations, POST /v1/rerank, POST /v2/rerank, GET /v1/realtime (WebSocket)"
        );
        assert_eq!(Api::of_path("/v2/rerank"), Some(Api::Rerank));
    }

    #[test]
    fn messages_errors_are_anthropic_shaped_and_the_others_openai_shaped() {
        let e = GatewayError::model_not_found("m");
        let a: serde_json::Value = serde_json::from_slice(&Api::Messages.error_body(&e)).unwrap();
        assert_eq!(a["type"], "error");
        for api in [Api::ChatCompletions, Api::Embeddings] {
            let o: serde_json::Value = serde_json::from_slice(&api.error_body(&e)).unwrap();
            assert_eq!(o["error"]["code"], "model_not_found");
        }
    }
}
