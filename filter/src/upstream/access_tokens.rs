//! Access tokens for providers that take an OAuth bearer token fetched from a
//! token source ([`providers::Auth::Token`]; Vertex AI today):
//! obtained by the filter itself from the provider's token source (the
//! GCE/GKE metadata server's shape, through an Envoy cluster, by callout),
//! kept in shared data for every worker until shortly before they expire.
//!
//! One fetch at a time across the workers: the request that finds no token
//! takes a lock in shared data and makes the call; every other request that
//! needs the token meanwhile has gone as far as Envoy's router (its request
//! rewritten for the provider but for `authorization`) and is paused. The
//! fetching request's answer wakes the waiters of its worker (their
//! `authorization` set, their requests resumed, through Envoy's effective
//! context); each other worker's tick wakes its own once the token is in
//! shared data. A waiter left waiting past the token source's timeout (its
//! fetch failed, or its fetching request went away) goes on without a token
//! and gets the provider's 401; the log says why.

use crate::host::metrics;
use crate::host::Host;
use crate::host::{Action, LogLevel};
use crate::loaded::Loaded;
use crate::request::{Phase, RequestContext};
use portcullis_core::config::TokenSource;
use portcullis_core::providers::{self, Auth};
use portcullis_core::shared::store;

fn key(provider: &str) -> String {
    format!("portcullis.token.{provider}")
}

fn lock_key(provider: &str) -> String {
    format!("portcullis.token_lock.{provider}")
}

/// The token in shared data while it is fresh: `<refresh_at_ms>
/// <expires_at_ms> <token>`, used until `refresh_at` (a quarter of its
/// life, at most five minutes, before it expires).
pub fn cached(host: &impl Host, provider: &str, now: u64) -> Option<String> {
    let (value, _) = host.get(&key(provider)).ok()?;
    let value = String::from_utf8(value?).ok()?;
    let mut parts = value.splitn(3, ' ');
    let refresh_at: u64 = parts.next()?.parse().ok()?;
    let _expires_at: u64 = parts.next()?.parse().ok()?;
    let token = parts.next()?;
    (now < refresh_at && !token.is_empty()).then(|| token.to_string())
}

fn store_token(host: &impl Host, provider: &str, token: &str, ttl_s: u64, now: u64) {
    let life = ttl_s.saturating_mul(1000);
    let early = (life / 4).min(300_000);
    let expires_at = now.saturating_add(life);
    let refresh_at = expires_at.saturating_sub(early);
    let value = format!("{refresh_at} {expires_at} {token}");
    if let Err(e) = host.set(&key(provider), value.as_bytes(), None) {
        host.log(
            LogLevel::Warn,
            &format!("provider `{provider}`: the access token was not kept in shared data: {e:?}"),
        );
    }
}

/// Take the fetch lock (until `until`) unless another holds it unexpired.
fn try_lock(host: &impl Host, provider: &str, now: u64, until: u64) -> bool {
    store::update(host, &lock_key(provider), |current| {
        let held = current
            .and_then(|c| std::str::from_utf8(c).ok()?.parse::<u64>().ok())
            .is_some_and(|t| t > now);
        if held {
            (None, false)
        } else {
            (Some(until.to_string().into_bytes()), true)
        }
    })
    .unwrap_or(false)
}

fn unlock(host: &impl Host, provider: &str) {
    let _ = host.set(&lock_key(provider), b"0", None);
}

/// Wake this worker's waiters for `provider` with `authorization` (none:
/// without a token).
fn wake_all(host: &impl Host, provider: &str, authorization: Option<&str>) {
    let waiters = host
        .worker()
        .token_waiters
        .borrow_mut()
        .remove(provider)
        .unwrap_or_default();
    for (id, _) in waiters {
        // A request that went away meanwhile is not found: nothing to do.
        let _ = host.wake(id, authorization);
    }
}

/// The tick: wake this worker's waiters whose token another worker
/// fetched, and let go on without one those waiting past the timeout;
/// whether any was woken (the calls' context was switched).
pub fn wake_ready(host: &impl Host, loaded: &Loaded, now: u64) -> bool {
    let mut woke = false;
    let waiting: Vec<String> = host
        .worker()
        .token_waiters
        .borrow()
        .iter()
        .filter(|(_, w)| !w.is_empty())
        .map(|(k, _)| k.clone())
        .collect();
    for name in waiting {
        let Some(p) = loaded.gw.providers.iter().find(|p| p.name == name) else {
            woke = true;
            wake_all(host, &name, None);
            continue;
        };
        let Auth::Token(source) = providers::auth(p) else {
            continue;
        };
        if let Some(t) = cached(host, &name, now) {
            let (_, value) = providers::credential(p, &t);
            woke = true;
            wake_all(host, &name, Some(&value));
            continue;
        }
        let oldest = host
            .worker()
            .token_waiters
            .borrow()
            .get(&name)
            .and_then(|w| w.iter().map(|(_, since)| *since).min())
            .unwrap_or(now);
        if now.saturating_sub(oldest) > source.timeout_ms.saturating_mul(2) {
            host.log(
                LogLevel::Warn,
                &format!(
                    "provider `{name}`: no access token from cluster `{}` in {} ms; requests go on without one",
                    source.cluster,
                    now.saturating_sub(oldest)
                ),
            );
            host.count(metrics::TOKEN_FAILURES, 1);
            woke = true;
            wake_all(host, &name, None);
        }
    }
    woke
}

impl<H: Host> RequestContext<H> {
    /// A fetching request went away before its answer: free the lock so
    /// the next request that needs the token fetches it (this worker's
    /// waiters are woken by the tick once it is kept, or go on at the
    /// timeout).
    pub(crate) fn abandon_token_fetch(&mut self) {
        if let Some(provider) = self
            .flight
            .as_mut()
            .and_then(|f| f.upstream.token_provider.take())
        {
            unlock(&self.host, &provider);
        }
    }

    /// The first attempt is rewritten for the router but has no token yet:
    /// wait for it, fetching it unless another request is.
    pub(crate) fn await_token(&mut self, provider: &str, source: &TokenSource) -> Action {
        let now = self.host.now_ms();
        self.host
            .worker()
            .token_waiters
            .borrow_mut()
            .entry(provider.to_string())
            .or_default()
            .push((self.id, now));
        // Its phase stays `Proxied`: a waiter is woken by another's code,
        // which cannot change it, and its next callback is the router's.
        self.phase = Phase::Proxied;
        let until = now.saturating_add(source.timeout_ms.saturating_add(1_000));
        if !try_lock(&self.host, provider, now, until) {
            return Action::Pause;
        }
        // Another worker may have fetched the token and let go of the lock
        // between this request's look at the cache and its lock: it goes
        // with that token, and no second fetch is made.
        if let Some(token) = cached(&self.host, provider, now) {
            unlock(&self.host, provider);
            if let Some(w) = self
                .host
                .worker()
                .token_waiters
                .borrow_mut()
                .get_mut(provider)
            {
                w.retain(|(id, _)| *id != self.id);
            }
            let credential = self.loaded.as_ref().and_then(|l| {
                let p = l.gw.providers.iter().find(|p| p.name == provider)?;
                Some(providers::credential(p, &token).1)
            });
            if let Some(c) = credential.as_deref() {
                let _ = self
                    .host
                    .set_header(crate::host::Part::Request, "authorization", Some(c));
            }
            return Action::Continue;
        }
        let headers = [
            (":method", "GET"),
            (":path", source.path.as_str()),
            (":authority", source.host.as_str()),
            ("metadata-flavor", "Google"),
        ];
        match self
            .host
            .dispatch(&source.cluster, &headers, b"", source.timeout_ms)
        {
            Ok(call) => {
                self.host.count(metrics::TOKEN_FETCHES, 1);
                if let Some(f) = self.flight.as_mut() {
                    f.upstream.token_provider = Some(provider.to_string());
                }
                self.phase = Phase::AwaitingToken(call);
            }
            Err(s) => {
                self.host.log(
                    LogLevel::Warn,
                    &format!(
                        "provider `{provider}`: the token source's cluster `{}` cannot be called ({s:?}); requests go on without a token",
                        source.cluster
                    ),
                );
                self.host.count(metrics::TOKEN_FAILURES, 1);
                unlock(&self.host, provider);
                self.phase = Phase::Proxied;
                wake_all(&self.host, provider, None);
                return Action::Continue;
            }
        }
        Action::Pause
    }

    /// The token source answered this request's fetch: keep the token for
    /// every worker and wake this worker's waiters, this request last.
    pub(crate) fn on_token_answer(&mut self, body_size: usize) {
        let now = self.host.now_ms();
        let provider = self
            .flight
            .as_mut()
            .and_then(|f| f.upstream.token_provider.take())
            .unwrap_or_default();
        let status = self
            .host
            .headers(crate::host::Part::CallResponse)
            .ok()
            .and_then(|h| {
                h.get(":status")
                    .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
            });
        let body = self
            .host
            .body(crate::host::Part::CallResponse, body_size)
            .unwrap_or_default();
        let token = (status == Some(200))
            .then(|| providers::token_answer(&body))
            .flatten();
        self.phase = Phase::Proxied;
        // The token is kept before the lock is let go: a request of another
        // worker that takes the lock then finds it, and makes no second
        // fetch (unlocked first, one in that gap fetched again).
        if let Some((t, ttl)) = &token {
            store_token(&self.host, &provider, t, *ttl, now);
        }
        unlock(&self.host, &provider);
        let credential = match &token {
            Some((t, _)) => self.loaded.as_ref().and_then(|l| {
                let p = l.gw.providers.iter().find(|p| p.name == provider)?;
                Some(providers::credential(p, t).1)
            }),
            None => {
                self.host.log(
                    LogLevel::Warn,
                    &format!(
                        "provider `{provider}`: the token source answered {status:?} without a token; requests go on without one"
                    ),
                );
                self.host.count(metrics::TOKEN_FAILURES, 1);
                None
            }
        };
        // The others first: each wake switches the calls' context, and this
        // request's own comes last.
        let mine = self.id;
        let waiters: Vec<(u32, u64)> = self
            .host
            .worker()
            .token_waiters
            .borrow_mut()
            .remove(&provider)
            .unwrap_or_default();
        for (id, _) in waiters.iter().filter(|(id, _)| *id != mine) {
            let _ = self.host.wake(*id, credential.as_deref());
        }
        // Unless the tick already let it go (another worker's token).
        if waiters.iter().any(|(id, _)| *id == mine) {
            let _ = self.host.wake(mine, credential.as_deref());
        }
    }
}
