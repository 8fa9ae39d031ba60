//! Anthropic's Messages API, `POST /v1/messages`: the key may come in
//! `x-api-key`; the body needs `model` and a non-empty `messages`; errors
//! are Anthropic's `{"type":"error","error":{...}}`. Served by Anthropic
//! providers with the client's body as it is (the model id spliced in);
//! streams pass through, read only for their usage.

pub const PATH: &str = "/v1/messages";
