//! A request's limits at every level (its key's, its team's, its end
//! user's) across its life: taken at admission (each limit one CAS update
//! whose write carries the decision; all levels or none), held while the
//! request is in flight, and finished exactly once — settled with the
//! provider's real usage, or given back when nothing was used. The
//! counters are created ahead in [`prepare`]; what the levels have room
//! for before anything is taken is in [`room`].
//!
//! This is the admission seam: the limits live in this Envoy's shared data
//! (`local`); a fleet-wide service answers the same steps.

// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

use crate::host::Host;
use crate::host::LogLevel;
use crate::metrics;
use portcullis_core::config::{Budget, Client, Gateway, Level};
use portcullis_core::error::GatewayError;
use portcullis_core::keys::{self, Limit, Owner};
use portcullis_core::ratelimit::{self, Bucket, Micros, Price, Take};
use portcullis_core::rls::{self, Descriptor};
use portcullis_core::store::{update, StoreError};
use portcullis_core::usage::Usage;

mod prepare;
mod room;
pub use prepare::{prepare, track_user};
pub use room::{budget_low_model, completion_cap};

fn store_unavailable(host: &impl Host, what: &str, e: StoreError) {
    host.log(
        LogLevel::Warn,
        &format!("{what}: shared data unavailable ({e:?}); not limiting"),
    );
}

fn limited(
    host: &impl Host,
    kind: &'static str,
    code: &'static str,
    message: String,
    wait_ms: u64,
) -> GatewayError {
    host.count(metrics::RATE_LIMITED, 1);
    GatewayError::new(429, kind, code, message).with_retry_after(wait_ms.div_ceil(1000).max(1))
}

/// A limit's state for the `x-ratelimit-*` headers: the limit and what the
/// take left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shown {
    pub limit: u64,
    pub take: Take,
}

/// The tighter of two levels' states (the one with less left).
pub fn tighter(a: Option<Shown>, b: Shown) -> Option<Shown> {
    Some(match a {
        Some(a) if a.take.remaining <= b.take.remaining => a,
        _ => b,
    })
}

/// What is left of the tightest budget, for `x-portcullis-budget-*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetLeft {
    pub remaining_micros: Micros,
    /// Until the budget's period ends (`None`: a `total` budget).
    pub reset_ms: Option<u64>,
}

impl BudgetLeft {
    pub fn tighter(a: Option<BudgetLeft>, b: BudgetLeft) -> Option<BudgetLeft> {
        Some(match a {
            Some(a) if a.remaining_micros <= b.remaining_micros => a,
            _ => b,
        })
    }
}

/// Take `n` requests (one, or a batch's) from the requests-per-minute
/// bucket of each level (the key's, then its team's), all or none; a
/// refusal at one level gives back what the levels before it took. A
/// refusal comes with the refusing bucket's state, for the rate-limit
/// headers; an admission with the tightest one.
pub fn take_requests(
    host: &impl Host,
    gw: &Gateway,
    client: &Client,
    now_ms: u64,
    n: u64,
) -> Result<Option<Shown>, (GatewayError, Shown)> {
    let mut taken: Vec<(String, u64)> = Vec::new();
    let mut shown = None;
    for level in gw.levels(client) {
        match take_one_request(host, level, now_ms, n) {
            Ok(Some((key, s))) => {
                shown = tighter(shown, s);
                taken.push((key, s.limit));
            }
            Ok(None) => {}
            Err(refused) => {
                for (key, rpm) in &taken {
                    give_back_tokens(host, key, *rpm, n, now_ms);
                }
                return Err(refused);
            }
        }
    }
    Ok(shown)
}

/// One request from a level's requests-per-minute bucket: the bucket's
/// key and state, `None` when this Envoy does not count the level's
/// requests, or the 429 with the refusing bucket's state.
fn take_one_request(
    host: &impl Host,
    level: Level<'_>,
    now_ms: u64,
    n: u64,
) -> Result<Option<(String, Shown)>, (GatewayError, Shown)> {
    let (l, s) = (level.limits, level.limits.scope);
    let Some(rpm) = l
        .requests_per_minute
        .filter(|_| s.requests_per_minute.local())
    else {
        return Ok(None);
    };
    let key = keys::limit(level.owner, Limit::RequestsPerMinute);
    let r = update(host, &key, |cur| {
        let (next, t) = ratelimit::take(&Bucket::decode(cur), rpm, n, now_ms);
        (Some(next.encode()), t)
    });
    match r {
        Ok(take) if take.admitted => Ok(Some((key, Shown { limit: rpm, take }))),
        Ok(take) => {
            let e = limited(
                host,
                "requests",
                "rate_limit_exceeded",
                format!(
                    "Rate limit reached for requests per minute on {}: limit {rpm}. Retry in {}.",
                    level.owner.describe(),
                    ratelimit::reset_text(take.wait_ms)
                ),
                take.wait_ms,
            );
            Err((e, Shown { limit: rpm, take }))
        }
        Err(e) => {
            store_unavailable(host, "requests per minute", e);
            Ok(None)
        }
    }
}

/// Return `n` units to a bucket (a take undone).
fn give_back_tokens(host: &impl Host, key: &str, per_minute: u64, n: u64, now_ms: u64) {
    let _ = update(host, key, |cur| {
        let next = ratelimit::adjust(
            &Bucket::decode(cur),
            per_minute,
            ratelimit::signed(n),
            now_ms,
        );
        (Some(next.encode()), ())
    });
}

/// The tightest token bucket as it stands (for headers on cache hits).
pub fn peek_tokens(
    host: &impl Host,
    gw: &Gateway,
    client: &Client,
    user: Option<&str>,
    now_ms: u64,
) -> Option<Shown> {
    let mut shown = None;
    for level in gw.levels_of(client, user) {
        let (l, s) = (level.limits, level.limits.scope);
        let Some(tpm) = l.tokens_per_minute.filter(|_| s.tokens_per_minute.local()) else {
            continue;
        };
        let key = keys::limit(level.owner, Limit::TokensPerMinute);
        let Ok((cur, _)) = host.get(&key) else {
            continue;
        };
        let take = ratelimit::level(&Bucket::decode(cur.as_deref()), tpm, now_ms);
        shown = tighter(shown, Shown { limit: tpm, take });
    }
    shown
}

/// What a request holds of its limits (every level's) until it finishes.
#[derive(Debug, Default)]
pub struct Held {
    /// Concurrency counters holding a slot.
    concurrency: Vec<String>,
    /// Token buckets reserved from, with their limit per minute.
    tokens: Vec<(String, u64)>,
    reserved_tokens: u64,
    /// Budget counters reserved from.
    budgets: Vec<String>,
    reserved_micros: Micros,
    price: Option<Price>,
    /// Reserved by the rate limit service: (every level's descriptor,
    /// tokens).
    pub global_tokens: Option<(Vec<Descriptor>, u64)>,
    /// Reserved by the rate limit service: (every budget's descriptor,
    /// units of $0.0001, price).
    pub global_budget: Option<(Vec<Descriptor>, u64, Price)>,
    done: bool,
}

/// How a request's hold ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Finish {
    /// An answer came: settle reservations with its usage (without usage
    /// the reservations stand).
    Settle(Option<Usage>),
    /// No answer was used (refused, failed, cancelled): give it all back.
    Release,
}

/// What an admission shows: the tightest token bucket and budget (and an
/// end user's request bucket).
#[derive(Debug, Default, Clone, Copy)]
pub struct Admitted {
    pub requests: Option<Shown>,
    pub tokens: Option<Shown>,
    pub budget: Option<BudgetLeft>,
}

/// Admit a request that goes to a provider: concurrency, token reservation,
/// budget reservations, each at every level (the key's, then its team's).
/// All or nothing: a refusal at any level gives back what the others took.
pub fn admit(
    host: &impl Host,
    gw: &Gateway,
    (client, user): (&Client, Option<&str>),
    reserve: (u64, u64),
    price: Option<Price>,
    now_ms: u64,
) -> Result<(Held, Admitted), GatewayError> {
    let mut held = Held::default();
    let mut shown = Admitted::default();
    let mut result = Ok(());
    // An end user's request rate is taken here (the user is known from the
    // body); the key's and the team's were taken at the headers.
    let mut user_requests: Vec<(String, u64)> = Vec::new();
    for level in gw.levels_of(client, user) {
        if matches!(level.owner, Owner::User(_)) {
            result = result.and_then(|()| {
                take_user_request(host, level, now_ms, &mut user_requests, &mut shown)
            });
        }
        result = result
            .and_then(|()| take_concurrency(host, level, &mut held))
            .and_then(|()| take_tokens(host, level, reserve, now_ms, &mut held, &mut shown));
    }
    if let Some(price) = price {
        for level in gw.levels_of(client, user) {
            result = result.and_then(|()| {
                take_budgets(
                    host, gw, level, reserve, price, now_ms, &mut held, &mut shown,
                )
            });
        }
    }
    match result {
        Ok(()) => Ok((held, shown)),
        Err(e) => {
            held.finish(host, Finish::Release, now_ms);
            for (key, rpm) in &user_requests {
                give_back_tokens(host, key, *rpm, 1, now_ms);
            }
            Err(e)
        }
    }
}

/// One request from an end user's requests-per-minute bucket.
fn take_user_request(
    host: &impl Host,
    level: Level<'_>,
    now_ms: u64,
    taken: &mut Vec<(String, u64)>,
    shown: &mut Admitted,
) -> Result<(), GatewayError> {
    match take_one_request(host, level, now_ms, 1) {
        Ok(Some((key, s))) => {
            shown.requests = tighter(shown.requests, s);
            taken.push((key, s.limit));
            Ok(())
        }
        Ok(None) => Ok(()),
        Err((e, _)) => Err(e),
    }
}

fn take_concurrency(
    host: &impl Host,
    level: Level<'_>,
    held: &mut Held,
) -> Result<(), GatewayError> {
    let Some(max) = level.limits.max_concurrent else {
        return Ok(());
    };
    let key = keys::limit(level.owner, Limit::Concurrency);
    match update(host, &key, |cur| ratelimit::acquire(cur, max)) {
        Ok(true) => held.concurrency.push(key),
        Ok(false) => {
            return Err(limited(
                host,
                "requests",
                "concurrency_limit_exceeded",
                format!(
                    "Too many requests in flight for {}: limit {max}. Retry when one finishes.",
                    level.owner.describe()
                ),
                1000,
            ))
        }
        Err(e) => store_unavailable(host, "concurrency", e),
    }
    Ok(())
}

/// A reservation larger than a whole token limit: no wait would admit it
/// (OpenAI answers "Request too large"); nothing is taken.
pub fn too_large(
    owner: Owner<'_>,
    tpm: u64,
    (prompt_est, max_completion): (u64, u64),
) -> Option<GatewayError> {
    let want = prompt_est.saturating_add(max_completion);
    (want > tpm).then(|| {
        GatewayError::new(
            429,
            "tokens",
            "rate_limit_exceeded",
            format!(
                "Request too large for {}: tokens per minute limit {tpm}, this request reserves {want} tokens (prompt estimate {prompt_est} + max tokens {max_completion}). Lower `max_tokens` or `max_completion_tokens`.",
                owner.describe()
            ),
        )
        .with_retry_after(60)
    })
}

fn take_tokens(
    host: &impl Host,
    level: Level<'_>,
    reserve: (u64, u64),
    now_ms: u64,
    held: &mut Held,
    shown: &mut Admitted,
) -> Result<(), GatewayError> {
    let (l, s) = (level.limits, level.limits.scope);
    let Some(tpm) = l.tokens_per_minute.filter(|_| s.tokens_per_minute.local()) else {
        return Ok(());
    };
    if let Some(e) = too_large(level.owner, tpm, reserve) {
        host.count(metrics::RATE_LIMITED, 1);
        return Err(e);
    }
    let want = reserve.0.saturating_add(reserve.1);
    let key = keys::limit(level.owner, Limit::TokensPerMinute);
    let r = update(host, &key, |cur| {
        let (next, t) = ratelimit::take(&Bucket::decode(cur), tpm, want, now_ms);
        (Some(next.encode()), t)
    });
    match r {
        Ok(t) if t.admitted => {
            held.tokens.push((key, tpm));
            held.reserved_tokens = want;
            shown.tokens = tighter(shown.tokens, Shown { limit: tpm, take: t });
            Ok(())
        }
        Ok(t) => Err(limited(
            host,
            "tokens",
            "rate_limit_exceeded",
            format!(
                "Rate limit reached for tokens per minute on {}: limit {tpm}, requested {want}. Retry in {}.",
                level.owner.describe(),
                ratelimit::reset_text(t.wait_ms)
            ),
            t.wait_ms,
        )),
        Err(e) => {
            store_unavailable(host, "tokens per minute", e);
            Ok(())
        }
    }
}

/// The 429 of a budget that would be exceeded: until its period resets
/// (a `total` budget never does, so no `retry-after`).
pub fn over_budget(
    who: &str,
    b: &Budget,
    cost: Micros,
    reset_ms: Option<u64>,
    fleet: bool,
) -> GatewayError {
    let resets = match reset_ms {
        Some(ms) => format!(" It resets in {}.", ratelimit::reset_text(ms)),
        None => " It does not reset.".to_string(),
    };
    let e = GatewayError::new(
        429,
        "insufficient_quota",
        "budget_exceeded",
        format!(
            "{} budget of ${:.2} for {} would be exceeded by this request (reserving ${:.4}){}.{resets}",
            b.period.adjective(),
            b.micros as f64 / 1e6,
            who,
            cost as f64 / 1e6,
            if fleet { ", counted across the fleet" } else { "" },
        ),
    );
    match reset_ms {
        Some(ms) => e.with_retry_after(ms.div_ceil(1000).max(1)),
        None => e,
    }
}

#[allow(clippy::too_many_arguments)]
fn take_budgets(
    host: &impl Host,
    gw: &Gateway,
    level: Level<'_>,
    (prompt_est, max_completion): (u64, u64),
    price: Price,
    now_ms: u64,
    held: &mut Held,
    shown: &mut Admitted,
) -> Result<(), GatewayError> {
    if !level.limits.scope.budgets.local() {
        return Ok(());
    }
    let cost = price.cost(prompt_est, max_completion, 0);
    for b in &level.limits.budgets {
        let index = b.period.index(now_ms, gw.budget_offset_ms);
        let key = keys::budget(level.owner, b.period, index);
        let reset_ms = b.period.ms_to_end(now_ms, gw.budget_offset_ms);
        match update(host, &key, |cur| {
            let (next, ok, spent) = ratelimit::spend(cur, b.micros, cost);
            (next, (ok, spent))
        }) {
            Ok((true, spent)) => {
                held.budgets.push(key);
                held.reserved_micros = cost;
                held.price = Some(price);
                let left = BudgetLeft {
                    remaining_micros: b.micros.saturating_sub(spent).max(0),
                    reset_ms,
                };
                shown.budget = BudgetLeft::tighter(shown.budget, left);
            }
            Ok((false, _)) => {
                host.count(metrics::RATE_LIMITED, 1);
                return Err(over_budget(
                    &level.owner.describe(),
                    b,
                    cost,
                    reset_ms,
                    false,
                ));
            }
            Err(e) => store_unavailable(host, "budget", e),
        }
    }
    Ok(())
}

impl Held {
    /// Usage above a global reservation is counted after the answer (the
    /// protocol only adds: an over-estimate stays counted), one call for
    /// every level of a limit.
    fn settle_global(&self, host: &impl Host, u: &Usage) {
        let send = |descriptors: &[Descriptor], extra: u64| {
            if extra == 0 || descriptors.is_empty() {
                return;
            }
            let hits = u32::try_from(extra).unwrap_or(u32::MAX);
            host.count(metrics::GLOBAL_SETTLED, 1);
            host.send_later(rls::encode_request(descriptors, hits));
        };
        if let Some((descriptors, reserved)) = &self.global_tokens {
            send(descriptors, u.total().saturating_sub(*reserved));
        }
        if let Some((descriptors, reserved, price)) = &self.global_budget {
            let used = rls::budget_units(price.usage_cost(u));
            send(descriptors, used.saturating_sub(*reserved));
        }
    }

    /// End the hold, once: settle or release the reservations, free the
    /// concurrency slots. Later calls do nothing.
    pub fn finish(&mut self, host: &impl Host, how: Finish, now_ms: u64) {
        if self.done {
            return;
        }
        self.done = true;
        if let Finish::Settle(Some(u)) = &how {
            self.settle_global(host, u);
        }
        // Token and budget deltas to give back (positive) or take (negative).
        let reserved = ratelimit::signed(self.reserved_tokens);
        let (tokens_back, micros_back) = match how {
            Finish::Release => (reserved, self.reserved_micros),
            Finish::Settle(None) => (0, 0),
            Finish::Settle(Some(u)) => (
                reserved.saturating_sub(ratelimit::signed(u.total())),
                self.price
                    .map_or(0, |p| self.reserved_micros.saturating_sub(p.usage_cost(&u))),
            ),
        };
        if tokens_back != 0 {
            for (key, tpm) in &self.tokens {
                let _ = update(host, key, |cur| {
                    let next = ratelimit::adjust(&Bucket::decode(cur), *tpm, tokens_back, now_ms);
                    (Some(next.encode()), ())
                });
            }
        }
        if micros_back != 0 {
            for key in &self.budgets {
                let _ = update(host, key, |cur| {
                    (
                        Some(ratelimit::settle_spend(cur, micros_back.saturating_neg())),
                        (),
                    )
                });
            }
        }
        for key in &self.concurrency {
            let _ = update(host, key, |cur| (ratelimit::release(cur), ()));
        }
    }

    /// Whether the answer's usage matters (a reservation to settle).
    pub fn wants_usage(&self) -> bool {
        !self.done
            && (!self.tokens.is_empty()
                || !self.budgets.is_empty()
                || self.global_tokens.is_some()
                || self.global_budget.is_some())
    }
}

/// What a charge takes: tokens and budgets (a Realtime session's
/// responses), or budgets only (a batch finished long after its requests
/// were counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Charge {
    TokensAndBudgets,
    Budgets,
}

/// Usage counted while a request goes on (a Realtime session's
/// responses) or after it (a batch's): taken now from every level's token
/// bucket and budget, over what admission reserved. The first level left
/// with nothing (no token, or its budget spent) comes back as its 429: a
/// session ends.
pub fn charge(
    host: &impl Host,
    gw: &Gateway,
    (client, user): (&Client, Option<&str>),
    (u, price): (&Usage, Option<Price>),
    what: Charge,
    now_ms: u64,
) -> Option<GatewayError> {
    let mut out = None;
    let used = ratelimit::signed(u.total()).saturating_neg();
    let cost = price.map_or(0, |p| p.usage_cost(u));
    for level in gw.levels_of(client, user) {
        let (l, s) = (level.limits, level.limits.scope);
        let tpm = l
            .tokens_per_minute
            .filter(|_| s.tokens_per_minute.local() && what == Charge::TokensAndBudgets);
        if let Some(tpm) = tpm {
            let key = keys::limit(level.owner, Limit::TokensPerMinute);
            let r = update(host, &key, |cur| {
                let next = ratelimit::adjust(&Bucket::decode(cur), tpm, used, now_ms);
                let t = ratelimit::level(&next, tpm, now_ms);
                (Some(next.encode()), t)
            });
            if let (Ok(t), None) = (r, out.as_ref()) {
                if t.remaining == 0 {
                    host.count(metrics::RATE_LIMITED, 1);
                    out = Some(
                        GatewayError::new(
                            429,
                            "tokens",
                            "rate_limit_exceeded",
                            format!(
                                "Rate limit reached for tokens per minute on {}: limit {tpm}. The session ends; retry in {}.",
                                level.owner.describe(),
                                ratelimit::reset_text(t.wait_ms)
                            ),
                        )
                        .with_retry_after(t.wait_ms.div_ceil(1000).max(1)),
                    );
                }
            }
        }
        if cost == 0 || !s.budgets.local() {
            continue;
        }
        for b in &l.budgets {
            let index = b.period.index(now_ms, gw.budget_offset_ms);
            let key = keys::budget(level.owner, b.period, index);
            let r = update(host, &key, |cur| {
                let next = ratelimit::settle_spend(cur, cost);
                let spent = ratelimit::decode_i64(Some(&next));
                (Some(next), spent)
            });
            if let (Ok(spent), None) = (r, out.as_ref()) {
                if spent >= b.micros {
                    host.count(metrics::RATE_LIMITED, 1);
                    let reset_ms = b.period.ms_to_end(now_ms, gw.budget_offset_ms);
                    let mut e = over_budget(&level.owner.describe(), b, cost, reset_ms, false);
                    e.message = format!(
                        "{} budget of ${:.2} for {} is spent. The session ends.",
                        b.period.adjective(),
                        b.micros as f64 / 1e6,
                        level.owner.describe()
                    );
                    out = Some(e);
                }
            }
        }
    }
    out
}

/// OpenAI's rate-limit headers for the tightest level of each limit.
pub fn headers(requests: Option<Shown>, tokens: Option<Shown>) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(s) = requests {
        out.push(("x-ratelimit-limit-requests", s.limit.to_string()));
        out.push((
            "x-ratelimit-remaining-requests",
            s.take.remaining.to_string(),
        ));
        out.push((
            "x-ratelimit-reset-requests",
            ratelimit::reset_text(s.take.wait_ms),
        ));
    }
    if let Some(s) = tokens {
        out.push(("x-ratelimit-limit-tokens", s.limit.to_string()));
        out.push(("x-ratelimit-remaining-tokens", s.take.remaining.to_string()));
        out.push((
            "x-ratelimit-reset-tokens",
            ratelimit::reset_text(s.take.wait_ms),
        ));
    }
    out
}

/// What remains of the tightest budget: `x-portcullis-budget-remaining-usd`
/// (after this request's reservation) and `x-portcullis-budget-reset`
/// (OpenAI's reset format; none for a `total` budget). Replaces earlier
/// budget headers when this one is tighter.
pub fn budget_headers(out: &mut Vec<(&'static str, String)>, left: BudgetLeft) {
    const REMAINING: &str = "x-portcullis-budget-remaining-usd";
    const RESET: &str = "x-portcullis-budget-reset";
    let shown = out
        .iter()
        .find(|(k, _)| *k == REMAINING)
        .and_then(|(_, v)| v.parse::<f64>().ok());
    let usd = left.remaining_micros as f64 / 1e6;
    if shown.is_some_and(|s| s <= usd) {
        return;
    }
    out.retain(|(k, _)| *k != REMAINING && *k != RESET);
    out.push((REMAINING, format!("{usd:.4}")));
    if let Some(ms) = left.reset_ms {
        out.push((RESET, ratelimit::reset_text(ms)));
    }
}
