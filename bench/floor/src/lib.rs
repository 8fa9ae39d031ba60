//! Two floors, chosen by the plugin configuration's first word:
//!
//! - `route`: pause at the request headers, read the whole body once, set
//!   the cluster, `:authority`, timeout and credential headers, continue;
//!   read the response `:status` and add two response headers. What every
//!   routed request of a body-routing gateway costs, and nothing more.
//! - `answer`: pause, read the whole body once, answer locally with a
//!   fixed completion. What any cache hit costs, and nothing more.
//! - `stream`: set the routing headers at the request headers and go on
//!   (a WebSocket upgrade has no body), then read every body chunk of
//!   both directions and pass it. What a gateway that sees every byte of
//!   a Realtime session costs, and nothing more.
//! - `shared`: `route`, and a read and a compare-and-swap write of a
//!   119-byte shared-data value for each of two keys at the request
//!   headers, at the body and at the answer's end (12 calls, what a
//!   request limited at a key and its team makes): what limits counted
//!   exactly across workers cost through the proxy-wasm ABI, and nothing
//!   more (#49).
//!
//! A benchmark fixture, not gateway code: it trusts its host.

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

const ANSWER: &[u8] = br#"{"id":"chatcmpl-floor","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello benchmark, hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26}}"#;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Warn);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Root { answer: false, stream: false, shared: false }) });
}}

struct Root {
    answer: bool,
    stream: bool,
    shared: bool,
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, _size: usize) -> bool {
        let config = self.get_plugin_configuration().unwrap_or_default();
        self.answer = config.starts_with(b"answer");
        self.stream = config.starts_with(b"stream");
        self.shared = config.starts_with(b"shared");
        true
    }

    fn create_http_context(&self, _id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Floor {
            answer: self.answer,
            stream: self.stream,
            shared: self.shared,
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

struct Floor {
    answer: bool,
    stream: bool,
    shared: bool,
}

/// The two keys of `shared` (a key's level and its team's).
const KEYS: [&str; 2] = ["floor:level:demo", "floor:team:level:bench"];

impl Floor {
    /// One step of `shared`: each key read, then written back changed
    /// with the read's CAS (retried when another worker wrote between).
    fn step(&self) {
        if !self.shared {
            return;
        }
        for key in KEYS {
            for _ in 0..8 {
                let (value, cas) = self.get_shared_data(key);
                let mut value = value.unwrap_or_else(|| vec![0; 119]);
                if let Some(b) = value.first_mut() {
                    *b = b.wrapping_add(1);
                }
                if self.set_shared_data(key, Some(&value), cas).is_ok() {
                    break;
                }
            }
        }
    }

    fn route(&self) {
        self.set_http_request_header("x-portcullis-cluster", Some("primary"));
        self.set_http_request_header(":authority", Some("primary.mock"));
        self.set_http_request_header("x-envoy-upstream-rq-timeout-ms", Some("30000"));
        self.set_http_request_header("authorization", Some("Bearer sk-bench"));
    }
}

impl Context for Floor {}

impl HttpContext for Floor {
    fn on_http_request_headers(&mut self, _n: usize, _eos: bool) -> Action {
        self.step();
        if self.stream {
            self.route();
            return Action::Continue;
        }
        Action::Pause
    }

    fn on_http_request_body(&mut self, size: usize, eos: bool) -> Action {
        if self.stream {
            let _ = self.get_http_request_body(0, size);
            return Action::Continue;
        }
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
        self.step();
        self.route();
        Action::Continue
    }

    fn on_http_response_headers(&mut self, _n: usize, _eos: bool) -> Action {
        if let Some(status) = self.get_http_response_header(":status") {
            self.add_http_response_header("x-floor-status", &status);
        }
        self.add_http_response_header("x-floor", "route");
        Action::Continue
    }

    fn on_http_response_body(&mut self, size: usize, eos: bool) -> Action {
        if self.stream {
            let _ = self.get_http_response_body(0, size);
        }
        if eos {
            self.step();
        }
        Action::Continue
    }
}
