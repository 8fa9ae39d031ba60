//! The prompt cache on the request path: exact lookups and stores (this
//! file) and the semantic tier (`semantic`: a prompt's embedding, the
//! nearest answer above the threshold).
//!
//! May use: `host`, `loaded`, `request`.
//!
//! The prompt cache on the host: a lookup before any provider is reached,
//! and the store of a complete answer. These are functions over the parts
//! a step hands them (the client's request, the routed request with its
//! cache part); the model call's cache step (`llm::cache`) serves a hit
//! and keeps the fleet tier's lookup in flight.

pub mod semantic;

use crate::host::metrics;
use crate::host::worker::Worker;
use crate::host::Host;
use crate::host::LogLevel;
use crate::request::flight::Flight;
use crate::request::ClientRequest;
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

/// This worker's copy of an answer stored or found, when the request
/// may keep one (its first-level key's head is set).
fn keep_copy(
    host: &impl Host,
    flight: &mut Flight,
    key: Hash,
    answer: &[u8],
    expires_ms: u64,
    now: u64,
) {
    if let Some(head) = flight.cache.head.take() {
        local_put(
            host.worker(),
            &head,
            flight.chat.body(),
            key,
            answer,
            expires_ms,
            now,
        );
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

/// The exact tiers' lookup of a request: this worker's copy, then this
/// Envoy's table; a stored answer to serve, or `None` (a miss, the cache
/// off or bypassed). The key is the model and the first provider of its
/// chain (the resolved route), whichever provider would answer: a hit
/// needs no breaker read. Handed the client's request (its
/// `cache-control`, its API) and the routed request, whose cache part it
/// writes (the key to store under, the status, the table's index as read).
pub(crate) fn lookup(
    host: &impl Host,
    gw: &Gateway,
    client: &Client,
    request: &ClientRequest,
    flight: &mut Flight,
    now: u64,
) -> Result<Option<Vec<u8>>, GatewayError> {
    let Some(cfg) = gw.cache.as_ref() else {
        return Ok(None);
    };
    let directive = cache::directive(request.cache_control.as_deref());
    if directive == Directive::Bypass {
        return Ok(None);
    }
    let Some((first, first_model_id)) = flight.candidates.first() else {
        return Ok(None);
    };
    let api = request.api;
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
        .and_then(|h| local_get(host.worker(), h, flight.chat.body(), now));
    if let Some((key, answer)) = local {
        flight.cache.fill = Some(key);
        flight.cache.status = CacheStatus::Miss;
        host.count(metrics::CACHE_WORKER_HITS, 1);
        return Ok(Some(answer));
    }
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
    match cache::lookup_seen(host, cfg, &key, now) {
        Ok((Some(Found { answer, expires_ms }), _)) => {
            keep_copy(host, flight, key, &answer, expires_ms, now);
            Ok(Some(answer))
        }
        Ok((None, seen)) => {
            flight.cache.seen = Some(seen);
            host.count(metrics::CACHE_MISSES, 1);
            Ok(None)
        }
        Err(e) => {
            host.log(LogLevel::Warn, &format!("cache lookup failed: {e:?}"));
            Ok(None)
        }
    }
}

/// After a miss in this Envoy's cache: ask the fleet's tier, when the
/// config has one and the request may be served from a cache. `Some`: the
/// call's token; the request waits for its answer ([`read_shared`]).
pub(crate) fn ask_shared(
    host: &impl Host,
    gw: &Gateway,
    loaded: Option<&crate::loaded::Loaded>,
    flight: &Flight,
) -> Option<u32> {
    let tier = gw.cache.as_ref().and_then(|c| c.shared.as_ref())?;
    let key = Some(flight)
        .filter(|f| f.cache.status == CacheStatus::Miss)
        .and_then(|f| f.cache.fill)?;
    let owned = crate::loaded::limiter_metadata(loaded);
    let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    match host.dispatch_grpc(
        &tier.cluster,
        fleet::SERVICE,
        fleet::GET,
        &metadata,
        &fleet::encode_get(&key),
        tier.timeout_ms,
    ) {
        Ok(token) => Some(token),
        Err(s) => {
            host.count(metrics::CACHE_SHARED_ERRORS, 1);
            host.log(
                LogLevel::Warn,
                &format!(
                    "cannot call cluster `{}` (cache.shared): {s:?}",
                    tier.cluster
                ),
            );
            None
        }
    }
}

/// The fleet tier's answer: a hit is kept here too (this Envoy's table,
/// this worker's copy) and returned with its key; anything else (not
/// found, unreadable, late, failed) is a miss.
pub(crate) fn read_shared(
    host: &impl Host,
    cfg: &CacheConfig,
    flight: &mut Flight,
    (grpc_status, size): (u32, usize),
    now: u64,
) -> Option<(Hash, Vec<u8>)> {
    let key = flight.cache.fill?;
    let found = if grpc_status == 0 {
        host.grpc_answer(size)
            .ok()
            .and_then(|b| fleet::decode_get(&b, &key, now, cfg.max_entry_bytes))
    } else {
        // Late or failed: a miss, counted apart.
        host.count(metrics::CACHE_SHARED_ERRORS, 1);
        None
    };
    let Some(Found { answer, expires_ms }) = found else {
        if grpc_status == 0 {
            host.count(metrics::CACHE_SHARED_MISSES, 1);
        }
        return None;
    };
    host.count(metrics::CACHE_SHARED_HITS, 1);
    // Kept here too: this Envoy answers the next one itself.
    let seen = flight.cache.seen.take();
    counted_store(
        host,
        cache::insert_until(host, cfg, &key, &answer, now, seen, expires_ms),
    );
    keep_copy(host, flight, key, &answer, expires_ms, now);
    Some((key, answer))
}

/// Store a complete, successful answer under the request's key (this
/// Envoy's table, this worker's copy, the fleet's tier when there is one).
pub(crate) fn store(host: &impl Host, cfg: &CacheConfig, flight: &mut Flight, body: &[u8]) {
    let Some(key) = flight.cache.fill.take() else {
        return;
    };
    let seen = flight.cache.seen.take();
    let now = host.now_ms();
    if let Some(tier) = cfg.shared.as_ref() {
        if !body.is_empty() && body.len() <= cfg.max_entry_bytes {
            let entry = fleet::encode_entry(&key, body, now.saturating_add(cfg.ttl_ms));
            if !host
                .worker()
                .queue_shared_put(fleet::PUT, entry, tier.queue_bytes)
            {
                host.count(metrics::CACHE_SHARED_DROPPED, 1);
            }
            crate::cache::semantic::queue_put(
                host,
                flight.cache.semantic.as_ref(),
                body,
                now.saturating_add(cfg.ttl_ms),
                tier,
            );
        }
    }
    let stored = cache::insert_seen(host, cfg, &key, body, now, seen);
    if counted_store(host, stored) {
        keep_copy(host, flight, key, body, now.saturating_add(cfg.ttl_ms), now);
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
pub(crate) fn hit_body(
    stored: Vec<u8>,
    stream: bool,
    include_usage: bool,
) -> Option<(&'static str, Vec<u8>)> {
    if stream {
        sse::replay(&stored, include_usage).map(|b| ("text/event-stream", b))
    } else {
        Some(("application/json", stored))
    }
}
