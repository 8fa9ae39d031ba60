//! Two floors, chosen by the plugin configuration's first word:
//!
//! - `route`: pause at the request headers, read the whole body once, set
//!   the cluster, `:authority`, timeout and credential headers, continue;
//!   read the response `:status` and add two response headers. What every
//!   routed request of a body-routing gateway costs, and nothing more.
//! - `answer`: pause, read the whole body once, answer locally with a
//!   fixed completion. What any cache hit costs, and nothing more.
//!
//! A benchmark fixture, not gateway code: it trusts its host.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

const ANSWER: &[u8] = br#"{"id":"chatcmpl-floor","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello benchmark, hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26}}"#;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { answer: false }) });
}}

struct Root {
    answer: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        self.answer = config.starts_with(b"answer");
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Floor { answer: self.answer }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Floor {
    answer: bool,
}

impl Context for Floor {}

impl HttpContext for Floor {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        Action::Pause
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        if !eos {
            return Action::Pause;
        }
        let body = self.get_http_request_body(0, size).unwrap_or_default();
        if self.answer {
            let len = body.len().to_string();
            self.send_http_response(
                200,
                vec![("content-type", "application/json"), ("x-floor-read", &len)],
                Some(ANSWER),
            );
            return Action::Pause;
        }
        self.set_http_request_header("x-portcullis-cluster", Some("primary"));
        self.set_http_request_header(":authority", Some("primary.mock"));
        self.set_http_request_header("x-envoy-upstream-rq-timeout-ms", Some("30000"));
        self.set_http_request_header("authorization", Some("Bearer sk-bench"));
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if let Some(status) = self.get_http_response_header(":status") {
            self.add_http_response_header("x-floor-status", &status);
        }
        self.add_http_response_header("x-floor", "route");
        Action::Continue
    }
}
