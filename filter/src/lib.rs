//! Portcullis: the proxy-wasm host layer.
//!
//! This is the only code that talks to Envoy, and it talks through one
//! trait ([`host::Host`]): Envoy's ABI in production, a fake in the unit
//! tests. Each callback hands plain values to `portcullis_core` and maps the
//! decisions to host calls and `Action`s. Every host `Status` is mapped (see
//! `abi`): a panic would trap the VM and break every later request on this
//! worker.
//!
//! | file | concern |
//! |---|---|
//! | `root`, `loaded` | the root context: configure (compile, then swap), tick |
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
//! | `responses_by_id` | which provider made each response: by-id requests, chaining |
//! | `upstream` | the one request builder for every attempt |
//! | `answer`, `reading` | the one answer path (begin / chunk / end) |
//! | `telemetry`, `metrics`, `shipper` | the record, metric names, the log |
//! | `host`, `abi_host`, `registry`, `abi` | the host trait and Envoy behind it |
//! | `worker` | what a worker keeps between requests, in one owned value |
//!
//! Per-worker state lives in one [`worker::Worker`] the root context owns;
//! every request reaches it through its host (`Host::worker`), so there is
//! no `thread_local!` and a test's fake host starts from a fresh one.
//!
//! Imports run one way: the steps (`pipeline`, `request_*`, `prompt_cache`, `attempts`,
//! `upstream`, `answer`, `telemetry`, `policy`, `responses_by_id`) and `root`
//! use `context`; `context` uses only the state types (`flight`, `reading`,
//! `admission`, `global_limits`, `guard_state`, `loaded`, `policy_state`,
//! `exchange`)
//! and the host, and no state type uses a step: there is no import cycle.

mod abi;
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
mod loaded;
mod metrics;
mod pipeline;
mod policy;
mod policy_state;
mod prompt_cache;
mod reading;
mod registry;
mod request_body;
mod request_headers;
mod responses_by_id;
mod root;
mod shipper;
mod telemetry;
mod tokens;
mod upstream;
mod worker;

#[cfg(test)]
mod fake;
#[cfg(test)]
mod lifecycle_tests;

use root::Root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        let _ = abi::log(proxy_wasm::types::LogLevel::Critical, &format!("portcullis: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| -> Box<dyn proxy_wasm::traits::RootContext> {
        let mut root = Root::default();
        root.context_id = id;
        Box::new(root)
    });
}}
