//! The request body phase: the whole body, then the request's steps
//! (`pipeline`); the work of the route, admit and global-limit steps and the
//! first attempt through Envoy's router.

use crate::host::metrics;
use crate::host::Action;
use crate::host::Host;
use crate::limits::admission;
use crate::limits::global::{self, Ask};
use crate::request::exchange::{Exchange, Step};
use crate::request::flight::Flight;
use crate::request::{Phase, RequestContext};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::health::attempt::exhausted;
use portcullis_core::limits::ratelimit;
use portcullis_core::pricing;
use portcullis_core::request::ChatRequest;
use portcullis_core::routing::{resolve, Route};
use portcullis_core::translate;

impl<H: Host> RequestContext<H> {
    /// The body phase: wait for the whole body (refusing one over the
    /// limit at once), then run the request's steps (`pipeline`).
    pub(crate) fn request_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        let (limit, own) = match self.request.max_body {
            Some(applies) => applies,
            None => (self.loaded()?.gw.max_body_bytes, false),
        };
        if body_size > limit {
            return Err(GatewayError::body_too_large(limit, own));
        }
        if !end_of_stream {
            return Ok(Action::Pause);
        }
        let x = Exchange {
            body_size,
            ..Exchange::default()
        };
        self.run(Step::Parse, x)
    }

    /// The route step's work: conditional routes, the model and its
    /// candidates in order, only providers that serve the API, a chained
    /// response's provider first.
    pub(crate) fn route_flight(
        &mut self,
        gw: &Gateway,
        client: &Client,
        chat: ChatRequest,
        now: u64,
    ) -> Result<(), GatewayError> {
        let mut routed =
            self.conditional_route(gw, &client.name, &chat.model, || chat.document().ok());
        self.request.user = self.end_user(gw, client, &chat);
        let user = self.request.user.as_deref();
        let low =
            admission::budget_low_model(&self.host, gw, (client, user), now).filter(|cheaper| {
                let target = gw.names.get(cheaper.as_str());
                // Not when the request already goes there, nor to a model
                // the key may not use.
                target.is_some_and(|t| client.may_use(*t))
                    && target != gw.names.get(routed.model.as_str())
            });
        if let Some(cheaper) = &low {
            routed.model.clone_from(cheaper);
        }
        let ordered = resolve(gw, client, &routed.model, self.roll).and_then(|mut route| {
            let candidates = std::mem::take(&mut route.candidates);
            let (_, candidates) = self.ordered(
                gw,
                &routed,
                route.model,
                candidates,
                client.allow_overrides,
                now,
            )?;
            Ok(Route {
                candidates,
                ..route
            })
        });
        let route = match ordered {
            Ok(r) => r,
            Err(e) => {
                self.rate_headers_with_tokens(gw, client, now);
                return Err(e);
            }
        };
        if let Some(m) = gw.models.get(route.model) {
            if let Some(limit) = m.max_body_bytes.filter(|l| chat.body_len() > *l) {
                return Err(GatewayError::body_too_large_for_model(limit, &m.name));
            }
        }
        let mut flight = self.flight_for(gw, chat, route);
        flight.budget_routed = low.is_some();
        self.flight = Some(flight);
        self.serving_api_only(gw)?;
        if self.request.api.keeps_responses() {
            self.pin_to_previous_response(gw)?;
        }
        Ok(())
    }

    /// The end user whose limits apply, when the key has `per_user` limits
    /// and the request names one: `limits.user_header`, else the body's
    /// `user` (chat completions, responses) or `metadata.user_id`
    /// (messages).
    fn end_user(&self, gw: &Gateway, client: &Client, chat: &ChatRequest) -> Option<String> {
        client.limits.per_user.as_ref()?;
        let named = self
            .request
            .end_user
            .clone()
            .filter(|u| !u.is_empty())
            .or_else(|| {
                let doc = chat.document().ok()?;
                let v = doc
                    .get("user")
                    .or_else(|| doc.get("metadata")?.get("user_id"))?;
                v.as_str().filter(|u| !u.is_empty()).map(str::to_string)
            })?;
        Some(admission::track_user(&self.host, gw, client, &named))
    }

    /// The global limits this request asks the rate limit service for (the
    /// reservations go on the request's hold).
    pub(crate) fn global_asks(
        &mut self,
        gw: &Gateway,
        client: &Client,
        to_provider: bool,
        now: u64,
    ) -> Result<Vec<Ask>, GatewayError> {
        if gw.global_limits.is_none() {
            return Ok(Vec::new());
        }
        let reserve = self.flight.as_ref().filter(|_| to_provider).map(|f| {
            let r = ratelimit::reservation(
                f.chat.body_len(),
                f.chat.max_tokens,
                client.limits.default_max_tokens,
            );
            (r, f.price)
        });
        let held = self.limits.held_mut();
        global::asks(
            gw,
            (client, self.request.user.as_deref()),
            reserve,
            now,
            held,
        )
    }

    /// Only providers whose format serves the request's API (`translate::reach`)
    /// and that serve the model on it (the model's `apis`) are candidates.
    fn serving_api_only(&mut self, gw: &Gateway) -> Result<(), GatewayError> {
        let api = self.request.api;
        let Some(f) = self.flight.as_mut() else {
            return Ok(());
        };
        let serving = gw
            .models
            .get(f.model)
            .map(|m| m.serving.as_slice())
            .unwrap_or_default();
        f.candidates.retain(|(p, _)| {
            // The format serves the API, and the model's `apis` (if any) lists it.
            let listed = serving
                .iter()
                .find(|s| s.provider == *p)
                .and_then(|s| s.apis.as_ref())
                .is_none_or(|apis| apis.contains(&api));
            listed
                && gw
                    .providers
                    .get(*p)
                    .is_some_and(|p| translate::serves(p, api))
        });
        if f.candidates.is_empty() {
            return Err(GatewayError::new(
                404,
                "invalid_request_error",
                "model_not_found",
                format!(
                    "The model `{}` has no provider that serves {} (a provider's format decides which APIs it can serve, and the model's `apis` in the gateway's config may narrow them).",
                    f.chat.model,
                    api.path()
                ),
            ));
        }
        Ok(())
    }

    /// The gateway's own answer when the model's first provider answers
    /// this API locally (a token count estimated for a model whose provider
    /// cannot count).
    pub(crate) fn answer_locally(&mut self, gw: &Gateway) -> Result<Option<Action>, GatewayError> {
        let api = self.request.api;
        let Some(f) = self.flight.as_ref() else {
            return Ok(None);
        };
        let local = f
            .candidates
            .first()
            .and_then(|(p, _)| gw.providers.get(*p))
            .is_some_and(|p| translate::answered_locally(p, api));
        if !local {
            return Ok(None);
        }
        let Some((body, (name, value))) = translate::pivot::local_answer(api, f.chat.document()?)
        else {
            return Ok(None);
        };
        Ok(Some(self.reply(200, &[(name, value)], &body)))
    }

    /// What the answer will need: the usage chunk of a stream, the prompt
    /// text for the log.
    pub(crate) fn prepare_upstream(&mut self, gw: &Gateway) -> Result<(), GatewayError> {
        let wants_usage = self.wants_usage(gw);
        let Some(flight) = self.flight.as_mut() else {
            return Err(GatewayError::internal("no request in flight"));
        };
        // A Messages stream always carries its usage.
        flight.usage_chunk = self.request.api.asks_usage_chunk()
            && flight.chat.needs_usage_request()
            && (flight.cache.will_store() || wants_usage);
        if gw.log.as_ref().is_some_and(|l| l.include_content) {
            self.log.prompt = flight.chat.messages_text()?;
        }
        Ok(())
    }

    /// The rate-limit headers with the token bucket as it stands (answers
    /// that took no tokens).
    pub(crate) fn rate_headers_with_tokens(&mut self, gw: &Gateway, client: &Client, now: u64) {
        let user = self.request.user.as_deref();
        let tokens = admission::peek_tokens(&self.host, gw, client, user, now);
        self.limits.show_tokens(tokens);
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
        // Reserved at the first candidate's price (the record's cost is the
        // answering provider's).
        let first = route.candidates.first().map(|(p, _)| *p);
        let price = pricing::price_for(gw, route.model, first, &chat.units).map(|(p, _)| p);
        Flight::new(
            chat,
            route.model,
            model_name,
            route.candidates,
            experiment,
            price,
        )
    }

    /// Limits on what reaches a provider: the completion cap the levels
    /// allow, then concurrency, tokens, budgets, at every level of the key.
    pub(crate) fn admit_limits(
        &mut self,
        gw: &Gateway,
        client: &Client,
        now: u64,
    ) -> Result<(), GatewayError> {
        let Some(flight) = self.flight.as_mut() else {
            return Ok(());
        };
        // The prompt estimate of the client's body (a clamp's rewrite does
        // not change what the prompt is).
        let (prompt_est, _) = ratelimit::reservation(flight.chat.prompt_len(), None, 0);
        let asked = (prompt_est, flight.chat.max_tokens, flight.chat.stream);
        let mut clamped = None;
        if let Some(n) = admission::completion_cap(
            &self.host,
            gw,
            (client, self.request.user.as_deref()),
            asked,
            flight.price,
            now,
        )? {
            if flight.chat.max_tokens != Some(n) {
                flight.chat = flight.chat.with_max_tokens(n)?;
                flight.rewritten = true;
                clamped = Some(n);
            }
            flight.cap = Some((n, prompt_est));
        }
        let max_completion = flight
            .chat
            .max_tokens
            .unwrap_or(client.limits.default_max_tokens);
        let price = flight.price;
        let result = self.admit_levels(gw, client, (prompt_est, max_completion), price, now);
        if let Some(n) = clamped {
            self.limits
                .add_header("x-portcullis-max-tokens-clamped", n.to_string());
        }
        result
    }

    fn admit_levels(
        &mut self,
        gw: &Gateway,
        client: &Client,
        reserve: (u64, u64),
        price: Option<portcullis_core::limits::ratelimit::Price>,
        now: u64,
    ) -> Result<(), GatewayError> {
        let counted_here = gw
            .levels_of(client, self.request.user.as_deref())
            .any(|level| {
                let (l, s) = (level.limits, level.limits.scope);
                // An end user's request rate is taken at admission too.
                let user_rate =
                    matches!(level.owner, portcullis_core::shared::keys::Owner::User(_))
                        && l.requests_per_minute.is_some()
                        && s.requests_per_minute.local();
                user_rate
                    || l.max_concurrent.is_some()
                    || (l.tokens_per_minute.is_some() && s.tokens_per_minute.local())
                    || (!l.budgets.is_empty() && s.budgets.local())
            });
        if !counted_here {
            self.limits.show_tokens(None);
            return Ok(());
        }
        let user = self.request.user.as_deref();
        match admission::admit(&self.host, gw, (client, user), reserve, price, now) {
            Ok((held, shown)) => {
                self.limits.admitted(held, shown);
                Ok(())
            }
            Err(e) => {
                self.log.limited_by = "local";
                self.rate_headers_with_tokens(gw, client, now);
                Err(e)
            }
        }
    }

    /// Whether an answer's usage must be read: reservations to settle, or
    /// the request log.
    pub(crate) fn wants_usage(&self, gw: &Gateway) -> bool {
        self.limits.wants_usage() || gw.log.is_some()
    }

    /// The first candidate whose breaker admits it goes through Envoy's
    /// router: the client's request, rewritten for that provider.
    pub(crate) fn first_attempt(
        &mut self,
        body_size: usize,
        now: u64,
    ) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let Some(flight) = self.flight.as_mut() else {
            return Err(GatewayError::internal("no request in flight"));
        };
        let Some((provider, model_id)) = flight.admit_next(&self.host, &loaded.gw, now) else {
            return Err(exhausted(
                &flight.model_name,
                &flight.tried,
                &flight.skipped,
            ));
        };
        let api = self.request.api;
        let upstream =
            crate::upstream::for_attempt(&self.host, &loaded, api, flight, provider, &model_id)?;
        let traceparent = self.attempt_traceparent();
        crate::upstream::through_router(
            &self.host,
            &upstream,
            &self.request,
            traceparent,
            body_size,
        )?;
        self.phase = Phase::Proxied;
        if let Some(source) = upstream.awaiting_token {
            let name = loaded
                .gw
                .providers
                .get(provider)
                .map(|p| p.name.clone())
                .unwrap_or_default();
            return Ok(self.await_token(&name, source));
        }
        Ok(Action::Continue)
    }
}
