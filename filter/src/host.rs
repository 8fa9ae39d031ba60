use crate::abi;
use crate::limits::{self, Held};
use crate::shared::{count, count_gauge, gauge, histogram, provider_metric, HostStore};
use crate::telemetry::{self, Shipper};
use portcullis_core::attempt::{classify, classify_call, exhausted, Cause, Outcome};
use portcullis_core::breaker::{self, Admission, Breaker, Transition};
use portcullis_core::cache::{self, CacheConfig, Directive, StoreOutcome};
use portcullis_core::config::{compile, Client, Gateway, Provider};
use portcullis_core::error::GatewayError;
use portcullis_core::headers;
use portcullis_core::ratelimit::{self, Take};
use portcullis_core::record::{Attempt as RecordAttempt, Record};
use portcullis_core::request::ChatRequest;
use portcullis_core::routing::{authenticate, model_info, models_list, resolve};
use portcullis_core::sse::{self, Relay};
use portcullis_core::store::{update, Store};
use portcullis_core::usage::{AnswerCopy, Usage};
use proxy_wasm::hostcalls;
use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, BufferType, ContextType, LogLevel, MapType, Status};
use std::cell::Cell;
use std::rc::Rc;
use std::time::Duration;

fn log(level: LogLevel, msg: &str) {
    let _ = abi::log(level, msg);
}

pub fn now_ms() -> u64 {
    abi::now_ms().unwrap_or(0)
}

fn breaker_key(provider: &str) -> String {
    format!("portcullis:breaker:{provider}")
}

/// A compiled config plus what it needs from the VM environment.
struct Loaded {
    gw: Gateway,
    /// `Bearer <key>` per provider index, read from the VM environment at
    /// configure time. Never from the plugin config.
    credentials: Vec<Option<String>>,
}

impl Loaded {
    fn new(gw: Gateway) -> Self {
        let credentials = gw
            .providers
            .iter()
            .map(|p| {
                let env = p.api_key_env.as_ref()?;
                match std::env::var(env) {
                    Ok(v) if !v.is_empty() => Some(format!("Bearer {v}")),
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
        Self { gw, credentials }
    }
}

#[derive(Default)]
pub struct Root {
    loaded: Option<Rc<Loaded>>,
    rng: Cell<u64>,
    shipper: Shipper,
}

/// A config generation shared by the workers: it rises once per distinct
/// config, however many workers apply it.
fn bump_generation(config: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(config);
    let hash = h.finish();
    update(&HostStore, "portcullis:config_generation", |cur| {
        let (old_hash, gen) = match cur.filter(|c| c.len() == 16) {
            Some(c) => (
                c.get(..8)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0),
                c.get(8..)
                    .and_then(|b| b.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0),
            ),
            None => (0, 0),
        };
        if old_hash == hash {
            return (None, gen);
        }
        let mut v = hash.to_le_bytes().to_vec();
        v.extend_from_slice(&(gen + 1).to_le_bytes());
        (Some(v), gen + 1)
    })
    .unwrap_or(0)
}

impl Root {
    fn next_roll(&self) -> u64 {
        // xorshift64*: cheap, good enough to spread `auto` picks by weight.
        let mut x = self.rng.get();
        if x == 0 {
            x = (now_ms() << 20) ^ 0x9E37_79B9_7F4A_7C15;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

impl Context for Root {
    fn on_grpc_call_response(&mut self, token_id: u32, status_code: u32, _response_size: usize) {
        self.shipper.on_response(token_id, status_code);
    }
}

impl RootContext for Root {
    fn on_configure(&mut self, plugin_configuration_size: usize) -> bool {
        let bytes = match abi::get_buffer(
            BufferType::PluginConfiguration,
            0,
            plugin_configuration_size,
        ) {
            Ok(b) => b.unwrap_or_default(),
            Err(status) => {
                log(
                    LogLevel::Error,
                    &format!("cannot read plugin config: {status:?}"),
                );
                return false;
            }
        };
        match compile(&bytes) {
            Ok(gw) => {
                // Breaker keys are created here, so request-time updates always
                // have a CAS token; existing state (a reload) is kept.
                for p in &gw.providers {
                    let key = breaker_key(&p.name);
                    match HostStore.get(&key) {
                        Ok((Some(v), _)) => gauge(
                            &provider_metric(&p.name, "breaker_state"),
                            Breaker::decode(Some(&v)).state.gauge(),
                        ),
                        Ok((None, _)) => {
                            let _ = HostStore.set(&key, &Breaker::default().encode(), None);
                            gauge(&provider_metric(&p.name, "breaker_state"), 0);
                        }
                        Err(e) => log(
                            LogLevel::Warn,
                            &format!("breaker state of `{}` unreadable: {e:?}", p.name),
                        ),
                    }
                }
                telemetry::configure(gw.log.as_ref());
                let tick = gw.log.as_ref().map(|l| l.flush_interval_ms).unwrap_or(1000);
                let tick = u32::try_from(tick).unwrap_or(u32::MAX);
                if let Err(s) = abi::set_tick_period_ms(tick) {
                    log(
                        LogLevel::Warn,
                        &format!("no tick for metrics and the request log: {s:?}"),
                    );
                }
                telemetry::config_generation(bump_generation(&bytes));
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

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        Some(Box::new(Stream {
            loaded: self.loaded.clone(),
            roll: self.next_roll(),
            phase: Phase::Headers,
            client: None,
            flight: None,
            req_path: String::new(),
            req_authority: String::new(),
            cache_control: None,
            req_take: None,
            rate_headers: Vec::new(),
            held: None,
            log: LogFacts::default(),
        }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }

    fn on_tick(&mut self) {
        let cfg = self.loaded.as_ref().and_then(|l| l.gw.log.clone());
        self.shipper.tick(cfg.as_ref());
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Waiting for request headers.
    Headers,
    /// A chat request: waiting for the whole body.
    ChatBody,
    /// The first attempt went through Envoy's router.
    Proxied,
    /// A fallback `dispatch_http_call` is in flight; the upstream's answer is held.
    FallbackPending,
    /// An answer is on its way to the client.
    Responding,
    /// Answered locally, or not ours: nothing more to do.
    Done,
}

/// The provider currently tried, and whether it is a half-open probe.
#[derive(Debug, Clone)]
struct Current {
    provider: usize,
    probe: bool,
    reported: bool,
    /// The breaker was closed with nothing counted when this attempt began.
    clean: bool,
}

/// A routed chat request across its attempts.
struct Flight {
    chat: ChatRequest,
    model_name: String,
    candidates: Vec<(usize, String)>,
    next_candidate: usize,
    attempts: u32,
    tried: Vec<(String, Cause)>,
    skipped: Vec<(String, u64)>,
    current: Option<Current>,
    /// The status the current provider answered with, when it was not a
    /// retryable failure (that answer goes to the client).
    answered: Option<u16>,
    /// (token, started ms, timeout ms) of the pending fallback call.
    call: Option<(u32, u64, u64)>,
    /// `x-portcullis-cache`: hit, miss, refresh or off.
    cache_status: &'static str,
    /// Set when the answer should be stored, under this key.
    cache: Option<CacheFill>,
    /// The gateway asked a streaming provider for the usage chunk the client
    /// did not ask for; it is read, then dropped from what the client gets.
    ask_usage: bool,
    /// A streamed answer being relayed (and read).
    relay: Option<Relay>,
    /// `name/arm` when an experiment chose the model.
    experiment: Option<String>,
    /// The answer came content-encoded (compressed): it passes through
    /// untouched, unread and not stored.
    encoded: bool,
    /// A copy of a plain (not streamed) answer, taken as it passes.
    copy: Option<AnswerCopy>,
}

/// Whether a response's headers say its body is content-encoded.
fn is_encoded<V: AsRef<[u8]>>(headers: &[(String, V)]) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "content-encoding" && !v.as_ref().eq_ignore_ascii_case(b"identity"))
}

struct CacheFill {
    key: cache::Hash,
}

struct Stream {
    loaded: Option<Rc<Loaded>>,
    roll: u64,
    phase: Phase,
    /// The client's key hash (its handle in `Gateway::clients`).
    client: Option<[u8; 32]>,
    flight: Option<Flight>,
    req_path: String,
    req_authority: String,
    cache_control: Option<String>,
    /// The request-rate take at headers (for the rate-limit headers).
    req_take: Option<Take>,
    /// `x-ratelimit-*` headers for every response to this request.
    rate_headers: Vec<(&'static str, String)>,
    /// What the request holds of its client's limits until it finishes.
    held: Option<Held>,
    /// For the request record.
    log: LogFacts,
}

/// What the request record needs, gathered along the way.
#[derive(Default)]
struct LogFacts {
    chat: bool,
    started_ms: u64,
    request_id: String,
    status: u16,
    error: &'static str,
    ttfb_ms: u64,
    usage: Option<Usage>,
    prompt: String,
    completion: String,
}

fn note_transition(provider: &str, t: Option<Transition>) {
    if let Some(t) = t {
        gauge(&provider_metric(provider, "breaker_state"), t.to.gauge());
        count(
            &provider_metric(provider, &format!("breaker_to_{}", t.to.name())),
            1,
        );
        log(
            LogLevel::Info,
            &format!(
                "breaker of `{provider}`: {} -> {}",
                t.from.name(),
                t.to.name()
            ),
        );
    }
}

/// Ask the provider's breaker for admission (one CAS update carrying the
/// decision). Also says whether the breaker was clean (closed, no failures
/// counted, no ratio window): then a success has nothing to record.
fn breaker_admit(p: &Provider) -> (Admission, bool) {
    let r = update(&HostStore, &breaker_key(&p.name), |cur| {
        let b = Breaker::decode(cur);
        let clean = b.state == breaker::State::Closed
            && b.consecutive_failures == 0
            && p.breaker.failure_ratio.is_none();
        let (next, adm, t) = breaker::admit_at(&b, &p.breaker, now_ms);
        (next.map(|n| n.encode()), (adm, t, clean))
    });
    match r {
        Ok((adm, t, clean)) => {
            note_transition(&p.name, t);
            (adm, clean)
        }
        Err(e) => {
            // Fail open: a store problem must not take a provider out.
            log(
                LogLevel::Warn,
                &format!(
                    "breaker of `{}` unavailable ({e:?}); letting the request through",
                    p.name
                ),
            );
            (Admission::Allowed, false)
        }
    }
}

fn breaker_result(p: &Provider, success: bool, probe: bool) {
    let r = update(&HostStore, &breaker_key(&p.name), |cur| {
        let (next, t) =
            breaker::on_result_at(&Breaker::decode(cur), &p.breaker, now_ms, success, probe);
        (next.map(|n| n.encode()), t)
    });
    match r {
        Ok(t) => note_transition(&p.name, t),
        Err(e) => log(
            LogLevel::Warn,
            &format!("breaker of `{}` not updated: {e:?}", p.name),
        ),
    }
}

fn breaker_release_probe(p: &Provider) {
    let _ = update(&HostStore, &breaker_key(&p.name), |cur| {
        (
            breaker::release_probe(&Breaker::decode(cur)).map(|n| n.encode()),
            (),
        )
    });
}

fn store_entry(cfg: &CacheConfig, key: &cache::Hash, body: &[u8]) {
    match cache::insert(&HostStore, cfg, key, body, now_ms()) {
        Ok(StoreOutcome::Stored(st)) => {
            count("portcullis.cache.stores", 1);
            if st.evicted {
                count("portcullis.cache.evictions", 1);
            }
            if st.bytes_delta != 0 {
                // A gauge shared by the workers: each adds its own change.
                count_gauge("portcullis.cache.bytes", st.bytes_delta);
            }
        }
        Ok(StoreOutcome::TooLarge) => count("portcullis.cache.too_large", 1),
        Err(e) => log(LogLevel::Warn, &format!("cache store failed: {e:?}")),
    }
}

impl Stream {
    fn client<'g>(&self, gw: &'g Gateway) -> Option<&'g Client> {
        gw.clients.get(self.client.as_ref()?)
    }

    /// Every answer the filter makes itself goes out here.
    fn send(&mut self, status: u16, headers: &[(&str, &[u8])], body: &[u8]) -> Action {
        self.phase = Phase::Done;
        self.log.status = status;
        if let Err(s) = abi::send_http_response(u32::from(status), headers, body) {
            log(
                LogLevel::Error,
                &format!("send_http_response failed: {s:?}"),
            );
        }
        Action::Pause
    }

    /// An answer of the gateway's own (errors, `/v1/models`): nothing was
    /// used of the client's limits.
    fn reply(&mut self, status: u16, extra: &[(&str, &str)], body: &[u8]) -> Action {
        if let Some(h) = self.held.as_mut() {
            h.release(now_ms());
        }
        let rate = std::mem::take(&mut self.rate_headers);
        let mut hdrs: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
        hdrs.extend(extra.iter().map(|(k, v)| (*k, v.as_bytes())));
        hdrs.extend(rate.iter().map(|(k, v)| (*k, v.as_bytes())));
        self.send(status, &hdrs, body)
    }

    fn fail(&mut self, err: &GatewayError) -> Action {
        self.log.error = err.code;
        let retry = err.retry_after_s.map(|s| s.to_string());
        let extra: Vec<(&str, &str)> = retry
            .as_deref()
            .map(|r| vec![("retry-after", r)])
            .unwrap_or_default();
        self.reply(err.status, &extra, &err.body())
    }

    fn on_headers(&mut self, end_of_stream: bool) -> Result<Action, GatewayError> {
        let Some(loaded) = self.loaded.clone() else {
            return Err(GatewayError::internal(
                "The gateway has no valid configuration yet.",
            ));
        };
        let all = abi::get_map(MapType::HttpRequestHeaders)
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
                "cache-control" => self.cache_control = Some(v.clone()),
                "x-request-id" => self.log.request_id = v.clone(),
                _ => {}
            }
        }
        let path = path.split('?').next().unwrap_or_default();
        let path = path.trim_end_matches('/');
        match (method, path) {
            ("GET", "/v1/models") => {
                let (_, client) = authenticate(&loaded.gw, authorization)?;
                let body = models_list(&loaded.gw, client);
                Ok(self.reply(200, &[], &body))
            }
            ("GET", p) if p.starts_with("/v1/models/") => {
                let (_, client) = authenticate(&loaded.gw, authorization)?;
                let id = p.get("/v1/models/".len()..).unwrap_or_default();
                let body = model_info(&loaded.gw, client, id)?;
                Ok(self.reply(200, &[], &body))
            }
            ("POST", "/v1/chat/completions") => {
                self.log.chat = true;
                let now = now_ms();
                self.log.started_ms = now;
                let (key, client) = authenticate(&loaded.gw, authorization)?;
                self.client = Some(key);
                // Request rate first: a refused request's body is never read.
                match limits::take_request(client, now) {
                    Ok(t) => self.req_take = t,
                    Err((e, t)) => {
                        self.rate_headers = limits::headers(client, Some(t), None);
                        return Err(e);
                    }
                }
                if content_length.is_some_and(|n| n > loaded.gw.max_body_bytes) {
                    return Err(GatewayError::body_too_large(loaded.gw.max_body_bytes));
                }
                if end_of_stream {
                    return Err(GatewayError::bad_request(
                        "invalid_json",
                        "Request body is empty: send a JSON object with `model` and `messages`.",
                    ));
                }
                // Client-sent gateway headers never go upstream. Nor does
                // `accept-encoding`: the gateway reads answers (usage, the
                // cache), so providers must answer uncompressed (Envoy's
                // compressor filter can compress towards clients).
                for (k, _) in all
                    .iter()
                    .filter(|(k, _)| headers::is_gateway_header(k) || k == "accept-encoding")
                {
                    let _ = abi::set_map_value(MapType::HttpRequestHeaders, k, None);
                }
                self.req_path = path.to_string();
                self.req_authority = all
                    .iter()
                    .find(|(k, _)| k == ":authority")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                self.phase = Phase::ChatBody;
                Ok(Action::Pause)
            }
            _ => Err(GatewayError::not_found_path(method, path)),
        }
    }

    fn on_body(&mut self, body_size: usize, end_of_stream: bool) -> Result<Action, GatewayError> {
        let Some(loaded) = self.loaded.clone() else {
            return Err(GatewayError::internal(
                "The gateway has no valid configuration yet.",
            ));
        };
        let gw = &loaded.gw;
        if body_size > gw.max_body_bytes {
            return Err(GatewayError::body_too_large(gw.max_body_bytes));
        }
        if !end_of_stream {
            return Ok(Action::Pause);
        }
        let body = abi::get_buffer(BufferType::HttpRequestBody, 0, body_size)
            .map_err(|s| GatewayError::internal(format!("cannot read request body: {s:?}")))?
            .unwrap_or_default();
        let chat = ChatRequest::parse(&body)?;
        let client = self.client(gw).ok_or_else(GatewayError::unknown_key)?;
        // One clock read for the body phase (cache expiry, limits).
        let now = now_ms();
        let route = match resolve(gw, client, &chat.model, self.roll) {
            Ok(r) => r,
            Err(e) => {
                self.rate_headers =
                    limits::headers(client, self.req_take, limits::peek_tokens(client, now));
                return Err(e);
            }
        };
        let model_name = gw
            .models
            .get(route.model)
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let experiment = route.experiment.and_then(|(ei, ai)| {
            let e = gw.experiments.get(ei)?;
            let arm = e.arms.get(ai)?;
            count(
                &format!(
                    "portcullis.experiment_requests.experiment.{}.arm.{}.total",
                    e.name, arm.name
                ),
                1,
            );
            Some(format!("{}/{}", e.name, arm.name))
        });
        let mut flight = Flight {
            chat,
            model_name,
            candidates: route.candidates,
            next_candidate: 0,
            attempts: 0,
            tried: Vec::new(),
            skipped: Vec::new(),
            current: None,
            answered: None,
            call: None,
            cache_status: "off",
            cache: None,
            ask_usage: false,
            relay: None,
            experiment,
            encoded: false,
            copy: None,
        };
        // The cache is keyed by the model and the first provider of its chain
        // (the resolved route), whichever provider ends up answering: a hit
        // needs no breaker read and never touches a provider.
        if let (Some(cfg), Some((first, first_model_id))) = (&gw.cache, flight.candidates.first()) {
            let directive = cache::directive(self.cache_control.as_deref());
            let first_name = gw
                .providers
                .get(*first)
                .map(|p| p.name.as_str())
                .unwrap_or_default();
            if directive != Directive::Bypass {
                let scope = cfg.per_client.then_some(client.name.as_str());
                let key = cache::key(
                    first_name,
                    first_model_id,
                    &flight.chat,
                    cfg.normalize,
                    scope,
                );
                if directive == Directive::Normal {
                    // What a hit answers: the stored answer, or for a streamed
                    // request its replay as SSE. One that cannot be replayed
                    // (tool calls, several choices) is a miss for a stream.
                    let answer = |stored: Vec<u8>| {
                        if flight.chat.stream {
                            sse::replay(&stored, flight.chat.include_usage)
                                .map(|b| ("text/event-stream", b))
                        } else {
                            Some(("application/json", stored))
                        }
                    };
                    match cache::lookup(&HostStore, cfg, &key, now).map(|s| s.map(answer)) {
                        Ok(Some(Some((content_type, body)))) => {
                            count("portcullis.cache.hits", 1);
                            // A hit costs no tokens or budget, but it was a request.
                            self.rate_headers = limits::headers(
                                client,
                                self.req_take,
                                limits::peek_tokens(client, now),
                            );
                            flight.cache_status = "hit";
                            self.flight = Some(flight);
                            return Ok(self.answer_from_cache(content_type, &body));
                        }
                        Ok(_) => count("portcullis.cache.misses", 1),
                        Err(e) => log(LogLevel::Warn, &format!("cache lookup failed: {e:?}")),
                    }
                }
                flight.cache_status = if directive == Directive::Refresh {
                    "refresh"
                } else {
                    "miss"
                };
                flight.cache = Some(CacheFill { key });
                // Stored streams keep their usage, for replays that ask for it.
                flight.ask_usage = flight.chat.needs_usage_request();
            }
        }
        // Limits on what reaches a provider: concurrency, tokens, budget.
        let l = &client.limits;
        if l.max_concurrent.is_some() || l.tokens_per_minute.is_some() || l.budget_micros.is_some()
        {
            let reserve = ratelimit::reservation(
                flight.chat.body_len(),
                flight.chat.max_tokens,
                l.default_max_tokens,
            );
            let price = gw.prices.get(route.model).copied().flatten();
            match limits::admit(client, reserve, price, now) {
                Ok((held, tokens)) => {
                    self.rate_headers = limits::headers(client, self.req_take, tokens);
                    if held.wants_usage() {
                        flight.ask_usage |= flight.chat.needs_usage_request();
                    }
                    self.held = Some(held);
                }
                Err(e) => {
                    self.rate_headers =
                        limits::headers(client, self.req_take, limits::peek_tokens(client, now));
                    return Err(e);
                }
            }
        } else {
            self.rate_headers = limits::headers(client, self.req_take, None);
        }
        if telemetry::enabled() {
            flight.ask_usage |= flight.chat.needs_usage_request();
            if gw.log.as_ref().is_some_and(|l| l.include_content) {
                self.log.prompt = flight.chat.messages_text();
            }
        }
        let Some((provider_idx, model_id)) = flight.admit_next(gw) else {
            return Err(exhausted(
                &flight.model_name,
                &flight.tried,
                &flight.skipped,
            ));
        };
        let provider = gw
            .providers
            .get(provider_idx)
            .ok_or_else(|| GatewayError::internal("routing chose a missing provider"))?;
        let host_err =
            |s: Status| GatewayError::internal(format!("cannot rewrite the request: {s:?}"));
        let set = |k: &str, v: Option<&str>| {
            abi::set_map_value(MapType::HttpRequestHeaders, k, v).map_err(host_err)
        };
        // Each host call costs: touch only what changes.
        if model_id != flight.chat.model || flight.ask_usage {
            let new_body = flight.chat.body_for_with(&model_id, flight.ask_usage);
            abi::set_buffer(BufferType::HttpRequestBody, 0, body_size, &new_body)
                .map_err(host_err)?;
            set("content-length", Some(&new_body.len().to_string()))?;
        }
        let path = provider.chat_path();
        if path != self.req_path {
            set(":path", Some(&path))?;
        }
        if provider.host != self.req_authority {
            set(":authority", Some(&provider.host))?;
        }
        set(headers::CLUSTER, Some(&provider.cluster))?;
        set(
            "x-envoy-upstream-rq-timeout-ms",
            Some(&provider.timeout_ms.to_string()),
        )?;
        // The client's key never reaches a provider.
        set(
            "authorization",
            loaded
                .credentials
                .get(provider_idx)
                .and_then(|c| c.as_deref()),
        )?;
        self.flight = Some(flight);
        self.phase = Phase::Proxied;
        Ok(Action::Continue)
    }

    /// Record the current attempt's outcome; on a retryable failure, start the
    /// next attempt or answer with the aggregated error.
    fn after_attempt(&mut self, status: Option<u16>, outcome: Outcome) -> Option<Action> {
        let loaded = self.loaded.clone()?;
        let gw = &loaded.gw;
        let flight = self.flight.as_mut()?;
        let cur = flight.current.as_mut()?;
        let provider = gw.providers.get(cur.provider)?;
        cur.reported = true;
        if !matches!(outcome, Outcome::Retryable(_)) {
            flight.answered = status;
        }
        match outcome {
            // Nothing to record: saves a shared-data read on the hot path.
            Outcome::Success if cur.clean && !cur.probe => {}
            Outcome::Success => breaker_result(provider, true, cur.probe),
            // The provider is alive; the client's request is at fault.
            Outcome::ClientError if cur.probe => breaker_result(provider, true, true),
            Outcome::ClientError => {}
            Outcome::Retryable(cause) => {
                breaker_result(provider, false, cur.probe);
                count(&provider_metric(&provider.name, cause.metric()), 1);
                flight.tried.push((provider.name.clone(), cause));
                return Some(self.next_attempt());
            }
        }
        None
    }

    /// Dispatch to the next admitted candidate, or answer with the error.
    fn next_attempt(&mut self) -> Action {
        let Some(loaded) = self.loaded.clone() else {
            return Action::Continue;
        };
        let gw = &loaded.gw;
        let Some(flight) = self.flight.as_mut() else {
            return Action::Continue;
        };
        while let Some((idx, model_id)) = flight.admit_next(gw) {
            let Some(p) = gw.providers.get(idx) else {
                continue;
            };
            let body = flight.chat.body_for_with(&model_id, flight.ask_usage);
            let path = p.chat_path();
            let mut hdrs: Vec<(&str, &str)> = vec![
                (":method", "POST"),
                (":path", &path),
                (":authority", &p.host),
                ("content-type", "application/json"),
            ];
            if let Some(c) = loaded.credentials.get(idx).and_then(|c| c.as_deref()) {
                hdrs.push(("authorization", c));
            }
            match hostcalls::dispatch_http_call(
                &p.cluster,
                hdrs,
                Some(&body),
                vec![],
                Duration::from_millis(p.timeout_ms),
            ) {
                Ok(token) => {
                    count("portcullis.fallbacks", 1);
                    flight.call = Some((token, now_ms(), p.timeout_ms));
                    self.phase = Phase::FallbackPending;
                    return Action::Pause;
                }
                Err(s) => {
                    log(
                        LogLevel::Error,
                        &format!(
                            "fallback to `{}` (cluster {}) not dispatched: {s:?}",
                            p.name, p.cluster
                        ),
                    );
                    if let Some(cur) = flight.current.as_mut() {
                        cur.reported = true;
                        if cur.probe {
                            breaker_release_probe(p);
                        }
                    }
                    flight.tried.push((p.name.clone(), Cause::ConnectFailure));
                }
            }
        }
        let err = exhausted(&flight.model_name, &flight.tried, &flight.skipped);
        self.fail(&err)
    }

    /// The provider whose answer the client gets: the one tried last, or for
    /// a cache hit the first of the chain (the entry's key).
    fn answering_provider(&self) -> Option<String> {
        let f = self.flight.as_ref()?;
        let gw = &self.loaded.as_ref()?.gw;
        let idx = if f.cache_status == "hit" {
            f.candidates.first()?.0
        } else {
            f.current.as_ref()?.provider
        };
        gw.providers.get(idx).map(|p| p.name.clone())
    }

    fn gateway_headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(f) = self.flight.as_ref() {
            out.push((headers::MODEL, f.model_name.clone()));
            if let Some(p) = self.answering_provider() {
                out.push((headers::PROVIDER, p));
            }
            out.push((headers::ATTEMPTS, f.attempts.to_string()));
            out.push((headers::CACHE, f.cache_status.to_string()));
            if let Some(e) = &f.experiment {
                out.push((headers::EXPERIMENT, e.clone()));
            }
        }
        out.extend(self.rate_headers.iter().cloned());
        out
    }

    /// Answer from the cache (the stored answer, or its SSE replay). A hit
    /// spends no provider tokens: its record and metrics say 0.
    fn answer_from_cache(&mut self, content_type: &str, body: &[u8]) -> Action {
        let ours = self.gateway_headers();
        let mut hdrs: Vec<(&str, &[u8])> = vec![("content-type", content_type.as_bytes())];
        hdrs.extend(ours.iter().map(|(k, v)| (*k, v.as_bytes())));
        self.send(200, &hdrs, body)
    }

    /// Settle the client's reservations with what the provider reported.
    fn settle(&mut self, usage: Option<Usage>) {
        self.log.usage = usage;
        if let Some(h) = self.held.as_mut() {
            h.settle(usage, now_ms());
        }
    }

    fn include_content(&self) -> bool {
        self.loaded
            .as_ref()
            .and_then(|l| l.gw.log.as_ref())
            .is_some_and(|l| l.include_content)
    }

    /// A whole, successful answer arrived (`completion` in the non-streamed
    /// format, when it could be had): settle limits with its usage, keep its
    /// text for the record when asked, store it in the cache.
    fn answer_complete(&mut self, usage: Option<Usage>, completion: Option<Vec<u8>>) {
        self.settle(usage);
        if let Some(c) = completion {
            if self.include_content() {
                self.log.completion = sse::completion_text(&c);
            }
            self.cache_store(&c);
        }
    }

    /// The request record and per-request metrics, at the end of the stream.
    fn emit_record(&mut self) {
        if !self.log.chat {
            return;
        }
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let gw = &loaded.gw;
        let mut rec = Record {
            request_id: std::mem::take(&mut self.log.request_id),
            time_ms: self.log.started_ms,
            client: self.client(gw).map(|c| c.name.clone()).unwrap_or_default(),
            status: u32::from(self.log.status),
            error: self.log.error.to_string(),
            latency_ms: now_ms().saturating_sub(self.log.started_ms),
            ttfb_ms: self.log.ttfb_ms,
            prompt: std::mem::take(&mut self.log.prompt),
            completion: std::mem::take(&mut self.log.completion),
            cache: "off".into(),
            ..Record::default()
        };
        if rec.request_id.is_empty() {
            rec.request_id = format!("{:x}-{:x}", self.log.started_ms, self.roll);
        }
        rec.provider = self.answering_provider().unwrap_or_default();
        if let Some(f) = self.flight.as_ref() {
            rec.requested_model = f.chat.model.clone();
            rec.model = f.model_name.clone();
            rec.stream = f.chat.stream;
            rec.cache = f.cache_status.to_string();
            if let Some((e, a)) = f.experiment.as_deref().and_then(|x| x.split_once('/')) {
                rec.experiment = e.to_string();
                rec.arm = a.to_string();
            }
            for (p, cause) in &f.tried {
                rec.attempts.push(RecordAttempt {
                    provider: p.clone(),
                    status: cause.status(),
                    cause: cause.class().into(),
                });
            }
            for (p, _) in &f.skipped {
                rec.attempts.push(RecordAttempt {
                    provider: p.clone(),
                    status: 0,
                    cause: "circuit_open".into(),
                });
            }
            if let Some(status) = f.answered {
                rec.attempts.push(RecordAttempt {
                    provider: rec.provider.clone(),
                    status: status.into(),
                    cause: String::new(),
                });
            }
            if f.attempts > 1 {
                // Single-attempt requests skip it: one host call less each.
                histogram("portcullis.attempts", u64::from(f.attempts));
            }
            if let Some(u) = self.log.usage {
                rec.prompt_tokens = u.prompt;
                rec.completion_tokens = u.completion;
                rec.cached_tokens = u.cached;
                rec.reasoning_tokens = u.reasoning;
                if let Some(price) = gw
                    .names
                    .get(&rec.model)
                    .and_then(|&m| gw.prices.get(m).copied().flatten())
                {
                    rec.cost_micros = price.cost(u.prompt, u.completion, u.cached);
                }
            }
        }
        telemetry::request_metrics(&rec);
        telemetry::push(&rec);
    }

    /// Whether the answer's usage must be read (limits to settle, or the log).
    fn wants_usage(&self) -> bool {
        self.held.as_ref().is_some_and(Held::wants_usage) || telemetry::enabled()
    }

    /// Store a complete, successful answer.
    fn cache_store(&mut self, body: &[u8]) {
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(cfg) = loaded.gw.cache.as_ref() else {
            return;
        };
        let Some(fill) = self.flight.as_mut().and_then(|f| f.cache.take()) else {
            return;
        };
        store_entry(cfg, &fill.key, body);
    }
}

impl Flight {
    /// The next candidate whose breaker admits a request, within the attempt
    /// budget. Open breakers are skipped without spending an attempt.
    fn admit_next(&mut self, gw: &Gateway) -> Option<(usize, String)> {
        while self.attempts < gw.max_attempts {
            let (idx, model_id) = self.candidates.get(self.next_candidate)?.clone();
            self.next_candidate += 1;
            let p = gw.providers.get(idx)?;
            match breaker_admit(p) {
                (Admission::Refused { retry_after_ms }, _) => {
                    count(&provider_metric(&p.name, "skipped_open"), 1);
                    self.skipped.push((p.name.clone(), retry_after_ms));
                }
                (adm, clean) => {
                    self.attempts += 1;
                    self.current = Some(Current {
                        provider: idx,
                        probe: adm == Admission::Probe,
                        reported: false,
                        clean,
                    });
                    return Some((idx, model_id));
                }
            }
        }
        None
    }
}

impl Context for Stream {
    fn on_http_call_response(
        &mut self,
        token_id: u32,
        _num_headers: usize,
        body_size: usize,
        _num_trailers: usize,
    ) {
        let Some((token, started, timeout)) = self.flight.as_ref().and_then(|f| f.call) else {
            return;
        };
        if self.phase != Phase::FallbackPending || token != token_id {
            return;
        }
        if let Some(f) = self.flight.as_mut() {
            f.call = None;
        }
        // As bytes: the provider's header values pass to the client unchanged.
        let call_headers = abi::get_map_bytes(MapType::HttpCallResponseHeaders).unwrap_or_default();
        let status = call_headers
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| std::str::from_utf8(v).ok()?.parse::<u16>().ok());
        let outcome = classify_call(status, now_ms().saturating_sub(started), timeout);
        let encoded = is_encoded(&call_headers);
        if self.after_attempt(status, outcome).is_some() {
            return; // next attempt dispatched, or the error was sent
        }
        let mut body = abi::get_buffer(BufferType::HttpCallResponseBody, 0, body_size)
            .ok()
            .flatten()
            .unwrap_or_default();
        let (stream, ask_usage) = self
            .flight
            .as_ref()
            .map(|f| (f.chat.stream, f.ask_usage))
            .unwrap_or_default();
        if status == Some(200) && encoded {
            // Passed through as it came (its content-encoding header too),
            // unread: the reservation stands.
            if let Some(h) = self.held.as_mut() {
                h.settle(None, now_ms());
            }
        } else if status == Some(200) && stream {
            // The whole stream came at once: read it, and drop the usage chunk
            // the client did not ask for.
            let mut relay = Relay::new(ask_usage);
            let mut out = relay.chunk(&body);
            out.extend(relay.finish());
            if ask_usage {
                body = out;
            }
            self.answer_complete(
                relay.assembly.usage.as_ref().and_then(Usage::from_usage),
                relay.assembly.completion(),
            );
        } else if status == Some(200) {
            self.answer_complete(Usage::from_body(&body), Some(body.clone()));
        } else if let Some(h) = self.held.as_mut() {
            h.release(now_ms());
        }
        let ours = self.gateway_headers();
        let mut hdrs: Vec<(&str, &[u8])> = call_headers
            .iter()
            .filter(|(k, _)| {
                !k.starts_with(':')
                    && !matches!(
                        k.as_str(),
                        "content-length" | "transfer-encoding" | "connection" | "keep-alive"
                    )
                    && !headers::is_gateway_header(k)
            })
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        hdrs.extend(ours.iter().map(|(k, v)| (*k, v.as_bytes())));
        self.send(status.unwrap_or(502), &hdrs, &body);
    }
}

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
        match self.phase {
            Phase::Proxied => {}
            Phase::FallbackPending => return Action::Pause,
            _ => return Action::Continue,
        }
        let resp = abi::get_map(MapType::HttpResponseHeaders).unwrap_or_default();
        let status = resp
            .iter()
            .find(|(k, _)| k == ":status")
            .and_then(|(_, v)| v.parse::<u16>().ok())
            .unwrap_or(0);
        // Why Envoy failed, for its own local replies (only read on failures).
        let details = (status == 429 || status >= 500)
            .then(|| {
                abi::get_property(&["response", "code_details"])
                    .ok()
                    .flatten()
            })
            .flatten()
            .and_then(|b| String::from_utf8(b).ok());
        if let Some(action) = self.after_attempt(Some(status), classify(status, details.as_deref()))
        {
            return action;
        }
        let wants_usage = self.wants_usage();
        self.log.status = status;
        if self.flight.as_ref().is_some_and(|f| f.chat.stream) {
            self.log.ttfb_ms = now_ms().saturating_sub(self.log.started_ms);
        }
        if (400..500).contains(&status) {
            self.log.error = "provider_client_error";
        }
        if status >= 400 {
            // Passed through as the client's error: it used nothing.
            if let Some(h) = self.held.as_mut() {
                h.release(now_ms());
            }
        }
        // How much of a plain answer to keep whole: what the cache may store,
        // or the record's completion text; past that only its tail (usage).
        let cache_max = self
            .loaded
            .as_ref()
            .and_then(|l| l.gw.cache.as_ref())
            .map_or(0, |c| c.max_entry_bytes);
        let content_max = if self.include_content() { 1 << 16 } else { 0 };
        if let Some(f) = self.flight.as_mut() {
            f.encoded = is_encoded(&resp);
            if status != 200 || f.encoded {
                f.cache = None;
            }
            if f.chat.stream
                && status == 200
                && !f.encoded
                && (f.cache.is_some() || f.ask_usage || wants_usage)
            {
                f.relay = Some(Relay::new(f.ask_usage));
            } else if status == 200 && !f.encoded && (f.cache.is_some() || wants_usage) {
                let keep = if f.cache.is_some() { cache_max } else { 0 };
                f.copy = Some(AnswerCopy::new(keep.max(content_max)));
            }
        }
        // Gateway headers from a provider never reach the client as ours.
        // The provider's other headers are left as they are (not rewritten:
        // their values need not be UTF-8).
        for (k, _) in resp.iter().filter(|(k, _)| headers::is_gateway_header(k)) {
            let _ = abi::set_map_value(MapType::HttpResponseHeaders, k, None);
        }
        for (k, v) in self.gateway_headers() {
            let _ = abi::add_map_value(MapType::HttpResponseHeaders, k, &v);
        }
        self.phase = Phase::Responding;
        Action::Continue
    }

    fn on_http_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match self.phase {
            // While a fallback is pending, hold the failed upstream's body:
            // letting it through would flush the held headers to the client.
            Phase::FallbackPending => return Action::Pause,
            Phase::Responding => {}
            _ => return Action::Continue,
        }
        let Some(f) = self.flight.as_mut() else {
            return Action::Continue;
        };
        if f.encoded {
            return Action::Continue;
        }
        if let Some(relay) = f.relay.as_mut() {
            // Streams pass through chunk by chunk; a copy is read.
            let chunk = abi::get_buffer(BufferType::HttpResponseBody, 0, body_size)
                .ok()
                .flatten()
                .unwrap_or_default();
            let mut out = relay.chunk(&chunk);
            if end_of_stream {
                out.extend(relay.finish());
            }
            if relay.strip_usage {
                let _ = abi::set_buffer(BufferType::HttpResponseBody, 0, body_size, &out);
            }
            if end_of_stream {
                let usage = relay.assembly.usage.as_ref().and_then(Usage::from_usage);
                let done = relay.assembly.completion();
                self.answer_complete(usage, done);
            }
            return Action::Continue;
        }
        // A plain answer is copied as it passes (Envoy never holds it, so its
        // buffer limit never applies and the client gets bytes at once),
        // then read and stored at its end.
        let Some(copy) = f.copy.as_mut() else {
            return Action::Continue;
        };
        if let Ok(Some(chunk)) = abi::get_buffer(BufferType::HttpResponseBody, 0, body_size) {
            copy.push(&chunk);
        }
        if end_of_stream {
            if let Some(copy) = f.copy.take() {
                let (usage, whole) = copy.finish();
                if whole.is_none() && f.cache.take().is_some() {
                    count("portcullis.cache.too_large", 1);
                }
                self.answer_complete(usage, whole);
            }
        }
        Action::Continue
    }

    fn on_log(&mut self) {
        self.emit_record();
        if let Some(h) = self.held.as_mut() {
            match self.phase {
                // Cancelled before any answer: it used nothing.
                Phase::Proxied | Phase::FallbackPending | Phase::ChatBody => h.release(now_ms()),
                // An answer without usage (or cut short): the reservation stands.
                _ => h.settle(None, now_ms()),
            }
        }
        // A probe that never reported (client went away) gives its slot back.
        let (Some(loaded), Some(f)) = (self.loaded.as_ref(), self.flight.as_ref()) else {
            return;
        };
        if let Some(cur) = f.current.as_ref().filter(|c| c.probe && !c.reported) {
            if let Some(p) = loaded.gw.providers.get(cur.provider) {
                breaker_release_probe(p);
            }
        }
    }
}
