//! The prompt cache's semantic tier on the host (`cache.semantic`): after
//! both exact tiers missed, an eligible request's prompt is embedded by a
//! request to the gateway itself (its own listener, under the client's
//! key: limited, priced and logged like any embeddings request), the
//! fleet's tier is asked for the nearest stored prompt of the same space,
//! and a hit answers as an exact one does (`hit-semantic`, with its
//! similarity and age). A fresh answer is stored under the embedding. Any
//! failure on the way is a miss: the request goes to its provider. The
//! model call's cache step (`llm::cache`) makes the calls wait and serves
//! the hit; these functions are handed its parts.

use crate::host::metrics;
use crate::host::worker::Worker;
use crate::host::{Host, LogLevel, Part};
use crate::loaded::Loaded;
use crate::request::flight::{Flight, Semantic};
use crate::request::ClientRequest;
use portcullis_core::cache::semantic::{self, Near};
use portcullis_core::cache::{fleet, CacheStatus, SharedTier};
use portcullis_core::config::Gateway;

/// Queue a fresh answer under its prompt's embedding, when the request
/// had one (a semantic miss).
pub fn queue_put(
    host: &impl Host,
    s: Option<&Semantic>,
    answer: &[u8],
    expires_ms: u64,
    tier: &SharedTier,
) {
    let Some((s, vector)) = s.and_then(|s| Some((s, s.vector.as_ref()?))) else {
        return;
    };
    let entry = semantic::encode_vector_entry(&s.space, vector, answer, expires_ms);
    let w: &Worker = host.worker();
    if !w.queue_shared_put(semantic::PUT_VECTORS, entry, tier.queue_bytes) {
        host.count(metrics::CACHE_SHARED_DROPPED, 1);
    }
}

/// After a miss in both exact tiers: ask the gateway for the prompt's
/// embedding, when the config has a semantic tier for this model and the
/// request is eligible. `Some`: the call's token (the routed request's
/// semantic view is set); the request waits for it ([`ask_nearest`]).
pub(crate) fn ask_embedding(
    host: &impl Host,
    gw: &Gateway,
    request: &ClientRequest,
    flight: &mut Flight,
) -> Option<u32> {
    let cfg = gw.cache.as_ref()?;
    let (Some(tier), Some(bearer)) = (cfg.semantic.as_ref(), request.bearer.as_deref()) else {
        return None;
    };
    if flight.cache.status != CacheStatus::Miss {
        return None;
    }
    if !tier
        .models
        .iter()
        .any(|m| *m == flight.chat.model || *m == flight.model_name)
    {
        return None;
    }
    let Some(prompt) = semantic::prompt(&flight.chat, tier.multi_turn) else {
        host.count(metrics::CACHE_SEMANTIC_INELIGIBLE, 1);
        return None;
    };
    let (first, model_id) = flight.candidates.first()?;
    let route = gw.providers.get(*first).map_or("", |p| p.name.as_str());
    let client = request.client(gw)?;
    let team = client
        .team
        .and_then(|t| gw.teams.get(t))
        .map(|t| t.name.as_str());
    let scope = tier.scope.owner(&client.name, team, cfg.per_client);
    let space = semantic::space(route, model_id, scope.as_deref(), tier, &prompt);
    let body = semantic::embedding_request(tier, &prompt.text);
    let authority = if request.authority.is_empty() {
        "portcullis"
    } else {
        request.authority.as_str()
    };
    let headers = [
        (":method", "POST"),
        (":path", semantic::EMBEDDINGS_PATH),
        (":authority", authority),
        ("content-type", "application/json"),
        ("authorization", bearer),
    ];
    match host.dispatch(&tier.cluster, &headers, &body, tier.timeout_ms) {
        Ok(token) => {
            host.count(metrics::CACHE_SEMANTIC_LOOKUPS, 1);
            flight.cache.semantic = Some(Semantic {
                space,
                vector: None,
                hit: None,
            });
            Some(token)
        }
        Err(s) => {
            host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
            host.log(
                LogLevel::Warn,
                &format!(
                    "cannot call cluster `{}` (cache.semantic): {s:?}",
                    tier.cluster
                ),
            );
            None
        }
    }
}

/// The prompt's embedding (the gateway's own answer): kept in the routed
/// request's semantic view, and the fleet's tier asked for the nearest
/// stored prompt. `Some`: that call's token; `None`: a miss.
pub(crate) fn ask_nearest(
    host: &impl Host,
    loaded: Option<&Loaded>,
    flight: Option<&mut Flight>,
    body_size: usize,
) -> Option<u32> {
    let status = host.headers(Part::CallResponse).ok().and_then(|h| {
        h.get(":status")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
    });
    let vector = (status == Some(200))
        .then(|| host.body(Part::CallResponse, body_size).ok())
        .flatten()
        .and_then(|b| semantic::read_embedding(&b));
    let tiers = loaded.and_then(|l| {
        let c = l.gw.cache.as_ref()?;
        Some((c.shared.as_ref()?, c.semantic.as_ref()?))
    });
    let (Some(vector), Some((shared, tier))) = (vector, tiers) else {
        host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
        host.log(
            LogLevel::Warn,
            &format!("cache.semantic: no embedding (status {status:?}); a miss"),
        );
        return None;
    };
    let s = flight?.cache.semantic.as_mut()?;
    s.vector = Some(vector);
    let owned = crate::loaded::limiter_metadata(loaded);
    let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
    let message = semantic::encode_nearest(&s.space, s.vector.as_deref()?, tier.threshold_ppm);
    match host.dispatch_grpc(
        &shared.cluster,
        fleet::SERVICE,
        semantic::NEAREST,
        &metadata,
        &message,
        shared.timeout_ms,
    ) {
        Ok(token) => Some(token),
        Err(_) => {
            host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
            None
        }
    }
}

/// The fleet's nearest stored prompt, or none.
pub(crate) fn read_nearest(
    host: &impl Host,
    loaded: Option<&Loaded>,
    flight: Option<&Flight>,
    (grpc_status, size): (u32, usize),
) -> Option<Near> {
    let now = host.now_ms();
    match (grpc_status, loaded) {
        (0, Some(l)) => {
            let max = l.gw.cache.as_ref().map_or(0, |c| c.max_entry_bytes);
            let threshold =
                l.gw.cache
                    .as_ref()
                    .and_then(|c| c.semantic.as_ref())
                    .map_or(u32::MAX, |t| t.threshold_ppm);
            let space = flight.and_then(|f| Some(f.cache.semantic.as_ref()?.space));
            match (host.grpc_answer(size), space) {
                (Ok(b), Some(space)) => semantic::decode_nearest(&b, &space, threshold, now, max),
                _ => None,
            }
        }
        _ => {
            host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
            None
        }
    }
}
