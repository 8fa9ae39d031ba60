//! Portcullis: the proxy-wasm host layer.
//!
//! This is the only code that talks to Envoy. It reads the host once per
//! callback, hands plain values to `portcullis_core`, and maps the decisions
//! to host calls and `Action`s. Every host `Status` is mapped (see `abi`): a
//! panic would trap the VM and break every later request on this worker.

mod abi;
mod host;
mod limits;
mod shared;
mod telemetry;

use host::Root;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        let _ = abi::log(proxy_wasm::types::LogLevel::Critical, &format!("portcullis: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|_| -> Box<dyn proxy_wasm::traits::RootContext> { Box::new(Root::default()) });
}}
