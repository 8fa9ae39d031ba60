//! OpenAI's chat completions, `POST /v1/chat/completions`: the gateway's
//! pivot API. Its body is read by [`crate::request`] (`model`, a non-empty
//! `messages`, `stream`, `stream_options`, the token bounds); its answers,
//! streams (SSE chunks, usage in the last one when asked) and errors are
//! OpenAI's, and every provider format translates to and from it. Its
//! shapes are [`crate::wire::chat`].

pub const PATH: &str = "/v1/chat/completions";
