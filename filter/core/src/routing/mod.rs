//! Routing: who is calling and where their request goes (this file), sticky
//! experiments (`experiment`) and which provider made which response
//! (`affinity`).
//!
//! May use: `api`, `config`, `error`, `health`, `pricing`, `translate`, `wire`.
//!
//! Who is calling, and where their request goes.

pub mod affinity;
pub mod experiment;

use crate::config::{Applies, Client, Experiment, Gateway, AUTO_MODEL};
use crate::error::GatewayError;

use sha2::{Digest, Sha256};

/// The client key from an `Authorization` header value (`Bearer <key>`).
pub fn bearer_key(authorization: Option<&str>) -> Option<&str> {
    let v = authorization?.trim();
    let (scheme, key) = v.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

/// Authenticate a client by the SHA-256 of its key: the config holds no
/// secret. Returns the hash too, the client's handle for later lookups
/// (a rotated-out key in its grace period gives its client's current key).
pub fn authenticate<'g>(
    gw: &'g Gateway,
    authorization: Option<&str>,
    now_ms: u64,
) -> Result<([u8; 32], &'g Client), GatewayError> {
    authenticate_with(gw, authorization, &mut KeyHashes::default(), || now_ms)
}

/// [`authenticate`], remembering the hashes of keys that authenticated.
/// The clock is read only for a key that is not a current one (a host
/// call the common path does not make).
pub fn authenticate_with<'g>(
    gw: &'g Gateway,
    authorization: Option<&str>,
    known: &mut KeyHashes,
    now_ms: impl FnOnce() -> u64,
) -> Result<([u8; 32], &'g Client), GatewayError> {
    let key = bearer_key(authorization).ok_or_else(GatewayError::missing_key)?;
    let remembered = known.get(key.as_bytes());
    let own: [u8; 32] = remembered.unwrap_or_else(|| Sha256::digest(key.as_bytes()).into());
    let (hash, client) = match gw.clients.get(&own) {
        Some(c) => (own, c),
        None => {
            let old = gw
                .previous_keys
                .get(&own)
                .filter(|p| now_ms() < p.until_ms)
                .ok_or_else(GatewayError::unknown_key)?;
            let c = gw
                .clients
                .get(&old.current)
                .ok_or_else(GatewayError::unknown_key)?;
            (old.current, c)
        }
    };
    if remembered.is_none() {
        known.put(key.as_bytes(), own);
    }
    Ok((hash, client))
}

/// The SHA-256 of client keys that authenticated, so a worker hashes each
/// key once (a hash is ~1 us in Wasm). Only keys some config accepted are
/// kept (unknown keys cannot fill it), at most [`KeyHashes::MAX`]; a
/// hash does not depend on the config, so a reload keeps them, and a key
/// a reload removed still fails at the config's own lookup.
#[derive(Default)]
pub struct KeyHashes {
    map: hashbrown::HashMap<Box<[u8]>, [u8; 32], fnv::FnvBuildHasher>,
}

impl KeyHashes {
    pub const MAX: usize = 4096;

    fn get(&self, key: &[u8]) -> Option<[u8; 32]> {
        self.map.get(key).copied()
    }

    fn put(&mut self, key: &[u8], hash: [u8; 32]) {
        if self.map.len() >= Self::MAX {
            self.map.clear();
        }
        self.map.insert(key.into(), hash);
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The decision for one request: the model and the providers to try, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    pub model: usize,
    /// (experiment index, arm index) when an experiment chose the model.
    pub experiment: Option<(usize, usize)>,
    /// Indexes into `Gateway::providers`, paired with the provider's model id.
    pub candidates: Vec<(usize, String)>,
}

/// The strategy of a request: the matched rule's, else the requested
/// name's (model, alias, `auto`), else its model's, else the default.
pub fn strategy_for(
    gw: &Gateway,
    requested: &str,
    model: usize,
    rule: Option<&crate::health::strategy::Rule>,
) -> crate::health::strategy::Strategy {
    let p = &gw.policy;
    rule.and_then(|r| r.strategy)
        .or_else(|| p.by_name.get(requested).copied())
        .or_else(|| {
            let name = &gw.models.get(model)?.name;
            p.by_name.get(name).copied()
        })
        .unwrap_or(p.default)
}

/// A candidate's blended price, from the price layers
/// ([`crate::pricing::price_of`]).
pub fn candidate_price(gw: &Gateway, model: usize, provider: usize) -> Option<f64> {
    let (price, _) = crate::pricing::price_of(gw, model, Some(provider))?;
    Some(crate::health::strategy::blended(
        &price,
        gw.policy.output_share,
    ))
}

/// Pick by weight: `roll` is any uniformly random u64.
pub fn pick_weighted(choices: &[(usize, u32)], roll: u64) -> Option<usize> {
    let total: u64 = choices.iter().map(|&(_, w)| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    let mut point = roll % total;
    for &(idx, w) in choices {
        let w = u64::from(w);
        if point < w {
            return Some(idx);
        }
        point -= w;
    }
    None
}

/// Resolve the requested model (name, alias or `auto`) for a client.
pub fn resolve(
    gw: &Gateway,
    client: &Client,
    requested: &str,
    roll: u64,
) -> Result<Route, GatewayError> {
    let asked = requested_model(gw, client, requested, roll)?;
    let (model, experiment) = match experiment_arm(gw, client, requested, asked) {
        Some((ei, ai, model)) => (model, Some((ei, ai))),
        None => (asked, None),
    };
    let serving = gw
        .models
        .get(model)
        .map(|m| m.serving.as_slice())
        .unwrap_or_default();
    let candidates = serving
        .iter()
        .map(|s| (s.provider, s.provider_model_id.clone()))
        .collect::<Vec<_>>();
    if candidates.is_empty() {
        return Err(GatewayError::model_not_found(requested));
    }
    Ok(Route {
        model,
        experiment,
        candidates,
    })
}

/// The model a client asked for: by name or alias, or picked by weight for
/// `auto` among the models it may use.
fn requested_model(
    gw: &Gateway,
    client: &Client,
    requested: &str,
    roll: u64,
) -> Result<usize, GatewayError> {
    if requested == AUTO_MODEL {
        let allowed: Vec<(usize, u32)> = gw
            .auto
            .iter()
            .copied()
            .filter(|&(m, _)| client.may_use(m))
            .collect();
        return pick_weighted(&allowed, roll)
            .ok_or_else(|| GatewayError::model_not_allowed(AUTO_MODEL));
    }
    let idx = *gw
        .names
        .get(requested)
        .ok_or_else(|| GatewayError::model_not_found(requested))?;
    if !client.may_use(idx) {
        return Err(GatewayError::model_not_allowed(requested));
    }
    Ok(idx)
}

/// An experiment overrides even an explicit model: that is what an A/B test
/// of model quality means. The first experiment covering the request wins;
/// an arm the client may not use leaves the request alone. Returns
/// (experiment, arm, model).
fn experiment_arm(
    gw: &Gateway,
    client: &Client,
    requested: &str,
    model: usize,
) -> Option<(usize, usize, usize)> {
    let covers = |e: &Experiment| match &e.applies {
        Applies::All => true,
        Applies::Models { auto, .. } if requested == AUTO_MODEL => *auto,
        Applies::Models { models, .. } => models.contains(&model),
    };
    let (ei, e, ai) = gw
        .experiments
        .iter()
        .enumerate()
        .filter(|(_, e)| covers(e))
        .find_map(|(ei, e)| {
            let weights: Vec<u32> = e.arms.iter().map(|a| a.weight).collect();
            let ai = experiment::arm_for(experiment::bucket(&e.salt, &client.name), &weights)?;
            Some((ei, e, ai))
        })?;
    let arm = e.arms.get(ai).filter(|a| client.may_use(a.model))?;
    Some((ei, ai, arm.model))
}

/// The `/v1/models` list for a client, in OpenAI's format: every model and
/// alias it may use, and `auto`.
pub fn models_list(gw: &Gateway, client: &Client) -> Vec<u8> {
    let data = model_entries(gw, client);
    serde_json::to_vec(&serde_json::json!({"object": "list", "data": data})).unwrap_or_default()
}

/// A path segment with its `%XX` escapes decoded (a model id such as
/// `meta-llama/Llama-3` arrives as `meta-llama%2FLlama-3`). Text that does
/// not decode to UTF-8 is returned as it came.
pub fn percent_decode(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (b, hex) {
            (b'%', Some(v)) => {
                out.push(v);
                i += 3;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| segment.to_string())
}

/// `/v1/models/{id}`: one entry of the client's list, or 404 as OpenAI
/// answers for a model the key cannot see. `id` is the path segment as sent.
pub fn model_info(gw: &Gateway, client: &Client, id: &str) -> Result<Vec<u8>, GatewayError> {
    let id = percent_decode(id);
    let id = id.as_str();
    model_entries(gw, client)
        .into_iter()
        .find(|m| m.get("id").and_then(serde_json::Value::as_str) == Some(id))
        .map(|m| serde_json::to_vec(&m).unwrap_or_default())
        .ok_or_else(|| GatewayError::model_not_found(id))
}

/// The paths a model is served at: each API some provider of it serves
/// (its format, narrowed by the model's `apis`).
fn endpoints_of(gw: &Gateway, m: &crate::config::Model) -> Vec<&'static str> {
    crate::api::ALL
        .iter()
        .filter(|api| {
            m.serving.iter().any(|s| {
                s.apis.as_ref().is_none_or(|a| a.contains(api))
                    && gw
                        .providers
                        .get(s.provider)
                        .is_some_and(|p| crate::translate::serves(p, **api))
            })
        })
        .map(|api| api.path())
        .collect()
}

fn model_entries(gw: &Gateway, client: &Client) -> Vec<serde_json::Value> {
    let mut data = Vec::new();
    for (idx, m) in gw.models.iter().enumerate() {
        if !client.may_use(idx) {
            continue;
        }
        let owner = m
            .serving
            .first()
            .and_then(|s| gw.providers.get(s.provider))
            .map(|p| p.name.as_str())
            .unwrap_or("");
        let endpoints = endpoints_of(gw, m);
        for id in std::iter::once(&m.name).chain(m.aliases.iter()) {
            data.push(serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": owner, "endpoints": endpoints}));
        }
    }
    if gw.auto.iter().any(|&(m, _)| client.may_use(m)) {
        data.push(serde_json::json!({"id": AUTO_MODEL, "object": "model", "created": 0, "owned_by": "portcullis"}));
    }
    data
}

#[cfg(test)]
mod tests;
