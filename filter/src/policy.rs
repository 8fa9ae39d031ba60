//! The routing-policy step: a conditional route may send the request to
//! another model or strategy; the strategy orders the candidates (from the
//! latencies and requests in flight in shared data); a client allowed to
//! may pin one provider. Also the shared state the strategies read:
//! latencies (after each success) and requests in flight per provider.

use crate::context::RequestContext;
use crate::host::Host;
use portcullis_core::config::Gateway;
use portcullis_core::error::GatewayError;
use portcullis_core::keys;
use portcullis_core::ratelimit::decode_i64;
use portcullis_core::request::Document;
use portcullis_core::routing::{candidate_price, strategy_for};
use portcullis_core::store::update;
use portcullis_core::strategy::{self, Candidate, Request, Rule, Strategy};
use std::cell::RefCell;
use std::collections::HashMap;

thread_local! {
    /// The strategies' reads of shared data, by key, with when they were
    /// read: served from here for `READ_TTL_MS` (each read is a host call;
    /// a few milliseconds of staleness does not change an order much).
    static READS: RefCell<HashMap<String, (i64, u64)>> = RefCell::new(HashMap::new());
}

const READ_TTL_MS: u64 = 100;
/// Entries kept at most (keys of providers and models; a reload can leave
/// old ones behind).
const READS_MAX: usize = 4096;

fn cached(host: &impl Host, key: &str, now_ms: u64) -> Option<i64> {
    let hit = READS.with(|r| {
        r.borrow()
            .get(key)
            .filter(|(_, at)| now_ms.saturating_sub(*at) < READ_TTL_MS)
            .map(|(v, _)| *v)
    });
    if hit.is_some() {
        return hit;
    }
    let v = match host.get(key) {
        Ok((Some(v), _)) => Some(decode_i64(Some(&v))),
        _ => None,
    }?;
    remember(key, v, now_ms);
    Some(v)
}

fn remember(key: &str, v: i64, now_ms: u64) {
    READS.with(|r| {
        let mut r = r.borrow_mut();
        if r.len() >= READS_MAX {
            r.clear();
        }
        r.insert(key.to_string(), (v, now_ms));
    });
}

/// Where a conditional route sends a request.
pub struct Routed<'g> {
    pub model: String,
    pub rule: Option<&'g Rule>,
}

impl<H: Host> RequestContext<H> {
    /// The first conditional route that matches, and the model it asks for.
    pub(crate) fn conditional_route<'g, 'd>(
        &self,
        gw: &'g Gateway,
        client: &str,
        requested: &str,
        doc: impl FnOnce() -> Option<&'d Document>,
    ) -> Routed<'g> {
        let rules = &gw.policy.rules;
        if rules.is_empty() {
            return Routed {
                model: requested.to_string(),
                rule: None,
            };
        }
        // The body's tree is built only when a rule reads it.
        let needs_body = rules
            .iter()
            .any(|r| r.users.is_some() || !r.metadata.is_empty());
        let (metadata, user) = match doc().filter(|_| needs_body) {
            Some(d) => strategy::body_facts(d),
            None => (Vec::new(), None),
        };
        let r = Request {
            client,
            headers: &self.request.rule_headers,
            metadata: &metadata,
            user: user.as_deref(),
            model: requested,
        };
        let rule = strategy::route(rules, &r);
        Routed {
            model: rule
                .and_then(|r| r.to_model.clone())
                .unwrap_or_else(|| requested.to_string()),
            rule,
        }
    }

    /// The candidates in the order the request's strategy says, narrowed
    /// to a pinned provider when the client may pin one.
    pub(crate) fn ordered(
        &self,
        gw: &Gateway,
        routed: &Routed<'_>,
        model: usize,
        candidates: Vec<(usize, String)>,
        may_pin: bool,
        now_ms: u64,
    ) -> Result<(Strategy, Vec<(usize, String)>), GatewayError> {
        let s = strategy_for(gw, &routed.model, model, routed.rule);
        let mut out = match s {
            Strategy::Weighted => candidates,
            _ => {
                let facts = candidates
                    .into_iter()
                    .map(|(provider, model_id)| {
                        let name = gw.providers.get(provider).map_or("", |p| p.name.as_str());
                        Candidate {
                            price: (s == Strategy::Cheapest)
                                .then(|| candidate_price(gw, model, provider))
                                .flatten(),
                            latency_ms: if s == Strategy::Fastest {
                                self.latency_ms(gw, provider, name, &model_id, now_ms)
                            } else {
                                0
                            },
                            busy: if s == Strategy::LeastBusy {
                                self.busy(name, now_ms)
                            } else {
                                0
                            },
                            provider,
                            model_id,
                        }
                    })
                    .collect();
                strategy::order(s, facts, gw.policy.fastest.explore, self.roll)
            }
        };
        if let Some(pin) = self.request.pin_provider.as_deref() {
            if !may_pin {
                return Err(GatewayError::new(
                    403,
                    "invalid_request_error",
                    "override_not_allowed",
                    "This key may not pin a provider (x-portcullis-pin-provider); ask the operator for allow_overrides.",
                ));
            }
            out.retain(|(p, _)| gw.providers.get(*p).is_some_and(|p| p.name == pin));
            if out.is_empty() {
                return Err(GatewayError::bad_request(
                    "invalid_pin",
                    format!(
                        "Provider `{pin}` does not serve this model (x-portcullis-pin-provider)."
                    ),
                ));
            }
        }
        Ok((s, out))
    }

    fn latency_ms(
        &self,
        gw: &Gateway,
        provider: usize,
        name: &str,
        model_id: &str,
        now_ms: u64,
    ) -> u64 {
        match cached(&self.host, &keys::latency(name, model_id), now_ms) {
            Some(v) => u64::try_from(v).unwrap_or(0),
            None => gw
                .policy
                .fastest
                .initial_ms
                .get(provider)
                .copied()
                .unwrap_or(1000),
        }
    }

    fn busy(&self, name: &str, now_ms: u64) -> u64 {
        cached(&self.host, &keys::busy(name), now_ms)
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(0)
    }
}

/// A success's latency into the provider's moving average for the model.
/// The average moves from this VM's copy of it and is written without a
/// compare-and-swap: two workers writing at once lose one sample, which an
/// average can spare (a counter could not).
pub fn note_latency(
    host: &impl Host,
    gw: &Gateway,
    provider: usize,
    model_id: &str,
    sample_ms: u64,
    now_ms: u64,
) {
    let Some(p) = gw.providers.get(provider) else {
        return;
    };
    let initial = gw
        .policy
        .fastest
        .initial_ms
        .get(provider)
        .copied()
        .unwrap_or(1000);
    let key = keys::latency(&p.name, model_id);
    let old = cached(host, &key, now_ms)
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(initial);
    let next = strategy::ewma(old, sample_ms, gw.policy.fastest.alpha);
    if next == old {
        return;
    }
    let next = i64::try_from(next).unwrap_or(i64::MAX);
    if host.set(&key, &next.to_le_bytes(), None).is_ok() {
        remember(&key, next, now_ms);
    }
}

/// At configure time: create the keys the strategies update (so updates
/// always have a CAS token); existing values (a reload) are kept.
pub fn prepare(host: &impl Host, gw: &Gateway) {
    let create = |key: String, value: i64| {
        if matches!(host.get(&key), Ok((None, _))) {
            let _ = host.set(&key, &value.to_le_bytes(), None);
        }
    };
    for (i, p) in gw.providers.iter().enumerate() {
        if gw.policy.uses_busy {
            create(keys::busy(&p.name), 0);
        }
        if gw.policy.uses_latency {
            let initial = gw.policy.fastest.initial_ms.get(i).copied().unwrap_or(1000);
            for m in &gw.models {
                for s in m.serving.iter().filter(|s| s.provider == i) {
                    create(
                        keys::latency(&p.name, &s.provider_model_id),
                        i64::try_from(initial).unwrap_or(i64::MAX),
                    );
                }
            }
        }
    }
}

/// One more (or one fewer) request in flight at a provider.
pub fn add_busy(host: &impl Host, provider: &str, by: i64) {
    let key = keys::busy(provider);
    let written = update(host, &key, |cur| {
        let n = decode_i64(cur).saturating_add(by).max(0);
        (Some(n.to_le_bytes().to_vec()), n)
    });
    if let Ok(n) = written {
        remember(&key, n, host.now_ms());
    }
}
