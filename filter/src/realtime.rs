//! The Realtime API through the gateway (#48): `GET /v1/realtime?model=...`
//! upgraded to a WebSocket. At the upgrade: the key (its `Authorization`,
//! or a browser's `openai-insecure-api-key.` subprotocol), the request
//! rate, the model's route, a hold on the key's limits; then Envoy's
//! router takes the upgrade to the provider with the provider's
//! credential. Once the provider answers `101`, both directions pass as
//! body callbacks ([`portcullis_core::wire::websocket`] reads the frames):
//! each `response.done`'s usage is taken from the key's token limits and
//! budgets as it passes, text is checked by the guardrails, and when a
//! limit runs out, a check denies or a frame breaks the protocol the
//! gateway ends the session (an `error` event and a close frame to the
//! client, a close frame to the provider). One record per session.
//!
//! May use: `host`, `limits`, `loaded`, `request`, `upstream`.

use crate::host::{Action, Host, Part};
use crate::limits::admission::{self, Finish};
use crate::limits::global::{self, Ask};
use crate::request::realtime::Session;
use crate::request::{Phase, RequestContext};
use crate::upstream::UpstreamRequest;
use portcullis_core::api::realtime::{self, Checked, ServerEvent};
use portcullis_core::api::Api;
use portcullis_core::config::Gateway;
use portcullis_core::error::GatewayError;
use portcullis_core::guard::{self, Kind, Stage};
use portcullis_core::limits::rls;
use portcullis_core::routing::resolve;
use portcullis_core::telemetry::record::Record;
use portcullis_core::usage::Usage;
use portcullis_core::wire::websocket::{Message, Verdict};
use portcullis_core::{pricing, translate};
use std::sync::atomic::Ordering;

/// Close codes (RFC 6455): a policy ends the session, a frame broke the
/// protocol, the server side failed.
const POLICY: u16 = 1008;
const PROTOCOL: u16 = 1002;
const SERVER_ERROR: u16 = 1011;

/// The checks a session's texts go through: text-scanning and bounds
/// checks (a model's allow and deny lists are read at the upgrade; schema
/// and external checks are about whole answers).
fn text_checks(g: &guard::Guardrails, stage: Stage, client: &str, model: usize) -> Vec<usize> {
    g.active(stage, client, model)
        .into_iter()
        .filter(|&i| {
            matches!(
                g.checks(stage).get(i).map(|c| &c.kind),
                Some(Kind::Regex(_) | Kind::Pii(_) | Kind::Bounds(_))
            )
        })
        .collect()
}

impl<H: Host> RequestContext<H> {
    /// The upgrade: checked, admitted and sent to the model's provider.
    pub(crate) fn realtime_headers(
        &mut self,
        gw: &Gateway,
        up: crate::request::realtime::Upgrade<'_>,
        authorization: Option<&str>,
    ) -> Result<Action, GatewayError> {
        let now = self.host.now_ms();
        self.log.started_ms = now;
        self.request.api = Api::Realtime;
        // A session refused here is recorded as a request (the session's
        // own record takes over once it is admitted).
        self.log.chat = true;
        let (protocol_key, protocols) = up
            .protocols
            .as_deref()
            .map_or((None, None), realtime::key_in_protocols);
        let bearer = protocol_key.map(|k| format!("Bearer {k}"));
        let authorization = authorization.or(bearer.as_deref());
        let client = self.key_and_rate(gw, authorization, now)?;
        if !up.websocket {
            return Err(realtime::not_an_upgrade());
        }
        let requested = realtime::model_of(up.query).ok_or_else(realtime::missing_model)?;
        let route = resolve(gw, client, &requested, self.roll)?;
        let serving = gw
            .models
            .get(route.model)
            .map(|m| m.serving.as_slice())
            .unwrap_or_default();
        let (provider, model_id) = route
            .candidates
            .iter()
            .find(|(p, _)| {
                let listed = serving
                    .iter()
                    .find(|s| s.provider == *p)
                    .and_then(|s| s.apis.as_ref())
                    .is_none_or(|a| a.contains(&Api::Realtime));
                listed
                    && gw
                        .providers
                        .get(*p)
                        .is_some_and(|p| translate::serves(p, Api::Realtime))
            })
            .cloned()
            .ok_or_else(|| realtime::no_provider(&requested))?;
        if let Some(g) = gw.guardrails.as_ref() {
            // A model the client may not use is refused here, before any frame.
            let models: Vec<usize> = g
                .active(Stage::Input, &client.name, route.model)
                .into_iter()
                .filter(|&i| {
                    matches!(
                        g.checks(Stage::Input).get(i).map(|c| &c.kind),
                        Some(Kind::Models { .. })
                    )
                })
                .collect();
            let out = guard::check_input_doc(g, &models, route.model, None);
            self.note_verdicts(&out.verdicts);
            if let Some(e) = out.denied {
                return Err(e);
            }
        }
        let priced = pricing::price_of(gw, route.model, Some(provider));
        // An end user (`limits.user_header`) has limits of its own.
        if client.limits.per_user.is_some() {
            if let Some(named) = self.request.end_user.clone().filter(|u| !u.is_empty()) {
                self.request.user = Some(admission::track_user(&self.host, gw, client, &named));
            }
        }
        // The session holds a slot of `max_concurrent` and one token: a
        // key with nothing left is refused before the upgrade.
        let (held, shown) = admission::admit(
            &self.host,
            gw,
            (client, self.request.user.as_deref()),
            (1, 0),
            priced.map(|(p, _)| p),
            now,
        )?;
        self.limits.hold(held, shown.tokens);
        let key = self.roll.to_le_bytes();
        // Every text event is read whole up to the key's body bound; a
        // larger one ends the session (never passes unread).
        let mut session = Session::new(
            requested,
            route.model,
            provider,
            model_id.clone(),
            [key[0], key[1], key[2], key[3]],
            client.limits.max_body_bytes,
        );
        session.configs_seen = crate::loaded::CONFIGS_APPLIED.load(Ordering::Acquire);
        session.stamp = self.key_stamp();
        session.price = priced.map(|(p, _)| p);
        session.price_source = priced.map_or("", |(_, s)| s.as_str());
        if gw.global_limits.is_some() {
            // The limits counted across the fleet: the session's request
            // and a token (and its cost) asked now, its responses' usage
            // as they pass; a refusal ends the session.
            let mut scratch = admission::Held::default();
            session.global = global::asks(
                gw,
                (client, self.request.user.as_deref()),
                Some(((1, 0), session.price)),
                now,
                &mut scratch,
            )?;
        }
        let first = session.global.clone();
        self.realtime = Some(Box::new(session));
        // Frames are read as they come: no extension (compression) may
        // be negotiated, and a key sent as a subprotocol goes no further.
        let _ = self
            .host
            .set_header(Part::Request, "sec-websocket-extensions", None);
        if up.protocols.is_some() {
            let _ = self.host.set_header(
                Part::Request,
                "sec-websocket-protocol",
                protocols.as_deref(),
            );
        }
        // The service's word on the session comes while it opens: an
        // upgrade paused at its headers and resumed from a callout keeps the
        // route Envoy chose at its headers (probed: the no-route 404), so
        // the upgrade does not wait for it.
        self.count_global(gw, first);
        self.realtime_send(gw)?;
        Ok(Action::Continue)
    }

    /// The stamp the serving config wrote for this request's key (none:
    /// no config wrote one).
    fn key_stamp(&self) -> Option<Vec<u8>> {
        let hash = self.request.key.as_ref()?;
        let (v, _) = self
            .host
            .get(&portcullis_core::shared::keys::client_stamp_key(hash))
            .ok()?;
        v
    }

    /// The upgrade on its way to the session's provider.
    fn realtime_send(&mut self, gw: &Gateway) -> Result<(), GatewayError> {
        let (provider, model_id) = self
            .realtime
            .as_ref()
            .map(|s| (s.provider, s.model_id.clone()))
            .ok_or_else(|| GatewayError::internal("no session"))?;
        let loaded = self.loaded()?;
        let path = gw
            .providers
            .get(provider)
            .map(|p| translate::path(p, Api::Realtime, &model_id, true))
            .unwrap_or_default();
        // An upgrade has no body: no content type is added.
        self.request.has_content_type = true;
        let up = UpstreamRequest::to_provider(&loaded, provider, path, true, None)?;
        let traceparent = self.attempt_traceparent();
        crate::upstream::through_router(&self.host, &up, &self.request, traceparent, 0)?;
        self.phase = Phase::RealtimeUpgrade;
        Ok(())
    }

    /// The provider's answer to the upgrade: `101` opens the session; any
    /// other answer goes to the client as it is.
    pub(crate) fn realtime_answer_headers(&mut self) -> Action {
        let status = self.answer_status();
        for (k, v) in self.limits.take_headers() {
            let _ = self.host.set_header(Part::Response, k, Some(&v));
        }
        if status == 101 {
            self.phase = Phase::Realtime;
        } else {
            self.phase = Phase::Done;
        }
        Action::Continue
    }

    /// The client's frames on their way to the provider.
    pub(crate) fn realtime_client_bytes(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        let _ = end_of_stream;
        let Ok(loaded) = self.loaded() else {
            return Action::Continue;
        };
        let gw = &loaded.gw;
        // The key's stamp is read again only when a config was applied
        // since the session last looked (an atomic load otherwise).
        let applied = crate::loaded::CONFIGS_APPLIED.load(Ordering::Acquire);
        let looks = body_size > 0
            && self
                .realtime
                .as_ref()
                .is_some_and(|s| s.configs_seen != applied);
        let stamp_now = if looks { self.key_stamp() } else { None };
        let client_cap = gw
            .clients
            .get(self.request.key.as_ref().unwrap_or(&[0; 32]))
            .map_or(gw.max_body_bytes, |c| c.limits.max_body_bytes);
        let Some(s) = self.realtime.as_deref_mut() else {
            return Action::Continue;
        };
        if looks {
            s.configs_seen = applied;
        }
        if looks && s.stamp.is_some() && s.stamp != stamp_now {
            // The key was revoked or changed by a config applied since the
            // session began (the config it began with would let it go on).
            let revoked = stamp_now.as_ref().is_none_or(Vec::is_empty);
            s.end(
                if revoked {
                    GatewayError::new(
                        401,
                        "invalid_request_error",
                        "invalid_api_key",
                        "This key was revoked: the session ends.",
                    )
                } else {
                    GatewayError::new(
                        403,
                        "invalid_request_error",
                        "key_changed",
                        "This key's access changed with the gateway's config: the session ends; open a new one.",
                    )
                },
                POLICY,
            );
        }
        if s.told_provider {
            // Ended: nothing more goes to the provider.
            if body_size > 0 {
                let _ = self.host.set_body(Part::Request, body_size, &[]);
            }
            return Action::Continue;
        }
        if body_size == 0 {
            return Action::Continue;
        }
        let Ok(chunk) = self.host.body(Part::Request, body_size) else {
            return Action::Continue;
        };
        let client_name = gw
            .clients
            .get(self.request.key.as_ref().unwrap_or(&[0; 32]))
            .map_or("", |c| c.name.as_str());
        let checks = gw
            .guardrails
            .as_ref()
            .map(|g| (g, text_checks(g, Stage::Input, client_name, s.model)))
            .filter(|(_, a)| !a.is_empty());
        let mut verdicts = Vec::new();
        let mut closed = false;
        let Session { client, ending, .. } = s;
        let mut out = client.feed(&chunk, &mut |m| match m {
            Message::Close(_) => {
                closed = true;
                Verdict::Pass
            }
            Message::Text(_) if ending.is_some() => Verdict::Drop,
            Message::Text(t) => {
                let Some((g, active)) = checks.as_ref() else {
                    return Verdict::Pass;
                };
                let Some((out, rewritten)) = realtime::check_client_event(g, active, t) else {
                    return Verdict::Pass;
                };
                verdicts.extend(out.verdicts);
                if let Some(e) = out.denied {
                    if ending.is_none() {
                        *ending = Some((e, POLICY));
                    }
                    return Verdict::Drop;
                }
                if let Some(r) = rewritten {
                    return Verdict::Replace(r);
                }
                Verdict::Pass
            }
        });
        if let Some(e) = client.error.clone() {
            let err = if e.0 == portcullis_core::wire::websocket::OVERSIZED {
                GatewayError::new(
                    413,
                    "invalid_request_error",
                    "event_too_large",
                    format!(
                        "A client event of more than {} bytes: the gateway reads every text event whole (limits.max_body_bytes) and ends the session rather than pass one unread.",
                        client_cap
                    ),
                )
            } else {
                GatewayError::bad_request(
                    "invalid_frame",
                    format!(
                        "The session's WebSocket frames break the protocol: {}.",
                        e.0
                    ),
                )
            };
            s.end(err, PROTOCOL);
        }
        if s.ending.is_some() && !s.told_provider {
            s.told_provider = true;
            if !closed {
                // Masked, as a client's frames are.
                let code = s.ending.as_ref().map_or(1000, |(_, c)| *c);
                let reason = s.ending.as_ref().map_or("", |(e, _)| e.code);
                let frame = s.client.close_frame(code, reason);
                out.get_or_insert_with(|| chunk.clone()).extend(frame);
            }
        }
        if let Some(o) = out {
            let _ = self.host.set_body(Part::Request, body_size, &o);
        }
        self.note_verdicts(&verdicts);
        Action::Continue
    }

    /// The provider's frames on their way to the client.
    pub(crate) fn realtime_server_bytes(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Action {
        let Ok(loaded) = self.loaded() else {
            return Action::Continue;
        };
        let gw = &loaded.gw;
        let Some(client) = self.client(gw) else {
            return Action::Continue;
        };
        let user = self.request.user.clone();
        let Some(s) = self.realtime.as_deref_mut() else {
            return Action::Continue;
        };
        if s.told_client {
            if body_size > 0 {
                let _ = self.host.set_body(Part::Response, body_size, &[]);
            }
            return Action::Continue;
        }
        let chunk = if body_size > 0 {
            self.host
                .body(Part::Response, body_size)
                .unwrap_or_default()
        } else {
            Vec::new()
        };
        let checks = gw
            .guardrails
            .as_ref()
            .map(|g| (g, text_checks(g, Stage::Output, &client.name, s.model)))
            .filter(|(_, a)| !a.is_empty());
        let host = &self.host;
        let now = host.now_ms();
        let mut verdicts = Vec::new();
        let mut counted: Vec<(Usage, i64)> = Vec::new();
        let Session {
            server,
            ending,
            usage,
            cost_micros,
            statuses,
            last_response,
            price,
            output,
            ..
        } = s;
        let mut out = server.feed(&chunk, &mut |m| {
            let t = match m {
                // The provider's close after the gateway ended the session
                // is the gateway's own, with its error event first.
                Message::Close(_) if ending.is_some() => return Verdict::Drop,
                Message::Close(_) => return Verdict::Pass,
                Message::Text(_) if ending.is_some() => return Verdict::Drop,
                Message::Text(t) => t,
            };
            if let Some(ServerEvent::Done {
                usage: u,
                id,
                status,
            }) = realtime::response_done(t)
            {
                statuses.push(status);
                *last_response = id;
                if let Some(u) = u {
                    add(usage, &u);
                    let cost = price.map_or(0, |p| p.usage_cost(&u));
                    *cost_micros = cost_micros.saturating_add(cost);
                    counted.push((u, cost));
                    let used = (&u, *price);
                    let what = admission::Charge::TokensAndBudgets;
                    if let Some(e) =
                        admission::charge(host, gw, (client, user.as_deref()), used, what, now)
                    {
                        *ending = Some((e, POLICY));
                    }
                }
            }
            let Some((g, active)) = checks.as_ref() else {
                return Verdict::Pass;
            };
            match output.event(g, active, t, &mut verdicts) {
                Checked::Pass => Verdict::Pass,
                Checked::Events(events) => Verdict::Messages(events),
                Checked::Denied(e) => {
                    if ending.is_none() {
                        *ending = Some((e, POLICY));
                    }
                    Verdict::Drop
                }
            }
        });
        if let Some(e) = server.error.clone() {
            s.end(
                GatewayError::new(
                    502,
                    "api_error",
                    "upstream_protocol_error",
                    format!(
                        "The provider's WebSocket frames break the protocol: {}.",
                        e.0
                    ),
                ),
                SERVER_ERROR,
            );
        }
        if s.ending.is_some() && !s.told_client {
            s.told_client = true;
            s.made = s.made.saturating_add(1);
            if let Some((e, code)) = s.ending.as_ref() {
                let o = out.get_or_insert_with(|| chunk.clone());
                o.extend(s.server.text_frame(&realtime::error_event(e, s.made)));
                o.extend(s.server.close_frame(*code, e.code));
            }
        }
        let _ = end_of_stream;
        if let Some(o) = out {
            let _ = self.host.set_body(Part::Response, body_size, &o);
        }
        self.note_verdicts(&verdicts);
        for (u, cost) in counted {
            self.count_usage_globally(gw, &u, cost);
        }
        Action::Continue
    }

    /// A response's usage counted by the rate limit service: its tokens
    /// and its cost in every level's descriptors.
    fn count_usage_globally(&mut self, gw: &Gateway, u: &Usage, cost: i64) {
        let Some(s) = self.realtime.as_ref() else {
            return;
        };
        let asks: Vec<Ask> = s
            .global
            .iter()
            .filter_map(|a| {
                let hits = match a.kind {
                    global::Kind::Requests => return None,
                    global::Kind::Tokens => u.total(),
                    global::Kind::Budgets => rls::budget_units(cost),
                };
                (hits > 0).then(|| Ask {
                    hits: u32::try_from(hits).unwrap_or(u32::MAX),
                    ..a.clone()
                })
            })
            .collect();
        self.count_global(gw, asks);
    }

    /// Asks sent to the rate limit service; their answers come to
    /// [`Self::realtime_global_answer`].
    /// Whether a call is in flight.
    fn count_global(&mut self, gw: &Gateway, asks: Vec<Ask>) -> bool {
        let Some(service) = gw.global_limits.as_ref().filter(|_| !asks.is_empty()) else {
            return false;
        };
        match self.dispatch_asks(service, &asks) {
            Ok(token) => {
                if let Some(s) = self.realtime.as_mut() {
                    s.global_calls.push((token, asks));
                }
                true
            }
            Err(e) => {
                self.host.log(
                    crate::host::LogLevel::Warn,
                    &format!("realtime: cannot call the rate limit service: {e:?}"),
                );
                false
            }
        }
    }

    /// The rate limit service's answer for a session: over a limit (or,
    /// with `failure_mode: deny`, no answer to the upgrade's call), the
    /// session ends at its next event either way (its first, when the
    /// answer comes before it); a failed call counts nothing more.
    pub(crate) fn realtime_global_answer(&mut self, token: u32, grpc_status: u32, size: usize) {
        let Some(s) = self.realtime.as_mut() else {
            return;
        };
        let Some(i) = s.global_calls.iter().position(|(t, _)| *t == token) else {
            return;
        };
        let (_, asks) = s.global_calls.swap_remove(i);
        let groups: Vec<usize> = asks.iter().map(|a| a.descriptors.len()).collect();
        let verdicts = match (grpc_status, self.host.grpc_answer(size)) {
            (0, Ok(bytes)) => rls::verdicts(&bytes, &groups),
            _ => vec![rls::Verdict::Unusable("the call failed"); groups.len()],
        };
        let mut refused = None;
        let mut failed = false;
        for (ask, v) in asks.iter().zip(verdicts) {
            match v {
                rls::Verdict::OverLimit(status) => {
                    let (i, st) = status.map_or((0, None), |(i, st)| (i, Some(st)));
                    refused.get_or_insert_with(|| global::refusal(ask, i, st));
                }
                rls::Verdict::Unusable(_) => failed = true,
                rls::Verdict::Ok(_) => {}
            }
        }
        if refused.is_some() {
            self.host.count(crate::host::metrics::GLOBAL_OVER_LIMIT, 1);
            self.log.limited_by = "global";
        }
        // The upgrade's own call asks the request rate.
        let upgrade = asks.iter().any(|a| a.kind == global::Kind::Requests);
        let deny = self
            .loaded
            .as_ref()
            .and_then(|l| l.gw.global_limits.as_ref())
            .is_some_and(|g| g.failure == portcullis_core::config::GlobalFailure::Deny);
        let err = refused.or_else(|| {
            (failed && deny && upgrade).then(|| {
                GatewayError::new(
                    503,
                    "api_error",
                    "rate_limit_service_unavailable",
                    "The rate limit service did not answer: the session cannot be counted.",
                )
            })
        });
        if let (Some(err), Some(s)) = (err, self.realtime.as_mut()) {
            s.end(err, POLICY);
        }
    }

    /// The session's end: its hold on the limits given back (its usage
    /// was taken as it came), its record.
    pub(crate) fn realtime_end(&mut self) {
        self.finish_limits(Finish::Release);
        let Some(s) = self.realtime.take() else {
            return;
        };
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let gw = &loaded.gw;
        if let Some((e, _)) = s.ending.as_ref() {
            self.log.error = e.code;
        }
        let u = s.usage;
        let mut ended = self.ended();
        let rec = Record {
            provider: gw
                .providers
                .get(s.provider)
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            requested_model: s.requested.clone(),
            model: gw
                .models
                .get(s.model)
                .map(|m| m.name.clone())
                .unwrap_or_default(),
            response_model: s.model_id.clone(),
            api: Api::Realtime.name(),
            stream: true,
            prompt_tokens: u.prompt,
            completion_tokens: u.completion,
            cached_tokens: u.cached,
            cost_micros: s.cost_micros,
            price_source: s.price_source.to_string(),
            response_id: s.last_response.clone(),
            finish_reasons: s.statuses.clone(),
            request_bytes: s.client.bytes,
            response_bytes: s.server.bytes,
            ..ended.record_base(gw, None)
        };
        ended.emit(&rec);
    }
}

fn add(sum: &mut Usage, u: &Usage) {
    sum.prompt = sum.prompt.saturating_add(u.prompt);
    sum.completion = sum.completion.saturating_add(u.completion);
    sum.cached = sum.cached.saturating_add(u.cached);
    sum.audio_prompt = sum.audio_prompt.saturating_add(u.audio_prompt);
    sum.audio_completion = sum.audio_completion.saturating_add(u.audio_completion);
}
