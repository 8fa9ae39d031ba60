//! The state of a request's global limits (see [`crate::global`]): what it
//! asks the rate limit service, the calls in flight, the answers' words.
//!
//! Limits scoped `global`: counted by a rate limit service (Envoy's
//! protocol, `limits.global`) for every Envoy of the fleet.
//!
//! At the body phase, after the local limits, each global limit of the
//! request is one `ShouldRateLimit` call with its own `hits_addend` (1 for
//! the request rate, the token reservation, the budget reservation in units
//! of $0.0001), all sent at once; the request waits for every answer. A
//! cache hit asks only for the request rate. When an answer uses more than
//! was reserved the difference is counted after the answer (the root context
//! sends it); an over-estimate cannot be given back (the protocol only adds),
//! so a global limit errs on refusing early, never on admitting past it.

#![deny(clippy::arithmetic_side_effects)]

use crate::admission::Held;
use portcullis_core::config::Client;
use portcullis_core::error::GatewayError;
use portcullis_core::ratelimit::{self, Price};
use portcullis_core::rls::{self, Limit, Status};

/// One global limit a request asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ask {
    pub limit: Limit,
    /// The limit (requests, tokens, or budget units per period).
    pub value: u32,
    pub hits: u32,
}

/// What sending the calls came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Calls in flight: the request waits for their answers.
    Waiting,
    /// No call could be sent, and the failure mode lets the request go on.
    Decided,
}

/// The calls of one request in flight, and what came back so far.
pub struct Pending {
    pub calls: Vec<(u32, Ask)>,
    pub refused: Option<(Ask, Option<Status>)>,
    pub failed: Option<String>,
    /// When the calls went out, and their timeout: Envoy reports a call
    /// that ran out of time as UNAVAILABLE (its 504 mapped to gRPC), so a
    /// failure that took the whole timeout counts as a timeout.
    pub sent_ms: u64,
    pub timeout_ms: u64,
    /// The service's failure mode: refuse (`deny`) or admit (`allow`).
    pub deny: bool,
}

impl Pending {
    /// The failure mode's name, for metrics and the log.
    pub fn mode(&self) -> &'static str {
        if self.deny {
            "deny"
        } else {
            "allow"
        }
    }
}

/// The global limits of a request: the request rate always, tokens and
/// budget only when it goes to a provider. Also records the reservations
/// on `held` (settled with the real usage at the end).
pub fn asks(
    client: &Client,
    to_provider: Option<((u64, u64), Option<Price>)>,
    now_ms: u64,
    held: &mut Held,
) -> Result<Vec<Ask>, GatewayError> {
    let (l, s) = (&client.limits, client.limits.scope);
    let mut out = Vec::new();
    let fit = |v: u64| u32::try_from(v).unwrap_or(u32::MAX);
    if let Some(rpm) = l
        .requests_per_minute
        .filter(|_| s.requests_per_minute.global())
    {
        out.push(Ask {
            limit: Limit::RequestsPerMinute,
            value: fit(rpm),
            hits: 1,
        });
    }
    let Some(((prompt_est, max_completion), price)) = to_provider else {
        return Ok(out);
    };
    if let Some(tpm) = l.tokens_per_minute.filter(|_| s.tokens_per_minute.global()) {
        let want = prompt_est.saturating_add(max_completion);
        if want > tpm {
            return Err(GatewayError::new(
                429,
                "tokens",
                "rate_limit_exceeded",
                format!(
                    "Request too large for key `{}`: tokens per minute limit {tpm}, this request reserves {want} tokens (prompt estimate {prompt_est} + max tokens {max_completion}). Lower `max_tokens` or `max_completion_tokens`.",
                    client.name
                ),
            )
            .with_retry_after(60));
        }
        out.push(Ask {
            limit: Limit::TokensPerMinute,
            value: fit(tpm),
            hits: fit(want).max(1),
        });
        held.global_tokens = Some((fit(tpm), want));
    }
    if let (Some(cap), Some(price)) = (
        l.budget_micros.filter(|_| s.budget_usd_per_day.global()),
        price,
    ) {
        let cost = rls::budget_units(price.cost(prompt_est, max_completion, 0));
        let day = ratelimit::day_of(now_ms);
        out.push(Ask {
            limit: Limit::BudgetPerDay(day),
            value: fit(rls::budget_units(cap)).max(1),
            hits: fit(cost).max(1),
        });
        held.global_budget = Some((fit(rls::budget_units(cap)), cost.max(1), price, day));
    }
    Ok(out)
}

/// The 429 of a refusal, in the words of the local limits.
pub fn refusal(client: &Client, ask: Ask, status: Option<Status>) -> GatewayError {
    let wait_ms = status.map_or(1000, |s| s.reset_ms);
    let retry = wait_ms.div_ceil(1000).max(1);
    let (kind, code, message) = match ask.limit {
        Limit::RequestsPerMinute => (
            "requests",
            "rate_limit_exceeded",
            format!(
                "Rate limit reached for requests per minute on key `{}`: limit {} across the fleet. Retry in {}.",
                client.name,
                ask.value,
                ratelimit::reset_text(wait_ms)
            ),
        ),
        Limit::TokensPerMinute => (
            "tokens",
            "rate_limit_exceeded",
            format!(
                "Rate limit reached for tokens per minute on key `{}`: limit {} across the fleet, requested {}. Retry in {}.",
                client.name,
                ask.value,
                ask.hits,
                ratelimit::reset_text(wait_ms)
            ),
        ),
        Limit::BudgetPerDay(_) => {
            let units = rls::BUDGET_UNIT_MICROS as f64;
            (
                "insufficient_quota",
                "budget_exceeded",
                format!(
                    "Daily budget of ${:.2} for key `{}` would be exceeded by this request (reserving ${:.4}), counted across the fleet. It resets at 00:00 UTC.",
                    f64::from(ask.value) * units / 1e6,
                    client.name,
                    f64::from(ask.hits) * units / 1e6
                ),
            )
        }
    };
    GatewayError::new(429, kind, code, message).with_retry_after(retry)
}

/// OpenAI's rate-limit headers from the service's answer, replacing the
/// local ones of the same limit.
pub fn rate_headers(out: &mut Vec<(&'static str, String)>, ask: Ask, status: Status) {
    let names = match ask.limit {
        Limit::RequestsPerMinute => [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
        Limit::TokensPerMinute => [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
        Limit::BudgetPerDay(_) => return,
    };
    out.retain(|(k, _)| !names.contains(k));
    let [limit, remaining, reset] = names;
    out.push((limit, status.limit.unwrap_or(ask.value).to_string()));
    out.push((remaining, status.remaining.to_string()));
    out.push((reset, ratelimit::reset_text(status.reset_ms)));
}

/// Settlements waiting for the root context's tick (in the worker's state,
/// bounded).
pub mod later {
    use crate::worker::Worker;

    const MAX: usize = 10_000;

    /// Queue a message; `false` when the queue is full (it is dropped).
    pub fn push(w: &Worker, message: Vec<u8>) -> bool {
        let Ok(mut q) = w.settlements.try_borrow_mut() else {
            return false;
        };
        if q.len() >= MAX {
            return false;
        }
        q.push(message);
        true
    }

    pub fn drain(w: &Worker) -> Vec<Vec<u8>> {
        w.settlements
            .try_borrow_mut()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }
}
