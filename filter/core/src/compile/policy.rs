//! `routing`'s policies: strategies per model (or alias, or `auto`),
//! `fastest`'s settings, and the conditional routes, all checked against
//! the models, aliases, providers and clients they name.

use super::raw::RawConfig;
use super::{Policy, AUTO_MODEL};
use crate::health::attempt::Class;
use crate::health::strategy::{Fastest, Rule, Strategy};
use hashbrown::HashMap;

const DEFAULT_OUTPUT_SHARE: f64 = 0.3;
const DEFAULT_EXPLORE: f64 = 0.05;
const DEFAULT_ALPHA: f64 = 0.3;
const DEFAULT_INITIAL_MS: u64 = 1000;

fn strategy(at: &str, s: &str, problems: &mut Vec<String>) -> Strategy {
    Strategy::parse(s).unwrap_or_else(|| {
        problems.push(format!(
            "{at}: `{s}` is not a strategy (expected weighted, cheapest, fastest or least_busy)"
        ));
        Strategy::Weighted
    })
}

pub(super) fn policy(
    raw: &RawConfig,
    names: &HashMap<String, usize>,
    provider_names: &[String],
    problems: &mut Vec<String>,
) -> Policy {
    let r = &raw.routing;
    let known = |n: &str| n == AUTO_MODEL || names.contains_key(n);
    let default = r.strategy.as_deref().map_or(Strategy::Weighted, |s| {
        strategy("routing.strategy", s, problems)
    });
    let mut by_name = HashMap::new();
    for (name, s) in &r.strategies {
        if !known(name) {
            problems.push(format!(
                "routing.strategies: `{name}` is not a model, an alias or auto"
            ));
        }
        by_name.insert(
            name.clone(),
            strategy(&format!("routing.strategies.{name}"), s, problems),
        );
    }
    let output_share = r.output_share.unwrap_or(DEFAULT_OUTPUT_SHARE);
    if !(0.0..=1.0).contains(&output_share) {
        problems.push("routing.output_share must be between 0 and 1".into());
    }
    let f = r.fastest.as_ref();
    let mut initial_ms = vec![DEFAULT_INITIAL_MS; provider_names.len()];
    for (name, ms) in f.map(|f| &f.initial_ms).into_iter().flatten() {
        match provider_names.iter().position(|p| p == name) {
            Some(i) => {
                if let Some(slot) = initial_ms.get_mut(i) {
                    *slot = *ms;
                }
            }
            None => problems.push(format!(
                "routing.fastest.initial_ms: no provider named `{name}`"
            )),
        }
    }
    let explore = f.and_then(|f| f.explore).unwrap_or(DEFAULT_EXPLORE);
    let alpha = f.and_then(|f| f.alpha).unwrap_or(DEFAULT_ALPHA);
    if !(0.0..=1.0).contains(&explore) {
        problems.push("routing.fastest.explore must be between 0 and 1".into());
    }
    if !(alpha > 0.0 && alpha <= 1.0) {
        problems.push("routing.fastest.alpha must be in (0, 1]".into());
    }
    let clients: Vec<&str> = raw.clients.iter().map(|c| c.name.as_str()).collect();
    let mut rules = Vec::new();
    let mut rule_headers: Vec<String> = Vec::new();
    for (i, rule) in r.routes.iter().enumerate() {
        let at = format!("routing.routes[{i}]");
        let m = &rule.when;
        for c in m
            .clients
            .iter()
            .flatten()
            .filter(|c| !clients.contains(&c.as_str()))
        {
            problems.push(format!("{at}.match.clients: `{c}` is not a client"));
        }
        for n in m.models.iter().flatten().filter(|n| !known(n)) {
            problems.push(format!(
                "{at}.match.models: `{n}` is not a model, an alias or auto"
            ));
        }
        if let Some(to) = rule.to.as_deref().filter(|t| !known(t)) {
            problems.push(format!("{at}.to: `{to}` is not a model, an alias or auto"));
        }
        if rule.to.is_none() && rule.strategy.is_none() {
            problems.push(format!(
                "{at}: say where the request goes (`to`, `strategy` or both)"
            ));
        }
        let headers: Vec<(String, String)> = m
            .headers
            .iter()
            .map(|(k, v)| (k.to_ascii_lowercase(), v.clone()))
            .collect();
        for (k, _) in &headers {
            if !rule_headers.contains(k) {
                rule_headers.push(k.clone());
            }
        }
        rules.push(Rule {
            clients: m.clients.clone(),
            headers,
            metadata: m
                .metadata
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            users: m.users.clone(),
            models: m.models.clone(),
            to_model: rule.to.clone(),
            strategy: rule
                .strategy
                .as_deref()
                .map(|s| strategy(&format!("{at}.strategy"), s, problems)),
        });
    }
    let fallback_on = match &r.fallback_on {
        None => Class::DEFAULT_FALLBACK.to_vec(),
        Some(list) => list
            .iter()
            .filter_map(|c| {
                Class::parse(c).or_else(|| {
                    problems.push(format!(
                        "routing.fallback_on: `{c}` is not an error class (expected {})",
                        Class::ALL.map(Class::name).join(", ")
                    ));
                    None
                })
            })
            .collect(),
    };
    let all: Vec<Strategy> = std::iter::once(default)
        .chain(by_name.values().copied())
        .chain(rules.iter().filter_map(|r| r.strategy))
        .collect();
    Policy {
        default,
        by_name,
        output_share,
        fastest: Fastest {
            initial_ms,
            explore,
            alpha,
        },
        rules,
        rule_headers,
        uses_latency: all.contains(&Strategy::Fastest),
        uses_busy: all.contains(&Strategy::LeastBusy),
        fallback_on,
    }
}
