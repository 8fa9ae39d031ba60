//! A client's limits: its key's, team's and end user's counters in this
//! Envoy's shared data, taken at admission and settled at the end
//! (`admission`, with `admission::prepare` and `admission::room`), and
//! what a request asks the fleet's rate limit service (`global`). The
//! steps that take them run on the request path (`llm::body`,
//! `llm::limit_service`, `realtime`, `mcp`, `files`).
//!
//! May use: `host`.

pub mod admission;
pub mod global;
