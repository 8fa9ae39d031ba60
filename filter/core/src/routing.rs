//! Who is calling, and where their request goes.

use crate::config::{Applies, Client, Gateway, AUTO_MODEL};
use crate::error::GatewayError;
use crate::experiment;
use sha2::{Digest, Sha256};

/// The client key from an `Authorization` header value (`Bearer <key>`).
pub fn bearer_key(authorization: Option<&str>) -> Option<&str> {
    let v = authorization?.trim();
    let (scheme, key) = v.split_once(' ')?;
    let key = key.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !key.is_empty()).then_some(key)
}

/// Authenticate a client by the SHA-256 of its key: the config holds no
/// secret. Returns the hash too, the client's handle for later lookups.
pub fn authenticate<'g>(
    gw: &'g Gateway,
    authorization: Option<&str>,
) -> Result<([u8; 32], &'g Client), GatewayError> {
    let key = bearer_key(authorization).ok_or_else(GatewayError::missing_key)?;
    let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
    gw.clients
        .get(&hash)
        .map(|c| (hash, c))
        .ok_or_else(GatewayError::unknown_key)
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

/// The order in which a request's candidates are tried (and fallen back
/// through): chain order. This is the step routing strategies replace
/// (cheapest, fastest, least busy); open breakers are skipped afterwards,
/// whatever the order.
pub fn order_candidates(candidates: Vec<(usize, String)>) -> Vec<(usize, String)> {
    candidates
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
    let model = if requested == AUTO_MODEL {
        let allowed: Vec<(usize, u32)> = gw
            .auto
            .iter()
            .copied()
            .filter(|&(m, _)| client.may_use(m))
            .collect();
        pick_weighted(&allowed, roll).ok_or_else(|| GatewayError::model_not_allowed(AUTO_MODEL))?
    } else {
        let idx = *gw
            .names
            .get(requested)
            .ok_or_else(|| GatewayError::model_not_found(requested))?;
        if !client.may_use(idx) {
            return Err(GatewayError::model_not_allowed(requested));
        }
        idx
    };
    // An experiment overrides even an explicit model: that is what an A/B
    // test of model quality means. The first experiment covering it wins;
    // an arm the client may not use leaves the request alone.
    let mut model = model;
    let mut chosen = None;
    for (ei, e) in gw.experiments.iter().enumerate() {
        let covers = match &e.applies {
            Applies::All => true,
            Applies::Models { models, auto } => {
                if requested == AUTO_MODEL {
                    *auto
                } else {
                    models.contains(&model)
                }
            }
        };
        if !covers {
            continue;
        }
        let weights: Vec<u32> = e.arms.iter().map(|a| a.weight).collect();
        let Some(ai) = experiment::arm_for(experiment::bucket(&e.salt, &client.name), &weights)
        else {
            continue;
        };
        if let Some(arm) = e.arms.get(ai).filter(|a| client.may_use(a.model)) {
            model = arm.model;
            chosen = Some((ei, ai));
        }
        break;
    }
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
        experiment: chosen,
        candidates,
    })
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
        for id in std::iter::once(&m.name).chain(m.aliases.iter()) {
            data.push(
                serde_json::json!({"id": id, "object": "model", "created": 0, "owned_by": owner}),
            );
        }
    }
    if gw.auto.iter().any(|&(m, _)| client.may_use(m)) {
        data.push(serde_json::json!({"id": AUTO_MODEL, "object": "model", "created": 0, "owned_by": "portcullis"}));
    }
    data
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::compile;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn gw() -> Gateway {
        compile(crate::config::tests::GOOD.as_bytes()).unwrap()
    }

    fn client<'a>(g: &'a Gateway, name: &str) -> &'a Client {
        g.clients.values().find(|c| c.name == name).unwrap()
    }

    #[test]
    fn bearer_key_parsing() {
        assert_eq!(bearer_key(Some("Bearer sk-1")), Some("sk-1"));
        assert_eq!(bearer_key(Some("bearer   sk-1 ")), Some("sk-1"));
        assert_eq!(bearer_key(Some("Basic abc")), None);
        assert_eq!(bearer_key(Some("Bearer ")), None);
        assert_eq!(bearer_key(None), None);
    }

    #[test]
    fn authenticate_by_key_hash() {
        let mut g = gw();
        let hash: [u8; 32] = Sha256::digest(b"sk-demo").into();
        g.clients.insert(
            hash,
            Client {
                name: "real".into(),
                allowed: None,
                limits: Default::default(),
            },
        );
        assert_eq!(
            authenticate(&g, Some("Bearer sk-demo")).unwrap().1.name,
            "real"
        );
        assert_eq!(
            authenticate(&g, Some("Bearer sk-other"))
                .unwrap_err()
                .status,
            401
        );
        assert_eq!(
            authenticate(&g, None).unwrap_err().message,
            GatewayError::missing_key().message
        );
    }

    #[test]
    fn explicit_model_goes_to_providers_in_chain_order() {
        let g = gw();
        let r = resolve(&g, client(&g, "demo"), "gpt-4o-mini", 0).unwrap();
        assert_eq!(
            r.candidates,
            vec![
                (0, "gpt-4o-mini".to_string()),
                (1, "openai/gpt-4o-mini".to_string())
            ]
        );
        let r = resolve(&g, client(&g, "demo"), "llama-3", 0).unwrap();
        assert_eq!(r.candidates, vec![(1, "llama-3".to_string())]);
    }

    #[test]
    fn alias_resolves_to_its_model() {
        let g = gw();
        let r = resolve(&g, client(&g, "demo"), "mini", 0).unwrap();
        assert_eq!(g.models[r.model].name, "gpt-4o-mini");
    }

    #[test]
    fn unknown_and_forbidden_models() {
        let g = gw();
        assert_eq!(
            resolve(&g, client(&g, "demo"), "gpt-9", 0)
                .unwrap_err()
                .status,
            404
        );
        assert_eq!(
            resolve(&g, client(&g, "limited"), "gpt-4o", 0)
                .unwrap_err()
                .status,
            403
        );
        assert!(resolve(&g, client(&g, "limited"), "mini", 0).is_ok());
    }

    #[test]
    fn auto_follows_weights_exactly_over_a_full_cycle() {
        let g = gw();
        let mut counts = [0u32; 2];
        for roll in 0..4000u64 {
            let r = resolve(&g, client(&g, "demo"), "auto", roll).unwrap();
            counts[r.model] += 1;
        }
        assert_eq!(counts, [3000, 1000]);
    }

    #[test]
    fn auto_respects_client_allow_list() {
        let g = gw();
        for roll in 0..50 {
            let r = resolve(&g, client(&g, "limited"), "auto", roll).unwrap();
            assert_eq!(g.models[r.model].name, "gpt-4o-mini");
        }
    }

    fn with_experiment(applies: &str) -> Gateway {
        let cfg = format!(
            "{}experiments:\n  - name: ab\n    applies_to: [{applies}]\n    arms:\n      - {{name: small, weight: 1, model: gpt-4o-mini}}\n      - {{name: big, weight: 1, model: gpt-4o}}\n",
            crate::config::tests::GOOD
        );
        compile(cfg.as_bytes()).unwrap()
    }

    #[test]
    fn experiment_overrides_even_an_explicit_model_and_is_sticky_per_client() {
        let g = with_experiment("gpt-4o-mini, auto");
        let mut seen = [0; 2];
        for i in 0..200 {
            let c = Client {
                name: format!("client-{i}"),
                allowed: None,
                limits: Default::default(),
            };
            let r = resolve(&g, &c, "mini", 0).unwrap();
            let (e, arm) = r.experiment.unwrap();
            assert_eq!(e, 0);
            assert_eq!(g.models[r.model].name, ["gpt-4o-mini", "gpt-4o"][arm]);
            seen[arm] += 1;
            for roll in 0..5 {
                assert_eq!(
                    resolve(&g, &c, "auto", roll).unwrap().experiment,
                    Some((0, arm)),
                    "sticky"
                );
            }
        }
        assert!(seen[0] > 60 && seen[1] > 60, "{seen:?}");
        // Not covered: llama-3 is not in applies_to.
        let c = client(&g, "demo");
        assert_eq!(resolve(&g, c, "llama-3", 0).unwrap().experiment, None);
    }

    #[test]
    fn experiment_arm_outside_the_allow_list_is_not_applied() {
        let g = with_experiment("all");
        let limited = client(&g, "limited");
        let r = resolve(&g, limited, "mini", 0).unwrap();
        assert_eq!(g.models[r.model].name, "gpt-4o-mini");
    }

    #[test]
    fn pick_weighted_edges() {
        assert_eq!(pick_weighted(&[], 5), None);
        assert_eq!(pick_weighted(&[(7, 0)], 5), None);
        assert_eq!(pick_weighted(&[(7, 0), (9, 2)], u64::MAX), Some(9));
    }

    #[test]
    fn models_list_shows_what_the_client_may_use() {
        let g = gw();
        let v: serde_json::Value =
            serde_json::from_slice(&models_list(&g, client(&g, "limited"))).unwrap();
        let ids: Vec<&str> = v["data"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec!["gpt-4o-mini", "mini", "auto"]);
        assert_eq!(v["object"], "list");
        let v: serde_json::Value =
            serde_json::from_slice(&models_list(&g, client(&g, "demo"))).unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 5);
    }

    #[test]
    fn model_info_answers_only_for_what_the_client_may_see() {
        let g = gw();
        let v: serde_json::Value =
            serde_json::from_slice(&model_info(&g, client(&g, "limited"), "mini").unwrap())
                .unwrap();
        assert_eq!(v["id"], "mini");
        assert_eq!(v["object"], "model");
        let e = model_info(&g, client(&g, "limited"), "gpt-4o").unwrap_err();
        assert_eq!((e.status, e.code), (404, "model_not_found"));
        assert!(model_info(&g, client(&g, "demo"), "gpt-4o").is_ok());
        assert!(model_info(&g, client(&g, "demo"), "nope").is_err());
        assert!(model_info(&g, client(&g, "limited"), "mi%6Ei").is_ok());
    }

    #[test]
    fn percent_decoding_of_a_path_segment() {
        assert_eq!(percent_decode("meta-llama%2FLlama-3"), "meta-llama/Llama-3");
        assert_eq!(percent_decode("caf%C3%A9"), "café");
        assert_eq!(percent_decode("plain"), "plain");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%FF"), "%FF", "not UTF-8: as it came");
    }
}
