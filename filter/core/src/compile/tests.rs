//! The config compiler's tests.
use super::*;
use crate::health::breaker::BreakerConfig;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A daily budget of `micros`.
pub(crate) fn day_budget(micros: i64) -> Budget {
    Budget {
        micros,
        period: crate::limits::period::Period::Day,
    }
}

pub(crate) const GOOD: &str = r#"
providers:
  - name: primary
    cluster: c_primary
    host: primary.example
    api_key_env: OPENAI_API_KEY
    models:
      - {name: gpt-4o-mini, weight: 3, aliases: [mini]}
      - {name: gpt-4o, id: gpt-4o-2024-08-06, weight: 1}
  - name: backup
    cluster: c_backup
    host: backup.example
    base_path: /openai/v1/
    breaker: {cooldown_ms: 500}
    models:
      - {name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini]}
      - {name: llama-3, weight: 0}
routing:
  chain: [primary, backup]
breaker:
  consecutive_failures: 4
clients:
  - name: demo
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"
  - name: limited
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000002"
    models: [mini]
"#;

#[test]
fn good_config_compiles_with_models_in_chain_order() {
    let g = compile(GOOD.as_bytes()).unwrap();
    assert_eq!(g.providers.len(), 2);
    let mini = g.names["gpt-4o-mini"];
    assert_eq!(g.names["mini"], mini);
    let serving = &g.models[mini].serving;
    assert_eq!(serving[0].provider, 0);
    assert_eq!(serving[1].provider_model_id, "openai/gpt-4o-mini");
    assert_eq!(g.auto.len(), 2);
    assert_eq!(
        crate::translate::path(
            &g.providers[1],
            crate::api::Api::ChatCompletions,
            "m",
            false
        ),
        "/openai/v1/chat/completions"
    );
    assert_eq!(g.max_body_bytes, 32 << 20, "32 MiB unless set");
}

/// A provider's `upstream`: the cluster the control plane makes for it
/// (defaults: `host`, 443, TLS), every problem named at once.
#[test]
fn a_providers_upstream_has_defaults_and_its_problems_are_named() {
    let g = compile(GOOD.as_bytes()).unwrap();
    assert_eq!(g.providers[0].upstream, None, "none unless asked");
    let asked = GOOD.replace(
        "    breaker: {cooldown_ms: 500}\n",
        "    breaker: {cooldown_ms: 500}\n    upstream: {}\n",
    );
    let g = compile(asked.as_bytes()).unwrap();
    assert_eq!(
        g.providers[1].upstream,
        Some(Upstream {
            address: "backup.example".into(),
            port: 443,
            tls: true
        })
    );
    let plain = GOOD.replace(
        "    breaker: {cooldown_ms: 500}\n",
        "    breaker: {cooldown_ms: 500}\n    upstream: {address: 127.0.0.1, port: 8080, tls: false}\n",
    );
    let g = compile(plain.as_bytes()).unwrap();
    assert_eq!(
        g.providers[1].upstream,
        Some(Upstream {
            address: "127.0.0.1".into(),
            port: 8080,
            tls: false
        })
    );
    let bad = GOOD.replace(
        "    breaker: {cooldown_ms: 500}\n",
        "    breaker: {cooldown_ms: 500}\n    upstream: {address: \"a b\", port: 0}\n",
    );
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(
        err.contains("upstream: `address`") && err.contains("upstream.port"),
        "{err}"
    );
}

#[test]
fn breaker_defaults_and_per_provider_overrides() {
    let g = compile(GOOD.as_bytes()).unwrap();
    assert_eq!(g.providers[0].breaker.consecutive_failures, 4);
    assert_eq!(
        g.providers[0].breaker.cooldown_ms,
        BreakerConfig::default().cooldown_ms
    );
    assert_eq!(g.providers[1].breaker.consecutive_failures, 4);
    assert_eq!(g.providers[1].breaker.cooldown_ms, 500);
    assert_eq!(g.max_attempts, 3);
    let bad = GOOD.replace(
        "breaker: {cooldown_ms: 500}",
        "breaker: {cooldown_ms: 0, failure_ratio: 2.0, probes: 1}",
    );
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(
        err.contains("`probes`")
            && err.contains("`failure_ratio` must be")
            && err.contains("`cooldown_ms`"),
        "{err}"
    );
}

#[test]
fn cache_is_off_by_default_and_sized_from_bytes() {
    assert!(compile(GOOD.as_bytes()).unwrap().cache.is_none());
    let on = format!("{GOOD}cache: {{enabled: true, max_bytes: 1048576, max_entry_bytes: 16384, scope: client}}\n");
    let c = compile(on.as_bytes()).unwrap().cache.unwrap();
    assert_eq!(
        (c.sets, c.ways, c.per_client, c.ttl_ms),
        (16, 4, true, 3_600_000)
    );
    // Each worker's copies: an eighth of the table, at most 1 MiB, held 1 s.
    assert_eq!((c.worker_bytes, c.worker_ttl_ms), (131_072, 1000));
    let big = on.replace("max_bytes: 1048576", "max_bytes: 67108864");
    let c = compile(big.as_bytes()).unwrap().cache.unwrap();
    assert_eq!(c.worker_bytes, 1 << 20);
    let set = on.replace(
        "scope: client",
        "scope: client, worker_bytes: 0, worker_ttl_ms: 250",
    );
    let c = compile(set.as_bytes()).unwrap().cache.unwrap();
    assert_eq!((c.worker_bytes, c.worker_ttl_ms), (0, 250));
    let over = on.replace("scope: client", "scope: client, worker_bytes: 2097152");
    let err = compile(over.as_bytes()).unwrap_err();
    assert!(err.contains("`worker_bytes`"), "{err}");
    let bad = format!("{GOOD}cache: {{enabled: true, max_bytes: 10, max_entry_bytes: 100, scope: team, size: 1}}\n");
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(
        err.contains("cache.scope")
            && err.contains("max_entry_bytes <= max_bytes")
            && err.contains("`size`"),
        "{err}"
    );
}

#[test]
fn limits_defaults_overrides_prices_and_experiments() {
    let cfg = GOOD.replace("limits:\n", "")
        + r#"
limits:
  requests_per_minute: 60
  budget_usd_per_day: 1.5
prices:
  gpt-4o-mini: {input: 0.15, output: 0.6}
  gpt-4o: {input: 2.5, output: 10, cached_input: 1.25}
  llama-3: {input: 0, output: 0}
experiments:
  - name: ab
    applies_to: [mini, auto]
    arms:
      - {name: control, weight: 1, model: gpt-4o-mini}
      - {name: big, weight: 1, model: gpt-4o}
"#;
    let cfg = cfg.replace(
        "    models: [mini]\n",
        "    models: [mini]\n    limits: {requests_per_minute: 5, max_concurrent: 2}\n",
    );
    let g = compile(cfg.as_bytes()).unwrap();
    let demo = g.clients.values().find(|c| c.name == "demo").unwrap();
    assert_eq!(demo.limits.requests_per_minute, Some(60));
    assert_eq!(demo.limits.budgets, vec![day_budget(1_500_000)]);
    assert_eq!(demo.limits.default_max_tokens, 1024);
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    assert_eq!(
        (
            limited.limits.requests_per_minute,
            limited.limits.max_concurrent
        ),
        (Some(5), Some(2))
    );
    assert_eq!(
        limited.limits.budgets,
        vec![day_budget(1_500_000)],
        "inherits the default"
    );
    assert_eq!(g.prices[g.names["gpt-4o-mini"]].unwrap().cached_input, 0.15);
    let e = &g.experiments[0];
    assert_eq!(e.salt, "ab");
    assert_eq!(
        e.applies,
        Applies::Models {
            models: vec![g.names["gpt-4o-mini"]],
            auto: true
        }
    );
}

#[test]
fn limit_price_and_experiment_problems_are_reported() {
    let cfg = GOOD.to_string()
        + r#"
limits: {requests_per_minute: 0, budget_usd_per_day: 2}
prices:
  gpt-5: {input: 1, output: 1}
experiments:
  - name: ab
    applies_to: [nothing]
    arms:
      - {name: a, weight: 0, model: gpt-4o}
      - {name: a, weight: 0, model: ghost}
"#;
    let err = compile(cfg.as_bytes()).unwrap_err();
    for needle in [
        "limit of 0",
        "`gpt-5` is not a model",
        "no price is known for these models (add them to `prices`, or a provider model's `price`): llama-3",
        "applies_to `nothing`",
        "arm name `a` is empty or repeated",
        "targets `ghost`",
    ] {
        assert!(err.contains(needle), "{needle} missing: {err}");
    }
}

#[test]
fn json_config_is_accepted() {
    let json = r#"{"providers":[{"name":"p","cluster":"c","host":"h","models":[{"name":"m"}]}],
            "clients":[{"name":"a","key_sha256":"0000000000000000000000000000000000000000000000000000000000000001"}]}"#;
    let g = compile(json.as_bytes()).unwrap();
    assert_eq!(g.models[0].name, "m");
}

#[test]
fn unknown_keys_at_every_level_are_all_reported() {
    let bad = GOOD
        .replace("routing:\n", "routing:\n  retries: 3\n")
        .replace("    api_key_env:", "    colour: red\n    api_key_env:")
        .replace("{name: gpt-4o, id:", "{name: gpt-4o, nickname: x, id:")
        + "extra: 1\n";
    let err = compile(bad.as_bytes()).unwrap_err();
    for needle in ["`retries`", "`colour`", "`nickname`", "`extra`"] {
        assert!(err.contains(needle), "{needle} missing from {err}");
    }
    assert!(
        err.starts_with("plugin config rejected (4 problems)"),
        "{err}"
    );
    let both = GOOD.replace(
        "chain: [primary, backup]",
        "chain: [primary, ghost]\n  retries: 2",
    );
    let err = compile(both.as_bytes()).unwrap_err();
    assert!(
        err.contains("`retries`") && err.contains("no provider named `ghost`"),
        "{err}"
    );
}

#[test]
fn cross_reference_problems_are_reported_together() {
    let bad = GOOD
        .replace(
            "chain: [primary, backup]",
            "chain: [primary, backup, ghost]",
        )
        .replace(
            "aliases: [mini]}\n      - {name: gpt-4o,",
            "aliases: [mini, gpt-4o]}\n      - {name: gpt-4o,",
        )
        .replace("models: [mini]", "models: [mini, claude]")
        .replace("weight: 3", "weight: 0")
        .replace("weight: 1}", "weight: 0}");
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(err.contains("no provider named `ghost`"), "{err}");
    assert!(err.contains("alias `gpt-4o`"), "{err}");
    assert!(err.contains("`claude` is not served"), "{err}");
    assert!(err.contains("sum to zero"), "{err}");
}

#[test]
fn alias_naming_two_models_is_rejected() {
    let bad = GOOD.replace(
        "{name: llama-3, weight: 0}",
        "{name: llama-3, weight: 0, aliases: [mini]}",
    );
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(err.contains("alias `mini` names two models"), "{err}");
}

#[test]
fn provider_missing_from_chain_and_bad_fields_are_reported() {
    let bad = GOOD
        .replace("chain: [primary, backup]", "chain: [primary]")
        .replace("base_path: /openai/v1/", "base_path: openai")
        .replace(
            "\"0000000000000000000000000000000000000000000000000000000000000002\"",
            "nothex",
        );
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(err.contains("not in routing.chain"), "{err}");
    assert!(err.contains("must be empty or start with `/`"), "{err}");
    assert!(err.contains("64 hex characters"), "{err}");
}

#[test]
fn empty_and_garbage_configs_are_rejected_with_a_message() {
    assert!(compile(b"").unwrap_err().contains("empty"));
    assert!(compile(b"providers: [")
        .unwrap_err()
        .contains("not valid YAML"));
    assert!(compile(b"- 1\n- 2")
        .unwrap_err()
        .contains("must be a mapping"));
    assert!(compile(b"providers: 3\nclients: []")
        .unwrap_err()
        .contains("wrong type"));
    let err = compile(b"providers: 3\nclients: []\nflavour: x").unwrap_err();
    assert!(
        err.contains("wrong type") && err.contains("`flavour`"),
        "{err}"
    );
    let err = compile(b"providers: []\nclients: []").unwrap_err();
    assert!(
        err.contains("at least one provider") && err.contains("at least one client"),
        "{err}"
    );
}

#[test]
fn client_allow_list_resolves_aliases() {
    let g = compile(GOOD.as_bytes()).unwrap();
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    assert!(limited.may_use(g.names["gpt-4o-mini"]));
    assert!(!limited.may_use(g.names["gpt-4o"]));
}

#[test]
fn global_scopes_and_the_service_section() {
    let text = format!(
        "{GOOD}limits:\n  requests_per_minute: 100\n  scope: global\n  global: {{cluster: rls}}\n"
    );
    let g = compile(text.as_bytes()).unwrap();
    let gl = g.global_limits.clone().unwrap();
    // Local shares by default (#34), one replica unless told.
    assert_eq!(
        (gl.cluster.as_str(), gl.timeout_ms, gl.failure, gl.replicas),
        ("rls", 50, GlobalFailure::LocalShare, 1)
    );
    let demo = g.clients.values().find(|c| c.name == "demo").unwrap();
    assert_eq!(demo.limits.scope.requests_per_minute, Scope::Global);
    assert_eq!(demo.limits.scope.budgets, Scope::Global);
    // Per limit, under a client, over the defaults.
    let text = GOOD.replace(
        "    models: [mini]\n",
        "    models: [mini]\n    limits: {tokens_per_minute: 1000, scope: {tokens_per_minute: both}}\n",
    ) + "limits:\n  global: {cluster: rls, timeout_ms: 50, failure_mode: deny}\n";
    let g = compile(text.as_bytes()).unwrap();
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    assert_eq!(limited.limits.scope.tokens_per_minute, Scope::Both);
    assert_eq!(limited.limits.scope.requests_per_minute, Scope::Local);
    assert_eq!(g.global_limits.unwrap().failure, GlobalFailure::Deny);
    let text =
        format!("{GOOD}limits:\n  global: {{cluster: rls, failure_mode: allow, replicas: 3}}\n");
    let gl = compile(text.as_bytes()).unwrap().global_limits.unwrap();
    assert_eq!((gl.failure, gl.replicas), (GlobalFailure::Allow, 3));
}

#[test]
fn global_limit_problems_are_reported_together() {
    let text = GOOD.replace(
        "    models: [mini]\n",
        "    models: [mini]\n    limits: {tokens_per_minute: 5000000000, scope: {tokens_per_minute: global, max_concurrent: global, budget_usd_per_day: fleet}}\n",
    );
    let e = compile(text.as_bytes()).unwrap_err();
    assert!(
        e.contains("limits.global is required: clients (limited)"),
        "{e}"
    );
    assert!(e.contains("`max_concurrent` cannot be scoped"), "{e}");
    assert!(
        e.contains("scope.budget_usd_per_day: `fleet` is not a scope"),
        "{e}"
    );
    assert!(e.contains("5000000000 is too large"), "{e}");
    let text = format!(
        "{GOOD}limits:\n  scope: everywhere\n  global: {{cluster: '', timeout_ms: 0, failure_mode: maybe, retries: 2, replicas: 0}}\n"
    );
    let e = compile(text.as_bytes()).unwrap_err();
    for want in [
        "`everywhere` is not a scope",
        "limits.global.cluster",
        "timeout_ms must be between",
        "`maybe` is not a failure mode",
        "limits.global: unknown key `retries`",
        "limits.global.replicas must be at least 1",
    ] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
}

#[test]
fn yaml_tags_are_refused_and_the_tagged_mapping_is_still_checked() {
    let text =
        format!("!custom\n{}", GOOD.trim_start()).replace("clients:\n", "bogus: 1\nclients:\n");
    let err = compile(text.as_bytes()).unwrap_err();
    assert!(
        err.contains("config: YAML tag `!custom` is not accepted"),
        "{err}"
    );
    assert!(err.contains("config: unknown key `bogus`"), "{err}");
    let nested = GOOD.replace("  - name: limited\n", "  - !x\n    name: limited\n");
    let err = compile(nested.as_bytes()).unwrap_err();
    assert!(err.contains("clients[1]: YAML tag `!x`"), "{err}");
}

#[test]
fn a_config_over_the_size_limit_is_refused_naming_both_sizes() {
    assert_eq!(too_large(10, 10), None);
    let msg = too_large(5_000_001, DEFAULT_MAX_CONFIG_BYTES).unwrap();
    assert!(
        msg.contains("5000001 bytes") && msg.contains("4194304 bytes"),
        "{msg}"
    );
    assert_eq!(max_config_bytes(None), DEFAULT_MAX_CONFIG_BYTES);
    assert_eq!(max_config_bytes(Some(" 1024 ")), 1024);
    assert_eq!(max_config_bytes(Some("0")), DEFAULT_MAX_CONFIG_BYTES);
    assert_eq!(max_config_bytes(Some("lots")), DEFAULT_MAX_CONFIG_BYTES);
}

#[test]
fn a_models_apis_are_known_apis_its_providers_format_serves() {
    use crate::api::Api;
    let ok = GOOD.replace(
        "{name: llama-3, weight: 0}",
        "{name: llama-3, weight: 0, apis: [embeddings, chat_completions, embeddings]}",
    );
    let g = compile(ok.as_bytes()).unwrap();
    let llama = g.models.iter().find(|m| m.name == "llama-3").unwrap();
    assert_eq!(
        llama.serving[0].apis,
        Some(vec![Api::Embeddings, Api::ChatCompletions])
    );
    let mini = g.models.iter().find(|m| m.name == "gpt-4o-mini").unwrap();
    assert!(mini.serving.iter().all(|s| s.apis.is_none()));

    // One message lists every problem: an unknown name, an empty list, an
    // API the format cannot serve (naming both).
    let bad = GOOD
        .replace(
            "{name: llama-3, weight: 0}",
            "{name: llama-3, weight: 0, apis: [chat, messages]}",
        )
        .replace(
            "{name: gpt-4o, id: gpt-4o-2024-08-06, weight: 1}",
            "{name: gpt-4o, id: gpt-4o-2024-08-06, weight: 1, apis: []}",
        )
        .replace(
            "    base_path: /openai/v1/\n",
            "    base_path: /openai/v1/\n    schema: anthropic\n",
        )
        .replace(
            "{name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini]}",
            "{name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini], apis: [embeddings]}",
        );
    let err = compile(bad.as_bytes()).unwrap_err();
    assert!(err.contains("provider `backup` model `llama-3`: `apis` lists `chat`, which is not an API (one of: chat_completions, messages, embeddings, count_tokens, responses, images_generations, images_edits, audio_speech, audio_transcriptions, audio_translations, moderations, rerank, realtime)"), "{err}");
    assert!(
        err.contains("provider `primary` model `gpt-4o`: `apis` is empty"),
        "{err}"
    );
    assert!(err.contains("provider `backup` model `gpt-4o-mini`: `apis` lists `embeddings` (/v1/embeddings), which a provider of schema `anthropic` cannot serve"), "{err}");
    assert!(!err.contains("`messages`"), "{err}");
}

#[test]
fn a_bedrock_provider_needs_a_region_and_gets_its_host_and_paths() {
    let yaml = |extra: &str| {
        format!(
            "providers:\n  - name: b\n    cluster: b\n    schema: bedrock\n{extra}    models: [{{name: claude, id: \"anthropic.claude-3-haiku-20240307-v1:0\"}}]\nclients:\n  - name: c\n    key_sha256: \"0000000000000000000000000000000000000000000000000000000000000001\"\n"
        )
    };
    let g = compile(yaml("    region: eu-west-3\n    aws_env_prefix: PROD_\n").as_bytes()).unwrap();
    let p = &g.providers[0];
    assert_eq!(
        p.schema,
        Schema::Bedrock {
            region: "eu-west-3".into(),
            env_prefix: "PROD_".into(),
            drop_unsupported: false
        }
    );
    assert_eq!(p.host, "bedrock-runtime.eu-west-3.amazonaws.com");
    let path = |api, stream| {
        crate::translate::path(p, api, "anthropic.claude-3-haiku-20240307-v1:0", stream)
    };
    assert_eq!(
        path(crate::api::Api::ChatCompletions, false),
        "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse"
    );
    assert_eq!(
        path(crate::api::Api::Messages, true),
        "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
    );
    assert_eq!(
        path(crate::api::Api::Embeddings, false),
        "/model/anthropic.claude-3-haiku-20240307-v1%3A0/invoke"
    );
    // A host of one's own (a VPC endpoint) stays.
    let g = compile(yaml("    region: us-east-1\n    host: vpce.example\n").as_bytes()).unwrap();
    assert_eq!(g.providers[0].host, "vpce.example");
    // Every problem in one report.
    let e =
        compile(yaml("    api_key_env: KEY\n    aws_env_prefix: \"1-\"\n").as_bytes()).unwrap_err();
    for says in [
        "schema `bedrock` needs `region`",
        "instead of `api_key_env`",
        "`aws_env_prefix` `1-` does not make environment variable names",
    ] {
        assert!(e.contains(says), "{says}: {e}");
    }
    let e = compile(
        yaml("    region: us-east-1\n")
            .replace("schema: bedrock", "schema: openai\n    host: h")
            .as_bytes(),
    )
    .unwrap_err();
    assert!(
        e.contains("`region` applies to schema `bedrock` only"),
        "{e}"
    );
}

#[test]
fn a_vertex_provider_needs_a_project_and_region_and_gets_its_host_paths_and_token_source() {
    let yaml = |extra: &str| {
        format!(
            "providers:\n  - name: v\n    cluster: v\n    schema: vertex\n{extra}    models: [{{name: m, id: \"claude-sonnet-4-5@20250929\"}}]\nclients:\n  - name: c\n    key_sha256: \"0000000000000000000000000000000000000000000000000000000000000001\"\n"
        )
    };
    let g = compile(yaml("    project: my-proj\n    region: europe-west1\n    publisher: anthropic\n    default_max_tokens: 512\n").as_bytes()).unwrap();
    let p = &g.providers[0];
    assert_eq!(p.host, "europe-west1-aiplatform.googleapis.com");
    let Schema::Vertex {
        publisher,
        token,
        options,
        ..
    } = &p.schema
    else {
        panic!("{:?}", p.schema);
    };
    assert_eq!(*publisher, super::Publisher::Anthropic);
    assert_eq!(options.default_max_tokens, 512);
    assert_eq!(
        (token.cluster.as_str(), token.host.as_str()),
        ("gcp_metadata", "metadata.google.internal")
    );
    assert_eq!(
        crate::translate::path(p, crate::api::Api::Messages, "claude-sonnet-4-5@20250929", true),
        "/v1/projects/my-proj/locations/europe-west1/publishers/anthropic/models/claude-sonnet-4-5%4020250929:streamRawPredict"
    );
    let g = compile(yaml("    project: my-proj\n    region: global\n").as_bytes()).unwrap();
    assert_eq!(g.providers[0].host, "aiplatform.googleapis.com");
    assert_eq!(
        crate::translate::path(&g.providers[0], crate::api::Api::CountTokens, "gemini-2.5-flash", false),
        "/v1/projects/my-proj/locations/global/publishers/google/models/gemini-2.5-flash:countTokens"
    );
    let e =
        compile(yaml("    publisher: meta\n    api_key_env: K\n    token_path: x\n").as_bytes())
            .unwrap_err();
    for says in [
        "schema `vertex` needs `region`",
        "schema `vertex` needs `project`",
        "`publisher` must be google or anthropic",
        "not `api_key_env`",
        "`token_path` must start with `/`",
    ] {
        assert!(e.contains(says), "{says}: {e}");
    }
    let e = compile(
        yaml("    region: us-east1\n")
            .replace("schema: vertex", "schema: bedrock\n    project: p")
            .as_bytes(),
    )
    .unwrap_err();
    assert!(
        e.contains("`project` applies to schema `vertex` only"),
        "{e}"
    );
}

#[test]
fn a_gemini_provider_takes_drop_unsupported_and_refuses_anthropic_keys() {
    let yaml = |extra: &str| {
        format!(
            "providers:\n  - name: g\n    cluster: g\n    host: generativelanguage.googleapis.com\n    base_path: /v1beta\n    schema: gemini\n{extra}    models: [{{name: flash, id: gemini-2.5-flash}}]\nclients:\n  - name: c\n    key_sha256: \"0000000000000000000000000000000000000000000000000000000000000001\"\n"
        )
    };
    let g = compile(yaml("    drop_unsupported: true\n").as_bytes()).unwrap();
    assert_eq!(
        g.providers[0].schema,
        Schema::Gemini {
            drop_unsupported: true
        }
    );
    assert_eq!(g.providers[0].schema.name(), "gemini");
    assert_eq!(
        crate::translate::path(
            &g.providers[0],
            crate::api::Api::ChatCompletions,
            "gemini-2.5-flash",
            true
        ),
        "/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
    );
    let e =
        compile(yaml("    default_max_tokens: 10\n    anthropic_version: 2023-06-01\n").as_bytes())
            .unwrap_err();
    assert!(
        e.contains("`default_max_tokens` applies to schema `anthropic` only")
            && e.contains("`anthropic_version` applies to schema `anthropic` only"),
        "{e}"
    );
    let e = compile(
        yaml("")
            .replace("schema: gemini", "schema: openai")
            .replace(
                "    base_path: /v1beta\n",
                "    base_path: /v1\n    drop_unsupported: true\n",
            )
            .as_bytes(),
    )
    .unwrap_err();
    assert!(
        e.contains(
            "`drop_unsupported` applies to schemas `anthropic`, `gemini`, `bedrock` and `vertex` only"
        ),
        "{e}"
    );
    let e = compile(
        yaml("")
            .replace("schema: gemini", "schema: palm")
            .as_bytes(),
    )
    .unwrap_err();
    assert!(e.contains("anthropic, gemini"), "{e}");
}

#[test]
fn a_clients_body_limit_overrides_the_gateways_and_zero_is_refused() {
    let yaml = GOOD.replace(
        "    models: [mini]\n",
        "    models: [mini]\n    limits: {max_body_bytes: 4096}\n",
    );
    assert!(yaml.contains("max_body_bytes: 4096"));
    let g = compile(format!("{yaml}limits:\n  max_body_bytes: 65536\n").as_bytes()).unwrap();
    assert_eq!(g.max_body_bytes, 65536);
    let mut limits: Vec<usize> = g
        .clients
        .values()
        .map(|c| c.limits.max_body_bytes)
        .collect();
    limits.sort_unstable();
    assert_eq!(
        limits,
        [4096, 65536],
        "the client's own, and the gateway's for the other"
    );
    let g = compile(yaml.as_bytes()).unwrap();
    assert!(g
        .clients
        .values()
        .any(|c| c.limits.max_body_bytes == 32 << 20));
    let e = compile(format!("{GOOD}limits:\n  max_body_bytes: 0\n").as_bytes()).unwrap_err();
    assert!(e.contains("a limit of 0 would refuse everything"), "{e}");
}

#[test]
fn a_models_body_limit_is_the_smallest_its_providers_set() {
    let text = GOOD
        .replace(
            "      - {name: gpt-4o-mini, weight: 3, aliases: [mini]}",
            "      - {name: gpt-4o-mini, weight: 3, aliases: [mini], max_body_bytes: 9000}",
        )
        .replace(
            "      - {name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini]}",
            "      - {name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini], max_body_bytes: 5000}",
        );
    let g = compile(text.as_bytes()).unwrap();
    assert_eq!(g.models[g.names["gpt-4o-mini"]].max_body_bytes, Some(5000));
    assert_eq!(g.models[g.names["gpt-4o"]].max_body_bytes, None);
    let bad = GOOD.replace(
        "      - {name: llama-3, weight: 0}",
        "      - {name: llama-3, weight: 0, max_body_bytes: 0}",
    );
    let e = compile(bad.as_bytes()).unwrap_err();
    assert!(e.contains("model `llama-3`: `max_body_bytes` of 0"), "{e}");
}

#[test]
fn a_preset_fills_what_the_provider_leaves_out_and_the_config_wins() {
    let text = r#"
providers:
  - {name: m, cluster: c_m, preset: mistral, models: [{name: mistral-large}]}
  - {name: g, cluster: c_g, preset: groq, base_path: /custom/v1, api_key_env: MY_GROQ, models: [{name: llama}]}
  - {name: o, cluster: c_o, preset: ollama, host: gpu-box:11434, drop_fields: [logit_bias], models: [{name: qwen}]}
  - {name: p, cluster: c_p, preset: perplexity, models: [{name: sonar}]}
clients:
  - name: demo
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"
"#;
    let gw = compile(text.as_bytes()).unwrap();
    let by = |n: &str| gw.providers.iter().find(|p| p.name == n).unwrap();
    let m = by("m");
    assert_eq!(
        (
            m.host.as_str(),
            m.base_path.as_str(),
            m.api_key_env.as_deref()
        ),
        ("api.mistral.ai", "/v1", Some("MISTRAL_API_KEY"))
    );
    assert_eq!(m.drop_fields, ["stream_options"]);
    assert_eq!(m.schema, Schema::OpenAi);
    let g = by("g");
    assert_eq!(
        (
            g.host.as_str(),
            g.base_path.as_str(),
            g.api_key_env.as_deref()
        ),
        ("api.groq.com", "/custom/v1", Some("MY_GROQ"))
    );
    let o = by("o");
    assert_eq!(
        (
            o.host.as_str(),
            o.base_path.as_str(),
            o.api_key_env.as_deref()
        ),
        ("gpu-box:11434", "/v1", None)
    );
    assert_eq!(o.drop_fields, ["logit_bias"]);
    assert_eq!(by("p").base_path, "");
}

#[test]
fn presets_and_drop_fields_that_cannot_apply_are_refused_in_one_report() {
    let text = r#"
providers:
  - {name: a, cluster: c, preset: nonesuch, host: h, models: [{name: x}]}
  - {name: b, cluster: c, preset: groq, schema: anthropic, models: [{name: y}]}
  - {name: c, cluster: c, host: h, schema: gemini, drop_fields: [stream_options], models: [{name: z}]}
  - {name: d, cluster: c, models: [{name: w}]}
  - {name: e, cluster: c, host: h, drop_fields: [messages], models: [{name: v}]}
clients:
  - name: demo
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"
"#;
    let err = compile(text.as_bytes()).unwrap_err();
    for want in [
        "providers[0] (a): preset `nonesuch` is not one of groq, mistral",
        "providers[1] (b): a preset is an OpenAI-compatible service",
        "`drop_fields` applies to schema `openai` only",
        "providers[3] (d): `host` is empty or missing",
        "providers[4] (e): `drop_fields` cannot drop `messages`",
    ] {
        assert!(err.contains(want), "{want} in {err}");
    }
}
