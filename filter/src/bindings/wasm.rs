//! The proxy-wasm entry: the SDK's root and HTTP contexts over the same
//! [`Root`] and [`RequestContext`] the native build drives. Only this file,
//! `abi` and `abi_host` know the proxy-wasm ABI.

use crate::bindings::abi;
use crate::bindings::abi_host::{self, AbiHost};
use crate::host::{Action, Host, LogLevel};
use crate::request::RequestContext;
use crate::root::Root;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{BufferType, ContextType};

fn action(a: Action) -> proxy_wasm::types::Action {
    match a {
        Action::Continue => proxy_wasm::types::Action::Continue,
        Action::Pause => proxy_wasm::types::Action::Pause,
    }
}

/// The root context of a worker's VM.
#[derive(Default)]
pub struct WasmRoot(pub Root<AbiHost>);

impl Context for RequestContext<AbiHost> {
    fn on_http_call_response(
        &mut self,
        token: u32,
        _headers: usize,
        body_size: usize,
        _trailers: usize,
    ) {
        self.on_call_response(token, body_size);
    }

    fn on_grpc_call_response(&mut self, token: u32, status_code: u32, response_size: usize) {
        self.on_grpc_answer(token, status_code, response_size);
    }
}

impl HttpContext for RequestContext<AbiHost> {
    fn on_http_request_headers(
        &mut self,
        _num_headers: usize,
        end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.on_request_headers(end_of_stream))
    }

    fn on_http_request_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.on_request_body(body_size, end_of_stream))
    }

    fn on_http_response_headers(
        &mut self,
        _num_headers: usize,
        end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.on_response_headers(end_of_stream))
    }

    fn on_http_response_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> proxy_wasm::types::Action {
        action(self.on_response_body(body_size, end_of_stream))
    }

    fn on_log(&mut self) {
        RequestContext::on_log(self);
    }
}

impl Context for WasmRoot {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, _response_size: usize) {
        self.0.on_grpc_answer(token_id, status_code);
    }
}

impl RootContext for WasmRoot {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let ok = self.0.configure(plugin_configuration_size, || {
            abi::get_buffer(
                BufferType::PluginConfiguration,
                0,
                plugin_configuration_size,
            )
            .map(Option::unwrap_or_default)
            .map_err(|s| format!("{s:?}"))
        });
        if ok {
            let tick = u32::try_from(self.0.tick_ms).unwrap_or(u32::MAX);
            if let Err(s) = abi::set_tick_period_ms(tick) {
                self.0.host.log(
                    LogLevel::Warn,
                    &format!("no tick for metrics and the request log: {s:?}"),
                );
            }
        }
        ok
    }

    fn create_http_context(&self, context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(
            self.0.new_request(self.0.host.clone(), context_id),
        ))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn on_tick(&mut self) {
        abi_host::flush_metrics(self.0.host.worker());
        if self.0.tick() {
            if let Err(s) = proxy_wasm::hostcalls::set_effective_context(self.0.context_id) {
                self.0.host.log(
                    LogLevel::Warn,
                    &format!("effective context not restored: {s:?}"),
                );
            }
        }
    }
}

proxy_wasm::main! {{
    proxy_wasm::set_log_level(proxy_wasm::types::LogLevel::Info);
    std::panic::set_hook(Box::new(|info| {
        let _ = abi::log(LogLevel::Critical, &format!("portcullis: panic: {info}"));
    }));
    proxy_wasm::set_root_context(|id| -> Box<dyn proxy_wasm::traits::RootContext> {
        let mut root = WasmRoot::default();
        root.0.context_id = id;
        Box::new(root)
    });
}}
