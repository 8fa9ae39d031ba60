//! Portcullis: the host layer, built two ways from the same code.
//!
//! This is the only code that talks to Envoy, and it talks through one
//! trait ([`host::Host`]): Envoy's proxy-wasm ABI in the Wasm build
//! (`wasm`, `abi`, `abi_host`; wasm32 only), its dynamic-module ABI in the
//! native build (`native`, a `cdylib` built natively; docs/native.md), a
//! fake in the unit tests. Each callback hands plain values to
//! `portcullis_core` and maps the decisions to host calls and `Action`s.
//! Every host status is mapped: a panic would trap the VM (Wasm) or take
//! Envoy down (native, where each hook also catches one).
//!
//! | file | concern |
//! |---|---|
//! | `root`, `loaded` | a worker's root: configure (compile, then swap), tick |
//! | `context` | one HTTP stream: its state and the callbacks |
//! | `pipeline`, `exchange` | the request's life as steps, top to bottom; what the steps hand each other |
//! | `request_headers`, `request_body` | the two request phases: authenticate, then the body's steps |
//! | `guardrails` | input checks (external guards by callout), output checks |
//! | `prompt_cache` | lookup (a hit answers) and store |
//! | `admission` | the client's limits across the request's life |
//! | `global`, `global_limits` | limits counted by the rate limit service |
//! | `flight`, `attempts`, `breakers` | candidates, breakers, fallback callouts |
//! | `concurrency` | adaptive concurrency per provider (AIMD) in shared data |
//! | `policy` | conditional routes, strategies, pinned providers |
//! | `policy_state` | the state strategies read: latencies, requests in flight |
//! | `kept_answers` | which provider made each response: by-id requests, chaining |
//! | `upstream` | the one request builder for every attempt |
//! | `answer`, `reading` | the one answer path (begin / chunk / end) |
//! | `telemetry`, `metrics`, `shipper` | the record, metric names, the log |
//! | `host`, `registry` | the host trait; counters summed per worker |
//! | `wasm`, `abi_host`, `abi` | the Wasm build: proxy-wasm's contexts, Envoy behind the trait |
//! | `native` | the native build: the dynamic module's hooks, Envoy behind the trait |
//! | `worker` | what a worker keeps between requests, in one owned value |
//!
//! Per-worker state lives in one [`worker::Worker`] the root context owns;
//! every request reaches it through its host (`Host::worker`), so the
//! request path has no `thread_local!` and a test's fake host starts from a
//! fresh one (the native build keeps each worker's root in one, as its
//! worker thread is the only thing that tells workers apart).
//!
//! Imports run one way: the steps (`pipeline`, `request_*`, `prompt_cache`, `attempts`,
//! `upstream`, `answer`, `telemetry`, `policy`, `kept_answers`) and `root`
//! use `context`; `context` uses only the state types (`flight`, `reading`,
//! `admission`, `global_limits`, `guard_state`, `loaded`, `policy_state`,
//! `exchange`)
//! and the host, and no state type uses a step: there is no import cycle.

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod abi_host;
mod admission;
mod answer;
mod attempts;
mod breakers;
mod concurrency;
mod context;
mod exchange;
mod flight;
mod global;
mod global_limits;
mod guard_state;
mod guardrails;
mod host;
mod kept_answers;
mod loaded;
mod mcp;
mod mcp_aggregate;
mod mcp_state;
mod metrics;
mod pipeline;
mod policy;
mod policy_state;
mod prompt_cache;
mod reading;
mod realtime;
mod realtime_state;
mod registry;
mod request_body;
mod request_headers;
mod root;
mod semantic_cache;
mod shipper;
mod stored;
mod stored_state;
mod telemetry;
mod tokens;
mod upstream;
mod worker;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod lifecycle_tests;

#[cfg(not(target_arch = "wasm32"))]
pub mod native;
#[cfg(target_arch = "wasm32")]
mod wasm;
