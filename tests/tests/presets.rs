//! Presets for OpenAI-compatible services (#26) in real Envoy: each fills
//! the host, base path and key variable it stands for, and the fields the
//! service refuses are left out. The primary mock refuses `stream_options`
//! as Mistral does (422 `extra_forbidden`, usage in a stream's last chunk
//! unasked); the backup mock takes no key, as a local server.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};

const MISTRAL_KEY: &str = "sk-mistral-test";

fn plugin() -> String {
    format!(
        "providers:
  - {{name: mistral, cluster: primary, preset: mistral, models: [{{name: mistral-large, id: mistral-large-latest}}]}}
  - {{name: raw, cluster: primary, preset: mistral, drop_fields: [], models: [{{name: mistral-raw, id: mistral-large-latest}}]}}
  - {{name: local, cluster: backup, preset: ollama, models: [{{name: qwen, id: qwen2.5:7b}}]}}
  - {{name: groq, cluster: backup, preset: groq, api_key_env: BACKUP_API_KEY, models: [{{name: llama, id: llama-3.3-70b-versatile}}]}}
clients:
  - name: demo
    key_sha256: {}
",
        key_hash(DEMO_KEY)
    )
}

fn last_request(m: &Mock) -> Value {
    m.requests()
        .into_iter()
        .rev()
        .find(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| !p.starts_with("/__mock"))
        })
        .expect("the mock saw a request")
}

#[test]
fn presets_route_to_their_service_and_leave_out_what_it_refuses() {
    let primary = Mock::start_with_args(
        env!("CARGO_BIN_EXE_portcullis-mock"),
        "mistral",
        Some(MISTRAL_KEY),
        &["--refuse-fields", "stream_options"],
    );
    let backup = mock("local", None);
    let plugin = plugin();
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 1,
        env: vec![
            ("MISTRAL_API_KEY", MISTRAL_KEY),
            ("BACKUP_API_KEY", "sk-groq-test"),
        ],
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
    });
    let url = envoy.url("/v1/chat/completions");
    let auth = format!("Bearer {DEMO_KEY}");
    let hdrs = [("authorization", auth.as_str())];
    let msgs = json!([{"role": "user", "content": "hi"}]);

    // A stream whose client asked for usage: `stream_options` left out (the
    // client is told), the service's host, path and key, usage arrives.
    let body = json!({"model": "mistral-large", "messages": msgs, "stream": true,
        "stream_options": {"include_usage": true}});
    let r = post(&url, &hdrs, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.trim_end().ends_with("data: [DONE]"), "{}", r.body);
    assert!(
        r.body.contains(r#""usage""#),
        "usage reaches the client: {}",
        r.body
    );
    assert_eq!(r.header("x-portcullis-dropped"), Some("stream_options"));
    let seen = last_request(&primary);
    assert_eq!(seen["path"], "/v1/chat/completions");
    assert_eq!(seen["headers"]["host"], "api.mistral.ai");
    assert_eq!(
        seen["headers"]["authorization"],
        format!("Bearer {MISTRAL_KEY}")
    );
    assert_eq!(seen["body"]["model"], "mistral-large-latest");
    assert_eq!(seen["body"].get("stream_options"), None);

    // A stream that asked nothing: the gateway does not ask for usage itself
    // (the service would refuse it); nothing reported dropped.
    let body = json!({"model": "mistral-large", "messages": msgs, "stream": true});
    let r = post(&url, &hdrs, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("x-portcullis-dropped"), None);
    assert_eq!(last_request(&primary)["body"].get("stream_options"), None);

    // Anthropic's Messages API through the pivot, streamed: the pivot's own
    // `stream_options` left out too.
    let r = post(
        &envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY), ("anthropic-version", "2023-06-01")],
        &json!({"model": "mistral-large", "max_tokens": 50, "stream": true, "messages": msgs})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(r.body.contains("message_stop"), "{}", r.body);
    assert_eq!(last_request(&primary)["body"].get("stream_options"), None);

    // The same service with the preset's drop turned off (`drop_fields:
    // []`): the client's `stream_options` goes through, and the service's
    // refusal reaches the client.
    let body = json!({"model": "mistral-raw", "messages": msgs, "stream": true,
        "stream_options": {"include_usage": true}});
    let r = post(&url, &hdrs, &body.to_string());
    assert_eq!(r.status, 422, "{}", r.body);
    assert!(r.body.contains("extra_forbidden"), "{}", r.body);

    // A local server (ollama): localhost, /v1, no credential.
    let r = post(&url, &hdrs, &chat_body("qwen", "hi"));
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = last_request(&backup);
    assert_eq!(seen["path"], "/v1/chat/completions");
    assert_eq!(seen["headers"]["host"], "localhost");
    assert_eq!(seen["headers"].get("authorization"), None);

    // Groq: its base path, its key from the variable the config names.
    let r = post(&url, &hdrs, &chat_body("llama", "hi"));
    assert_eq!(r.status, 200, "{}", r.body);
    let seen = last_request(&backup);
    assert_eq!(seen["path"], "/openai/v1/chat/completions");
    assert_eq!(seen["headers"]["host"], "api.groq.com");
    assert_eq!(seen["headers"]["authorization"], "Bearer sk-groq-test");

    // Every preset's models are listed.
    let models = get(&envoy.url("/v1/models"), &hdrs).json();
    let owned: Vec<(String, String)> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().into(),
                m["owned_by"].as_str().unwrap().into(),
            )
        })
        .collect();
    for (id, by) in [
        ("mistral-large", "mistral"),
        ("qwen", "local"),
        ("llama", "groq"),
    ] {
        assert!(
            owned.contains(&(id.into(), by.into())),
            "{id} by {by} in {owned:?}"
        );
    }
}

/// Every preset in the table loads, routes to its host and base path with
/// its key (none for a local server), and is listed in `/v1/models`.
#[test]
fn every_preset_routes_to_its_service_and_is_listed() {
    use portcullis_core::compile::presets::PRESETS;
    const KEY: &str = "sk-every-preset";
    let service = mock("service", Some(KEY));
    let local = mock("local", None);
    let mut providers = String::new();
    for p in PRESETS {
        let cluster = if p.api_key_env.is_some() {
            "primary"
        } else {
            "backup"
        };
        providers.push_str(&format!(
            "  - {{name: {n}, cluster: {cluster}, preset: {n}, models: [{{name: m-{n}, id: {n}-model}}]}}\n",
            n = p.name
        ));
    }
    let plugin = format!(
        "providers:\n{providers}clients:\n  - name: demo\n    key_sha256: {}\n",
        key_hash(DEMO_KEY)
    );
    let env: Vec<(&str, &str)> = PRESETS
        .iter()
        .filter_map(|p| p.api_key_env)
        .map(|e| (e, KEY))
        .collect();
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: service.port,
        backup_port: local.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 1,
        env,
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
    });
    let auth = format!("Bearer {DEMO_KEY}");
    let hdrs = [("authorization", auth.as_str())];
    for p in PRESETS {
        let r = post(
            &envoy.url("/v1/chat/completions"),
            &hdrs,
            &chat_body(&format!("m-{}", p.name), "hi"),
        );
        assert_eq!(r.status, 200, "{}: {}", p.name, r.body);
        assert_eq!(r.header("x-portcullis-provider"), Some(p.name));
        let seen = last_request(if p.api_key_env.is_some() {
            &service
        } else {
            &local
        });
        assert_eq!(
            seen["path"],
            format!("{}/chat/completions", p.base_path),
            "{}",
            p.name
        );
        assert_eq!(seen["headers"]["host"], p.host, "{}", p.name);
        assert_eq!(seen["body"]["model"], format!("{}-model", p.name));
        match p.api_key_env {
            Some(_) => assert_eq!(seen["headers"]["authorization"], format!("Bearer {KEY}")),
            None => assert_eq!(seen["headers"].get("authorization"), None, "{}", p.name),
        }
    }
    let listed = get(&envoy.url("/v1/models"), &hdrs).json();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    for p in PRESETS {
        assert!(
            ids.contains(&format!("m-{}", p.name).as_str()),
            "{}: {ids:?}",
            p.name
        );
    }
}
