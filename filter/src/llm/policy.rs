//! The routing-policy step: a conditional route may send the request to
//! another model or strategy; the strategy orders the candidates (from the
//! latencies and requests in flight in shared data); a client allowed to
//! may pin one provider. The shared state the strategies read (latencies,
//! requests in flight) is kept by `health::load`.

use crate::health::load;
use crate::host::Host;
use crate::request::RequestContext;
use portcullis_core::config::Gateway;
use portcullis_core::error::GatewayError;
use portcullis_core::health::strategy::{self, Candidate, Request, Rule, Strategy};
use portcullis_core::request::Document;
use portcullis_core::routing::{candidate_price, strategy_for};
use portcullis_core::shared::keys;

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
        match load::cached(&self.host, &keys::latency(name, model_id), now_ms) {
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

    /// Requests in flight at a provider (this VM's and the others').
    fn busy(&self, name: &str, now_ms: u64) -> u64 {
        load::busy(&self.host, name, now_ms)
    }
}
