//! What the gateway tells about a request: the request record (`record`),
//! W3C trace context (`trace`) and the labels inside metric names
//! (`metric_tags`).
//!
//! May use: `wire`.

pub mod metric_tags;
pub mod record;
pub mod trace;
