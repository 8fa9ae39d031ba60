//! A client's limits across one request's life: taken at admission (each
//! limit one CAS update whose write carries the decision), held while the
//! request is in flight, and finished exactly once — settled with the
//! provider's real usage, or given back when nothing was used.
//!
//! This is the admission seam: the limits live in this Envoy's shared data
//! (`local`); a fleet-wide service answers the same steps.

// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

use crate::host::Host;
use crate::metrics;
use portcullis_core::config::{Client, Gateway, Scope, Scopes};
use portcullis_core::error::GatewayError;
use portcullis_core::keys::{self, Limit};
use portcullis_core::ratelimit::{self, Bucket, Micros, Price, Take};
use portcullis_core::rls::{self, Limit as GlobalLimit};
use portcullis_core::store::{update, StoreError};
use portcullis_core::usage::Usage;
use proxy_wasm::types::LogLevel;

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

/// Create the limit keys that do not exist yet, before any request needs
/// them: Envoy's shared data has no atomic create (a write without a CAS
/// token is unconditional), so two workers both creating a key on first use
/// could each write and one reservation would be lost. Every update of an
/// existing key is a CAS. Counters are created at configure time; each
/// day's budget keys for `day` and the day after (the root context calls
/// this again when the day changes).
pub fn prepare(host: &impl Host, gw: &Gateway, day: u64) {
    let create = |key: String, initial: &[u8]| {
        if let Ok((None, _)) = host.get(&key) {
            let _ = host.set(&key, initial, None);
        }
    };
    for c in gw.clients.values() {
        let l = &c.limits;
        if local(c, l.requests_per_minute, |s| s.requests_per_minute).is_some() {
            create(
                keys::limit(&c.name, Limit::RequestsPerMinute),
                &Bucket::default().encode(),
            );
        }
        if local(c, l.tokens_per_minute, |s| s.tokens_per_minute).is_some() {
            create(
                keys::limit(&c.name, Limit::TokensPerMinute),
                &Bucket::default().encode(),
            );
        }
        if l.max_concurrent.is_some() {
            create(
                keys::limit(&c.name, Limit::Concurrency),
                &0u32.to_le_bytes(),
            );
        }
        if local(c, l.budget_micros, |s| s.budget_usd_per_day).is_some() {
            for d in [day, day.saturating_add(1)] {
                create(keys::budget(&c.name, d), &0i64.to_le_bytes());
            }
        }
    }
}

/// A limit's value when this Envoy counts it (scope `local` or `both`).
fn local<T>(client: &Client, value: Option<T>, scope: impl Fn(Scopes) -> Scope) -> Option<T> {
    value.filter(|_| scope(client.limits.scope).local())
}

/// Take one request from the client's requests-per-minute bucket. A refusal
/// comes with the bucket's state, for the rate-limit headers.
pub fn take_request(
    host: &impl Host,
    client: &Client,
    now_ms: u64,
) -> Result<Option<Take>, (GatewayError, Take)> {
    let Some(rpm) = local(client, client.limits.requests_per_minute, |s| {
        s.requests_per_minute
    }) else {
        return Ok(None);
    };
    let r = update(
        host,
        &keys::limit(&client.name, Limit::RequestsPerMinute),
        |cur| {
            let (next, t) = ratelimit::take(&Bucket::decode(cur), rpm, 1, now_ms);
            (Some(next.encode()), t)
        },
    );
    match r {
        Ok(t) if t.admitted => Ok(Some(t)),
        Ok(t) => Err((
            limited(
                host,
                "requests",
                "rate_limit_exceeded",
                format!(
                    "Rate limit reached for requests per minute on key `{}`: limit {rpm}. Retry in {}.",
                    client.name,
                    ratelimit::reset_text(t.wait_ms)
                ),
                t.wait_ms,
            ),
            t,
        )),
        Err(e) => {
            store_unavailable(host, "requests per minute", e);
            Ok(None)
        }
    }
}

/// The client's token bucket as it stands (for headers on cache hits).
pub fn peek_tokens(host: &impl Host, client: &Client, now_ms: u64) -> Option<Take> {
    let tpm = local(client, client.limits.tokens_per_minute, |s| {
        s.tokens_per_minute
    })?;
    let key = keys::limit(&client.name, Limit::TokensPerMinute);
    let (cur, _) = host.get(&key).ok()?;
    Some(ratelimit::level(
        &Bucket::decode(cur.as_deref()),
        tpm,
        now_ms,
    ))
}

/// What a request holds of its client's limits until it finishes.
#[derive(Debug, Default)]
pub struct Held {
    client: String,
    concurrency: bool,
    /// (tokens per minute, tokens reserved)
    tokens: Option<(u64, u64)>,
    /// (budget key, micro-USD reserved, price)
    budget: Option<(String, Micros, Price)>,
    /// Reserved by the rate limit service: (tokens per minute, tokens).
    pub global_tokens: Option<(u32, u64)>,
    /// Reserved by the rate limit service: (cap, units of $0.0001, price,
    /// UTC day).
    pub global_budget: Option<(u32, u64, Price, u64)>,
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

/// Admit a request that goes to a provider: concurrency, token reservation,
/// budget reservation, in that order; a refusal gives back what was taken.
pub fn admit(
    host: &impl Host,
    client: &Client,
    reserve: (u64, u64),
    price: Option<Price>,
    now_ms: u64,
) -> Result<(Held, Option<Take>), GatewayError> {
    let mut held = Held {
        client: client.name.clone(),
        ..Held::default()
    };
    let result = take_concurrency(host, client, &mut held)
        .and_then(|()| take_tokens(host, client, reserve, now_ms, &mut held))
        .and_then(|tokens| {
            take_budget(host, client, reserve, price, now_ms, &mut held).map(|()| tokens)
        });
    match result {
        Ok(tokens) => Ok((held, tokens)),
        Err(e) => {
            held.finish(host, Finish::Release, now_ms);
            Err(e)
        }
    }
}

fn take_concurrency(
    host: &impl Host,
    client: &Client,
    held: &mut Held,
) -> Result<(), GatewayError> {
    let Some(max) = client.limits.max_concurrent else {
        return Ok(());
    };
    let key = keys::limit(&client.name, Limit::Concurrency);
    match update(host, &key, |cur| ratelimit::acquire(cur, max)) {
        Ok(true) => held.concurrency = true,
        Ok(false) => {
            return Err(limited(
                host,
                "requests",
                "concurrency_limit_exceeded",
                format!(
                "Too many requests in flight for key `{}`: limit {max}. Retry when one finishes.",
                client.name
            ),
                1000,
            ))
        }
        Err(e) => store_unavailable(host, "concurrency", e),
    }
    Ok(())
}

fn take_tokens(
    host: &impl Host,
    client: &Client,
    (prompt_est, max_completion): (u64, u64),
    now_ms: u64,
    held: &mut Held,
) -> Result<Option<Take>, GatewayError> {
    let Some(tpm) = local(client, client.limits.tokens_per_minute, |s| {
        s.tokens_per_minute
    }) else {
        return Ok(None);
    };
    let want = prompt_est.saturating_add(max_completion);
    if want > tpm {
        // Larger than the whole limit: no wait would admit it, and the
        // bucket is left untouched (OpenAI answers "Request too large").
        return Err(limited(
            host,
            "tokens",
            "rate_limit_exceeded",
            format!(
                "Request too large for key `{}`: tokens per minute limit {tpm}, this request reserves {want} tokens (prompt estimate {prompt_est} + max tokens {max_completion}). Lower `max_tokens` or `max_completion_tokens`.",
                client.name
            ),
            60_000,
        ));
    }
    let r = update(
        host,
        &keys::limit(&client.name, Limit::TokensPerMinute),
        |cur| {
            let (next, t) = ratelimit::take(&Bucket::decode(cur), tpm, want, now_ms);
            (Some(next.encode()), t)
        },
    );
    match r {
        Ok(t) if t.admitted => {
            held.tokens = Some((tpm, want));
            Ok(Some(t))
        }
        Ok(t) => Err(limited(
            host,
            "tokens",
            "rate_limit_exceeded",
            format!(
                "Rate limit reached for tokens per minute on key `{}`: limit {tpm}, requested {want}. Retry in {}.",
                client.name,
                ratelimit::reset_text(t.wait_ms)
            ),
            t.wait_ms,
        )),
        Err(e) => {
            store_unavailable(host, "tokens per minute", e);
            Ok(None)
        }
    }
}

fn take_budget(
    host: &impl Host,
    client: &Client,
    (prompt_est, max_completion): (u64, u64),
    price: Option<Price>,
    now_ms: u64,
    held: &mut Held,
) -> Result<(), GatewayError> {
    let cap = local(client, client.limits.budget_micros, |s| {
        s.budget_usd_per_day
    });
    let (Some(cap), Some(price)) = (cap, price) else {
        return Ok(());
    };
    let cost = price.cost(prompt_est, max_completion, 0);
    let bkey = keys::budget(&client.name, ratelimit::day_of(now_ms));
    match update(host, &bkey, |cur| {
        let (next, ok, _) = ratelimit::spend(cur, cap, cost);
        (next, ok)
    }) {
        Ok(true) => held.budget = Some((bkey, cost, price)),
        Ok(false) => {
            return Err(limited(
                host,
                "insufficient_quota",
                "budget_exceeded",
                format!(
                    "Daily budget of ${:.2} for key `{}` would be exceeded by this request (reserving ${:.4}). It resets at 00:00 UTC.",
                    cap as f64 / 1e6,
                    client.name,
                    cost as f64 / 1e6
                ),
                ratelimit::ms_to_midnight(now_ms),
            ));
        }
        Err(e) => store_unavailable(host, "budget", e),
    }
    Ok(())
}

impl Held {
    pub fn new(client: &str) -> Held {
        Held {
            client: client.to_string(),
            ..Held::default()
        }
    }

    /// Usage above a global reservation is counted after the answer (the
    /// protocol only adds: an over-estimate stays counted).
    fn settle_global(&self, host: &impl Host, u: &Usage) {
        let send = |limit: GlobalLimit, value: u32, extra: u64| {
            if extra == 0 {
                return;
            }
            let hits = u32::try_from(extra).unwrap_or(u32::MAX);
            host.count(metrics::GLOBAL_SETTLED, 1);
            host.send_later(rls::encode_request(
                &[limit.descriptor(&self.client, value)],
                hits,
            ));
        };
        if let Some((tpm, reserved)) = self.global_tokens {
            send(
                GlobalLimit::TokensPerMinute,
                tpm,
                u.total().saturating_sub(reserved),
            );
        }
        if let Some((cap, reserved, price, day)) = self.global_budget {
            let used = rls::budget_units(price.usage_cost(u));
            send(
                GlobalLimit::BudgetPerDay(day),
                cap,
                used.saturating_sub(reserved),
            );
        }
    }

    /// End the hold, once: settle or release the reservations, free the
    /// concurrency slot. Later calls do nothing.
    pub fn finish(&mut self, host: &impl Host, how: Finish, now_ms: u64) {
        if self.done {
            return;
        }
        self.done = true;
        if let Finish::Settle(Some(u)) = &how {
            self.settle_global(host, u);
        }
        // Token and budget deltas to give back (positive) or take (negative).
        let (tokens_back, micros_back) = match how {
            Finish::Release => (
                self.tokens.map_or(0, |(_, r)| ratelimit::signed(r)),
                self.budget.as_ref().map_or(0, |(_, r, _)| *r),
            ),
            Finish::Settle(None) => (0, 0),
            Finish::Settle(Some(u)) => (
                self.tokens.map_or(0, |(_, r)| {
                    ratelimit::signed(r).saturating_sub(ratelimit::signed(u.total()))
                }),
                self.budget
                    .as_ref()
                    .map_or(0, |(_, r, price)| r.saturating_sub(price.usage_cost(&u))),
            ),
        };
        if let (Some((tpm, _)), true) = (self.tokens, tokens_back != 0) {
            let key = keys::limit(&self.client, Limit::TokensPerMinute);
            let _ = update(host, &key, |cur| {
                let next = ratelimit::adjust(&Bucket::decode(cur), tpm, tokens_back, now_ms);
                (Some(next.encode()), ())
            });
        }
        if let (Some((bkey, _, _)), true) = (&self.budget, micros_back != 0) {
            let _ = update(host, bkey, |cur| {
                (
                    Some(ratelimit::settle_spend(cur, micros_back.saturating_neg())),
                    (),
                )
            });
        }
        if self.concurrency {
            let key = keys::limit(&self.client, Limit::Concurrency);
            let _ = update(host, &key, |cur| (ratelimit::release(cur), ()));
        }
    }

    /// Whether the answer's usage matters (a reservation to settle).
    pub fn wants_usage(&self) -> bool {
        !self.done
            && (self.tokens.is_some()
                || self.budget.is_some()
                || self.global_tokens.is_some()
                || self.global_budget.is_some())
    }
}

/// OpenAI's rate-limit headers for the takes of this request.
pub fn headers(
    client: &Client,
    requests: Option<Take>,
    tokens: Option<Take>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let (Some(limit), Some(t)) = (client.limits.requests_per_minute, requests) {
        out.push(("x-ratelimit-limit-requests", limit.to_string()));
        out.push(("x-ratelimit-remaining-requests", t.remaining.to_string()));
        out.push((
            "x-ratelimit-reset-requests",
            ratelimit::reset_text(t.wait_ms),
        ));
    }
    if let (Some(limit), Some(t)) = (client.limits.tokens_per_minute, tokens) {
        out.push(("x-ratelimit-limit-tokens", limit.to_string()));
        out.push(("x-ratelimit-remaining-tokens", t.remaining.to_string()));
        out.push(("x-ratelimit-reset-tokens", ratelimit::reset_text(t.wait_ms)));
    }
    out
}
