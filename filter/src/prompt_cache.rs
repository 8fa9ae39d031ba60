//! The prompt cache on the host: a lookup before any provider is reached
//! (a hit is answered here), and the store of a complete answer.

use crate::context::RequestContext;
use crate::host::Host;
use crate::metrics;
use portcullis_core::cache::{self, CacheStatus, Directive, StoreOutcome};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::sse;
use proxy_wasm::types::{Action, LogLevel};

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
        if self.request.messages_api && flight.chat.stream {
            // A stored answer is replayed as OpenAI's stream only.
            return Ok(None);
        }
        let name = gw.providers.get(*first).map_or("", |p| p.name.as_str());
        // Messages answers are stored apart: the same body to the same
        // provider is another answer in another shape.
        let messages_name;
        let first_name = if self.request.messages_api {
            messages_name = format!("messages:{name}");
            messages_name.as_str()
        } else {
            name
        };
        let scope = cfg.per_client.then_some(client.name.as_str());
        let key = cache::key(
            first_name,
            first_model_id,
            &flight.chat,
            cfg.normalize,
            scope,
        )?;
        flight.cache_fill = Some(key);
        flight.cache_status = CacheStatus::Refresh;
        if directive == Directive::Refresh {
            return Ok(None);
        }
        flight.cache_status = CacheStatus::Miss;
        let (stream, include_usage) = (flight.chat.stream, flight.chat.include_usage);
        let stored = match cache::lookup(&self.host, cfg, &key, now) {
            Ok(Some(stored)) => stored,
            Ok(None) => {
                self.host.count(metrics::CACHE_MISSES, 1);
                return Ok(None);
            }
            Err(e) => {
                self.host
                    .log(LogLevel::Warn, &format!("cache lookup failed: {e:?}"));
                return Ok(None);
            }
        };
        // The entry may come from a client with other output checks: this
        // client's run on it before it is replayed.
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
            f.cache_status = CacheStatus::Hit;
            f.cache_fill = None;
        }
        self.host.count(metrics::CACHE_HITS, 1);
        // A hit costs no tokens or budget, but it was a request.
        self.rate_headers_with_tokens(client, now);
        match denied {
            Some(e) => Err(e),
            None => Ok(answer),
        }
    }

    /// Answer a hit: the stored answer with the gateway's headers. It spends
    /// no provider tokens: its record and metrics say 0.
    pub(crate) fn answer_hit(&mut self, content_type: &str, body: &[u8]) -> Action {
        let ours = self.gateway_headers();
        let mut hdrs: Vec<(&str, &[u8])> = vec![("content-type", content_type.as_bytes())];
        hdrs.extend(ours.iter().map(|(k, v)| (*k, v.as_bytes())));
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
        let Some(key) = self.flight.as_mut().and_then(|f| f.cache_fill.take()) else {
            return;
        };
        match cache::insert(&self.host, cfg, &key, body, self.host.now_ms()) {
            Ok(StoreOutcome::Stored(st)) => {
                self.host.count(metrics::CACHE_STORES, 1);
                if st.evicted {
                    self.host.count(metrics::CACHE_EVICTIONS, 1);
                }
                if st.bytes_delta != 0 {
                    self.host.add_to_gauge(metrics::CACHE_BYTES, st.bytes_delta);
                }
            }
            Ok(StoreOutcome::TooLarge) => self.host.count(metrics::CACHE_TOO_LARGE, 1),
            Err(e) => self
                .host
                .log(LogLevel::Warn, &format!("cache store failed: {e:?}")),
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
