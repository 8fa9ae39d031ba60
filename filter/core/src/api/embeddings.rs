//! OpenAI's embeddings, `POST /v1/embeddings`: the body needs `model` and a
//! non-empty `input` (a string, strings, or token arrays); `dimensions`,
//! `encoding_format` (float or base64) and `user` pass through untouched.
//! Never streamed. Usage is `usage.prompt_tokens` (input price); the
//! answer's vectors are not read beyond it. Served by OpenAI-compatible and
//! Azure OpenAI providers.

pub const PATH: &str = "/v1/embeddings";
