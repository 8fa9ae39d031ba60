//! The global-limits step: send a request's calls to the rate limit
//! service, gather the answers, then refuse, fail by the failure mode, or
//! go on (the state and its rules are in [`crate::limits::global`]).

#![deny(clippy::arithmetic_side_effects)]

use crate::host::metrics;
use crate::host::Host;
use crate::host::LogLevel;
use crate::limits::global::{rate_headers, refusal, Ask, Kind, Pending, Sent};
use crate::request::{Phase, RequestContext};
use portcullis_core::config::{GlobalFailure, GlobalLimits};
use portcullis_core::error::GatewayError;
use portcullis_core::limits::rls::Descriptor;
use portcullis_core::limits::rls::{self, Verdict};
use portcullis_core::{limits::share, shared::store};

/// gRPC status of a call that ran out of time.
const DEADLINE_EXCEEDED: u32 = 4;

impl<H: Host> RequestContext<H> {
    /// Send the calls; the request waits in `Phase::Limiting` (the
    /// pipeline resumes it at `Dispatch` when every answer is in).
    pub(crate) fn check_global(
        &mut self,
        service: &GlobalLimits,
        asks: Vec<Ask>,
    ) -> Result<Sent, GatewayError> {
        let mut calls = Vec::with_capacity(1);
        let mut failed = None;
        match self.dispatch_asks(service, &asks) {
            Ok(token) => calls.push((token, asks)),
            Err(s) => {
                for ask in &asks {
                    self.forget_reservation(ask);
                }
                failed = Some((
                    format!("cannot call cluster `{}`: {s:?}", service.cluster),
                    asks,
                ));
            }
        }
        let (failed, unanswered) = failed.map_or((None, Vec::new()), |(w, a)| (Some(w), a));
        let pending = Pending {
            calls,
            refused: None,
            failed,
            sent_ms: self.host.now_ms(),
            timeout_ms: service.timeout_ms,
            failure: service.failure,
            replicas: service.replicas,
            unanswered,
        };
        if pending.calls.is_empty() {
            self.decide_global(pending)?;
            return Ok(Sent::Decided);
        }
        self.limits.wait_for(pending);
        self.phase = Phase::Limiting;
        Ok(Sent::Waiting)
    }

    /// One call to the rate limit service: every limit in it, each
    /// descriptor with its own hits.
    pub(crate) fn dispatch_asks(
        &mut self,
        service: &GlobalLimits,
        asks: &[Ask],
    ) -> Result<u32, crate::host::Status> {
        let message = rls::encode_weighted(
            asks.iter()
                .flat_map(|a| a.descriptors.iter().map(move |d| (d, a.hits))),
        );
        self.host.count(metrics::GLOBAL_CHECKS, 1);
        let owned = crate::loaded::limiter_metadata(self.loaded.as_deref());
        let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        self.host.dispatch_grpc(
            &service.cluster,
            rls::SERVICE,
            rls::METHOD,
            &metadata,
            &message,
            service.timeout_ms,
        )
    }

    /// `local_share`: count the limits the service did not answer for
    /// against this replica's share of each, all of them or none.
    fn take_shares(&mut self, asks: &[Ask], replicas: u32) -> Result<(), GatewayError> {
        let now = self.host.now_ms();
        let mut taken: Vec<(&Descriptor, u64)> = Vec::new();
        for ask in asks {
            let hits = u64::from(ask.hits);
            for (i, d) in ask.descriptors.iter().enumerate() {
                let key = share::key(d);
                match store::update(&self.host, &key, |cur| {
                    share::take(cur, d, replicas, hits, now)
                }) {
                    Ok(true) => taken.push((d, hits)),
                    Ok(false) => {
                        for (d, hits) in taken {
                            let _ = store::update(&self.host, &share::key(d), |cur| {
                                (share::give_back(cur, d, replicas, hits, now), ())
                            });
                        }
                        self.host.count(metrics::GLOBAL_SHARE_REFUSED, 1);
                        self.host.count(metrics::RATE_LIMITED, 1);
                        self.log.limited_by = "global";
                        let mut e = refusal(ask, i, None);
                        e.message.push_str(" (This replica's share, counted locally while the rate limit service does not answer.)");
                        return Err(e);
                    }
                    // Shared data refused: the share cannot be counted.
                    Err(e) => self.host.log(
                        LogLevel::Warn,
                        &format!("cannot count the local share of a global limit: {e:?}"),
                    ),
                }
            }
        }
        self.host.count(metrics::GLOBAL_SHARE_ADMITTED, 1);
        Ok(())
    }

    /// The service failed a call in `local_share` mode: the first failure
    /// after answers switches this worker to its shares (counted, logged).
    fn service_away(&mut self) {
        let w = self.host.worker();
        if !w.global_away.replace(true) {
            self.host.count(metrics::GLOBAL_TO_SHARES, 1);
            self.host.log(
                LogLevel::Warn,
                "rate limit service unavailable: counting each global limit's local share (limit / limits.global.replicas) until it answers",
            );
        }
    }

    /// The service answered: back to exact counting (counted, logged).
    fn service_answered(&mut self) {
        let w = self.host.worker();
        if w.global_away.replace(false) {
            self.host.count(metrics::GLOBAL_TO_SERVICE, 1);
            self.host.log(
                LogLevel::Info,
                "rate limit service answers again: global limits counted by it",
            );
        }
    }

    /// A reservation the service never counted is not settled either.
    fn forget_reservation(&mut self, ask: &Ask) {
        if let Some(h) = self.limits.held() {
            match ask.kind {
                Kind::Tokens => h.global_tokens = None,
                Kind::Budgets => h.global_budget = None,
                Kind::Requests => {}
            }
        }
    }

    /// One answer of the service (`on_grpc_call_response`).
    pub fn on_global_answer(&mut self, token: u32, grpc_status: u32, size: usize) {
        if self.phase != Phase::Limiting {
            return;
        }
        let Some(mut pending) = self.limits.take_pending() else {
            return;
        };
        let Some(i) = pending.calls.iter().position(|(t, _)| *t == token) else {
            self.limits.wait_for(pending);
            return;
        };
        let (_, asks) = pending.calls.swap_remove(i);
        let groups: Vec<usize> = asks.iter().map(|a| a.descriptors.len()).collect();
        let verdicts = if grpc_status == 0 {
            match self.host.grpc_answer(size) {
                Ok(b) => rls::verdicts(&b, &groups),
                Err(_) => vec![Verdict::Unusable("the answer could not be read"); groups.len()],
            }
        } else {
            let took = self.host.now_ms().saturating_sub(pending.sent_ms);
            let timed_out =
                grpc_status == DEADLINE_EXCEEDED || took.saturating_add(1) >= pending.timeout_ms;
            if timed_out {
                self.host
                    .count(&metrics::global_timeouts(pending.mode()), 1);
            }
            let why = if timed_out {
                "no answer within limits.global.timeout_ms"
            } else {
                "the call failed"
            };
            vec![Verdict::Unusable(why); groups.len()]
        };
        // The call was admitted or refused whole: a refusal or a failure
        // leaves no reservation to settle.
        let admitted = verdicts.iter().all(|v| matches!(v, Verdict::Ok(_)));
        for (ask, verdict) in asks.into_iter().zip(verdicts) {
            if !admitted {
                self.forget_reservation(&ask);
            }
            match verdict {
                Verdict::Ok(status) => {
                    if let Some((i, s)) = status {
                        rate_headers(self.limits.headers_mut(), &ask, i, s);
                    }
                }
                Verdict::OverLimit(status) => {
                    if let Some((i, s)) = status {
                        rate_headers(self.limits.headers_mut(), &ask, i, s);
                    }
                    let (i, s) = status.map_or((0, None), |(i, s)| (i, Some(s)));
                    pending.refused.get_or_insert((ask, i, s));
                }
                Verdict::Unusable(why) => {
                    pending.failed = Some(format!("{why} (gRPC status {grpc_status})"));
                    pending.unanswered.push(ask);
                }
            }
        }
        if pending.failed.is_none() {
            self.service_answered();
        }
        if !pending.calls.is_empty() {
            self.limits.wait_for(pending);
            return;
        }
        let step = self.decide_global(pending).and_then(|()| self.resume());
        self.resume_with(step);
    }

    /// Every answer is in: refuse, fail by the failure mode, or go on.
    fn decide_global(&mut self, pending: Pending) -> Result<(), GatewayError> {
        if let Some((ask, i, status)) = pending.refused {
            self.host.count(metrics::GLOBAL_OVER_LIMIT, 1);
            self.host.count(metrics::RATE_LIMITED, 1);
            self.log.limited_by = "global";
            return Err(refusal(&ask, i, status));
        }
        let mode = pending.mode();
        if let Some(why) = pending.failed {
            self.host.count(&metrics::global_errors(mode), 1);
            self.host.log(
                LogLevel::Warn,
                &format!("rate limit service: {why}; failure mode `{mode}`"),
            );
            match pending.failure {
                GlobalFailure::Allow => {}
                GlobalFailure::Deny => {
                    self.log.limited_by = "global";
                    return Err(GatewayError::new(
                        503,
                        "server_error",
                        "rate_limit_unavailable",
                        "The rate limit service did not answer, and this gateway refuses requests it cannot count. Retry shortly.".to_string(),
                    )
                    .with_retry_after(1));
                }
                GlobalFailure::LocalShare => {
                    self.service_away();
                    return self.take_shares(&pending.unanswered, pending.replicas);
                }
            }
        }
        Ok(())
    }
}
