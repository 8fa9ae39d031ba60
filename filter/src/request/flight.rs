//! A routed request across its attempts: which providers it may still try
//! (open breakers are skipped without spending an attempt), which it tried,
//! and what its answer is for (the cache, the usage chunk).

use crate::health::breakers;
use crate::host::metrics;
use crate::host::Host;
use crate::request::guard::OutputGuard;
use crate::request::reading::Reader;
use portcullis_core::cache::{CacheStatus, Hash};
use portcullis_core::config::Gateway;
use portcullis_core::health::attempt::{Cause, Skip};
use portcullis_core::health::breaker::Admission;
use portcullis_core::limits::ratelimit::Price;
use portcullis_core::request::ChatRequest;
use portcullis_core::translate;

/// The provider currently tried, and whether it is a half-open probe.
#[derive(Debug, Clone)]
pub struct Current {
    pub provider: usize,
    pub probe: bool,
    pub reported: bool,
    /// The breaker was closed with nothing counted when this attempt began.
    pub clean: bool,
    /// The provider's model id (the latency key of `fastest`).
    pub model_id: String,
    /// When it was sent (the clock read that admitted it).
    pub started_ms: u64,
    /// Its number among the request's attempts (1 for the first): its span.
    pub n: u32,
    /// Counted in the provider's requests in flight (`least_busy`).
    pub busy: bool,
    /// Holds a slot of the provider's adaptive concurrency.
    pub slot: bool,
}

impl Current {
    /// The attempt is over: the provider has one request fewer in flight.
    pub fn release_busy(&mut self, host: &impl Host, gw: &Gateway) {
        let Some(p) = gw.providers.get(self.provider) else {
            return;
        };
        if std::mem::take(&mut self.busy) {
            crate::health::load::add_busy(host, &p.name, -1);
        }
        if std::mem::take(&mut self.slot) {
            crate::health::concurrency::release(host, p);
        }
    }
}

/// A pending fallback callout.
#[derive(Debug, Clone, Copy)]
pub struct Call {
    pub token: u32,
    pub started_ms: u64,
    pub timeout_ms: u64,
}

/// How the answering provider's answer becomes the pivot's shape.
pub enum Translation {
    /// A whole answer (or error) of this status, translated at its end by
    /// the provider's format.
    Whole { status: u16, back: translate::Back },
    /// A stream, translated event by event.
    Stream(Box<translate::Stream>),
}

pub struct Flight {
    pub chat: ChatRequest,
    /// The answer is a response a provider keeps: remember which provider
    /// made it (read from its first bytes).
    pub remember_response: bool,
    /// Tries Envoy's retries added to the attempts (not counted against
    /// `max_attempts`, which counts providers).
    pub retried: u32,
    /// The router's answer is held whole until its end (output checks, a
    /// translation).
    pub hold: bool,
    pub translation: Option<Translation>,
    /// Fields the answering provider could not honour and were dropped.
    pub dropped: Vec<String>,
    /// After a `context_length` failure: only candidates with a larger
    /// context window than this are tried.
    pub min_context: Option<u64>,
    /// A 4xx from the router held until its body tells its class.
    pub refusal: Option<u16>,
    /// The current attempt's `Retry-After`, in ms (adaptive concurrency).
    pub retry_after_ms: Option<u64>,
    /// The resolved model's index.
    pub model: usize,
    /// Input checks rewrote the prompt: every provider gets the new body.
    pub rewritten: bool,
    pub output: Option<OutputGuard>,
    /// The model's public name.
    pub model_name: String,
    /// (provider index, provider's model id), in the order they are tried.
    pub candidates: Vec<(usize, String)>,
    next_candidate: usize,
    pub attempts: u32,
    pub tried: Vec<(String, Cause)>,
    /// Per entry of `tried`: its attempt number, when it was sent and when
    /// it ended.
    pub tried_at: Vec<(u32, u64, u64)>,
    pub skipped: Vec<(String, u64, Skip)>,
    pub current: Option<Current>,
    /// The status the current provider answered with, when it was not a
    /// retryable failure (that answer goes to the client).
    pub answered: Option<u16>,
    pub call: Option<Call>,
    /// The prompt cache's part (`cache/` reads and writes it).
    pub cache: CacheState,
    /// The gateway asks a streaming provider for the usage chunk the client
    /// did not ask for; it is read, then dropped from what the client gets.
    pub usage_chunk: bool,
    /// (experiment, arm) when an experiment chose the model.
    pub experiment: Option<(String, String)>,
    pub price: Option<Price>,
    /// What the request builder keeps across attempts (`upstream/`).
    pub upstream: UpstreamState,
    /// How the answer on its way is read (usage, cache, content).
    pub reader: Option<Reader>,
    /// The completion cap a level in `clamp` mode holds the answer to, and
    /// the prompt estimate (for the usage of a stream ended at it).
    pub cap: Option<(u64, u64)>,
    /// A low budget sent the request to a cheaper model (`on_budget_low`).
    pub budget_routed: bool,
    /// A stream held to `cap` as it passes.
    pub stream_cap: Option<portcullis_core::limits::stream_cap::StreamCap>,
    /// A success passing through, scrubbed of the provider's key as it
    /// goes (`secrets::Scrubber`, same length).
    pub scrubber: Option<portcullis_core::credentials::secrets::Scrubber>,
}

impl Flight {
    /// The current attempt's `traceparent` in `trace`: the trace's, with
    /// the attempt's own span id (none without a trace or an attempt).
    pub fn traceparent(
        &self,
        trace: Option<&portcullis_core::telemetry::trace::Trace>,
    ) -> Option<String> {
        Some(trace?.traceparent(self.current.as_ref()?.n))
    }

    /// The index of the provider that answered (a cache hit: the first
    /// candidate's).
    pub fn answering(&self) -> Option<usize> {
        if self.cache.status.is_hit() {
            Some(self.candidates.first()?.0)
        } else {
            Some(self.current.as_ref()?.provider)
        }
    }

    pub fn new(
        chat: ChatRequest,
        model: usize,
        model_name: String,
        candidates: Vec<(usize, String)>,
        experiment: Option<(String, String)>,
        price: Option<Price>,
    ) -> Self {
        Self {
            chat,
            retried: 0,
            remember_response: false,
            min_context: None,
            refusal: None,
            retry_after_ms: None,
            hold: false,
            translation: None,
            dropped: Vec::new(),
            model,
            rewritten: false,
            output: None,
            model_name,
            candidates,
            next_candidate: 0,
            attempts: 0,
            tried: Vec::new(),
            tried_at: Vec::new(),
            skipped: Vec::new(),
            current: None,
            answered: None,
            call: None,
            cache: CacheState::default(),
            usage_chunk: false,
            experiment,
            price,
            upstream: UpstreamState::default(),
            reader: None,
            cap: None,
            budget_routed: false,
            stream_cap: None,
            scrubber: None,
        }
    }

    /// The current attempt failed at `now` for `cause`.
    pub fn tried_current(&mut self, provider: String, cause: Cause, now: u64) {
        let (n, start) = self
            .current
            .as_ref()
            .map_or((0, 0), |c| (c.n, c.started_ms));
        self.tried.push((provider, cause));
        self.tried_at.push((n, start, now));
    }

    /// The context window a provider serves this flight's model with.
    pub fn context_of(&self, gw: &Gateway, provider: usize) -> Option<u64> {
        gw.models
            .get(self.model)?
            .serving
            .iter()
            .find(|s| s.provider == provider)?
            .context_window
    }

    /// The next candidate whose breaker admits a request, within the
    /// attempt budget.
    pub fn admit_next(
        &mut self,
        host: &impl Host,
        gw: &Gateway,
        now: u64,
    ) -> Option<(usize, String)> {
        while self.attempts < gw.max_attempts {
            let (idx, model_id) = self.candidates.get(self.next_candidate)?.clone();
            self.next_candidate = self.next_candidate.saturating_add(1);
            let p = gw.providers.get(idx)?;
            if let (Some(min), Some(w)) = (self.min_context, self.context_of(gw, idx)) {
                if w <= min {
                    continue; // no more context than the one that was too small
                }
            }
            // Paused or at its concurrency limit: skipped like an open breaker.
            if let Err(wait_ms) = crate::health::concurrency::admit(host, p, now) {
                host.count(&metrics::skipped_busy(&p.name), 1);
                self.skipped.push((p.name.clone(), wait_ms, Skip::Busy));
                continue;
            }
            let slot = p.concurrency.is_some();
            match breakers::admit(host, p, now) {
                (Admission::Refused { retry_after_ms }, _) => {
                    if slot {
                        crate::health::concurrency::release(host, p);
                    }
                    host.count(&metrics::skipped_open(&p.name), 1);
                    self.skipped
                        .push((p.name.clone(), retry_after_ms, Skip::Open));
                }
                (adm, clean) => {
                    self.attempts = self.attempts.saturating_add(1);
                    let busy = gw.policy.uses_busy;
                    if busy {
                        crate::health::load::add_busy(host, &p.name, 1);
                    }
                    if let Some(prev) = self.current.as_mut() {
                        prev.release_busy(host, gw);
                    }
                    self.current = Some(Current {
                        provider: idx,
                        probe: adm == Admission::Probe,
                        reported: false,
                        clean,
                        model_id: model_id.clone(),
                        started_ms: now,
                        n: self.attempts,
                        busy,
                        slot,
                    });
                    return Some((idx, model_id));
                }
            }
        }
        None
    }
}

/// What the request builder keeps across a request's attempts (only
/// `upstream/` reads and writes it).
#[derive(Default)]
pub struct UpstreamState {
    /// The client's headers every fallback sends, read at the first one.
    pub forwarded: Option<Vec<(String, String)>>,
    /// The provider whose access token this request is fetching.
    pub token_provider: Option<String>,
}

/// The prompt cache's part of a routed request: what the lookup found and
/// what the store needs. Only `cache/` writes its fields; the model call's
/// steps say what happened through its methods ([`CacheState::forget`],
/// [`CacheState::served`], [`CacheState::missed`]).
#[derive(Default)]
pub struct CacheState {
    pub status: CacheStatus,
    /// Set when the answer is to be stored in the cache, under this key.
    pub fill: Option<Hash>,
    /// The set's index as the lookup read it: the store starts from it.
    pub seen: Option<portcullis_core::cache::Seen>,
    /// The route and scope part of the worker's first-level key (set when
    /// the answer may be held there once stored).
    pub head: Option<Vec<u8>>,
    /// The semantic tier's view of the request (`cache.semantic`): its
    /// space, then its embedding (what a fresh answer is stored under),
    /// then, on a hit, how similar and how old the answer was.
    pub semantic: Option<Semantic>,
}

impl CacheState {
    /// Whether the answer is to be stored.
    pub fn will_store(&self) -> bool {
        self.fill.is_some()
    }

    /// The answer is not to be stored (an error, a denied or changed
    /// answer); `true` when it was to be.
    pub fn forget(&mut self) -> bool {
        self.fill.take().is_some()
    }

    /// A stored answer serves the request (`tier` says which): nothing to
    /// store.
    pub fn served(&mut self, tier: CacheStatus) {
        self.status = tier;
        self.fill = None;
    }

    /// A stored answer the request could not use: a miss after all, its
    /// answer stored afresh under `key`.
    pub fn missed(&mut self, key: Option<Hash>) {
        self.fill = key;
        self.status = CacheStatus::Miss;
    }

    /// The key the answer is to be stored under, taken (a near-duplicate's
    /// answer is not stored under this prompt's key).
    pub fn take_fill(&mut self) -> Option<Hash> {
        self.fill.take()
    }

    /// A semantic hit: how similar (millionths) and how old (seconds);
    /// nothing to store under the embedding.
    pub fn semantic_hit(&mut self, similarity_ppm: u32, age_s: u64) {
        if let Some(s) = self.semantic.as_mut() {
            s.hit = Some((similarity_ppm, age_s));
            s.vector = None;
        }
    }
}

/// The semantic tier's view of a request (`cache.semantic`).
#[derive(Debug, Clone)]
pub struct Semantic {
    /// The space its prompt is compared in.
    pub space: portcullis_core::cache::Hash,
    /// The prompt's embedding, once the gateway has it.
    pub vector: Option<Vec<f32>>,
    /// A hit's similarity (millionths) and the answer's age (seconds).
    pub hit: Option<(u32, u64)>,
}
