//! The state of a request's global limits (see [`crate::llm::limit_service`]): what it
//! asks the rate limit service, the calls in flight, the answers' words.
//!
//! Limits scoped `global`: counted by a rate limit service (Envoy's
//! protocol, `limits.global`) for every Envoy of the fleet.
//!
//! At the body phase, after the local limits, every global limit of the
//! request goes in one `ShouldRateLimit` call (#34), each descriptor with
//! its own `hits_addend` (1 for the request rate, the token reservation,
//! the budget reservation in units of $0.0001); the service admits all of
//! them or none, and the request waits for the one answer. A
//! cache hit asks only for the request rate. When an answer uses more than
//! was reserved the difference is counted after the answer (the root context
//! sends it); an over-estimate cannot be given back (the protocol only adds),
//! so a global limit errs on refusing early, never on admitting past it.

#![deny(clippy::arithmetic_side_effects)]

use crate::limits::admission::{self, BudgetLeft, Held};
use portcullis_core::config::{Client, Gateway, GlobalFailure};
use portcullis_core::error::GatewayError;
use portcullis_core::limits::ratelimit::{self, Price};
use portcullis_core::limits::rls::{self, Descriptor, Limit, Status};
use portcullis_core::shared::keys::Owner;

/// Which limit a call counts (every level's descriptor of it in one call,
/// so the service admits all levels or none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Requests,
    Tokens,
    Budgets,
}

/// One level's limit in a call.
#[derive(Debug, Clone, PartialEq)]
pub struct Item {
    /// "key `alice`", "team `research`".
    pub who: String,
    /// For a budget: its USD cap and the time until its period ends.
    pub budget: Option<(portcullis_core::config::Budget, Option<u64>)>,
}

/// One call to the rate limit service: a descriptor per level (and per
/// budget period), all counting the same hits.
#[derive(Debug, Clone, PartialEq)]
pub struct Ask {
    pub kind: Kind,
    pub descriptors: Vec<Descriptor>,
    pub items: Vec<Item>,
    pub hits: u32,
}

impl Ask {
    fn new(kind: Kind, hits: u32) -> Ask {
        Ask {
            kind,
            descriptors: Vec::new(),
            items: Vec::new(),
            hits,
        }
    }

    fn push(
        &mut self,
        owner: Owner<'_>,
        limit: Limit,
        value: u32,
        budget: Option<(portcullis_core::config::Budget, Option<u64>)>,
    ) {
        self.descriptors.push(limit.descriptor(owner, value));
        self.items.push(Item {
            who: owner.describe(),
            budget,
        });
    }

    /// The limit (per period) of descriptor `i`.
    fn value(&self, i: usize) -> u32 {
        self.descriptors.get(i).map_or(0, |d| d.requests_per_unit)
    }
}

/// What sending the calls came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sent {
    /// Calls in flight: the request waits for their answers.
    Waiting,
    /// No call could be sent, and the failure mode lets the request go on.
    Decided,
}

/// The call of one request in flight (all its limits in one call, each
/// descriptor with its own hits), and what came back.
pub struct Pending {
    pub calls: Vec<(u32, Vec<Ask>)>,
    /// The call that refused, its refusing descriptor and status.
    pub refused: Option<(Ask, usize, Option<Status>)>,
    pub failed: Option<String>,
    /// When the calls went out, and their timeout: Envoy reports a call
    /// that ran out of time as UNAVAILABLE (its 504 mapped to gRPC), so a
    /// failure that took the whole timeout counts as a timeout.
    pub sent_ms: u64,
    pub timeout_ms: u64,
    /// The service's failure mode, and the replicas sharing its limits.
    pub failure: GlobalFailure,
    pub replicas: u32,
    /// The limits of a call that failed, for `local_share` to count.
    pub unanswered: Vec<Ask>,
}

impl Pending {
    /// The failure mode's name, for metrics and the log.
    pub fn mode(&self) -> &'static str {
        self.failure.as_str()
    }
}

fn fit(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// The global limits of a request, one call per limit with every level's
/// descriptor in it: the request rate always, tokens and budgets only when
/// it goes to a provider. Also records the reservations on `held` (settled
/// with the real usage at the end).
pub fn asks(
    gw: &Gateway,
    (client, user): (&Client, Option<&str>),
    to_provider: Option<((u64, u64), Option<Price>)>,
    now_ms: u64,
    held: &mut Held,
) -> Result<Vec<Ask>, GatewayError> {
    let mut requests = Ask::new(Kind::Requests, 1);
    for level in gw.levels_of(client, user) {
        let (l, s) = (level.limits, level.limits.scope);
        if let Some(rpm) = l
            .requests_per_minute
            .filter(|_| s.requests_per_minute.global())
        {
            requests.push(level.owner, Limit::RequestsPerMinute, fit(rpm), None);
        }
    }
    let mut out: Vec<Ask> = Vec::new();
    if !requests.items.is_empty() {
        out.push(requests);
    }
    let Some((reserve, price)) = to_provider else {
        return Ok(out);
    };
    let want = reserve.0.saturating_add(reserve.1);
    let mut tokens = Ask::new(Kind::Tokens, fit(want).max(1));
    let cost = price.map(|p| rls::budget_units(p.cost(reserve.0, reserve.1, 0)));
    let mut budgets = Ask::new(Kind::Budgets, fit(cost.unwrap_or(0)).max(1));
    for level in gw.levels_of(client, user) {
        let (l, s) = (level.limits, level.limits.scope);
        if let Some(tpm) = l.tokens_per_minute.filter(|_| s.tokens_per_minute.global()) {
            if let Some(e) = admission::too_large(level.owner, tpm, reserve) {
                return Err(e);
            }
            tokens.push(level.owner, Limit::TokensPerMinute, fit(tpm), None);
        }
        if cost.is_none() || !s.budgets.global() {
            continue;
        }
        for b in &l.budgets {
            let index = b.period.index(now_ms, gw.budget_offset_ms);
            let reset = b.period.ms_to_end(now_ms, gw.budget_offset_ms);
            let cap = fit(rls::budget_units(b.micros)).max(1);
            budgets.push(
                level.owner,
                Limit::Budget(b.period, index),
                cap,
                Some((*b, reset)),
            );
        }
    }
    if !tokens.items.is_empty() {
        held.global_tokens = Some((tokens.descriptors.clone(), want));
        out.push(tokens);
    }
    if let (false, Some(price), Some(cost)) = (budgets.items.is_empty(), price, cost) {
        held.global_budget = Some((budgets.descriptors.clone(), cost.max(1), price));
        out.push(budgets);
    }
    Ok(out)
}

/// The 429 of a refusal, in the words of the local limits.
pub fn refusal(ask: &Ask, i: usize, status: Option<Status>) -> GatewayError {
    let wait_ms = status.map_or(1000, |s| s.reset_ms);
    let retry = wait_ms.div_ceil(1000).max(1);
    let Some(item) = ask.items.get(i) else {
        return GatewayError::new(
            429,
            "requests",
            "rate_limit_exceeded",
            "Rate limit reached across the fleet.".to_string(),
        )
        .with_retry_after(retry);
    };
    let value = ask.value(i);
    let (kind, message) = match (ask.kind, item.budget) {
        (Kind::Budgets, Some((budget, reset))) => {
            let cost = i64::from(ask.hits).saturating_mul(rls::BUDGET_UNIT_MICROS as i64);
            return admission::over_budget(&item.who, &budget, cost, reset, true);
        }
        (Kind::Tokens, _) => (
            "tokens",
            format!(
                "Rate limit reached for tokens per minute on {}: limit {value} across the fleet, requested {}. Retry in {}.",
                item.who,
                ask.hits,
                ratelimit::reset_text(wait_ms)
            ),
        ),
        _ => (
            "requests",
            format!(
                "Rate limit reached for requests per minute on {}: limit {value} across the fleet. Retry in {}.",
                item.who,
                ratelimit::reset_text(wait_ms)
            ),
        ),
    };
    GatewayError::new(429, kind, "rate_limit_exceeded", message).with_retry_after(retry)
}

/// The service's answer to the headers: OpenAI's rate-limit headers
/// (replacing the local ones of the same limit when tighter), and what is
/// left of a budget.
pub fn rate_headers(out: &mut Vec<(&'static str, String)>, ask: &Ask, i: usize, status: Status) {
    let names = match ask.kind {
        Kind::Requests => [
            "x-ratelimit-limit-requests",
            "x-ratelimit-remaining-requests",
            "x-ratelimit-reset-requests",
        ],
        Kind::Tokens => [
            "x-ratelimit-limit-tokens",
            "x-ratelimit-remaining-tokens",
            "x-ratelimit-reset-tokens",
        ],
        Kind::Budgets => {
            let reset_ms = ask
                .items
                .get(i)
                .and_then(|it| it.budget)
                .and_then(|(_, r)| r);
            let units = i64::from(status.remaining);
            admission::budget_headers(
                out,
                BudgetLeft {
                    remaining_micros: units.saturating_mul(rls::BUDGET_UNIT_MICROS as i64),
                    reset_ms,
                },
            );
            return;
        }
    };
    let [limit, remaining, reset] = names;
    let local_left = out
        .iter()
        .find(|(k, _)| *k == remaining)
        .and_then(|(_, v)| v.parse::<u64>().ok());
    if local_left.is_some_and(|l| l < u64::from(status.remaining)) {
        return;
    }
    out.retain(|(k, _)| !names.contains(k));
    out.push((limit, status.limit.unwrap_or(ask.value(i)).to_string()));
    out.push((remaining, status.remaining.to_string()));
    out.push((reset, ratelimit::reset_text(status.reset_ms)));
}
