//! The inbound API's side of the matrix: an API's request as a chat
//! completion (the pivot), and the pivot's answers, errors and streams as
//! the API's; the answers the gateway gives itself.

use super::Stream;
use crate::api::{count_tokens, messages, responses, Api};
use crate::error::GatewayError;
use crate::request::{ChatRequest, Document};

/// This API's request as a chat completion for `model_id` (the pivot),
/// and the fields dropped on the way.
pub fn to_pivot(
    api: Api,
    req: &ChatRequest,
    model_id: &str,
) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    match api {
        Api::Messages => messages::to_chat(req.body(), model_id),
        Api::Responses => responses::to_chat(req.body(), model_id),
        _ => Err(GatewayError::internal(format!(
            "{} is not translated to chat completions",
            api.path()
        ))),
    }
}

/// A whole chat completion as this API's answer, at `now` (seconds), for
/// a request with these settings.
pub fn answer_from_pivot(
    api: Api,
    body: &[u8],
    now: u64,
    echo: &responses::Echo,
) -> Option<Vec<u8>> {
    match api {
        Api::Messages => messages::answer_from_chat(body),
        Api::Responses => responses::answer_from_chat(body, now, echo),
        _ => Some(body.to_vec()),
    }
}

/// A chat provider's error as this API's error (same status).
pub fn error_from_pivot(api: Api, body: &[u8], status: u16) -> Vec<u8> {
    match api {
        Api::Messages => messages::error_from_chat(body, status),
        _ => body.to_vec(),
    }
}

/// A chat completions stream as this API's stream, for a request with
/// these settings.
pub fn stream_from_pivot(api: Api, created: u64, echo: &responses::Echo) -> Option<Stream> {
    match api {
        Api::Messages => Some(Stream::ChatToMessages(messages::FromChatStream::new())),
        Api::Responses => Some(Stream::ChatToResponses(responses::FromChatStream::new(
            created, echo,
        ))),
        _ => None,
    }
}

/// The gateway's own answer for a model whose provider format answers
/// this API [`super::Reach::Local`]ly: its body and the
/// header that marks it.
pub fn local_answer(api: Api, doc: &Document) -> Option<(Vec<u8>, (&'static str, &'static str))> {
    match api {
        Api::CountTokens => Some((
            count_tokens::answer(doc),
            (count_tokens::ESTIMATED_HEADER, "true"),
        )),
        _ => None,
    }
}
