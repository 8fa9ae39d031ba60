//! Tests of `routing`.

use super::*;
use crate::compile::compile;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn gw() -> Gateway {
    compile(crate::compile::tests::GOOD.as_bytes()).unwrap()
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
            allow_overrides: false,
            team: None,
            counters_key: String::new(),
        },
    );
    assert_eq!(
        authenticate(&g, Some("Bearer sk-demo"), 0).unwrap().1.name,
        "real"
    );
    assert_eq!(
        authenticate(&g, Some("Bearer sk-other"), 0)
            .unwrap_err()
            .status,
        401
    );
    assert_eq!(
        authenticate(&g, None, 0).unwrap_err().message,
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
        crate::compile::tests::GOOD
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
            allow_overrides: false,
            team: None,
            counters_key: String::new(),
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
        serde_json::from_slice(&model_info(&g, client(&g, "limited"), "mini").unwrap()).unwrap();
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

#[test]
fn remembered_key_hashes_are_only_accepted_keys_and_the_config_still_decides() {
    let mut g = gw();
    let hash: [u8; 32] = Sha256::digest(b"sk-demo").into();
    let client = Client {
        name: "real".into(),
        allowed: None,
        limits: Default::default(),
        allow_overrides: false,
        team: None,
        counters_key: String::new(),
    };
    g.clients.insert(hash, client);
    let mut known = KeyHashes::default();
    assert!(authenticate_with(&g, Some("Bearer sk-other"), &mut known, || 0).is_err());
    assert!(known.is_empty(), "an unknown key is not remembered");
    for _ in 0..2 {
        let (h, c) = authenticate_with(&g, Some("Bearer sk-demo"), &mut known, || 0).unwrap();
        assert_eq!((h, c.name.as_str()), (hash, "real"));
        assert_eq!(known.len(), 1);
    }
    // A reload that removed the client: the remembered hash finds nothing.
    g.clients.remove(&hash);
    assert_eq!(
        authenticate_with(&g, Some("Bearer sk-demo"), &mut known, || 0)
            .unwrap_err()
            .status,
        401
    );
}

/// A rotated-out key works as its client (with the current key's handle)
/// until its grace period ends, then is refused like any unknown key.
#[test]
fn previous_key_works_until_its_grace_ends() {
    let hex = |k: &str| -> String {
        Sha256::digest(k.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    };
    let yaml = crate::compile::tests::GOOD.replace(
        "clients:\n",
        &format!(
            "clients:\n  - name: rotated\n    key_sha256: {}\n    previous_keys:\n      - {{sha256: {}, until: 1000}}\n",
            hex("sk-new"),
            hex("sk-old")
        ),
    );
    let g = compile(yaml.as_bytes()).unwrap();
    let new: [u8; 32] = Sha256::digest(b"sk-new").into();
    let mut known = KeyHashes::default();
    for key in ["Bearer sk-new", "Bearer sk-old"] {
        let (h, c) = authenticate_with(&g, Some(key), &mut known, || 999_999).unwrap();
        assert_eq!((h, c.name.as_str()), (new, "rotated"), "{key}");
    }
    assert_eq!(
        authenticate_with(&g, Some("Bearer sk-old"), &mut known, || 1_000_000)
            .unwrap_err()
            .status,
        401
    );
    assert!(authenticate(&g, Some("Bearer sk-new"), 5_000_000).is_ok());
    // An old key may not be a current one, nor appear twice.
    let bad = crate::compile::tests::GOOD.replace(
        "clients:\n",
        &format!(
            "clients:\n  - name: a\n    key_sha256: {}\n    previous_keys: [{{sha256: {b}, until: 1}}, {{sha256: {x}, until: 2}}, {{sha256: {x}, until: 3}}, {{sha256: zz, until: 1}}]\n  - name: b\n    key_sha256: {b}\n",
            hex("sk-a"),
            b = hex("sk-b"),
            x = hex("sk-x"),
        ),
    );
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(
        err.contains("(a).previous_keys[0]: `sha256` is a client's current key"),
        "{err}"
    );
    assert!(
        err.contains("(a).previous_keys[2]: `sha256` is another previous key too"),
        "{err}"
    );
    assert!(
        err.contains("(a).previous_keys[3]: `sha256` must be 64 hex"),
        "{err}"
    );
    assert!(!err.contains("previous_keys[1]"), "{err}");
}
