//! What is on the wire: the framings and encodings the gateway reads and
//! writes in passing (server-sent events `sse`, AWS's binary
//! `eventstream`, WebSocket frames `websocket`, multipart `form`,
//! protobuf `pb`, the little-endian fields of shared data `le`, JSON read
//! in place `borrowed`, one `strict` pass over a body, `headers` names,
//! `text` encodings), and the schemas below.
//!
//! May use: `error`, `usage`.
//!
//! The wire schemas: one module per shape the gateway reads or writes on
//! either side, used in both directions. Inbound APIs ([`crate::api`]) and
//! provider formats ([`crate::providers`]) import these and never each
//! other; the translations between them are [`crate::translate`].
//!
//! - [`chat`]: OpenAI's chat completions (the pivot): request messages and
//!   tools as read, whole answers as read and written, stream chunks.
//! - [`anthropic`]: Anthropic's Messages (request blocks, tool uses, whole
//!   answers, usage), for the inbound Messages API and the Anthropic,
//!   Claude-on-Vertex and Bedrock paths.

pub mod anthropic;
pub mod borrowed;
pub mod chat;
pub mod eventstream;
pub mod form;
pub mod headers;
pub mod le;
pub mod pb;
pub mod sse;
pub mod strict;
pub mod text;
pub mod websocket;
