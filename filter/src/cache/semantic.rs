//! The prompt cache's semantic tier on the host (`cache.semantic`): after
//! both exact tiers missed, an eligible request's prompt is embedded by a
//! request to the gateway itself (its own listener, under the client's
//! key: limited, priced and logged like any embeddings request), the
//! fleet's tier is asked for the nearest stored prompt of the same space,
//! and a hit answers as an exact one does (`hit-semantic`, with its
//! similarity and age). A fresh answer is stored under the embedding. Any
//! failure on the way is a miss: the request goes to its provider.

use crate::host::metrics;
use crate::host::worker::Worker;
use crate::host::{Host, LogLevel, Part};
use crate::request::flight::Semantic;
use crate::request::{Lookup, Phase, RequestContext};
use portcullis_core::cache::semantic::{self, Near};
use portcullis_core::cache::{fleet, CacheStatus, SemanticTier, SharedTier};
use portcullis_core::error::GatewayError;

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

impl<H: Host> RequestContext<H> {
    /// After a miss in both exact tiers: ask for the prompt's embedding,
    /// when the config has a semantic tier for this model and the request
    /// is eligible. `true`: the request waits for it.
    pub(crate) fn ask_semantic(&mut self) -> bool {
        let Some(loaded) = self.loaded.clone() else {
            return false;
        };
        let Some(cfg) = loaded.gw.cache.as_ref() else {
            return false;
        };
        let (Some(tier), Some(bearer)) = (cfg.semantic.as_ref(), self.request.bearer.clone())
        else {
            return false;
        };
        let Some(f) = self
            .flight
            .as_ref()
            .filter(|f| f.cache.status == CacheStatus::Miss)
        else {
            return false;
        };
        if !tier
            .models
            .iter()
            .any(|m| *m == f.chat.model || *m == f.model_name)
        {
            return false;
        }
        let Some(prompt) = semantic::prompt(&f.chat, tier.multi_turn) else {
            self.host.count(metrics::CACHE_SEMANTIC_INELIGIBLE, 1);
            return false;
        };
        let Some((first, model_id)) = f.candidates.first() else {
            return false;
        };
        let route = loaded
            .gw
            .providers
            .get(*first)
            .map_or("", |p| p.name.as_str());
        let Some(client) = self.client(&loaded.gw) else {
            return false;
        };
        let team = client
            .team
            .and_then(|t| loaded.gw.teams.get(t))
            .map(|t| t.name.as_str());
        let scope = tier.scope.owner(&client.name, team, cfg.per_client);
        let space = semantic::space(route, model_id, scope.as_deref(), tier, &prompt);
        let body = semantic::embedding_request(tier, &prompt.text);
        let authority = if self.request.authority.is_empty() {
            "portcullis"
        } else {
            self.request.authority.as_str()
        };
        let headers = [
            (":method", "POST"),
            (":path", semantic::EMBEDDINGS_PATH),
            (":authority", authority),
            ("content-type", "application/json"),
            ("authorization", bearer.as_str()),
        ];
        match self
            .host
            .dispatch(&tier.cluster, &headers, &body, tier.timeout_ms)
        {
            Ok(token) => {
                self.host.count(metrics::CACHE_SEMANTIC_LOOKUPS, 1);
                if let Some(f) = self.flight.as_mut() {
                    f.cache.semantic = Some(Semantic {
                        space,
                        vector: None,
                        hit: None,
                    });
                }
                self.shared_lookup = Some((token, Lookup::Embedding));
                self.phase = Phase::SharedCache;
                true
            }
            Err(s) => {
                self.host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
                self.host.log(
                    LogLevel::Warn,
                    &format!(
                        "cannot call cluster `{}` (cache.semantic): {s:?}",
                        tier.cluster
                    ),
                );
                false
            }
        }
    }

    /// The prompt's embedding (the gateway's own answer): ask the fleet's
    /// tier for the nearest stored prompt, or go on (a miss).
    pub(crate) fn on_embedding_answer(&mut self, token: u32, body_size: usize) {
        if self.shared_lookup != Some((token, Lookup::Embedding)) {
            return;
        }
        self.shared_lookup = None;
        let status = self.host.headers(Part::CallResponse).ok().and_then(|h| {
            h.get(":status")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u16>().ok())
        });
        let vector = (status == Some(200))
            .then(|| self.host.body(Part::CallResponse, body_size).ok())
            .flatten()
            .and_then(|b| semantic::read_embedding(&b));
        let tiers = self.loaded.clone().and_then(|l| {
            let c = l.gw.cache.as_ref()?;
            Some((c.shared.clone()?, c.semantic.clone()?))
        });
        let (Some(vector), Some((shared, tier))) = (vector, tiers) else {
            self.host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
            self.host.log(
                LogLevel::Warn,
                &format!("cache.semantic: no embedding (status {status:?}); a miss"),
            );
            return self.semantic_done(None);
        };
        let Some(space) = self.flight.as_mut().and_then(|f| {
            let s = f.cache.semantic.as_mut()?;
            s.vector = Some(vector.clone());
            Some(s.space)
        }) else {
            return self.semantic_done(None);
        };
        if self.ask_nearest(&shared, &tier, &space, &vector) {
            return;
        }
        self.semantic_done(None);
    }

    fn ask_nearest(
        &mut self,
        shared: &SharedTier,
        tier: &SemanticTier,
        space: &[u8; 32],
        vector: &[f32],
    ) -> bool {
        let owned = crate::loaded::limiter_metadata(self.loaded.as_deref());
        let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        let message = semantic::encode_nearest(space, vector, tier.threshold_ppm);
        match self.host.dispatch_grpc(
            &shared.cluster,
            fleet::SERVICE,
            semantic::NEAREST,
            &metadata,
            &message,
            shared.timeout_ms,
        ) {
            Ok(token) => {
                self.shared_lookup = Some((token, Lookup::Nearest));
                true
            }
            Err(_) => {
                self.host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
                false
            }
        }
    }

    /// The fleet's nearest stored prompt, or none.
    pub(crate) fn on_nearest_answer(&mut self, grpc_status: u32, size: usize) {
        self.shared_lookup = None;
        let now = self.host.now_ms();
        let found = match (grpc_status, self.loaded.clone()) {
            (0, Some(l)) => {
                let max = l.gw.cache.as_ref().map_or(0, |c| c.max_entry_bytes);
                let threshold =
                    l.gw.cache
                        .as_ref()
                        .and_then(|c| c.semantic.as_ref())
                        .map_or(u32::MAX, |t| t.threshold_ppm);
                let space = self
                    .flight
                    .as_ref()
                    .and_then(|f| Some(f.cache.semantic.as_ref()?.space));
                match (self.host.grpc_answer(size), space) {
                    (Ok(b), Some(space)) => {
                        semantic::decode_nearest(&b, &space, threshold, now, max)
                    }
                    _ => None,
                }
            }
            _ => {
                self.host.count(metrics::CACHE_SEMANTIC_ERRORS, 1);
                None
            }
        };
        self.semantic_done(found);
    }

    /// The semantic lookup ended: serve a near-duplicate's answer, or go
    /// on to the provider; either way the request resumes.
    fn semantic_done(&mut self, found: Option<Near>) {
        self.phase = Phase::ChatBody;
        let step = self
            .serve_near(found)
            .and_then(|hit| self.resume_with_hit(hit));
        self.resume_with(step);
    }

    fn serve_near(
        &mut self,
        found: Option<Near>,
    ) -> Result<Option<(&'static str, Vec<u8>)>, GatewayError> {
        let Some(near) = found else {
            self.host.count(metrics::CACHE_SEMANTIC_MISSES, 1);
            return Ok(None);
        };
        let loaded = self.loaded()?;
        let client = self
            .client(&loaded.gw)
            .ok_or_else(GatewayError::unknown_key)?;
        let now = self.host.now_ms();
        // Kept for later: what the hit replaces is not stored under the
        // request's exact key (another prompt's answer is not this one's).
        let fill = self.flight.as_mut().and_then(|f| f.cache.fill.take());
        let hit = self.serve_stored(
            &loaded.gw,
            client,
            near.answer,
            CacheStatus::HitSemantic,
            now,
        )?;
        match hit {
            Some(_) => {
                self.host.count(metrics::CACHE_SEMANTIC_HITS, 1);
                let age_s = now.saturating_sub(near.stored_ms) / 1000;
                if let Some(s) = self.flight.as_mut().and_then(|f| f.cache.semantic.as_mut()) {
                    s.hit = Some((near.similarity_ppm, age_s));
                    // Nothing to store under the embedding either.
                    s.vector = None;
                }
            }
            None => {
                // A stored answer this request cannot use (a stream of
                // tool calls): a miss, stored afresh.
                if let Some(f) = self.flight.as_mut() {
                    f.cache.fill = fill;
                    f.cache.status = CacheStatus::Miss;
                }
                self.host.count(metrics::CACHE_SEMANTIC_MISSES, 1);
            }
        }
        Ok(hit)
    }
}
