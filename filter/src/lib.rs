//! Portcullis: the host layer, built two ways from the same code.
//!
//! This is the only code that talks to Envoy, and it talks through one
//! trait ([`host::Host`]): Envoy's proxy-wasm ABI in the Wasm build, its
//! dynamic-module ABI in the native build (both in `bindings`;
//! docs/native.md), a fake in the unit tests. Each callback hands plain
//! values to `portcullis_core` and maps the decisions to host calls and
//! `Action`s. Every host status is mapped: a panic would trap the VM (Wasm)
//! or take Envoy down (native, where each hook also catches one).
//!
//! One folder (or file) per capability, from the bottom floor up; each
//! folder's `mod.rs` (and each file here) says what it owns and, on its
//! `May use:` line, which others it may import
//! (`tests/tests/test_declarations.rs` holds it to that):
//!
//! | module | capability |
//! |---|---|
//! | `host` | the trait Envoy is behind; per-worker state; metric names |
//! | `loaded` | the config a worker applied (compiled, then swapped in) |
//! | `health` | breakers, adaptive concurrency, latencies and load per provider |
//! | `limits` | a client's limits in shared data; the rate limit service's asks |
//! | `request` | one request's state: the holder and a part per capability |
//! | `upstream` | the one request builder for every attempt; access tokens |
//! | `guardrails` | input checks (external guards by callout), output checks |
//! | `llm` | the model call: headers, body, routes, attempts, the answer |
//! | `cache` | the prompt cache: exact and semantic lookups and stores |
//! | `mcp` | the MCP gateway: one server, or all behind one endpoint |
//! | `realtime` | Realtime sessions over WebSocket |
//! | `files` | files and batches, their ids sealed |
//! | `telemetry` | the request record, metrics, the log's shipper |
//! | `root` | a worker's root: configure, tick |
//! | `bindings` | the Wasm and native builds, the fake host |
//!
//! Per-worker state lives in one [`host::worker::Worker`] the root context
//! owns; every request reaches it through its host (`Host::worker`), so the
//! request path has no `thread_local!` and a test's fake host starts from a
//! fresh one (the native build keeps each worker's root in one, as its
//! worker thread is the only thing that tells workers apart).
//!
//! Every step is a method of [`request::RequestContext`], defined in its
//! capability's folder; the state types sit below the steps (`request`),
//! so no folder imports one that imports it back.

pub mod bindings;
mod cache;
mod files;
mod guardrails;
mod health;
mod host;
mod limits;
mod llm;
mod loaded;
mod mcp;
mod realtime;
mod request;
mod root;
mod telemetry;
mod upstream;

#[cfg(test)]
mod lifecycle_tests;
