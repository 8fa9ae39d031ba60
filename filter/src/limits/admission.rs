//! A request's limits at every level (its key's, its team's, its end
//! user's) across its life: taken at admission (each level's counters one
//! value, [`Counters`], and each step at a level one CAS whose write
//! carries every decision; all levels or none), held while the
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

use crate::host::metrics;
use crate::host::Host;
use crate::host::LogLevel;
use portcullis_core::config::{Budget, Client, Gateway, Level, Limits};
use portcullis_core::error::GatewayError;
use portcullis_core::limits::counters::Counters;
use portcullis_core::limits::period::Period;
use portcullis_core::limits::ratelimit::{self, Micros, Price, Take};
use portcullis_core::limits::rls::{self, Descriptor};
use portcullis_core::shared::keys::Owner;
use portcullis_core::shared::store::{update, StoreError};
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

/// What one step took from a level's counters (one CAS), so that it can be
/// given back (a refusal at a later level, or nothing used) or settled.
#[derive(Debug, Clone)]
pub struct Taken {
    key: String,
    /// Requests taken: (per minute, how many).
    requests: Option<(u64, u64)>,
    in_flight: bool,
    /// Tokens reserved: (per minute, how many).
    tokens: Option<(u64, u64)>,
    /// The periods the reservation counted in, one per budget.
    budgets: [Option<(Period, u64)>; 4],
    /// Reserved in each of `budgets`.
    micros: Micros,
}

impl Taken {
    fn new(key: String) -> Taken {
        Taken {
            key,
            requests: None,
            in_flight: false,
            tokens: None,
            budgets: [None; 4],
            micros: 0,
        }
    }

    fn has_budgets(&self) -> bool {
        self.budgets.iter().any(Option::is_some)
    }

    /// Undo every take on `c`.
    fn undo(&self, c: &mut Counters, now_ms: u64) {
        if let Some((rpm, n)) = self.requests {
            c.requests = ratelimit::adjust(&c.requests, rpm, ratelimit::signed(n), now_ms);
        }
        if self.in_flight {
            c.in_flight = c.in_flight.saturating_sub(1);
        }
        if let Some((tpm, n)) = self.tokens {
            c.tokens = ratelimit::adjust(&c.tokens, tpm, ratelimit::signed(n), now_ms);
        }
        for (p, index) in self.budgets.iter().flatten() {
            c.settle(*p, *index, self.micros.saturating_neg());
        }
    }
}

/// Give back all that a step took (one CAS).
pub fn give_back(host: &impl Host, t: &Taken, now_ms: u64) {
    let _ = update(host, &t.key, |cur| {
        let mut c = Counters::decode(cur);
        t.undo(&mut c, now_ms);
        (Some(c.encode()), ())
    });
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
    let mut taken: Vec<Taken> = Vec::new();
    let mut shown = None;
    for level in gw.levels(client) {
        match take_one_request(host, level, now_ms, n) {
            Ok(Some((t, s))) => {
                shown = tighter(shown, s);
                taken.push(t);
            }
            Ok(None) => {}
            Err(refused) => {
                for t in &taken {
                    give_back(host, t, now_ms);
                }
                return Err(refused);
            }
        }
    }
    Ok(shown)
}

/// The 429 of a requests-per-minute bucket.
fn requests_refused(host: &impl Host, owner: Owner<'_>, rpm: u64, take: Take) -> GatewayError {
    limited(
        host,
        "requests",
        "rate_limit_exceeded",
        format!(
            "Rate limit reached for requests per minute on {}: limit {rpm}. Retry in {}.",
            owner.describe(),
            ratelimit::reset_text(take.wait_ms)
        ),
        take.wait_ms,
    )
}

/// The 429 of a tokens-per-minute bucket: `then` goes between the limit
/// and the time to wait.
fn tokens_refused(
    host: &impl Host,
    owner: Owner<'_>,
    tpm: u64,
    then: &str,
    wait_ms: u64,
) -> GatewayError {
    limited(
        host,
        "tokens",
        "rate_limit_exceeded",
        format!(
            "Rate limit reached for tokens per minute on {}: limit {tpm}{then} {}.",
            owner.describe(),
            ratelimit::reset_text(wait_ms)
        ),
        wait_ms,
    )
}

/// `n` requests from a level's requests-per-minute bucket: what was taken
/// and the bucket's state, `None` when this Envoy does not count the
/// level's requests, or the 429 with the refusing bucket's state.
fn take_one_request(
    host: &impl Host,
    level: Level<'_>,
    now_ms: u64,
    n: u64,
) -> Result<Option<(Taken, Shown)>, (GatewayError, Shown)> {
    let (l, s) = (level.limits, level.limits.scope);
    let Some(rpm) = l
        .requests_per_minute
        .filter(|_| s.requests_per_minute.local())
    else {
        return Ok(None);
    };
    let key = level.counters_key();
    let r = update(host, &key, |cur| {
        let mut c = Counters::decode(cur);
        let (next, t) = ratelimit::take(&c.requests, rpm, n, now_ms);
        c.requests = next;
        (Some(c.encode()), t)
    });
    match r {
        Ok(take) if take.admitted => {
            let mut t = Taken::new(key.into_owned());
            t.requests = Some((rpm, n));
            Ok(Some((t, Shown { limit: rpm, take })))
        }
        Ok(take) => Err((
            requests_refused(host, level.owner, rpm, take),
            Shown { limit: rpm, take },
        )),
        Err(e) => {
            store_unavailable(host, "requests per minute", e);
            Ok(None)
        }
    }
}

/// Level counters as they stand (`None`: unreadable).
fn read_counters(host: &impl Host, level: &Level<'_>) -> Option<Counters> {
    let (cur, _) = host.get(&level.counters_key()).ok()?;
    Some(Counters::decode(cur.as_deref()))
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
        let Some(c) = read_counters(host, &level) else {
            continue;
        };
        let take = ratelimit::level(&c.tokens, tpm, now_ms);
        shown = tighter(shown, Shown { limit: tpm, take });
    }
    shown
}

/// What a request holds of its limits (every level's) until it finishes.
#[derive(Debug, Default)]
pub struct Held {
    /// What admission took at each level.
    levels: Vec<Taken>,
    /// The price the budget reservations were made at (to settle them).
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
/// budget reservations (and an end user's request), each level (the key's,
/// then its team's, then the end user's) in one CAS of its counters. All or
/// nothing: a level that refuses takes nothing, and gives back what the
/// levels before it took. Within a level the first refusal is told, in
/// this order: a reservation larger than its token limit, the end user's
/// requests, concurrency, tokens, budgets.
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
    for level in gw.levels_of(client, user) {
        match admit_level(host, gw, level, reserve, price, now_ms) {
            Ok(Some((t, s))) => {
                if let Some(r) = s.requests {
                    shown.requests = tighter(shown.requests, r);
                }
                if let Some(tk) = s.tokens {
                    shown.tokens = tighter(shown.tokens, tk);
                }
                if let Some(b) = s.budget {
                    shown.budget = BudgetLeft::tighter(shown.budget, b);
                }
                if t.has_budgets() {
                    held.price = price;
                }
                held.levels.push(t);
            }
            Ok(None) => {}
            Err(e) => {
                held.done = true;
                for t in &held.levels {
                    give_back(host, t, now_ms);
                }
                return Err(e);
            }
        }
    }
    Ok((held, shown))
}

/// Why a level refused, decided inside its CAS (the error is made after).
enum Refusal<'l> {
    Requests(u64, Take),
    Concurrency(u32),
    Tokens(u64, u64, Take),
    Budget(&'l Budget),
}

/// One level's part of [`admit`]: `None` when it counts nothing here.
fn admit_level(
    host: &impl Host,
    gw: &Gateway,
    level: Level<'_>,
    reserve: (u64, u64),
    price: Option<Price>,
    now_ms: u64,
) -> Result<Option<(Taken, Admitted)>, GatewayError> {
    let (l, s) = (level.limits, level.limits.scope);
    // An end user's request rate is taken here (the user is known from the
    // body); the key's and the team's were taken at the headers.
    let user_rpm = l
        .requests_per_minute
        .filter(|_| matches!(level.owner, Owner::User(_)) && s.requests_per_minute.local());
    let max = l.max_concurrent;
    let tpm = l.tokens_per_minute.filter(|_| s.tokens_per_minute.local());
    let price = price.filter(|_| s.budgets.local() && !l.budgets.is_empty());
    if user_rpm.is_none() && max.is_none() && tpm.is_none() && price.is_none() {
        return Ok(None);
    }
    // A reservation no wait would admit is refused before anything is read.
    if let Some(e) = tpm.and_then(|tpm| too_large(level.owner, tpm, reserve)) {
        host.count(metrics::RATE_LIMITED, 1);
        return Err(e);
    }
    let want = reserve.0.saturating_add(reserve.1);
    let cost = price.map_or(0, |p| p.cost(reserve.0, reserve.1, 0));
    let key = level.counters_key();
    let r = update(host, &key, |cur| {
        let mut c = Counters::decode(cur);
        let mut t = Taken::new(String::new());
        let mut shown = Admitted::default();
        if let Some(rpm) = user_rpm {
            let (next, take) = ratelimit::take(&c.requests, rpm, 1, now_ms);
            if !take.admitted {
                return (None, Err(Refusal::Requests(rpm, take)));
            }
            c.requests = next;
            t.requests = Some((rpm, 1));
            shown.requests = Some(Shown { limit: rpm, take });
        }
        if let Some(max) = max {
            if c.in_flight >= max {
                return (None, Err(Refusal::Concurrency(max)));
            }
            c.in_flight = c.in_flight.saturating_add(1);
            t.in_flight = true;
        }
        if let Some(tpm) = tpm {
            let (next, take) = ratelimit::take(&c.tokens, tpm, want, now_ms);
            if !take.admitted {
                return (None, Err(Refusal::Tokens(tpm, want, take)));
            }
            c.tokens = next;
            t.tokens = Some((tpm, want));
            shown.tokens = Some(Shown { limit: tpm, take });
        }
        if price.is_some() {
            match spend_all(&mut c, gw, l, cost, now_ms, &mut t) {
                Ok(left) => shown.budget = left,
                Err(b) => return (None, Err(Refusal::Budget(b))),
            }
        }
        (Some(c.encode()), Ok((t, shown)))
    });
    match r {
        Ok(Ok((mut t, shown))) => {
            t.key = key.into_owned();
            Ok(Some((t, shown)))
        }
        Ok(Err(refusal)) => Err(match refusal {
            Refusal::Requests(rpm, take) => requests_refused(host, level.owner, rpm, take),
            Refusal::Concurrency(max) => limited(
                host,
                "requests",
                "concurrency_limit_exceeded",
                format!(
                    "Too many requests in flight for {}: limit {max}. Retry when one finishes.",
                    level.owner.describe()
                ),
                1000,
            ),
            Refusal::Tokens(tpm, want, t) => tokens_refused(
                host,
                level.owner,
                tpm,
                &format!(", requested {want}. Retry in"),
                t.wait_ms,
            ),
            Refusal::Budget(b) => budget_refused(host, gw, level, b, cost, now_ms),
        }),
        Err(e) => {
            store_unavailable(host, "limits", e);
            Ok(None)
        }
    }
}

/// Reserve `cost` in every budget of a level's counters, all or none: what
/// is left of the tightest, or the first that refuses.
fn spend_all<'l>(
    c: &mut Counters,
    gw: &Gateway,
    l: &'l Limits,
    cost: Micros,
    now_ms: u64,
    t: &mut Taken,
) -> Result<Option<BudgetLeft>, &'l Budget> {
    let mut left = None;
    let before = *c;
    for (i, b) in l.budgets.iter().enumerate() {
        let index = b.period.index(now_ms, gw.budget_offset_ms);
        let Some((at, spent)) = c.spend(b.period, index, b.micros, cost) else {
            *c = before;
            return Err(b);
        };
        if let Some(slot) = t.budgets.get_mut(i) {
            *slot = Some((b.period, at));
        }
        let here = BudgetLeft {
            remaining_micros: b.micros.saturating_sub(spent).max(0),
            reset_ms: b.period.ms_to_end(now_ms, gw.budget_offset_ms),
        };
        left = BudgetLeft::tighter(left, here);
    }
    t.micros = cost;
    Ok(left)
}

/// The 429 of a level's budget that refused.
fn budget_refused(
    host: &impl Host,
    gw: &Gateway,
    level: Level<'_>,
    b: &Budget,
    cost: Micros,
    now_ms: u64,
) -> GatewayError {
    host.count(metrics::RATE_LIMITED, 1);
    over_budget(
        &level.owner.describe(),
        b,
        cost,
        b.period.ms_to_end(now_ms, gw.budget_offset_ms),
        false,
    )
}

/// Reserve a price in every budget of a level (an MCP tool call's), in
/// one CAS: what was taken (to give back), `None` when the level counts
/// no budget here, or the 429 of the budget that refuses.
pub fn spend_budgets(
    host: &impl Host,
    gw: &Gateway,
    level: Level<'_>,
    cost: Micros,
    now_ms: u64,
) -> Result<Option<Taken>, GatewayError> {
    let l = level.limits;
    if cost <= 0 || !l.scope.budgets.local() || l.budgets.is_empty() {
        return Ok(None);
    }
    let key = level.counters_key();
    let r = update(host, &key, |cur| {
        let mut c = Counters::decode(cur);
        let mut t = Taken::new(String::new());
        match spend_all(&mut c, gw, l, cost, now_ms, &mut t) {
            Ok(_) => (Some(c.encode()), Ok(t)),
            Err(b) => (None, Err(b)),
        }
    });
    match r {
        Ok(Ok(mut t)) => {
            t.key = key.into_owned();
            Ok(Some(t))
        }
        Ok(Err(b)) => Err(budget_refused(host, gw, level, b, cost, now_ms)),
        Err(e) => {
            store_unavailable(host, "budget", e);
            Ok(None)
        }
    }
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
    /// concurrency slots, one CAS per level. Later calls do nothing.
    pub fn finish(&mut self, host: &impl Host, how: Finish, now_ms: u64) {
        if self.done {
            return;
        }
        self.done = true;
        if let Finish::Settle(Some(u)) = &how {
            self.settle_global(host, u);
        }
        // What the answer used, against what each level reserved: the
        // deltas to give back (positive) or take (negative). Released, all
        // of it comes back; settled without usage, the reservations stand.
        let used = match how {
            Finish::Release => Some((0, 0)),
            Finish::Settle(None) => None,
            Finish::Settle(Some(u)) => Some((
                ratelimit::signed(u.total()),
                self.price.map_or(0, |p| p.usage_cost(&u)),
            )),
        };
        for t in &self.levels {
            let (tokens_back, micros_back) = used.map_or((0, 0), |(tokens, micros)| {
                let reserved = t.tokens.map_or(0, |(_, n)| ratelimit::signed(n));
                (
                    reserved.saturating_sub(tokens),
                    t.micros.saturating_sub(micros),
                )
            });
            let tokens = t.tokens.filter(|_| tokens_back != 0);
            let budgets = micros_back != 0 && t.has_budgets();
            if tokens.is_none() && !budgets && !t.in_flight {
                continue;
            }
            let _ = update(host, &t.key, |cur| {
                let mut c = Counters::decode(cur);
                if let Some((tpm, _)) = tokens {
                    c.tokens = ratelimit::adjust(&c.tokens, tpm, tokens_back, now_ms);
                }
                if budgets {
                    for (p, index) in t.budgets.iter().flatten() {
                        c.settle(*p, *index, micros_back.saturating_neg());
                    }
                }
                if t.in_flight {
                    c.in_flight = c.in_flight.saturating_sub(1);
                }
                (Some(c.encode()), ())
            });
        }
    }

    /// Whether the answer's usage matters (a reservation to settle).
    pub fn wants_usage(&self) -> bool {
        !self.done
            && (self
                .levels
                .iter()
                .any(|t| t.tokens.is_some() || t.has_budgets())
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
/// bucket and budget (one CAS per level), over what admission reserved.
/// The first level left with nothing (no token, or its budget spent) comes
/// back as its 429: a session ends.
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
        let budgets = cost != 0 && s.budgets.local() && !l.budgets.is_empty();
        if tpm.is_none() && !budgets {
            continue;
        }
        let r = update(host, &level.counters_key(), |cur| {
            let mut c = Counters::decode(cur);
            let take = tpm.map(|tpm| {
                c.tokens = ratelimit::adjust(&c.tokens, tpm, used, now_ms);
                ratelimit::level(&c.tokens, tpm, now_ms)
            });
            let mut spent_one = None;
            if budgets {
                for (i, b) in l.budgets.iter().enumerate() {
                    let index = b.period.index(now_ms, gw.budget_offset_ms);
                    let spent = c.charge(b.period, index, cost);
                    if spent_one.is_none() && spent >= b.micros {
                        spent_one = Some(i);
                    }
                }
            }
            (Some(c.encode()), (take, spent_one))
        });
        let Ok((take, spent_one)) = r else {
            continue;
        };
        if out.is_some() {
            continue;
        }
        if let (Some(tpm), Some(t)) = (tpm, take.filter(|t| t.remaining == 0)) {
            out = Some(tokens_refused(
                host,
                level.owner,
                tpm,
                ". The session ends; retry in",
                t.wait_ms,
            ));
        } else if let Some(b) = spent_one.and_then(|i| l.budgets.get(i)) {
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
    out
}

/// OpenAI's rate-limit headers for the tightest level of each limit.
pub fn headers(requests: Option<Shown>, tokens: Option<Shown>) -> Vec<(&'static str, String)> {
    // Room for these six and the two budget headers, allocated once.
    let mut out = Vec::with_capacity(8);
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
