//! Per-client admission on the host: every limit is one CAS update whose
//! write carries the decision; what was taken is remembered, so a request
//! that fails gives it back and a finished one settles with real usage.
// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

use crate::shared::{count, HostStore};
use portcullis_core::config::Client;
use portcullis_core::error::GatewayError;
use portcullis_core::ratelimit::{self, Bucket, Micros, Price, Take};
use portcullis_core::store::{update, Store};
use portcullis_core::usage::Usage;
use proxy_wasm::types::LogLevel;

fn key(client: &str, what: &str) -> String {
    format!("portcullis:rl:{client}:{what}")
}

fn log_store_error(what: &str, e: portcullis_core::store::StoreError) {
    let _ = crate::abi::log(
        LogLevel::Warn,
        &format!("{what}: shared data unavailable ({e:?}); not limiting"),
    );
}

fn limited(kind: &'static str, code: &'static str, message: String, wait_ms: u64) -> GatewayError {
    count("portcullis.rate_limited", 1);
    GatewayError::new(429, kind, code, message).with_retry_after(wait_ms.div_ceil(1000).max(1))
}

/// Take one request from the client's requests-per-minute bucket. A refusal
/// comes with the bucket's state, for the rate-limit headers.
pub fn take_request(client: &Client, now_ms: u64) -> Result<Option<Take>, (GatewayError, Take)> {
    let Some(rpm) = client.limits.requests_per_minute else {
        return Ok(None);
    };
    let r = update(&HostStore, &key(&client.name, "rpm"), |cur| {
        let (next, t) = ratelimit::take(&Bucket::decode(cur), rpm, 1, now_ms);
        (Some(next.encode()), t)
    });
    match r {
        Ok(t) if t.admitted => Ok(Some(t)),
        Ok(t) => Err((
            limited(
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
            log_store_error("requests per minute", e);
            Ok(None)
        }
    }
}

/// The client's token bucket as it stands (for headers on cache hits).
pub fn peek_tokens(client: &Client, now_ms: u64) -> Option<Take> {
    let tpm = client.limits.tokens_per_minute?;
    let (cur, _) = HostStore.get(&key(&client.name, "tpm")).ok()?;
    Some(ratelimit::level(
        &Bucket::decode(cur.as_deref()),
        tpm,
        now_ms,
    ))
}

/// What a request holds until it finishes.
#[derive(Debug, Default)]
pub struct Held {
    client: String,
    concurrency: bool,
    /// (tokens per minute, tokens reserved)
    tokens: Option<(u64, u64)>,
    /// (budget key, micro-USD reserved, price)
    budget: Option<(String, Micros, Price)>,
    done: bool,
}

/// Admit a request that goes to a provider: concurrency, token reservation,
/// budget reservation, in that order; a refusal gives back what was taken.
pub fn admit(
    client: &Client,
    reserve: (u64, u64),
    price: Option<Price>,
    now_ms: u64,
) -> Result<(Held, Option<Take>), GatewayError> {
    let mut held = Held {
        client: client.name.clone(),
        ..Held::default()
    };
    let l = &client.limits;
    if let Some(max) = l.max_concurrent {
        match update(&HostStore, &key(&client.name, "conc"), |cur| ratelimit::acquire(cur, max)) {
            Ok(true) => held.concurrency = true,
            Ok(false) => {
                return Err(limited(
                    "requests",
                    "concurrency_limit_exceeded",
                    format!("Too many requests in flight for key `{}`: limit {max}. Retry when one finishes.", client.name),
                    1000,
                ))
            }
            Err(e) => log_store_error("concurrency", e),
        }
    }
    let (prompt_est, max_completion) = reserve;
    let want = prompt_est.saturating_add(max_completion);
    let mut tokens_take = None;
    if let Some(tpm) = l.tokens_per_minute.filter(|&tpm| want > tpm) {
        // Larger than the whole limit: no wait would admit it, and the
        // bucket is left untouched (OpenAI answers "Request too large").
        held.release(now_ms);
        return Err(limited(
            "tokens",
            "rate_limit_exceeded",
            format!(
                "Request too large for key `{}`: tokens per minute limit {tpm}, this request reserves {want} tokens (prompt estimate {prompt_est} + max tokens {max_completion}). Lower `max_tokens` or `max_completion_tokens`.",
                client.name
            ),
            60_000,
        ));
    }
    if let Some(tpm) = l.tokens_per_minute {
        let r = update(&HostStore, &key(&client.name, "tpm"), |cur| {
            let (next, t) = ratelimit::take(&Bucket::decode(cur), tpm, want, now_ms);
            (Some(next.encode()), t)
        });
        match r {
            Ok(t) if t.admitted => {
                held.tokens = Some((tpm, want));
                tokens_take = Some(t);
            }
            Ok(t) => {
                held.release(now_ms);
                return Err(limited(
                    "tokens",
                    "rate_limit_exceeded",
                    format!(
                        "Rate limit reached for tokens per minute on key `{}`: limit {tpm}, requested {want}. Retry in {}.",
                        client.name,
                        ratelimit::reset_text(t.wait_ms)
                    ),
                    t.wait_ms,
                ));
            }
            Err(e) => log_store_error("tokens per minute", e),
        }
    }
    if let (Some(cap), Some(price)) = (l.budget_micros, price) {
        let cost = price.cost(prompt_est, max_completion, 0);
        let bkey = format!(
            "portcullis:budget:{}:{}",
            client.name,
            ratelimit::day_of(now_ms)
        );
        match update(&HostStore, &bkey, |cur| {
            let (next, ok, _) = ratelimit::spend(cur, cap, cost);
            (next, ok)
        }) {
            Ok(true) => held.budget = Some((bkey, cost, price)),
            Ok(false) => {
                held.release(now_ms);
                return Err(limited(
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
            Err(e) => log_store_error("budget", e),
        }
    }
    Ok((held, tokens_take))
}

impl Held {
    /// The request finished: settle reservations with real usage, or let
    /// them stand when no usage arrived. Frees the concurrency slot.
    pub fn settle(&mut self, usage: Option<Usage>, now_ms: u64) {
        if self.done {
            return;
        }
        if let Some(u) = usage {
            if let Some((tpm, reserved)) = self.tokens {
                let delta =
                    ratelimit::signed(reserved).saturating_sub(ratelimit::signed(u.total()));
                if delta != 0 {
                    let _ = update(&HostStore, &key(&self.client, "tpm"), |cur| {
                        (
                            Some(
                                ratelimit::adjust(&Bucket::decode(cur), tpm, delta, now_ms)
                                    .encode(),
                            ),
                            (),
                        )
                    });
                }
            }
            if let Some((bkey, reserved, price)) = &self.budget {
                let delta = price
                    .cost(u.prompt, u.completion, u.cached)
                    .saturating_sub(*reserved);
                if delta != 0 {
                    let _ = update(&HostStore, bkey, |cur| {
                        (Some(ratelimit::settle_spend(cur, delta)), ())
                    });
                }
            }
        }
        self.free_slot();
        self.done = true;
    }

    /// The request failed or was cancelled: give everything back.
    pub fn release(&mut self, now: u64) {
        if self.done {
            return;
        }
        if let Some((tpm, reserved)) = self.tokens {
            let _ = update(&HostStore, &key(&self.client, "tpm"), |cur| {
                (
                    Some(
                        ratelimit::adjust(
                            &Bucket::decode(cur),
                            tpm,
                            ratelimit::signed(reserved),
                            now,
                        )
                        .encode(),
                    ),
                    (),
                )
            });
        }
        if let Some((bkey, reserved, _)) = &self.budget {
            let _ = update(&HostStore, bkey, |cur| {
                (
                    Some(ratelimit::settle_spend(cur, reserved.saturating_neg())),
                    (),
                )
            });
        }
        self.free_slot();
        self.done = true;
    }

    fn free_slot(&mut self) {
        if self.concurrency {
            let _ = update(&HostStore, &key(&self.client, "conc"), |cur| {
                (ratelimit::release(cur), ())
            });
            self.concurrency = false;
        }
    }

    /// Whether usage matters for this request (something to settle).
    pub fn wants_usage(&self) -> bool {
        !self.done && (self.tokens.is_some() || self.budget.is_some())
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
