//! The prompt cache's step of a model call: it hands the cache
//! (`cache/`, which never sees the request's holder) the client's request
//! and the routed request, serves what it finds as the request's answer
//! (this client's output checks run on it), and keeps the fleet tier's
//! lookup in flight while the request waits (`Phase::SharedCache`).

use crate::cache;
use crate::host::metrics;
use crate::host::{Action, Host};
use crate::request::{Lookup, Phase, RequestContext};
use portcullis_core::cache::semantic::Near;
use portcullis_core::cache::CacheStatus;
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;

/// A hit to answer with: its content type and body.
type Hit = Option<(&'static str, Vec<u8>)>;

impl<H: Host> RequestContext<H> {
    /// Look the request up in the exact tiers here; a hit is the answer to
    /// send.
    pub(crate) fn cache_lookup(
        &mut self,
        gw: &Gateway,
        client: &Client,
        now: u64,
    ) -> Result<Hit, GatewayError> {
        let Some(flight) = self.flight.as_mut() else {
            return Ok(None);
        };
        let Some(stored) = cache::lookup(&self.host, gw, client, &self.request, flight, now)?
        else {
            return Ok(None);
        };
        let tier = if gw.cache.as_ref().is_some_and(|c| c.shared.is_some()) {
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
    fn serve_stored(
        &mut self,
        gw: &Gateway,
        client: &Client,
        stored: Vec<u8>,
        tier: CacheStatus,
        now: u64,
    ) -> Result<Hit, GatewayError> {
        let Some(flight) = self.flight.as_ref() else {
            return Ok(None);
        };
        if flight
            .output
            .as_ref()
            .is_some_and(|o| !o.vendors.is_empty())
        {
            // This client's vendor checks read its answers, and a stored
            // answer is not held for them: a miss, the provider's answer
            // checked (docs/vendor-guardrails.md).
            self.host.count(metrics::CACHE_MISSES, 1);
            return Ok(None);
        }
        let (stream, include_usage) = (flight.chat.stream, flight.chat.include_usage);
        let (answer, denied) = match self.check_whole_answer(&stored) {
            Ok(Some(redacted)) => (cache::hit_body(redacted, stream, include_usage), None),
            Ok(None) => (cache::hit_body(stored, stream, include_usage), None),
            Err(e) => (None, Some(e)),
        };
        if answer.is_none() && denied.is_none() {
            self.host.count(metrics::CACHE_MISSES, 1);
            return Ok(None);
        }
        if let Some(f) = self.flight.as_mut() {
            f.cache.served(tier);
        }
        self.host.count(metrics::CACHE_HITS, 1);
        // A hit costs no tokens or budget, but it was a request.
        self.rate_headers_with_tokens(gw, client, now);
        match denied {
            Some(e) => Err(e),
            None => Ok(answer),
        }
    }

    /// After a miss in this Envoy's cache: ask the fleet's tier. `true`:
    /// the request waits for the answer (`on_shared_answer`).
    pub(crate) fn ask_shared(&mut self, gw: &Gateway) -> bool {
        let Some(f) = self.flight.as_ref() else {
            return false;
        };
        match cache::ask_shared(&self.host, gw, self.loaded.as_deref(), f) {
            Some(token) => {
                self.shared_lookup = Some((token, Lookup::Exact));
                self.phase = Phase::SharedCache;
                true
            }
            None => false,
        }
    }

    /// The fleet tier's answer (`on_grpc_call_response` while waiting for
    /// it): a hit answers; anything else is a miss and the request goes on
    /// (to the semantic tier, when there is one).
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

    fn read_shared_answer(&mut self, grpc_status: u32, size: usize) -> Result<Hit, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        let client = self.client(gw).ok_or_else(GatewayError::unknown_key)?;
        let (Some(cfg), Some(f)) = (gw.cache.as_ref(), self.flight.as_mut()) else {
            return Ok(None);
        };
        let now = self.host.now_ms();
        let Some((key, answer)) = cache::read_shared(&self.host, cfg, f, (grpc_status, size), now)
        else {
            return Ok(None);
        };
        let hit = self.serve_stored(gw, client, answer, CacheStatus::HitShared, now)?;
        if hit.is_none() {
            // A stored answer this request cannot use: it goes to a
            // provider and its answer is stored again.
            if let Some(f) = self.flight.as_mut() {
                f.cache.missed(Some(key));
            }
        }
        Ok(hit)
    }

    /// After a miss in both exact tiers: ask for the prompt's embedding.
    /// `true`: the request waits for it.
    fn ask_semantic(&mut self) -> bool {
        let Some(loaded) = self.loaded.clone() else {
            return false;
        };
        let Some(f) = self.flight.as_mut() else {
            return false;
        };
        match cache::semantic::ask_embedding(&self.host, &loaded.gw, &self.request, f) {
            Some(token) => {
                self.shared_lookup = Some((token, Lookup::Embedding));
                self.phase = Phase::SharedCache;
                true
            }
            None => false,
        }
    }

    /// The prompt's embedding (the gateway's own answer): ask the fleet's
    /// tier for the nearest stored prompt, or go on (a miss).
    pub(crate) fn on_embedding_answer(&mut self, token: u32, body_size: usize) {
        if self.shared_lookup != Some((token, Lookup::Embedding)) {
            return;
        }
        self.shared_lookup = None;
        let loaded = self.loaded.clone();
        match cache::semantic::ask_nearest(
            &self.host,
            loaded.as_deref(),
            self.flight.as_mut(),
            body_size,
        ) {
            Some(token) => self.shared_lookup = Some((token, Lookup::Nearest)),
            None => self.semantic_done(None),
        }
    }

    /// The fleet's nearest stored prompt, or none.
    fn on_nearest_answer(&mut self, grpc_status: u32, size: usize) {
        self.shared_lookup = None;
        let loaded = self.loaded.clone();
        let found = cache::semantic::read_nearest(
            &self.host,
            loaded.as_deref(),
            self.flight.as_ref(),
            (grpc_status, size),
        );
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

    fn serve_near(&mut self, found: Option<Near>) -> Result<Hit, GatewayError> {
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
        let fill = self.flight.as_mut().and_then(|f| f.cache.take_fill());
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
                if let Some(f) = self.flight.as_mut() {
                    f.cache.semantic_hit(near.similarity_ppm, age_s);
                }
            }
            None => {
                // A stored answer this request cannot use (a stream of
                // tool calls): a miss, stored afresh.
                if let Some(f) = self.flight.as_mut() {
                    f.cache.missed(fill);
                }
                self.host.count(metrics::CACHE_SEMANTIC_MISSES, 1);
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
        let (Some(cfg), Some(f)) = (loaded.gw.cache.as_ref(), self.flight.as_mut()) else {
            return;
        };
        cache::store(&self.host, cfg, f, body);
    }
}
