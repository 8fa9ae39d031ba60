//! Host-independent decision logic of the Portcullis filter.
//!
//! Nothing here imports `proxy_wasm`: every function takes plain values
//! (time, header facts, body bytes) and returns decisions, so it is tested
//! natively and on wasm32 alike.

pub mod config;
pub mod error;
pub mod headers;
pub mod request;
pub mod routing;
pub mod breaker;
pub mod store;
pub mod attempt;
pub mod sse;
pub mod cache;
pub mod experiment;
pub mod ratelimit;
pub mod usage;
pub mod record;
mod robustness;
