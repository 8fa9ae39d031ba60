//! The request body phase: parse the body once, resolve the route, answer
//! from the cache when it can, take the client's limits, and send the first
//! attempt through Envoy's router.

use crate::admission;
use crate::context::{Phase, RequestContext};
use crate::flight::Flight;
use crate::host::{Host, Part};
use crate::metrics;
use portcullis_core::attempt::exhausted;
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::ratelimit;
use portcullis_core::request::ChatRequest;
use portcullis_core::routing::{order_candidates, resolve, Route};
use proxy_wasm::types::Action;

impl<H: Host> RequestContext<H> {
    pub(crate) fn request_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        if body_size > gw.max_body_bytes {
            return Err(GatewayError::body_too_large(gw.max_body_bytes));
        }
        if !end_of_stream {
            return Ok(Action::Pause);
        }
        let body = self
            .host
            .body(Part::Request, body_size)
            .map_err(|s| GatewayError::internal(format!("cannot read request body: {s:?}")))?;
        let chat = ChatRequest::parse(&body)?;
        let client = self.client(gw).ok_or_else(GatewayError::unknown_key)?;
        // One clock read for the body phase (cache expiry, limits).
        let now = self.host.now_ms();
        let route = match resolve(gw, client, &chat.model, self.roll) {
            Ok(r) => r,
            Err(e) => {
                self.rate_headers_with_tokens(client, now);
                return Err(e);
            }
        };
        self.flight = Some(self.flight_for(gw, chat, route));
        if let Some(answer) = self.answer_from_cache(gw, client, now)? {
            return Ok(answer);
        }
        self.admit_limits(client, now)?;
        let wants_usage = self.wants_usage(gw);
        let Some(flight) = self.flight.as_mut() else {
            return Err(GatewayError::internal("no request in flight"));
        };
        flight.usage_chunk =
            flight.chat.needs_usage_request() && (flight.cache_fill.is_some() || wants_usage);
        if gw.log.as_ref().is_some_and(|l| l.include_content) {
            self.log.prompt = flight.chat.messages_text()?;
        }
        self.first_attempt(body_size)
    }

    /// The rate-limit headers with the token bucket as it stands (answers
    /// that took no tokens).
    pub(crate) fn rate_headers_with_tokens(&mut self, client: &Client, now: u64) {
        let tokens = admission::peek_tokens(&self.host, client, now);
        self.rate_headers = admission::headers(client, self.req_take, tokens);
    }

    /// The request across its attempts, from its route.
    fn flight_for(&self, gw: &Gateway, chat: ChatRequest, route: Route) -> Flight {
        let model_name = gw
            .models
            .get(route.model)
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let experiment = route.experiment.and_then(|(ei, ai)| {
            let e = gw.experiments.get(ei)?;
            let arm = e.arms.get(ai)?;
            self.host
                .count(&metrics::experiment_requests(&e.name, &arm.name), 1);
            Some((e.name.clone(), arm.name.clone()))
        });
        let price = gw.prices.get(route.model).copied().flatten();
        Flight::new(
            chat,
            model_name,
            order_candidates(route.candidates),
            experiment,
            price,
        )
    }

    /// Limits on what reaches a provider: concurrency, tokens, budget.
    fn admit_limits(&mut self, client: &Client, now: u64) -> Result<(), GatewayError> {
        let l = &client.limits;
        if l.max_concurrent.is_none() && l.tokens_per_minute.is_none() && l.budget_micros.is_none()
        {
            self.rate_headers = admission::headers(client, self.req_take, None);
            return Ok(());
        }
        let Some(flight) = self.flight.as_ref() else {
            return Ok(());
        };
        let reserve = ratelimit::reservation(
            flight.chat.body_len(),
            flight.chat.max_tokens,
            l.default_max_tokens,
        );
        match admission::admit(&self.host, client, reserve, flight.price, now) {
            Ok((held, tokens)) => {
                self.rate_headers = admission::headers(client, self.req_take, tokens);
                self.held = Some(held);
                Ok(())
            }
            Err(e) => {
                self.rate_headers_with_tokens(client, now);
                Err(e)
            }
        }
    }

    /// Whether an answer's usage must be read: reservations to settle, or
    /// the request log.
    pub(crate) fn wants_usage(&self, gw: &Gateway) -> bool {
        self.held.as_ref().is_some_and(admission::Held::wants_usage) || gw.log.is_some()
    }

    /// The first candidate whose breaker admits it goes through Envoy's
    /// router: the client's request, rewritten for that provider.
    fn first_attempt(&mut self, body_size: usize) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let Some(flight) = self.flight.as_mut() else {
            return Err(GatewayError::internal("no request in flight"));
        };
        let Some((provider, model_id)) = flight.admit_next(&self.host, &loaded.gw) else {
            return Err(exhausted(
                &flight.model_name,
                &flight.tried,
                &flight.skipped,
            ));
        };
        let upstream = self.upstream_for(&loaded, provider, &model_id)?;
        self.send_through_router(&upstream, body_size)?;
        self.phase = Phase::Proxied;
        Ok(Action::Continue)
    }
}
