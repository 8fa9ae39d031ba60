//! Host-independent decision logic of the Portcullis filter.
//!
//! Nothing here imports `proxy_wasm`: every function takes plain values
//! (time, header facts, body bytes) and returns decisions, so it is tested
//! natively and on wasm32 alike.
//!
//! Two axes and the matrix above them (docs/architecture.md): the wire
//! schemas ([`wire`]) under both the inbound APIs ([`api`]) and the
//! provider formats ([`providers`]), which never import each other; the
//! translations between them in [`translate`]; the compiled config's types
//! in [`config`] and its parser and compiler in [`compile`], above all it
//! checks. No module imports one that imports it back
//! (`tests/tests/test_declarations.rs`).

pub mod affinity;
pub mod aimd;
pub mod api;
pub mod attempt;
pub mod borrowed;
pub mod breaker;
pub mod cache;
pub mod compile;
pub mod config;
pub mod counters;
pub mod error;
pub mod eventstream;
pub mod experiment;
pub mod form;
pub mod guard;
pub mod headers;
pub mod keys;
pub mod le;
pub mod mcp;
pub mod metric_tags;
pub mod pb;
pub mod period;
pub mod price_table;
pub mod pricing;
pub mod providers;
pub mod ratelimit;
pub mod record;
pub mod request;
pub mod rls;
mod robustness;
pub mod routing;
pub mod seal;
pub mod secrets;
pub mod share;
pub mod sigv4;
pub mod sse;
pub mod store;
pub mod strategy;
pub mod stream_cap;
pub mod strict;
pub mod trace;
pub mod translate;
pub mod units;
pub mod usage;
pub mod websocket;
pub mod wire;
