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

pub mod api;
pub mod cache;
pub mod compile;
pub mod config;
pub mod credentials;
pub mod error;
pub mod guard;
pub mod health;
pub mod limits;
pub mod mcp;
pub mod pricing;
pub mod providers;
pub mod request;
mod robustness;
pub mod routing;
pub mod shared;
pub mod telemetry;
pub mod translate;
pub mod units;
pub mod usage;
pub mod wire;
