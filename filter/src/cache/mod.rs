//! The prompt cache on the request path: exact lookups and stores (this
//! file) and the semantic tier (`semantic`: a prompt's embedding, the
//! nearest answer above the threshold).
//!
//! May use: `host`, `loaded`, `request`.
//!
//! The prompt cache on the host: a lookup before any provider is reached
//! (a hit is answered here), and the store of a complete answer.

pub mod semantic;

use crate::host::metrics;
use crate::host::worker::Worker;
use crate::host::Host;
use crate::host::{Action, LogLevel};
use crate::request::{Lookup, Phase, RequestContext};
use portcullis_core::cache::fleet;
use portcullis_core::cache::local::Local;
use portcullis_core::cache::{
    self, CacheConfig, CacheStatus, Directive, Found, Hash, StoreOutcome,
};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::wire::sse;

/// A new config: every set of the shared table gets its index (so every
/// store is CAS-guarded), and the worker's copies go (answers may be keyed
/// otherwise).
pub fn configure(host: &impl Host, cfg: Option<&CacheConfig>) {
    if let Some(c) = cfg {
        if let Err(e) = cache::prepare(host, c) {
            host.log(
                LogLevel::Warn,
                &format!("cache indexes not prepared: {e:?}"),
            );
        }
    }
    // This worker's copies of hot answers (`cache.worker_bytes`).
    if let Ok(mut l) = host.worker().cache.try_borrow_mut() {
        *l = cfg.map_or_else(Local::default, |c| {
            Local::new(c.worker_bytes, c.worker_ttl_ms)
        });
    }
}

fn local_get(w: &Worker, head: &[u8], body: &[u8], now: u64) -> Option<(Hash, Vec<u8>)> {
    let mut l = w.cache.try_borrow_mut().ok()?;
    l.get(&[head, body], now).map(|(k, a)| (k, a.to_vec()))
}

#[allow(clippy::too_many_arguments)]
fn local_put(
    w: &Worker,
    head: &[u8],
    body: &[u8],
    key: Hash,
    answer: &[u8],
    expires_ms: u64,
    now: u64,
) {
    if let Ok(mut l) = w.cache.try_borrow_mut() {
        l.put(&[head, body], key, answer, expires_ms, now);
    }
}

/// What decides the key besides the body: the route and the scope, each
/// with its length (so no two read alike).
fn route_head(first_name: &str, model_id: &str, scope: Option<&str>) -> Vec<u8> {
    let mut out = Vec::with_capacity(first_name.len() + model_id.len() + 40);
    for part in [first_name, model_id, scope.unwrap_or("\0")] {
        out.extend_from_slice(&(part.len() as u64).to_le_bytes());
        out.extend_from_slice(part.as_bytes());
    }
    out
}

impl<H: Host> RequestContext<H> {
    /// Look the request up; a hit is the answer to send. The key is the
    /// model and the first provider of its chain (the resolved route),
    /// whichever provider would answer: a hit needs no breaker read.
    pub(crate) fn cache_lookup(
        &mut self,
        gw: &Gateway,
        client: &Client,
        now: u64,
    ) -> Result<Option<(&'static str, Vec<u8>)>, GatewayError> {
        let Some(cfg) = gw.cache.as_ref() else {
            return Ok(None);
        };
        let directive = cache::directive(self.request.cache_control.as_deref());
        let Some(flight) = self
            .flight
            .as_mut()
            .filter(|_| directive != Directive::Bypass)
        else {
            return Ok(None);
        };
        let Some((first, first_model_id)) = flight.candidates.first() else {
            return Ok(None);
        };
        let api = self.request.api;
        if flight.chat.stream && !api.replays_streams() {
            // A stored answer is replayed as OpenAI's stream only.
            return Ok(None);
        }
        let name = gw.providers.get(*first).map_or("", |p| p.name.as_str());
        // Each API's answers are stored apart: the same body to the same
        // provider is another answer in another shape.
        let namespaced;
        let first_name = if api.cache_namespace().is_empty() {
            name
        } else {
            namespaced = format!("{}{name}", api.cache_namespace());
            namespaced.as_str()
        };
        let scope = cfg.per_client.then_some(client.name.as_str());
        // Nothing to key when the worker keeps no copies.
        let head = (cfg.worker_bytes > 0 && cfg.worker_ttl_ms > 0)
            .then(|| route_head(first_name, first_model_id, scope));
        // This worker's copy first: no canonical key, no shared-data read.
        let local = head
            .as_deref()
            .filter(|_| directive == Directive::Normal)
            .and_then(|h| local_get(self.host.worker(), h, flight.chat.body(), now));
        let stored = if let Some((key, answer)) = local {
            flight.cache.fill = Some(key);
            flight.cache.status = CacheStatus::Miss;
            self.host.count(metrics::CACHE_WORKER_HITS, 1);
            answer
        } else {
            let key = cache::key(
                first_name,
                first_model_id,
                &flight.chat,
                cfg.normalize,
                scope,
            )?;
            flight.cache.fill = Some(key);
            flight.cache.status = CacheStatus::Refresh;
            flight.cache.head = head;
            if directive == Directive::Refresh {
                return Ok(None);
            }
            flight.cache.status = CacheStatus::Miss;
            match cache::lookup_seen(&self.host, cfg, &key, now) {
                Ok((Some(Found { answer, expires_ms }), _)) => {
                    if let Some(head) = flight.cache.head.take() {
                        local_put(
                            self.host.worker(),
                            &head,
                            flight.chat.body(),
                            key,
                            &answer,
                            expires_ms,
                            now,
                        );
                    }
                    answer
                }
                Ok((None, seen)) => {
                    flight.cache.seen = Some(seen);
                    self.host.count(metrics::CACHE_MISSES, 1);
                    return Ok(None);
                }
                Err(e) => {
                    self.host
                        .log(LogLevel::Warn, &format!("cache lookup failed: {e:?}"));
                    return Ok(None);
                }
            }
        };
        let tier = if cfg.shared.is_some() {
            CacheStatus::HitLocal
        } else {
            CacheStatus::Hit
        };
        self.serve_stored(gw, client, stored, tier, now)
    }

    /// A stored answer, from either tier, as this request's answer: this
    /// client's output checks run on it (the entry may come from a client
    /// with others), a stream gets its replay. `None`: it cannot serve
    /// (a stream it cannot replay): a miss.
    pub(crate) fn serve_stored(
        &mut self,
        gw: &Gateway,
        client: &Client,
        stored: Vec<u8>,
        tier: CacheStatus,
        now: u64,
    ) -> Result<Option<(&'static str, Vec<u8>)>, GatewayError> {
        let Some(flight) = self.flight.as_ref() else {
            return Ok(None);
        };
        let (stream, include_usage) = (flight.chat.stream, flight.chat.include_usage);
        let (answer, denied) = match self.check_whole_answer(&stored) {
            Ok(Some(redacted)) => (hit_body(redacted, stream, include_usage), None),
            Ok(None) => (hit_body(stored, stream, include_usage), None),
            Err(e) => (None, Some(e)),
        };
        if answer.is_none() && denied.is_none() {
            self.host.count(metrics::CACHE_MISSES, 1);
            return Ok(None);
        }
        if let Some(f) = self.flight.as_mut() {
            f.cache.status = tier;
            f.cache.fill = None;
        }
        self.host.count(metrics::CACHE_HITS, 1);
        // A hit costs no tokens or budget, but it was a request.
        self.rate_headers_with_tokens(gw, client, now);
        match denied {
            Some(e) => Err(e),
            None => Ok(answer),
        }
    }

    /// After a miss in this Envoy's cache: ask the fleet's tier, when the
    /// config has one and the request may be served from a cache. `true`:
    /// the request waits for the answer (`on_shared_answer`).
    pub(crate) fn ask_shared(&mut self, gw: &Gateway) -> bool {
        let Some(tier) = gw.cache.as_ref().and_then(|c| c.shared.as_ref()) else {
            return false;
        };
        let Some(key) = self
            .flight
            .as_ref()
            .filter(|f| f.cache.status == CacheStatus::Miss)
            .and_then(|f| f.cache.fill)
        else {
            return false;
        };
        let owned = crate::loaded::limiter_metadata(self.loaded.as_deref());
        let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        match self.host.dispatch_grpc(
            &tier.cluster,
            fleet::SERVICE,
            fleet::GET,
            &metadata,
            &fleet::encode_get(&key),
            tier.timeout_ms,
        ) {
            Ok(token) => {
                self.shared_lookup = Some((token, Lookup::Exact));
                self.phase = Phase::SharedCache;
                true
            }
            Err(s) => {
                self.host.count(metrics::CACHE_SHARED_ERRORS, 1);
                self.host.log(
                    LogLevel::Warn,
                    &format!(
                        "cannot call cluster `{}` (cache.shared): {s:?}",
                        tier.cluster
                    ),
                );
                false
            }
        }
    }

    /// The fleet tier's answer (`on_grpc_call_response` while waiting for
    /// it): a hit is kept here too and answers; anything else (not found,
    /// unreadable, late, failed) is a miss and the request goes on.
    pub(crate) fn on_shared_answer(&mut self, token: u32, grpc_status: u32, size: usize) {
        match self.shared_lookup {
            Some((t, Lookup::Exact)) if t == token => {}
            Some((t, Lookup::Nearest)) if t == token => {
                self.on_nearest_answer(grpc_status, size);
                return;
            }
            _ => return,
        }
        self.shared_lookup = None;
        self.phase = Phase::ChatBody;
        let step = self.read_shared_answer(grpc_status, size).and_then(|hit| {
            if hit.is_none() && self.ask_semantic() {
                // Still waiting: for the prompt's embedding now.
                return Ok(Action::Pause);
            }
            self.resume_with_hit(hit)
        });
        if step.as_ref().is_ok_and(|a| *a == Action::Pause) && self.phase == Phase::SharedCache {
            return;
        }
        self.resume_with(step);
    }

    fn read_shared_answer(
        &mut self,
        grpc_status: u32,
        size: usize,
    ) -> Result<Option<(&'static str, Vec<u8>)>, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        let client = self.client(gw).ok_or_else(GatewayError::unknown_key)?;
        let (Some(cfg), Some(key)) = (
            gw.cache.as_ref(),
            self.flight.as_ref().and_then(|f| f.cache.fill),
        ) else {
            return Ok(None);
        };
        let now = self.host.now_ms();
        let found = if grpc_status == 0 {
            self.host
                .grpc_answer(size)
                .ok()
                .and_then(|b| fleet::decode_get(&b, &key, now, cfg.max_entry_bytes))
        } else {
            // Late or failed: a miss, counted apart.
            self.host.count(metrics::CACHE_SHARED_ERRORS, 1);
            None
        };
        let Some(Found { answer, expires_ms }) = found else {
            if grpc_status == 0 {
                self.host.count(metrics::CACHE_SHARED_MISSES, 1);
            }
            return Ok(None);
        };
        self.host.count(metrics::CACHE_SHARED_HITS, 1);
        // Kept here too: this Envoy answers the next one itself.
        let seen = self.flight.as_mut().and_then(|f| f.cache.seen.take());
        counted_store(
            &self.host,
            cache::insert_until(&self.host, cfg, &key, &answer, now, seen, expires_ms),
        );
        if let Some(f) = self.flight.as_mut() {
            if let Some(head) = f.cache.head.take() {
                local_put(
                    self.host.worker(),
                    &head,
                    f.chat.body(),
                    key,
                    &answer,
                    expires_ms,
                    now,
                );
            }
        }
        let hit = self.serve_stored(gw, client, answer, CacheStatus::HitShared, now)?;
        if hit.is_none() {
            // A stored answer this request cannot use: it goes to a
            // provider and its answer is stored again.
            if let Some(f) = self.flight.as_mut() {
                f.cache.fill = Some(key);
                f.cache.status = CacheStatus::Miss;
            }
        }
        Ok(hit)
    }

    /// Answer a hit: the stored answer with the gateway's headers. It spends
    /// no provider tokens: its record and metrics say 0.
    pub(crate) fn answer_hit(&mut self, content_type: &str, body: &[u8]) -> Action {
        let ours = self.gateway_headers();
        let mut hdrs: Vec<(&str, &[u8])> = vec![("content-type", content_type.as_bytes())];
        hdrs.extend(ours.pairs());
        self.send(200, &hdrs, body)
    }

    /// Store a complete, successful answer under the request's key.
    pub(crate) fn cache_store(&mut self, body: &[u8]) {
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(cfg) = loaded.gw.cache.as_ref() else {
            return;
        };
        let Some(f) = self.flight.as_mut() else {
            return;
        };
        let Some(key) = f.cache.fill.take() else {
            return;
        };
        let seen = f.cache.seen.take();
        let now = self.host.now_ms();
        if let Some(tier) = cfg.shared.as_ref() {
            if !body.is_empty() && body.len() <= cfg.max_entry_bytes {
                let entry = fleet::encode_entry(&key, body, now.saturating_add(cfg.ttl_ms));
                if !self
                    .host
                    .worker()
                    .queue_shared_put(fleet::PUT, entry, tier.queue_bytes)
                {
                    self.host.count(metrics::CACHE_SHARED_DROPPED, 1);
                }
                crate::cache::semantic::queue_put(
                    &self.host,
                    f.cache.semantic.as_ref(),
                    body,
                    now.saturating_add(cfg.ttl_ms),
                    tier,
                );
            }
        }
        let stored = cache::insert_seen(&self.host, cfg, &key, body, now, seen);
        if counted_store(&self.host, stored) {
            if let Some(head) = f.cache.head.take() {
                let expires = now.saturating_add(cfg.ttl_ms);
                local_put(
                    self.host.worker(),
                    &head,
                    f.chat.body(),
                    key,
                    body,
                    expires,
                    now,
                );
            }
        }
    }
}

/// A store in this Envoy's table, counted (stores, evictions, the bytes
/// gauge, answers too large) or logged; `true` when it was stored.
fn counted_store(
    host: &impl Host,
    outcome: Result<StoreOutcome, portcullis_core::shared::store::StoreError>,
) -> bool {
    match outcome {
        Ok(StoreOutcome::Stored(st)) => {
            host.count(metrics::CACHE_STORES, 1);
            if st.evicted {
                host.count(metrics::CACHE_EVICTIONS, 1);
            }
            if st.bytes_delta != 0 {
                host.add_to_gauge(metrics::CACHE_BYTES, st.bytes_delta);
            }
            true
        }
        Ok(StoreOutcome::TooLarge) => {
            host.count(metrics::CACHE_TOO_LARGE, 1);
            false
        }
        Err(e) => {
            host.log(LogLevel::Warn, &format!("cache store failed: {e:?}"));
            false
        }
    }
}

/// What a hit answers: the stored answer, or for a streamed request its
/// replay as SSE. One that cannot be replayed (tool calls, several choices)
/// is a miss for a stream.
fn hit_body(stored: Vec<u8>, stream: bool, include_usage: bool) -> Option<(&'static str, Vec<u8>)> {
    if stream {
        sse::replay(&stored, include_usage).map(|b| ("text/event-stream", b))
    } else {
        Some(("application/json", stored))
    }
}
