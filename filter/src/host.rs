use portcullis_core::config::{compile, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::headers;
use portcullis_core::request::ChatRequest;
use portcullis_core::routing::{authenticate, models_list, resolve};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, Status};
use std::cell::Cell;
use std::rc::Rc;
use std::time::UNIX_EPOCH;

fn log(level: LogLevel, msg: &str) {
    let _ = hostcalls::log(level, msg);
}

/// A compiled config plus what it needs from the VM environment.
struct Loaded {
    gw: Gateway,
    /// Provider credentials, read from the VM environment at configure time
    /// (index = provider index). Never from the plugin config.
    provider_keys: Vec<Option<String>>,
}

impl Loaded {
    fn new(gw: Gateway) -> Self {
        let provider_keys = gw
            .providers
            .iter()
            .map(|p| {
                let env = p.api_key_env.as_ref()?;
                match std::env::var(env) {
                    Ok(v) if !v.is_empty() => Some(v),
                    _ => {
                        log(
                            LogLevel::Warn,
                            &format!(
                                "provider `{}`: environment variable {env} is not set in the VM \
                                 (add it to vm_config.environment_variables.host_env_keys); requests go without a key",
                                p.name
                            ),
                        );
                        None
                    }
                }
            })
            .collect();
        Self { gw, provider_keys }
    }
}

#[derive(Default)]
pub struct Root {
    loaded: Option<Rc<Loaded>>,
    rng: Cell<u64>,
}

impl Root {
    fn next_roll(&self) -> u64 {
        // xorshift64*: cheap, good enough to spread `auto` picks by weight.
        let mut x = self.rng.get();
        if x == 0 {
            x = now_nanos() | 1;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

fn now_nanos() -> u64 {
    hostcalls::get_current_time()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9E37_79B9_7F4A_7C15)
}

impl Context for Root {}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let bytes = match hostcalls::get_buffer(BufferType::PluginConfiguration, 0, plugin_configuration_size) {
            Ok(b) => b.unwrap_or_default(),
            Err(status) => {
                log(LogLevel::Error, &format!("cannot read plugin config: {status:?}"));
                return false;
            }
        };
        match compile(&bytes) {
            Ok(gw) => {
                log(
                    LogLevel::Info,
                    &format!(
                        "config applied: {} providers, {} models, {} clients",
                        gw.providers.len(),
                        gw.models.len(),
                        gw.clients.len()
                    ),
                );
                self.loaded = Some(Rc::new(Loaded::new(gw)));
                true
            }
            Err(msg) => {
                log(LogLevel::Error, &msg);
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn proxy_wasm::traits::HttpContext>> {
        Some(Box::new(Stream { loaded: self.loaded.clone(), roll: self.next_roll(), phase: Phase::Headers, client: None, routed: None }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for request headers.
    Headers,
    /// A chat request: waiting for the whole body.
    ChatBody,
    /// Forwarded upstream.
    Proxied,
    /// Answered locally, or not ours: nothing more to do.
    Done,
}

struct Stream {
    loaded: Option<Rc<Loaded>>,
    roll: u64,
    phase: Phase,
    client: Option<String>,
    /// (model name, provider name) once routed.
    routed: Option<(String, String)>,
}


fn set_req_header(name: &str, value: Option<&str>) -> Result<(), Status> {
    hostcalls::set_map_value(MapType::HttpRequestHeaders, name, value)
}

impl Stream {
    fn reply(&mut self, status: u16, extra: &[(&str, &str)], body: &[u8]) -> Action {
        self.phase = Phase::Done;
        let mut hdrs: Vec<(&str, &str)> = vec![("content-type", "application/json")];
        hdrs.extend_from_slice(extra);
        if let Err(s) = hostcalls::send_http_response(u32::from(status), hdrs, Some(body)) {
            log(LogLevel::Error, &format!("send_http_response failed: {s:?}"));
        }
        Action::Pause
    }

    fn fail(&mut self, err: &GatewayError) -> Action {
        let retry = err.retry_after_s.map(|s| s.to_string());
        let extra: Vec<(&str, &str)> = retry.as_deref().map(|r| vec![("retry-after", r)]).unwrap_or_default();
        self.reply(err.status, &extra, &err.body())
    }

    fn on_headers(&mut self, end_of_stream: bool) -> Result<Action, GatewayError> {
        let Some(loaded) = self.loaded.clone() else {
            return Err(GatewayError::internal("The gateway has no valid configuration yet."));
        };
        let all = hostcalls::get_map(MapType::HttpRequestHeaders)
            .map_err(|s| GatewayError::internal(format!("cannot read request headers: {s:?}")))?;
        let mut method = "";
        let mut path = "";
        let mut authorization = None;
        let mut content_length = None;
        for (k, v) in &all {
            match k.as_str() {
                ":method" => method = v,
                ":path" => path = v,
                "authorization" => authorization = Some(v.as_str()),
                "content-length" => content_length = v.parse::<usize>().ok(),
                _ => {}
            }
        }
        for (k, _) in all.iter().filter(|(k, _)| headers::is_gateway_header(k)) {
            let _ = set_req_header(k, None);
        }
        let path = path.split('?').next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        match (method, path) {
            ("GET", "/v1/models") => {
                let client = authenticate(&loaded.gw, authorization)?;
                let body = models_list(&loaded.gw, client);
                Ok(self.reply(200, &[], &body))
            }
            ("POST", "/v1/chat/completions") => {
                let client = authenticate(&loaded.gw, authorization)?;
                self.client = Some(client.name.clone());
                if content_length.is_some_and(|n| n > loaded.gw.max_body_bytes) {
                    return Err(GatewayError::body_too_large(loaded.gw.max_body_bytes));
                }
                if end_of_stream {
                    return Err(GatewayError::bad_request(
                        "invalid_json",
                        "Request body is empty: send a JSON object with `model` and `messages`.",
                    ));
                }
                // The body is rewritten, so its length changes.
                let _ = set_req_header("content-length", None);
                self.phase = Phase::ChatBody;
                Ok(Action::Pause)
            }
            _ => Err(GatewayError::not_found_path(method, path)),
        }
    }

    fn on_body(&mut self, body_size: usize, end_of_stream: bool) -> Result<Action, GatewayError> {
        let Some(loaded) = self.loaded.clone() else {
            return Err(GatewayError::internal("The gateway has no valid configuration yet."));
        };
        let gw = &loaded.gw;
        if body_size > gw.max_body_bytes {
            return Err(GatewayError::body_too_large(gw.max_body_bytes));
        }
        if !end_of_stream {
            return Ok(Action::Pause);
        }
        let body = hostcalls::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .map_err(|s| GatewayError::internal(format!("cannot read request body: {s:?}")))?
            .unwrap_or_default();
        let chat = ChatRequest::parse(&body)?;
        let client = self
            .client
            .as_deref()
            .and_then(|name| gw.clients.values().find(|c| c.name == name))
            .ok_or_else(GatewayError::unknown_key)?;
        let route = resolve(gw, client, &chat.model, self.roll)?;
        let (provider_idx, provider_model_id) =
            route.candidates.first().ok_or_else(|| GatewayError::model_not_found(&chat.model))?;
        let provider = gw
            .providers
            .get(*provider_idx)
            .ok_or_else(|| GatewayError::internal("routing chose a provider that does not exist"))?;
        let new_body = chat.body_for(provider_model_id);
        let host_err = |s: Status| GatewayError::internal(format!("cannot rewrite the request: {s:?}"));
        hostcalls::set_buffer(BufferType::HttpRequestBody, 0, body_size, &new_body).map_err(host_err)?;
        set_req_header(headers::CLUSTER, Some(&provider.cluster)).map_err(host_err)?;
        set_req_header(":authority", Some(&provider.host)).map_err(host_err)?;
        set_req_header(":path", Some(&provider.chat_path())).map_err(host_err)?;
        let credential = loaded.provider_keys.get(*provider_idx).and_then(|k| k.as_ref()).map(|k| format!("Bearer {k}"));
        // The client's key never reaches a provider.
        set_req_header("authorization", credential.as_deref()).map_err(host_err)?;
        let model_name = gw.models.get(route.model).map(|m| m.name.clone()).unwrap_or_default();
        self.routed = Some((model_name, provider.name.clone()));
        self.phase = Phase::Proxied;
        Ok(Action::Continue)
    }
}

impl Context for Stream {}

impl HttpContext for Stream {
    fn on_http_request_headers(&mut self, _num_headers: usize, end_of_stream: bool) -> Action {
        if self.phase != Phase::Headers {
            return Action::Continue;
        }
        match self.on_headers(end_of_stream) {
            Ok(action) => action,
            Err(e) => self.fail(&e),
        }
    }

    fn on_http_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if self.phase != Phase::ChatBody {
            return Action::Continue;
        }
        match self.on_body(body_size, end_of_stream) {
            Ok(action) => action,
            Err(e) => self.fail(&e),
        }
    }

    fn on_http_response_headers(&mut self, _num_headers: usize, _end_of_stream: bool) -> Action {
        if let Some((model, provider)) = &self.routed {
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, headers::MODEL, Some(model));
            let _ = hostcalls::set_map_value(MapType::HttpResponseHeaders, headers::PROVIDER, Some(provider));
        }
        Action::Continue
    }
}
