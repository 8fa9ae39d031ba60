//! Routing policies: how each model's traffic is spread over the providers
//! serving it (the order its candidates are tried and fallen back through),
//! and conditional routes that send a request to another model or strategy.
//! Pure: the host reads the shared state (latencies, requests in flight)
//! and hands it over.

use crate::limits::ratelimit::Price;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Strategy {
    /// Chain order (today's behaviour; `auto` picks its model by weight).
    #[default]
    Weighted,
    /// By the price table, input and output weighted by the expected
    /// output share.
    Cheapest,
    /// By each provider's moving average of latency for the model (time to
    /// first byte for streams), with a small exploration share.
    Fastest,
    /// By requests in flight per provider.
    LeastBusy,
}

impl Strategy {
    pub fn parse(s: &str) -> Option<Strategy> {
        match s {
            "weighted" => Some(Strategy::Weighted),
            "cheapest" => Some(Strategy::Cheapest),
            "fastest" => Some(Strategy::Fastest),
            "least_busy" => Some(Strategy::LeastBusy),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Strategy::Weighted => "weighted",
            Strategy::Cheapest => "cheapest",
            Strategy::Fastest => "fastest",
            Strategy::LeastBusy => "least_busy",
        }
    }
}

/// `fastest`'s settings.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Fastest {
    /// Latency assumed for a provider not measured yet, by provider index.
    pub initial_ms: Vec<u64>,
    /// Share of requests (0..1) that try another candidate first, so a
    /// provider that recovered is measured again.
    pub explore: f64,
    /// Weight of a new sample in the moving average (0..1].
    pub alpha: f64,
}

/// One conditional route: every condition given must hold.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rule {
    pub clients: Option<Vec<String>>,
    /// Request headers (lower-case names) and the values they must have.
    pub headers: Vec<(String, String)>,
    /// `metadata.<key>` values in the body.
    pub metadata: Vec<(String, String)>,
    /// The body's `user`.
    pub users: Option<Vec<String>>,
    /// The requested model names (as sent: a model, an alias, `auto`).
    pub models: Option<Vec<String>>,
    /// Where the request goes: a model or alias...
    pub to_model: Option<String>,
    /// ...and/or the strategy that orders its providers.
    pub strategy: Option<Strategy>,
}

/// What a rule is matched against.
pub struct Request<'a> {
    pub client: &'a str,
    pub headers: &'a [(String, String)],
    pub metadata: &'a [(String, String)],
    pub user: Option<&'a str>,
    pub model: &'a str,
}

impl Rule {
    pub fn matches(&self, r: &Request<'_>) -> bool {
        let one_of = |list: &Option<Vec<String>>, v: Option<&str>| {
            list.as_ref()
                .is_none_or(|l| v.is_some_and(|v| l.iter().any(|x| x == v)))
        };
        let all = |want: &[(String, String)], have: &[(String, String)]| {
            want.iter()
                .all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v))
        };
        one_of(&self.clients, Some(r.client))
            && one_of(&self.users, r.user)
            && one_of(&self.models, Some(r.model))
            && all(&self.headers, r.headers)
            && all(&self.metadata, r.metadata)
    }
}

/// What rules read of a body: `metadata`'s string values and `user`.
pub fn body_facts(
    doc: &serde_json::Map<String, serde_json::Value>,
) -> (Vec<(String, String)>, Option<String>) {
    let metadata = doc
        .get("metadata")
        .and_then(serde_json::Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default();
    let user = doc
        .get("user")
        .and_then(serde_json::Value::as_str)
        .map(String::from);
    (metadata, user)
}

/// The first rule that matches, if any.
pub fn route<'r>(rules: &'r [Rule], r: &Request<'_>) -> Option<&'r Rule> {
    rules.iter().find(|rule| rule.matches(r))
}

/// A price as one number: USD per 1M tokens, input and output weighted by
/// the share of output expected.
pub fn blended(p: &Price, output_share: f64) -> f64 {
    p.input * (1.0 - output_share) + p.output * output_share
}

/// One candidate with what the strategies look at.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub provider: usize,
    pub model_id: String,
    /// Blended price (cheapest); `None` sorts last.
    pub price: Option<f64>,
    /// Moving average latency in ms (fastest).
    pub latency_ms: u64,
    /// Requests in flight at the provider (least busy).
    pub busy: u64,
}

/// The order to try the candidates in (chain order breaks ties). `roll`
/// is a random number (fastest's exploration).
pub fn order(
    strategy: Strategy,
    mut c: Vec<Candidate>,
    explore: f64,
    roll: u64,
) -> Vec<(usize, String)> {
    match strategy {
        Strategy::Weighted => {}
        Strategy::Cheapest => c.sort_by(|a, b| match (a.price, b.price) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        }),
        Strategy::Fastest => {
            c.sort_by_key(|x| x.latency_ms);
            // Exploration: now and then the next candidate goes first.
            let per_million = (explore.clamp(0.0, 1.0) * 1e6) as u64;
            if c.len() > 1 && roll % 1_000_000 < per_million {
                let pick = 1 + (roll / 1_000_000) as usize % (c.len() - 1);
                let chosen = c.remove(pick);
                c.insert(0, chosen);
            }
        }
        Strategy::LeastBusy => c.sort_by_key(|x| x.busy),
    }
    c.into_iter().map(|x| (x.provider, x.model_id)).collect()
}

/// The moving average after one more sample.
pub fn ewma(current: u64, sample: u64, alpha: f64) -> u64 {
    let a = alpha.clamp(0.0, 1.0);
    (current as f64 * (1.0 - a) + sample as f64 * a).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn cand(provider: usize, price: Option<f64>, latency_ms: u64, busy: u64) -> Candidate {
        Candidate {
            provider,
            model_id: format!("m{provider}"),
            price,
            latency_ms,
            busy,
        }
    }

    fn providers(v: Vec<(usize, String)>) -> Vec<usize> {
        v.into_iter().map(|(p, _)| p).collect()
    }

    #[test]
    fn each_strategy_orders_as_stated_and_chain_order_breaks_ties() {
        let c = vec![
            cand(0, Some(3.0), 300, 2),
            cand(1, None, 100, 0),
            cand(2, Some(1.0), 200, 2),
        ];
        assert_eq!(
            providers(order(Strategy::Weighted, c.clone(), 0.0, 0)),
            [0, 1, 2]
        );
        assert_eq!(
            providers(order(Strategy::Cheapest, c.clone(), 0.0, 0)),
            [2, 0, 1]
        );
        assert_eq!(
            providers(order(Strategy::Fastest, c.clone(), 0.0, 0)),
            [1, 2, 0]
        );
        assert_eq!(
            providers(order(Strategy::LeastBusy, c.clone(), 0.0, 0)),
            [1, 0, 2]
        );
        // Exploration: a roll under the share puts another candidate first.
        assert_eq!(
            providers(order(Strategy::Fastest, c.clone(), 0.05, 10)),
            [2, 1, 0]
        );
        assert_eq!(
            providers(order(Strategy::Fastest, c.clone(), 0.05, 1_000_010)),
            [0, 1, 2]
        );
        assert_eq!(
            providers(order(Strategy::Fastest, c, 0.05, 60_000)),
            [1, 2, 0]
        );
        assert_eq!(
            blended(
                &Price {
                    input: 1.0,
                    output: 3.0,
                    cached_input: 0.5,
                    cache_write: 1.0,
                    reasoning: 3.0,
                    ..Default::default()
                },
                0.25
            ),
            1.5
        );
        assert_eq!(ewma(1000, 0, 0.5), 500);
        assert_eq!(ewma(u64::MAX, u64::MAX, 0.3), u64::MAX);
    }

    #[test]
    fn rules_match_every_condition_they_name() {
        let rule = Rule {
            clients: Some(vec!["demo".into()]),
            headers: vec![("x-team".into(), "research".into())],
            metadata: vec![("tier".into(), "gold".into())],
            users: None,
            models: Some(vec!["auto".into()]),
            to_model: Some("gpt-4o".into()),
            strategy: None,
        };
        let headers = vec![("x-team".to_string(), "research".to_string())];
        let metadata = vec![("tier".to_string(), "gold".to_string())];
        let r = Request {
            client: "demo",
            headers: &headers,
            metadata: &metadata,
            user: None,
            model: "auto",
        };
        assert!(rule.matches(&r));
        assert!(!rule.matches(&Request {
            client: "other",
            ..r
        }));
        assert!(!rule.matches(&Request { headers: &[], ..r }));
        assert!(!rule.matches(&Request { metadata: &[], ..r }));
        assert!(!rule.matches(&Request {
            model: "gpt-4o",
            ..r
        }));
        let any = Rule {
            users: Some(vec!["u1".into()]),
            ..Rule::default()
        };
        assert!(!any.matches(&r), "a user is required and none was sent");
        assert!(any.matches(&Request {
            user: Some("u1"),
            ..r
        }));
        assert_eq!(route(&[any.clone(), rule.clone()], &r), Some(&rule));
    }
}
