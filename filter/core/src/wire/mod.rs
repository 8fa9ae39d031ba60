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
pub mod chat;
