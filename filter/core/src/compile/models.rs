//! Providers, their chain order, the models they serve (by public name, in
//! chain order), aliases, and the weights `auto` picks by.

use super::raw::{check_breaker, RawConfig, RawProvider};
use super::{valid_env_name, Model, Provider, Schema, Serving, AUTO_MODEL};
use crate::api::Api;
use crate::health::breaker::BreakerConfig;
use hashbrown::HashMap;

/// A name that labels metrics: letters, digits, `_` and `-`.
pub(super) fn is_label(name: &str) -> bool {
    name.chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Unique names and sane fields; provider index by name.
pub(super) fn check_providers<'r>(
    providers: &'r [RawProvider],
    problems: &mut Vec<String>,
) -> HashMap<&'r str, usize> {
    if providers.is_empty() {
        problems.push("providers: at least one provider is required".into());
    }
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, p) in providers.iter().enumerate() {
        let at = format!("providers[{i}] ({})", p.name);
        if p.name.trim().is_empty() {
            problems.push(format!("providers[{i}]: `name` is empty"));
        } else if !is_label(&p.name) {
            problems.push(format!(
                "{at}: `name` may use only letters, digits, `_` and `-` (it labels metrics)"
            ));
        } else if by_name.insert(p.name.as_str(), i).is_some() {
            problems.push(format!("{at}: duplicate provider name"));
        }
        check_provider_fields(&at, p, problems);
        check_provider_models(&at, p, problems);
    }
    by_name
}

fn check_provider_fields(at: &str, p: &RawProvider, problems: &mut Vec<String>) {
    if p.cluster.trim().is_empty() {
        problems.push(format!(
            "{at}: `cluster` is empty (name the Envoy cluster of this provider)"
        ));
    }
    if p.host.trim().is_empty() {
        problems.push(format!(
            "{at}: `host` is empty or missing (the :authority sent to the provider; a `preset` gives one)"
        ));
    }
    // Empty: the API's paths start at the root (Azure's `/openai/...`).
    if let Some(b) = p
        .base_path
        .as_ref()
        .filter(|b| !(b.is_empty() || b.starts_with('/')))
    {
        problems.push(format!(
            "{at}: `base_path` must be empty or start with `/` (got `{b}`)"
        ));
    }
    for f in p.drop_fields.iter().flatten() {
        if f.is_empty() || matches!(f.as_str(), "model" | "messages" | "input" | "stream") {
            problems.push(format!(
                "{at}: `drop_fields` cannot drop `{f}` (the request needs it)"
            ));
        }
    }
    if let Some(env) = p.api_key_env.as_ref().filter(|e| !valid_env_name(e)) {
        problems.push(format!(
            "{at}: `api_key_env` `{env}` is not an environment variable name"
        ));
    }
    if p.timeout_ms == 0 || p.stream_timeout_ms == 0 {
        problems.push(format!(
            "{at}: `timeout_ms` and `stream_timeout_ms` must be greater than 0"
        ));
    }
}

fn check_provider_models(at: &str, p: &RawProvider, problems: &mut Vec<String>) {
    if p.models.is_empty() {
        problems.push(format!("{at}: `models` is empty"));
    }
    let mut seen = hashbrown::HashSet::new();
    for (j, m) in p.models.iter().enumerate() {
        if m.name.trim().is_empty() {
            problems.push(format!("{at}.models[{j}]: `name` is empty"));
        } else if m.name == AUTO_MODEL {
            problems.push(format!(
                "{at}.models[{j}]: `{AUTO_MODEL}` is reserved and cannot name a model"
            ));
        } else if !seen.insert(m.name.as_str()) {
            problems.push(format!("{at}: model `{}` listed twice", m.name));
        }
        if m.id.as_deref().is_some_and(|id| id.trim().is_empty()) {
            problems.push(format!("{at}.models[{j}]: `id` is empty"));
        }
    }
}

/// Provider indexes in chain order (`routing.chain`, else list order).
pub(super) fn chain_order(
    raw: &RawConfig,
    by_name: &HashMap<&str, usize>,
    problems: &mut Vec<String>,
) -> Vec<usize> {
    let chain: Vec<String> = match &raw.routing.chain {
        Some(c) => c.clone(),
        None => raw.providers.iter().map(|p| p.name.clone()).collect(),
    };
    let mut order: Vec<usize> = Vec::new();
    for name in &chain {
        match by_name.get(name.as_str()) {
            Some(&i) if order.contains(&i) => {
                problems.push(format!("routing.chain: provider `{name}` appears twice"))
            }
            Some(&i) => order.push(i),
            None => problems.push(format!("routing.chain: no provider named `{name}`")),
        }
    }
    for (i, p) in raw.providers.iter().enumerate() {
        if !order.contains(&i) && by_name.get(p.name.as_str()) == Some(&i) {
            problems.push(format!(
                "providers[{i}] ({}): not in routing.chain, so it would never be used",
                p.name
            ));
        }
    }
    order
}

/// Providers in chain order with their breakers, and models by canonical
/// name with the providers serving them in that order.
pub(super) fn providers_and_models(
    raw: &RawConfig,
    order: &[usize],
    default_breaker: &BreakerConfig,
    problems: &mut Vec<String>,
) -> (Vec<Provider>, Vec<Model>, HashMap<String, usize>) {
    let mut providers = Vec::new();
    let mut models: Vec<Model> = Vec::new();
    let mut model_idx: HashMap<String, usize> = HashMap::new();
    for p in order.iter().filter_map(|&pi| raw.providers.get(pi)) {
        let chain_pos = providers.len();
        let breaker = p
            .breaker
            .as_ref()
            .map_or(*default_breaker, |b| b.over(default_breaker));
        if p.breaker.is_some() {
            check_breaker(
                &format!("provider `{}` breaker", p.name),
                &breaker,
                problems,
            );
        }
        providers.push(Provider {
            name: p.name.clone(),
            cluster: p.cluster.clone(),
            host: p.host.clone(),
            base_path: p.base_path.clone().unwrap_or_else(|| "/v1".into()),
            api_key_env: p.api_key_env.clone(),
            drop_fields: p.drop_fields.clone().unwrap_or_default(),
            timeout_ms: p.timeout_ms,
            stream_timeout_ms: p.stream_timeout_ms,
            breaker: BreakerConfig {
                probe_timeout_ms: p.timeout_ms.saturating_add(1_000),
                ..breaker
            },
            schema: p.schema(&format!("provider `{}`", p.name), problems),
            concurrency: p
                .concurrency
                .as_ref()
                .map(|c| c.compile(&format!("provider `{}`", p.name), problems)),
            retries: p
                .retries
                .as_ref()
                .filter(|r| r.attempts > 0)
                .map(|r| r.compile(&format!("provider `{}`", p.name), problems)),
            upstream: p
                .upstream
                .as_ref()
                .map(|u| u.compile(&format!("provider `{}`", p.name), &p.host, problems)),
        });
        let schema = providers
            .last()
            .map(|x| x.schema.clone())
            .unwrap_or_default();
        for m in &p.models {
            let apis = m
                .apis
                .as_ref()
                .map(|names| model_apis(&p.name, &m.name, &schema, names, problems));
            let idx = *model_idx.entry(m.name.clone()).or_insert_with(|| {
                models.push(Model {
                    name: m.name.clone(),
                    aliases: Vec::new(),
                    serving: Vec::new(),
                    max_body_bytes: None,
                });
                models.len().saturating_sub(1)
            });
            if m.max_body_bytes == Some(0) {
                problems.push(format!(
                    "provider `{}` model `{}`: `max_body_bytes` of 0 would refuse every request; leave it out for no limit of the model's own",
                    p.name, m.name
                ));
            }
            if let Some(model) = models.get_mut(idx) {
                if let Some(n) = m.max_body_bytes.filter(|n| *n > 0) {
                    model.max_body_bytes = Some(model.max_body_bytes.map_or(n, |o| o.min(n)));
                }
                model.serving.push(Serving {
                    provider: chain_pos,
                    provider_model_id: m.id.clone().unwrap_or_else(|| m.name.clone()),
                    context_window: m.context_window,
                    apis,
                    price: m.price.as_ref().map(|price| {
                        super::clients::price(
                            &format!("provider `{}` model `{}`: price", p.name, m.name),
                            price,
                            problems,
                        )
                    }),
                });
            }
        }
    }
    (providers, models, model_idx)
}

/// A provider model's `apis`: each a known inbound API its format can
/// serve (`translate::reach`), else a problem naming both.
fn model_apis(
    provider: &str,
    model: &str,
    schema: &Schema,
    names: &[String],
    problems: &mut Vec<String>,
) -> Vec<Api> {
    let at = format!("provider `{provider}` model `{model}`");
    if names.is_empty() {
        problems.push(format!(
            "{at}: `apis` is empty (leave it out to serve every API the provider's format serves)"
        ));
    }
    let mut out = Vec::new();
    for name in names {
        let Some(api) = crate::api::ALL.iter().copied().find(|a| a.name() == name) else {
            let known: Vec<&str> = crate::api::ALL.iter().map(|a| a.name()).collect();
            problems.push(format!(
                "{at}: `apis` lists `{name}`, which is not an API (one of: {})",
                known.join(", ")
            ));
            continue;
        };
        if crate::translate::reach(schema, api) == crate::translate::Reach::No {
            problems.push(format!(
                "{at}: `apis` lists `{name}` ({}), which a provider of schema `{}` cannot serve",
                api.path(),
                schema.name()
            ));
            continue;
        }
        if !out.contains(&api) {
            out.push(api);
        }
    }
    out
}

/// Every public name (models and aliases) to its model. An alias names
/// exactly one model and never shadows a model name.
pub(super) fn aliases(
    raw: &RawConfig,
    model_idx: &HashMap<String, usize>,
    models: &mut [Model],
    problems: &mut Vec<String>,
) -> HashMap<String, usize> {
    let mut names: HashMap<String, usize> = model_idx.clone();
    let mut alias_owner: HashMap<String, usize> = HashMap::new();
    for p in &raw.providers {
        for m in &p.models {
            let Some(&target) = model_idx.get(&m.name) else {
                continue;
            };
            for a in &m.aliases {
                let owner = alias_owner.get(a).copied();
                let problem = if a.trim().is_empty() {
                    Some(format!(
                        "provider `{}` model `{}`: empty alias",
                        p.name, m.name
                    ))
                } else if a == AUTO_MODEL {
                    Some(format!(
                        "provider `{}` model `{}`: alias `{AUTO_MODEL}` is reserved",
                        p.name, m.name
                    ))
                } else if model_idx.get(a).is_some_and(|&t| t != target) {
                    Some(format!(
                        "alias `{a}` (of model `{}`) collides with the model named `{a}`",
                        m.name
                    ))
                } else if let Some(other) = owner.filter(|&o| o != target) {
                    let other_name = models.get(other).map_or("?", |o| o.name.as_str());
                    Some(format!(
                        "alias `{a}` names two models: `{other_name}` and `{}`",
                        m.name
                    ))
                } else {
                    None
                };
                if let Some(problem) = problem {
                    problems.push(problem);
                } else if owner.is_none() && !model_idx.contains_key(a) {
                    alias_owner.insert(a.clone(), target);
                    names.insert(a.clone(), target);
                    if let Some(model) = models.get_mut(target) {
                        model.aliases.push(a.clone());
                    }
                }
            }
        }
    }
    names
}

/// `auto`: weighted among the models of the first provider in the chain.
pub(super) fn auto_weights(
    raw: &RawConfig,
    order: &[usize],
    model_idx: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Vec<(usize, u32)> {
    let Some(first) = order.first().and_then(|&i| raw.providers.get(i)) else {
        return Vec::new();
    };
    let auto: Vec<(usize, u32)> = first
        .models
        .iter()
        .filter(|m| m.weight > 0)
        .filter_map(|m| model_idx.get(&m.name).map(|&idx| (idx, m.weight)))
        .collect();
    if !first.models.is_empty() && auto.is_empty() {
        problems.push(format!(
            "provider `{}` (first in the chain): model weights sum to zero, so `{AUTO_MODEL}` has nothing to pick",
            first.name
        ));
    }
    auto
}
