//! A request's state: the holder of its parts ([`RequestContext`]), one
//! part per capability: the routed request across its attempts (`flight`),
//! a paused run of the steps (`exchange`), an answer being read
//! (`reading`), the external guards' calls in flight and the output
//! checks' state (`guard`), an MCP call (`mcp`), a files or batches call (`files`), a
//! Realtime session (`realtime`); the client's limits are
//! [`RequestLimits`](crate::limits::RequestLimits), whose fields only
//! `limits` reads. What a request hands its record when it ends is
//! [`Ended`] (`telemetry` reads nothing else).
//!
//! May use: `host`, `loaded`, `limits`, `health`.
//!
//! One HTTP stream through the gateway: its state, and the proxy-wasm
//! callbacks, each a few lines that hand over to a named step:
//!
//! | callback | step |
//! |---|---|
//! | request headers | [`llm::headers`](crate::llm::headers) |
//! | request body | [`llm::body`](crate::llm::body) |
//! | response headers and body | the router's answer, [`answer`](crate::llm::answer) |
//! | callout answer | a fallback's answer, [`answer`](crate::llm::answer) |
//! | log | the record ([`telemetry`](crate::telemetry)), limits, probes |

pub mod exchange;
pub mod files;
pub mod flight;
pub mod guard;
pub mod mcp;
pub mod reading;
pub mod realtime;

use crate::host::Host;
use crate::host::{Action, LogLevel};
use crate::limits::admission::Finish;
use crate::limits::RequestLimits;
use crate::loaded::Loaded;
use crate::request::flight::Flight;
use portcullis_core::api::Api;
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::usage::Usage;
use std::rc::Rc;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for request headers.
    Headers,
    /// A chat request: waiting for the whole body.
    ChatBody,
    /// Waiting for external guards (input guardrails).
    Guarding,
    /// Waiting for the rate limit service (global limits).
    Limiting,
    /// Waiting for the fleet's cache tier (`cache.shared`) after a miss
    /// here.
    SharedCache,
    /// The first attempt is ready for Envoy's router but for its access
    /// token, which this request fetches (the callout's token).
    AwaitingToken(u32),
    /// The first attempt went through Envoy's router.
    Proxied,
    /// A fallback callout is in flight; the upstream's answer is held.
    FallbackPending,
    /// An answer is on its way to the client.
    Responding,
    /// An MCP request (`mcp`): waiting for its whole body.
    McpBody,
    /// An MCP tool call waiting for the vendor checks over its arguments.
    McpGuarding,
    /// A whole answer held while vendor checks read it.
    GuardingAnswer,
    /// An MCP request on its way to its server, through Envoy's router.
    McpProxied,
    /// An MCP server's answer on its way to the client.
    McpResponding,
    /// The aggregated MCP endpoint: waiting for its servers' answers.
    McpFanout,
    /// A files or batches call (`files`): waiting for its whole body.
    StoredBody,
    /// A files or batches call on its way to its provider.
    StoredProxied,
    /// Its provider's answer on its way to the client.
    StoredResponding,
    /// A Realtime session's upgrade on its way to its provider.
    RealtimeUpgrade,
    /// A Realtime session open: frames both ways.
    Realtime,
    /// Answered by the filter, or not ours: nothing more to do.
    Done,
}

/// A lookup of the fleet's cache tiers a request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// The exact tier (`Get`).
    Exact,
    /// The prompt's embedding, asked of the gateway itself (an HTTP call).
    Embedding,
    /// The semantic tier (`Nearest`).
    Nearest,
}

/// What the request record needs, gathered along the way.
#[derive(Default)]
pub struct LogFacts {
    pub chat: bool,
    pub started_ms: u64,
    pub request_id: String,
    pub status: u16,
    pub error: &'static str,
    /// Which scope refused the request: "", "local" or "global".
    pub limited_by: &'static str,
    pub ttfb_ms: u64,
    /// A stream's first body chunk, ms after the start (0: none yet).
    pub ttft_ms: u64,
    /// The client's `traceparent`, read at the headers.
    pub parent: Option<portcullis_core::telemetry::trace::Parent>,
    /// The client's `tracestate`, as sent.
    pub tracestate: String,
    /// The request's trace: the client's continued, or one it started.
    pub trace: Option<portcullis_core::telemetry::trace::Trace>,
    /// What the answer said of itself: id, model, finish reasons.
    pub answer_facts: portcullis_core::usage::AnswerFacts,
    pub usage: Option<Usage>,
    /// The usage was counted by the gateway (the provider sent none).
    pub usage_estimated: bool,
    pub prompt: String,
    pub completion: String,
    /// What the guardrails did.
    pub guardrails: Vec<portcullis_core::guard::Verdict>,
}

impl LogFacts {
    /// Verdicts go to the record and the metrics.
    pub fn note_verdicts(
        &mut self,
        host: &impl Host,
        verdicts: &[portcullis_core::guard::Verdict],
    ) {
        for v in verdicts {
            host.count(
                &crate::host::metrics::guardrail(v.stage, &v.check, v.action),
                1,
            );
        }
        self.guardrails.extend(verdicts.iter().cloned());
    }
}

/// The client's request as read at its headers.
#[derive(Default)]
pub struct ClientRequest {
    /// The client's key hash (its handle in `Gateway::clients`).
    pub key: Option<[u8; 32]>,
    /// The client's `authorization`, kept only when the semantic tier may
    /// ask the gateway for the prompt's embedding under the same key.
    pub bearer: Option<String>,
    pub path: String,
    pub authority: String,
    pub cache_control: Option<String>,
    pub has_content_type: bool,
    /// A `multipart/...` content type as the client sent it (its
    /// boundary); other content types are not kept.
    pub multipart_type: Option<String>,
    /// The inbound API (decided by the path; its errors' shape).
    pub api: Api,
    /// The request headers conditional routes read.
    pub rule_headers: Vec<(String, String)>,
    /// `x-portcullis-pin-provider`: the provider a client asks for.
    pub pin_provider: Option<String>,
    /// The body limit that applies (the client's, else the gateway's) and
    /// whether it is the client's own; set at the headers.
    pub max_body: Option<(usize, bool)>,
    /// The end user named by `limits.user_header`, as sent.
    pub end_user: Option<String>,
    /// The end user whose limits apply (`<key>/<user>`, tracked), set at
    /// admission when the key has `per_user` limits.
    pub user: Option<String>,
}

/// What a request hands its record when it ends (`telemetry`): the facts
/// gathered along the way, the client's request, the routed request.
pub struct Ended<'a, H: Host> {
    pub host: &'a H,
    pub log: &'a mut LogFacts,
    pub request: &'a ClientRequest,
    pub flight: Option<&'a Flight>,
    /// The request's random number (a record id when Envoy gave none).
    pub roll: u64,
}

impl ClientRequest {
    /// The client the request's key names.
    pub fn client<'g>(&self, gw: &'g Gateway) -> Option<&'g Client> {
        gw.clients.get(self.key.as_ref()?)
    }
}

pub struct RequestContext<H: Host> {
    pub host: H,
    /// Envoy's id of this request's context (0 in lifecycle tests).
    pub id: u32,
    pub loaded: Option<Rc<Loaded>>,
    /// A random number for this request (`auto` picks by weight).
    pub roll: u64,
    pub phase: Phase,
    pub request: ClientRequest,
    /// A routed chat request across its attempts.
    pub flight: Option<Flight>,
    /// What the request holds of its client's limits, and the headers
    /// that show them.
    pub limits: RequestLimits,
    /// Calls to external guards in flight.
    pub guarding: Option<crate::request::guard::GuardCalls>,
    /// A whole answer held for the vendor checks over it.
    pub held_answer: Option<crate::request::guard::HeldAnswer>,
    /// The fleet cache tier's lookup in flight (its call's token, and
    /// which call it is).
    pub shared_lookup: Option<(u32, Lookup)>,
    /// A paused run of the request's steps: where it resumes, with what.
    pub paused: Option<(
        crate::request::exchange::Step,
        crate::request::exchange::Exchange,
    )>,
    /// An MCP request (`mcp`): its errors are JSON-RPC's.
    pub mcp: Option<Box<crate::request::mcp::McpCall>>,
    /// A files or batches call (`files`).
    pub stored: Option<Box<crate::request::files::StoredCall>>,
    /// A Realtime session (`realtime`).
    pub realtime: Option<Box<crate::request::realtime::Session>>,
    pub log: LogFacts,
}

impl<H: Host> RequestContext<H> {
    pub fn new(host: H, loaded: Option<Rc<Loaded>>, roll: u64) -> Self {
        Self {
            host,
            id: 0,
            loaded,
            roll,
            phase: Phase::Headers,
            request: ClientRequest::default(),
            flight: None,
            limits: RequestLimits::default(),
            guarding: None,
            held_answer: None,
            shared_lookup: None,
            paused: None,
            mcp: None,
            stored: None,
            realtime: None,
            log: LogFacts::default(),
        }
    }

    /// The config this request started with (a reload does not change it).
    pub fn loaded(&self) -> Result<Rc<Loaded>, GatewayError> {
        self.loaded
            .clone()
            .ok_or_else(|| GatewayError::internal("The gateway has no valid configuration yet."))
    }

    pub fn client<'g>(&self, gw: &'g Gateway) -> Option<&'g Client> {
        self.request.client(gw)
    }

    /// A provider's answer at its headers: its status, noted for the
    /// record with the time to it.
    pub(crate) fn answer_status(&mut self) -> u16 {
        let resp = self
            .host
            .headers(crate::host::Part::Response)
            .unwrap_or_default();
        let status = crate::host::status_of(&resp).unwrap_or(0);
        self.log.status = status;
        self.log.ttfb_ms = self.host.now_ms().saturating_sub(self.log.started_ms);
        status
    }

    /// The current attempt's `traceparent`: the trace's, with the attempt's
    /// own span id (none without a trace or an attempt).
    pub(crate) fn attempt_traceparent(&self) -> Option<String> {
        self.flight.as_ref()?.traceparent(self.log.trace.as_ref())
    }

    /// Verdicts go to the record and the metrics.
    pub(crate) fn note_verdicts(&mut self, verdicts: &[portcullis_core::guard::Verdict]) {
        self.log.note_verdicts(&self.host, verdicts);
    }

    /// The parts the record reads, handed over at the request's end.
    pub(crate) fn ended(&mut self) -> Ended<'_, H> {
        Ended {
            host: &self.host,
            log: &mut self.log,
            request: &self.request,
            flight: self.flight.as_ref(),
            roll: self.roll,
        }
    }

    /// The usage a capped stream counted as it passed, when the provider
    /// reported none (marked as estimated in the record).
    pub fn counted_usage(&mut self) -> Option<Usage> {
        if self.log.usage.is_some() {
            return None;
        }
        let f = self.flight.as_ref()?;
        let (_, prompt_est) = f.cap?;
        let counted = f.stream_cap.as_ref()?.counted();
        self.log.usage_estimated = true;
        let u = Usage {
            prompt: prompt_est,
            completion: counted,
            ..Usage::default()
        };
        self.log.usage = Some(u);
        Some(u)
    }

    /// The usage of an answer whose provider reported none, from its text
    /// (four bytes a token) and the prompt estimate; marked as estimated.
    pub fn usage_from_text(&mut self, text: &str) -> Usage {
        let prompt = self.flight.as_ref().map_or(0, |f| {
            f.cap
                .map_or((f.chat.body_len() as u64).div_ceil(4), |(_, p)| p)
        });
        self.log.usage_estimated = true;
        Usage {
            prompt,
            completion: (text.len() as u64).div_ceil(4),
            ..Usage::default()
        }
    }

    /// End the request's hold on its client's limits (once).
    pub fn finish_limits(&mut self, how: Finish) {
        self.limits.finish(&self.host, how);
    }

    /// Every answer the filter makes itself goes out here.
    pub fn send(&mut self, status: u16, headers: &[(&str, &[u8])], body: &[u8]) -> Action {
        self.phase = Phase::Done;
        self.log.status = status;
        if let Err(s) = self.host.send_response(status, headers, body) {
            self.host.log(
                LogLevel::Error,
                &format!("send_http_response failed: {s:?}"),
            );
        }
        Action::Pause
    }

    /// An answer of the gateway's own (errors, `/v1/models`): nothing was
    /// used of the client's limits.
    pub fn reply(&mut self, status: u16, extra: &[(&str, &str)], body: &[u8]) -> Action {
        self.finish_limits(Finish::Release);
        let rate = self.limits.take_headers();
        let mut hdrs: Vec<(&str, &[u8])> = vec![("content-type", b"application/json")];
        hdrs.extend(extra.iter().map(|(k, v)| (*k, v.as_bytes())));
        hdrs.extend(rate.iter().map(|(k, v)| (*k, v.as_bytes())));
        self.send(status, &hdrs, body)
    }

    /// A callout's wait ended with `step` (the request's next action, or
    /// why it fails): a request that goes on is resumed.
    pub(crate) fn resume_with(&mut self, step: Result<Action, GatewayError>) {
        let action = step.unwrap_or_else(|e| self.fail(&e));
        if action == Action::Continue {
            if let Err(s) = self.host.resume_request() {
                self.host.log(
                    LogLevel::Error,
                    &format!("cannot resume the request: {s:?}"),
                );
            }
        }
    }

    pub fn fail(&mut self, err: &GatewayError) -> Action {
        self.log.error = err.code;
        let retry = err.retry_after_s.map(|s| s.to_string());
        let mut extra: Vec<(&str, &str)> = retry
            .as_deref()
            .map(|r| vec![("retry-after", r)])
            .unwrap_or_default();
        let www;
        let body = match self.mcp.as_mut() {
            Some(call) => {
                call.rpc_error = portcullis_core::mcp::message::code_of(err);
                if err.status == 401 {
                    www = self
                        .loaded
                        .as_ref()
                        .and_then(|l| l.gw.mcp.as_ref()?.oauth.as_ref())
                        .map_or_else(
                            || crate::request::mcp::WWW_AUTHENTICATE.to_string(),
                            |o| o.www_authenticate(),
                        );
                    extra.push(("www-authenticate", &www));
                }
                portcullis_core::mcp::message::error_body(call.id.as_deref(), err)
            }
            None => self.request.api.error_body(err),
        };
        self.reply(err.status, &extra, &body)
    }

    fn or_fail(&mut self, step: Result<Action, GatewayError>) -> Action {
        step.unwrap_or_else(|e| self.fail(&e))
    }

    pub fn on_request_headers(&mut self, end_of_stream: bool) -> Action {
        if self.phase != Phase::Headers {
            return Action::Continue;
        }
        let step = self.request_headers(end_of_stream);
        self.or_fail(step)
    }

    pub fn on_request_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let step = match self.phase {
            Phase::ChatBody => self.request_body(body_size, end_of_stream),
            Phase::McpBody => self.mcp_body(body_size, end_of_stream),
            Phase::StoredBody => self.stored_body(body_size, end_of_stream),
            Phase::RealtimeUpgrade | Phase::Realtime => {
                return self.realtime_client_bytes(body_size, end_of_stream)
            }
            _ => return Action::Continue,
        };
        self.or_fail(step)
    }

    pub fn on_response_headers(&mut self, end_of_stream: bool) -> Action {
        match self.phase {
            Phase::Proxied => self.router_answer_headers(end_of_stream),
            // Woken by another's fetch (the tick) before its own answered.
            Phase::AwaitingToken(_) => {
                self.phase = Phase::Proxied;
                self.router_answer_headers(end_of_stream)
            }
            // Held until the fallback's answer replaces it.
            Phase::FallbackPending => Action::Pause,
            Phase::McpProxied => self.mcp_answer_headers(),
            Phase::StoredProxied => self.stored_answer_headers(),
            Phase::RealtimeUpgrade => self.realtime_answer_headers(),
            _ => Action::Continue,
        }
    }

    pub fn on_response_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        match self.phase {
            // Letting the failed upstream's body through would flush the
            // held headers to the client.
            Phase::FallbackPending => Action::Pause,
            Phase::Responding => self.router_answer_body(body_size, end_of_stream),
            Phase::McpResponding => self.mcp_answer_body(body_size, end_of_stream),
            Phase::StoredResponding => self.stored_answer_body(body_size, end_of_stream),
            Phase::Realtime => self.realtime_server_bytes(body_size, end_of_stream),
            _ => Action::Continue,
        }
    }

    /// A gRPC call's answer: the fleet cache tier's, or the rate limit
    /// service's (for a Realtime session's usage, or a request's limits).
    pub fn on_grpc_answer(&mut self, token: u32, grpc_status: u32, size: usize) {
        if self.phase == Phase::SharedCache {
            self.on_shared_answer(token, grpc_status, size);
        } else if self.realtime.is_some() {
            self.realtime_global_answer(token, grpc_status, size);
        } else {
            self.on_global_answer(token, grpc_status, size);
        }
    }

    pub fn on_call_response(&mut self, token: u32, body_size: usize) {
        match self.phase {
            Phase::FallbackPending => self.fallback_answer(token, body_size),
            Phase::Guarding => self.on_guard_answer(token, body_size),
            Phase::McpGuarding => self.on_mcp_guard_answer(token, body_size),
            Phase::GuardingAnswer => self.on_answer_guard(token, body_size),
            Phase::AwaitingToken(call) if call == token => self.on_token_answer(body_size),
            Phase::McpFanout => self.mcp_fanout_answer(token, body_size),
            Phase::SharedCache => self.on_embedding_answer(token, body_size),
            _ => {}
        }
    }

    pub fn on_log(&mut self) {
        if self.mcp.is_some() {
            self.mcp_end();
            return;
        }
        if self.stored.is_some() {
            self.stored_end();
            return;
        }
        if self.realtime.is_some() {
            self.realtime_end();
            return;
        }
        let how = match self.phase {
            // Cancelled before any answer: it used nothing.
            Phase::Proxied
            | Phase::FallbackPending
            | Phase::ChatBody
            | Phase::Guarding
            | Phase::AwaitingToken(_)
            | Phase::Limiting
            | Phase::SharedCache => Finish::Release,
            // An answer cut short: what a capped stream counted, else the
            // reservation stands.
            _ => Finish::Settle(self.counted_usage()),
        };
        if let Phase::AwaitingToken(_) = self.phase {
            // Gone before its token fetch answered: another request may fetch.
            self.abandon_token_fetch();
        }
        if let Some(loaded) = self.loaded.clone() {
            self.ended().emit_record(&loaded.gw);
        }
        self.finish_limits(how);
        self.release_unreported_probe();
        self.release_busy();
    }
}
