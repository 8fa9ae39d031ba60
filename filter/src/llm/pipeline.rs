//! The request's life, top to bottom. The headers phase authenticates the
//! key and decides the inbound API (`llm::headers`); a request with a
//! body then runs these steps in order:
//!
//! | step | what it does | how it can end or wait |
//! |---|---|---|
//! | `Parse` | reads the body once, in its API's strict parser | 400 / 413 |
//! | `Route` | conditional routes, the model, its candidates in order, the providers that serve the API, a pinned response's provider | 404, or a local answer (a token count estimated) |
//! | `InputChecks` | the guardrails over every text of the prompt | a deny; waits for external guards, then resumes at `Cache` |
//! | `Cache` | the prompt cache (the worker's copy, shared data, then the fleet's tier) | a hit is answered at `Dispatch`; waits for the fleet's tier, then resumes at `Admit` |
//! | `Admit` | the client's local limits: concurrency, tokens, budget | 429 |
//! | `GlobalLimits` | the limits counted by the rate limit service | waits for its answers, then resumes at `Dispatch` (or 429 / 503) |
//! | `Dispatch` | the cached answer, or the first candidate through Envoy's router | — |
//!
//! The config snapshot and the client are looked up once per run. Each step
//! is a method over the request context and the `Exchange` the
//! steps hand each other (`exchange`); it returns `Next`: go on, answer, or pause with
//! what it waits for and where the request resumes. A pause keeps the
//! exchange in the context; the callback that ends the wait calls
//! [`RequestContext::resume`]. What comes after `Dispatch` (the answer,
//! fallbacks through callouts, the record) is `answer`, `attempts` and
//! `telemetry`.

use crate::host::Action;
use crate::host::{Host, Part};
use crate::limits::global;
use crate::llm::guard::Guarded;
use crate::request::exchange::{Exchange, Next, Step, Wait, BODY};
use crate::request::RequestContext;
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::request::ChatRequest;

/// What every step reads, looked up once per run: the request's config
/// snapshot and its client.
struct Ctx<'g> {
    gw: &'g Gateway,
    client: &'g Client,
}

impl<H: Host> RequestContext<H> {
    /// Run the body phase from `from` on.
    pub(crate) fn run(&mut self, from: Step, mut x: Exchange) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let c = Ctx {
            gw: &loaded.gw,
            client: self
                .client(&loaded.gw)
                .ok_or_else(GatewayError::unknown_key)?,
        };
        for step in BODY.iter().copied().skip_while(|s| *s != from) {
            match self.step(step, &c, &mut x)? {
                Next::Go => {}
                Next::Done(action) => return Ok(action),
                Next::Pause(_, at) => {
                    self.paused = Some((at, x));
                    return Ok(Action::Pause);
                }
            }
        }
        Err(GatewayError::internal("the request ran out of steps"))
    }

    /// A wait ended: on from where the pause said, with what the steps had
    /// (the clock read again).
    /// Resume a request the cache's lookup paused, with what it found
    /// (`None`: a miss).
    pub(crate) fn resume_with_hit(
        &mut self,
        hit: Option<(&'static str, Vec<u8>)>,
    ) -> Result<Action, GatewayError> {
        if let Some((_, x)) = self.paused.as_mut() {
            x.hit = hit;
        }
        self.resume()
    }

    pub(crate) fn resume(&mut self) -> Result<Action, GatewayError> {
        let Some((at, mut x)) = self.paused.take() else {
            return Err(GatewayError::internal("resumed without a pause"));
        };
        x.now = self.host.now_ms();
        self.run(at, x)
    }

    fn step(&mut self, step: Step, c: &Ctx<'_>, x: &mut Exchange) -> Result<Next, GatewayError> {
        match step {
            Step::Parse => self.parse(x),
            Step::Route => self.route(c, x),
            Step::InputChecks => self.input_checks(c),
            Step::Cache => self.cache(c, x),
            Step::Admit => self.admit(c, x),
            Step::GlobalLimits => self.global_limits(c, x),
            Step::Dispatch => self.dispatch(x),
        }
    }

    fn parse(&mut self, x: &mut Exchange) -> Result<Next, GatewayError> {
        let body = self
            .host
            .body(Part::Request, x.body_size)
            .map_err(|s| GatewayError::internal(format!("cannot read request body: {s:?}")))?;
        let api = self.request.api;
        x.chat = Some(if api.multipart() {
            let content_type = self.request.multipart_type.as_deref().unwrap_or("");
            ChatRequest::parse_form(api, body, content_type)?
        } else {
            ChatRequest::parse_owned(api, body)?
        });
        x.now = self.host.now_ms();
        Ok(Next::Go)
    }

    fn route(&mut self, c: &Ctx<'_>, x: &mut Exchange) -> Result<Next, GatewayError> {
        let chat = x
            .chat
            .take()
            .ok_or_else(|| GatewayError::internal("no parsed request"))?;
        self.route_flight(c.gw, c.client, chat, x.now)?;
        Ok(match self.answer_locally(c.gw)? {
            Some(action) => Next::Done(action),
            None => Next::Go,
        })
    }

    fn input_checks(&mut self, c: &Ctx<'_>) -> Result<Next, GatewayError> {
        Ok(match self.input_guardrails(c.gw, c.client)? {
            Guarded::Wait => Next::Pause(Wait::Guards, Step::Cache),
            Guarded::Go => Next::Go,
        })
    }

    fn cache(&mut self, c: &Ctx<'_>, x: &mut Exchange) -> Result<Next, GatewayError> {
        // A free request (a token count) takes no tokens and is not cached;
        // images, audio, rankings and verdicts are not cached.
        if !self.request.api.free() && self.request.api.cached() {
            x.hit = self.cache_lookup(c.gw, c.client, x.now)?;
            if x.hit.is_none() && self.ask_shared(c.gw) {
                return Ok(Next::Pause(Wait::SharedCache, Step::Admit));
            }
        }
        Ok(Next::Go)
    }

    fn admit(&mut self, c: &Ctx<'_>, x: &mut Exchange) -> Result<Next, GatewayError> {
        if x.hit.is_none() && !self.request.api.free() {
            self.admit_limits(c.gw, c.client, x.now)?;
        }
        Ok(Next::Go)
    }

    fn global_limits(&mut self, c: &Ctx<'_>, x: &mut Exchange) -> Result<Next, GatewayError> {
        let (gw, client) = (c.gw, c.client);
        let to_provider = x.hit.is_none() && !self.request.api.free();
        // Global reservations go on the hold first: the answer's usage is
        // then wanted for them too.
        let asks = self.global_asks(gw, client, to_provider, x.now)?;
        if x.hit.is_none() {
            self.prepare_upstream(gw)?;
        }
        match gw.global_limits.as_ref() {
            Some(service) if !asks.is_empty() => {
                if self.check_global(service, asks)? == global::Sent::Waiting {
                    return Ok(Next::Pause(Wait::RateLimitService, Step::Dispatch));
                }
                Ok(Next::Go)
            }
            _ => Ok(Next::Go),
        }
    }

    fn dispatch(&mut self, x: &mut Exchange) -> Result<Next, GatewayError> {
        Ok(Next::Done(match x.hit.take() {
            Some((content_type, body)) => self.answer_hit(content_type, &body),
            None => self.first_attempt(x.body_size, x.now)?,
        }))
    }
}
