//! A routed request's attempts: what each attempt's result means for its
//! breaker, and the next attempt by callout when one fails.

use crate::health::breakers;
use crate::host::metrics;
use crate::host::Host;
use crate::host::{Action, LogLevel};
use crate::request::{Phase, RequestContext};
use portcullis_core::health::attempt::{class_of_refusal, exhausted, Cause, Class, Outcome};

impl<H: Host> RequestContext<H> {
    /// Record the current attempt's outcome; on a retryable failure, start
    /// the next attempt or answer with the aggregated error (the action).
    pub(crate) fn after_attempt(
        &mut self,
        status: Option<u16>,
        outcome: Outcome,
    ) -> Option<Action> {
        let loaded = self.loaded.clone()?;
        let flight = self.flight.as_mut()?;
        let cur = flight.current.as_mut()?;
        let provider = loaded.gw.providers.get(cur.provider)?;
        cur.reported = true;
        if !matches!(outcome, Outcome::Retryable(_)) {
            flight.answered = status;
        }
        if provider.concurrency.is_some() {
            let overload = matches!(
                outcome,
                Outcome::Retryable(c) if matches!(
                    c.error_class(),
                    Class::RateLimited | Class::Overloaded | Class::Transient | Class::Timeout
                )
            );
            if overload || outcome == Outcome::Success {
                let now = self.host.now_ms();
                crate::health::concurrency::on_result(
                    &self.host,
                    provider,
                    !overload,
                    flight.retry_after_ms.take(),
                    now,
                );
            }
        }
        if matches!(outcome, Outcome::Success) && loaded.gw.policy.uses_latency {
            let now = self.host.now_ms();
            let took = now.saturating_sub(cur.started_ms);
            crate::health::load::note_latency(
                &self.host,
                &loaded.gw,
                cur.provider,
                &cur.model_id,
                took,
                now,
            );
        }
        match outcome {
            // Read clean: a read (no write) unless another worker counted
            // failures since.
            Outcome::Success if cur.clean && !cur.probe => {
                breakers::on_clean_success(&self.host, provider)
            }
            Outcome::Success => breakers::on_result(&self.host, provider, true, cur.probe),
            // The provider is alive; the client's request is at fault.
            Outcome::ClientError if cur.probe => {
                breakers::on_result(&self.host, provider, true, true)
            }
            Outcome::ClientError => {}
            Outcome::Retryable(cause) => {
                let class = cause.error_class();
                self.host
                    .count(&metrics::attempt_class(&provider.name, class.name()), 1);
                if let Cause::Refused(..) = cause {
                    // The provider is alive: it refused this request.
                    if cur.probe {
                        breakers::on_result(&self.host, provider, true, true);
                    }
                } else {
                    breakers::on_result(&self.host, provider, false, cur.probe);
                    self.host
                        .count(&metrics::attempt_failure(&provider.name, cause), 1);
                }
                if !loaded.gw.policy.fallback_on.contains(&class) {
                    // Not a class the operator falls over on: the client
                    // gets this answer.
                    flight.answered = status;
                    return None;
                }
                cur.release_busy(&self.host, &loaded.gw);
                let failed_at = cur.provider;
                if class == Class::ContextLength {
                    flight.min_context =
                        Some(flight.context_of(&loaded.gw, failed_at).unwrap_or(0));
                }
                let now = self.host.now_ms();
                flight.tried_current(provider.name.clone(), cause, now);
                return Some(self.next_attempt());
            }
        }
        None
    }

    /// Dispatch the request to the next admitted candidate, or answer with
    /// the error when none is left.
    pub(crate) fn next_attempt(&mut self) -> Action {
        let Some(loaded) = self.loaded.clone() else {
            return Action::Continue;
        };
        loop {
            let Some(flight) = self.flight.as_mut() else {
                return Action::Continue;
            };
            let now = self.host.now_ms();
            let Some((idx, model_id)) = flight.admit_next(&self.host, &loaded.gw, now) else {
                let err = exhausted(&flight.model_name, &flight.tried, &flight.skipped);
                return self.fail(&err);
            };
            let Some(p) = loaded.gw.providers.get(idx) else {
                continue;
            };
            let api = self.request.api;
            let traceparent = flight.traceparent(self.log.trace.as_ref());
            let sent =
                crate::upstream::for_attempt(&self.host, &loaded, api, flight, idx, &model_id)
                    .map_err(|e| e.message)
                    .and_then(|up| match up.awaiting_token {
                        Some(_) => Err("no access token yet".to_string()),
                        None => crate::upstream::fallback(
                            &self.host,
                            &up,
                            &self.request,
                            flight,
                            traceparent,
                        )
                        .map_err(|s| format!("{s:?}")),
                    });
            match sent {
                Ok(call) => {
                    self.host.count(metrics::FALLBACKS, 1);
                    if let Some(f) = self.flight.as_mut() {
                        f.call = Some(call);
                    }
                    self.phase = Phase::FallbackPending;
                    return Action::Pause;
                }
                Err(why) => {
                    self.host.log(
                        LogLevel::Error,
                        &format!(
                            "fallback to `{}` (cluster {}) not dispatched: {why}",
                            p.name, p.cluster
                        ),
                    );
                    self.attempt_not_sent(idx);
                }
            }
        }
    }

    /// A fallback that could not be sent counts as a connect failure; a
    /// probe gives its slot back.
    fn attempt_not_sent(&mut self, idx: usize) {
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(flight) = self.flight.as_mut() else {
            return;
        };
        let Some(p) = loaded.gw.providers.get(idx) else {
            return;
        };
        if let Some(cur) = flight.current.as_mut() {
            cur.reported = true;
            cur.release_busy(&self.host, &loaded.gw);
            if cur.probe {
                breakers::release_probe(&self.host, p);
            }
        }
        let now = self.host.now_ms();
        flight.tried_current(p.name.clone(), Cause::ConnectFailure, now);
    }

    /// A 4xx's outcome once its body is read: a refusal of a class the
    /// policy falls over on, or the client's error.
    pub(crate) fn refusal_outcome(&self, status: u16, body: &[u8]) -> Outcome {
        let Some(loaded) = self.loaded.as_ref() else {
            return Outcome::ClientError;
        };
        let class = class_of_refusal(status, body);
        if loaded.gw.policy.fallback_on.contains(&class) {
            Outcome::Retryable(Cause::Refused(status, class))
        } else {
            Outcome::ClientError
        }
    }

    /// Whether a 4xx's body must be read before deciding (the policy falls
    /// over on a class only its body tells).
    pub(crate) fn refusals_read(&self) -> bool {
        self.loaded.as_ref().is_some_and(|l| {
            l.gw.policy.fallback_on.iter().any(|c| {
                matches!(
                    c,
                    Class::Auth | Class::ContextLength | Class::ContentPolicy | Class::Client
                )
            })
        })
    }

    /// The request is over: its attempt has left the provider.
    pub(crate) fn release_busy(&mut self) {
        let (Some(loaded), Some(f)) = (self.loaded.clone(), self.flight.as_mut()) else {
            return;
        };
        if let Some(cur) = f.current.as_mut() {
            cur.release_busy(&self.host, &loaded.gw);
        }
    }

    /// A probe that never reported (the client went away) gives its slot back.
    pub(crate) fn release_unreported_probe(&mut self) {
        let (Some(loaded), Some(f)) = (self.loaded.as_ref(), self.flight.as_ref()) else {
            return;
        };
        if let Some(cur) = f.current.as_ref().filter(|c| c.probe && !c.reported) {
            if let Some(p) = loaded.gw.providers.get(cur.provider) {
                breakers::release_probe(&self.host, p);
            }
        }
    }

    /// The provider whose answer the client gets: the one tried last, or
    /// for a cache hit the first of the chain (the entry's key).
    pub(crate) fn answering_provider(&self) -> Option<String> {
        self.answering_provider_name().map(str::to_owned)
    }

    /// The same, borrowed from the config.
    pub(crate) fn answering_provider_name(&self) -> Option<&str> {
        let gw = &self.loaded.as_ref()?.gw;
        gw.providers
            .get(self.answering_index()?)
            .map(|p| p.name.as_str())
    }

    /// The index of the provider that answered (a cache hit: the first
    /// candidate's).
    pub(crate) fn answering_index(&self) -> Option<usize> {
        self.flight.as_ref()?.answering()
    }
}
