//! Content-safety vendors as guardrails, in real Envoy: each vendor's
//! fake (the mock's `vendors.rs`, written from the vendor's API reference:
//! Bedrock's SigV4 recomputed, Azure's key header, bearer keys, required
//! fields) reached through a cluster of its own. Each vendor denies,
//! redacts (where it names what to replace) and monitors on chat
//! completions, Responses and Messages; a conversation's turns send the
//! vendor only their new messages; three vendors are asked at once; a
//! vendor that is late, fails or answers what does not read follows the
//! check's failure mode.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};

const VENDOR_KEY: &str = "sk-vendor-key-for-tests";
const KEY_ID: &str = "AKIDGUARDRAILTEST";
const SECRET: &str = "guardrail/test+SECRET";

/// (vendor kind, its settings, the text it flags as harmful, whether it
/// names what to replace).
const VENDORS: &[(&str, &str, &str, bool)] = &[
    (
        "bedrock_guardrails",
        "guardrail_id: gr-abc123, guardrail_version: '1', region: us-east-1",
        "vendor:block",
        true,
    ),
    (
        "azure_content_safety",
        "api_key_env: GUARD_VENDOR_KEY, authority: safety.cognitiveservices.azure.com",
        "vendor:block",
        false,
    ),
    (
        "azure_prompt_shields",
        "api_key_env: GUARD_VENDOR_KEY",
        "vendor:attack",
        false,
    ),
    (
        "model_armor",
        "api_key_env: GUARD_VENDOR_KEY, project: p1, location: us-central1, template: t1",
        "vendor:block",
        true,
    ),
    (
        "openai_moderation",
        "api_key_env: GUARD_OPENAI_KEY, authority: backup.mock",
        "kill",
        false,
    ),
    (
        "lakera_guard",
        "api_key_env: GUARD_VENDOR_KEY, project_id: project-9",
        "vendor:attack",
        true,
    ),
    (
        "presidio",
        "entities: [EMAIL_ADDRESS]",
        "write to eve@example.org now",
        true,
    ),
];

fn key_of(client: &str) -> String {
    format!("sk-{client}")
}

/// A client per (vendor, action), each with its own check.
fn plugin(failure_mode: &str) -> String {
    let mut clients = String::new();
    let mut checks = String::new();
    let mut outputs = String::new();
    let add = |clients: &mut String,
               checks: &mut String,
               client: &str,
               action: &str,
               kind: &str,
               settings: &str,
               cluster: &str,
               extra: &str| {
        clients.push_str(&format!(
            "  - name: {client}\n    key_sha256: {}\n",
            key_hash(&key_of(client))
        ));
        checks.push_str(&format!(
            "    - {{name: {client}, action: {action}, clients: [{client}], vendor: {{kind: {kind}, cluster: {cluster}, {settings}{extra}}}}}\n"
        ));
    };
    for (kind, settings, _, redacts) in VENDORS {
        let cluster = if *kind == "openai_moderation" {
            "backup"
        } else {
            "guard_vendors"
        };
        let short = kind.split('_').next().unwrap_or(kind);
        let short = if *kind == "azure_prompt_shields" {
            "shields"
        } else {
            short
        };
        add(
            &mut clients,
            &mut checks,
            &format!("v-{short}-deny"),
            "deny",
            kind,
            settings,
            cluster,
            "",
        );
        add(
            &mut clients,
            &mut checks,
            &format!("v-{short}-log"),
            "log",
            kind,
            settings,
            cluster,
            "",
        );
        if *redacts {
            add(
                &mut clients,
                &mut checks,
                &format!("v-{short}-redact"),
                "redact",
                kind,
                settings,
                cluster,
                "",
            );
        }
    }
    // Three vendors on one client, asked at once.
    for (kind, settings, _, _) in VENDORS
        .iter()
        .filter(|v| ["lakera_guard", "azure_content_safety", "presidio"].contains(&v.0))
    {
        let client = "v-three";
        if !clients.contains(client) {
            clients.push_str(&format!(
                "  - name: {client}\n    key_sha256: {}\n",
                key_hash(&key_of(client))
            ));
        }
        checks.push_str(&format!(
            "    - {{name: three-{kind}, action: deny, clients: [{client}], vendor: {{kind: {kind}, cluster: guard_vendors, {settings}}}}}\n"
        ));
    }
    // Faults: a short timeout, and one with a key the vendor refuses.
    add(
        &mut clients,
        &mut checks,
        "v-fault",
        "deny",
        "lakera_guard",
        "api_key_env: GUARD_VENDOR_KEY",
        "guard_vendors",
        &format!(", timeout_ms: 300, failure_mode: {failure_mode}"),
    );
    add(
        &mut clients,
        &mut checks,
        "v-badkey",
        "deny",
        "azure_content_safety",
        "api_key_env: GUARD_WRONG_KEY",
        "guard_vendors",
        &format!(", failure_mode: {failure_mode}"),
    );
    // Output checks on whole answers.
    for (client, action, kind, settings) in [
        (
            "v-out-redact",
            "redact",
            "lakera_guard",
            "api_key_env: GUARD_VENDOR_KEY",
        ),
        (
            "v-out-deny",
            "deny",
            "bedrock_guardrails",
            "guardrail_id: gr-out, guardrail_version: '2', region: us-east-1",
        ),
        (
            "v-out-armor",
            "redact",
            "model_armor",
            "api_key_env: GUARD_VENDOR_KEY, project: p1, location: us-central1, template: t1",
        ),
    ] {
        clients.push_str(&format!(
            "  - name: {client}\n    key_sha256: {}\n",
            key_hash(&key_of(client))
        ));
        outputs.push_str(&format!(
            "    - {{name: {client}, action: {action}, clients: [{client}], vendor: {{kind: {kind}, cluster: guard_vendors, failure_mode: {failure_mode}, {settings}}}}}\n"
        ));
    }
    // The real Presidio analyzer (presidio_server.py), on its own cluster.
    clients.push_str(&format!(
        "  - name: v-presidio-real\n    key_sha256: {}\n",
        key_hash(&key_of("v-presidio-real"))
    ));
    checks.push_str("    - {name: v-presidio-real, action: redact, clients: [v-presidio-real], vendor: {kind: presidio, cluster: presidio_real, entities: [EMAIL_ADDRESS, PHONE_NUMBER, CREDIT_CARD]}}\n");
    // A team rolling a vendor out: its keys only monitor what the check
    // denies for everyone else.
    for (client, team) in [("v-pilot", "\n    team: pilots"), ("v-other", "")] {
        clients.push_str(&format!(
            "  - name: {client}\n    key_sha256: {}{team}\n",
            key_hash(&key_of(client))
        ));
    }
    checks.push_str("    - {name: rollout, action: deny, clients: [v-pilot, v-other], vendor: {kind: lakera_guard, cluster: guard_vendors, api_key_env: GUARD_VENDOR_KEY}}\n");
    // The prompt cache on: a stored answer must not pass an output vendor
    // check unread.
    let base = test_plugin()
        .replacen("cache:\n  enabled: false", "cache:\n  enabled: true", 1)
        .replacen("clients:\n", &format!("clients:\n{clients}"), 1);
    format!("{base}\nteams:\n  - {{name: pilots, guardrails: {{rollout: log}}}}\nguardrails:\n  input:\n{checks}  output:\n{outputs}mcp:\n  servers:\n    - {{name: tools, cluster: mcp_tools}}\n")
}

/// The vendors' fakes: the mock with the key and the AWS credentials the
/// vendors take.
fn vendors_mock() -> Mock {
    Mock::start_with_args(
        env!("CARGO_BIN_EXE_portcullis-mock"),
        "vendors",
        Some(VENDOR_KEY),
        &[
            "--aws-access-key-id",
            KEY_ID,
            "--aws-secret-access-key",
            SECRET,
            "--aws-region",
            "us-east-1",
        ],
    )
}

struct Vendors {
    s: Stack,
    vendors: Mock,
    /// The MCP server `tools` (the official SDK's, `tests/sdk/mcp_server.py`).
    _tools: Proc,
    /// The request log.
    log: Collector,
    _log_dir: TempDir,
}

fn start() -> Vendors {
    start_with_presidio(dead_port())
}

/// The same, with the cluster `presidio_real` at `presidio_port`.
fn start_with_presidio(presidio_port: u16) -> Vendors {
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let vendors = vendors_mock();
    let cluster = format!(
        "  - name: presidio_real\n    type: STATIC\n    connect_timeout: 2s\n    load_assignment:\n      cluster_name: presidio_real\n      endpoints:\n      - lb_endpoints:\n        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {presidio_port}}}}}}}\n  - name: guard_vendors\n    type: STATIC\n    connect_timeout: 2s\n    load_assignment:\n      cluster_name: guard_vendors\n      endpoints:\n      - lb_endpoints:\n        - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}\n  - name: mcp_tools\n",
        vendors.port
    );
    let plugin = plugin("allow");
    let log_dir = TempDir::new("vendor-records");
    let log = Collector::start(&log_dir.0.join("log.db"), 0);
    let tools_port = dead_port();
    let tools = mcp_server("tools", tools_port, false);
    let tools_at = format!("port_value: {tools_port}");
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        collector_port: log.grpc_port,
        ratelimit_port: dead_port(),
        primary_port: primary.port,
        backup_port: backup.port,
        workers: 2,
        side_tls: None,
        bootstrap_patch: vec![
            ("  - name: mcp_tools\n", cluster.as_str()),
            ("port_value: 18011", tools_at.as_str()),
        ],
        control: None,
        clusters: None,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("BACKUP_API_KEY", BACKUP_KEY),
            ("ANTHROPIC_API_KEY", PRIMARY_KEY),
            ("GUARD_VENDOR_KEY", VENDOR_KEY),
            ("GUARD_OPENAI_KEY", BACKUP_KEY),
            ("GUARD_WRONG_KEY", "sk-not-the-vendors-key"),
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET),
            (
                "PORTCULLIS_SEAL_SECRET",
                "vendor-guardrails-seal-secret-32b",
            ),
        ],
    });
    Vendors {
        s: Stack {
            primary,
            backup,
            envoy,
        },
        vendors,
        _tools: tools,
        log,
        _log_dir: log_dir,
    }
}

fn short(kind: &str) -> &str {
    if kind == "azure_prompt_shields" {
        return "shields";
    }
    kind.split('_').next().unwrap_or(kind)
}

fn chat_as(v: &Vendors, client: &str, text: &str) -> Resp {
    v.s.chat(&key_of(client), &chat_body("mini", text))
}

fn responses_as(v: &Vendors, client: &str, text: &str) -> Resp {
    let auth = format!("Bearer {}", key_of(client));
    post(
        &v.s.envoy.url("/v1/responses"),
        &[("authorization", auth.as_str())],
        &json!({"model": "mini", "input": text}).to_string(),
    )
}

fn messages_as(v: &Vendors, client: &str, text: &str) -> Resp {
    let key = key_of(client);
    post(
        &v.s.envoy.url("/v1/messages"),
        &[("x-api-key", key.as_str()), ("anthropic-version", "2023-06-01")],
        &json!({"model": "mini", "max_tokens": 20, "messages": [{"role": "user", "content": text}]}).to_string(),
    )
}

/// What the provider was last sent, as text.
fn provider_saw(m: &Mock) -> String {
    m.requests()
        .last()
        .map(|r| r["body"].to_string())
        .unwrap_or_default()
}

fn vendor_calls(m: &Mock, prefix: &str) -> Vec<Value> {
    m.requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with(prefix)))
        .collect()
}

#[test]
fn every_vendor_denies_redacts_and_monitors_on_chat_responses_and_messages() {
    let v = start();
    for (kind, _, harmful, redacts) in VENDORS {
        let s = short(kind);
        let deny = format!("v-{s}-deny");
        let before = v.s.primary.requests().len();
        let text = format!("please {harmful} thanks ({kind})");
        for r in [chat_as(&v, &deny, &text), responses_as(&v, &deny, &text)] {
            assert_openai_error(&r, 400, "guardrail_denied");
            assert!(
                r.body.contains(&deny),
                "{kind}: the check is named: {}",
                r.body
            );
        }
        let r = messages_as(&v, &deny, &text);
        assert_eq!(r.status, 400, "{kind}: {}", r.body);
        assert_eq!(
            r.json()["type"],
            "error",
            "{kind}: Anthropic's shape: {}",
            r.body
        );
        assert_eq!(
            v.s.primary.requests().len(),
            before,
            "{kind}: nothing denied reached the provider"
        );
        // A harmless prompt passes.
        let r = chat_as(&v, &deny, "hello there");
        assert_eq!(r.status, 200, "{kind}: {}", r.body);

        // Monitor: the verdict recorded, the prompt unchanged.
        let flagged =
            v.s.envoy
                .stat("wasmcustom.portcullis.guardrail.vendor_flagged")
                .unwrap_or(0);
        let r = chat_as(&v, &format!("v-{s}-log"), &text);
        assert_eq!(r.status, 200, "{kind}: {}", r.body);
        assert!(
            provider_saw(&v.s.primary).contains(harmful),
            "{kind}: log changes nothing"
        );
        v.s.envoy.wait_stat_at_least(
            "wasmcustom.portcullis.guardrail.vendor_flagged",
            flagged + 1,
        );

        if *redacts {
            let redact = format!("v-{s}-redact");
            let r = chat_as(&v, &redact, "mail alice@example.com today");
            assert_eq!(r.status, 200, "{kind}: {}", r.body);
            let saw = provider_saw(&v.s.primary);
            assert!(!saw.contains("alice@example.com"), "{kind}: {saw}");
            assert!(
                saw.contains(&format!("[REDACTED:{redact}]")),
                "{kind}: {saw}"
            );
            // The same message again (another temperature: not the cache's
            // answer): its kept replacement is applied, no vendor is asked.
            let (asked, sent) = (v.vendors.hits(), v.s.primary.requests().len());
            let again = json!({"model": "mini", "temperature": 0.9,
                "messages": [{"role": "user", "content": "mail alice@example.com today"}]});
            let r = v.s.chat(&key_of(&redact), &again.to_string());
            assert_eq!(r.status, 200, "{kind}: {}", r.body);
            assert_eq!(
                v.s.primary.requests().len(),
                sent + 1,
                "{kind}: the provider was asked"
            );
            let saw = provider_saw(&v.s.primary);
            assert!(
                !saw.contains("alice@example.com"),
                "{kind}: kept redaction: {saw}"
            );
            assert!(
                saw.contains(&format!("[REDACTED:{redact}]")),
                "{kind}: {saw}"
            );
            assert_eq!(
                v.vendors.hits(),
                asked,
                "{kind}: a kept verdict asks no vendor"
            );
            let r = messages_as(&v, &redact, "mail bob@example.net today");
            assert_eq!(r.status, 200, "{kind}: {}", r.body);
            let saw = provider_saw(&v.s.primary);
            assert!(!saw.contains("bob@example.net"), "{kind}: {saw}");
            // Harm that no replacement removes is still denied.
            if *kind != "presidio" {
                let r = chat_as(&v, &redact, &format!("{harmful} and carol@example.com"));
                assert_openai_error(&r, 400, "guardrail_denied");
            }
        }
    }
    // What each vendor was sent, as its API reference says.
    let bedrock = vendor_calls(&v.vendors, "/guardrail/gr-abc123/version/1/apply");
    assert!(!bedrock.is_empty());
    assert_eq!(bedrock[0]["body"]["source"], "INPUT");
    assert!(bedrock[0]["body"]["content"][0]["text"]["text"].is_string());
    let lakera = vendor_calls(&v.vendors, "/v2/guard");
    assert!(lakera
        .iter()
        .any(|c| c["body"]["project_id"] == "project-9"));
    assert!(lakera
        .iter()
        .all(|c| c["headers"].get("authorization").is_none()
            || c["headers"]["authorization"] == format!("Bearer {VENDOR_KEY}")));
    let armor = vendor_calls(
        &v.vendors,
        "/v1/projects/p1/locations/us-central1/templates/t1:sanitizeUserPrompt",
    );
    assert!(armor
        .iter()
        .all(|c| c["body"]["userPromptData"]["text"].is_string()));
}

#[test]
fn a_tool_calls_arguments_are_denied_redacted_and_kept_through_the_mcp_sdk() {
    let v = start();
    let url = v.s.envoy.url("/mcp/tools");
    let lakera = || vendor_calls(&v.vendors, "/v2/guard").len();
    let out = sdk_script(
        "vendor_mcp_check.py",
        &[
            &url,
            &key_of("v-lakera-deny"),
            "hello tool",
            "please vendor:attack it",
        ],
    );
    assert_eq!(out[0], json!(["tools: hello tool"]), "{out}");
    assert!(
        out[1]["message"]
            .as_str()
            .unwrap()
            .contains("v-lakera-deny"),
        "refused in JSON-RPC's shape: {out}"
    );
    let before = lakera();
    let out = sdk_script(
        "vendor_mcp_check.py",
        &[
            &url,
            &key_of("v-lakera-redact"),
            "mail alice@example.com",
            "mail alice@example.com",
        ],
    );
    assert_eq!(
        out[0],
        json!(["tools: mail [REDACTED:v-lakera-redact]"]),
        "the server got the redacted text: {out}"
    );
    assert_eq!(out[1], out[0], "{out}");
    assert_eq!(
        lakera(),
        before + 1,
        "the second call's arguments had a kept verdict"
    );
    // The aggregated endpoint's tool names the server.
    let all = v.s.envoy.url("/mcp");
    let out = sdk_script(
        "vendor_mcp_check.py",
        &[
            &all,
            &key_of("v-lakera-redact"),
            "--tool=tools__echo",
            "mail bob@example.com",
            "vendor:attack",
        ],
    );
    assert_eq!(
        out[0],
        json!(["tools: mail [REDACTED:v-lakera-redact]"]),
        "{out}"
    );
    assert!(
        out[1]["message"]
            .as_str()
            .unwrap()
            .contains("v-lakera-redact"),
        "{out}"
    );
    // Monitor: the server gets what the caller sent.
    let out = sdk_script(
        "vendor_mcp_check.py",
        &[&url, &key_of("v-lakera-log"), "vendor:attack"],
    );
    assert_eq!(out[0], json!(["tools: vendor:attack"]), "{out}");
}

#[test]
fn whole_answers_are_denied_and_redacted_by_vendors_in_every_api() {
    let v = start();
    let answers = |texts: &[&str]| {
        v.s.primary.script(json!(texts
            .iter()
            .map(|t| json!({"content": t}))
            .collect::<Vec<_>>()));
    };
    answers(&[
        "reach me at alice@example.com",
        "reach me at bob@example.com",
        "reach me at carol@example.com",
    ]);
    let r = chat_as(&v, "v-out-redact", "hi");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "reach me at [REDACTED:v-out-redact]"
    );
    assert!(
        r.header("content-type")
            .unwrap_or_default()
            .contains("application/json"),
        "the answer's headers are kept"
    );
    let r = responses_as(&v, "v-out-redact", "hi");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.contains("reach me at [REDACTED:v-out-redact]") && !r.body.contains("bob@"),
        "{}",
        r.body
    );
    let r = messages_as(&v, "v-out-redact", "hi");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["content"][0]["text"],
        "reach me at [REDACTED:v-out-redact]",
        "{}",
        r.body
    );
    let lakera = vendor_calls(&v.vendors, "/v2/guard");
    assert_eq!(
        lakera.last().unwrap()["body"]["messages"][0]["role"],
        "assistant",
        "an answer is the assistant's"
    );

    answers(&["this is vendor:block material", "this is vendor:block too"]);
    let r = chat_as(&v, "v-out-deny", "hi");
    assert_openai_error(&r, 400, "guardrail_denied");
    assert!(!r.body.contains("vendor:block"), "{}", r.body);
    let r = messages_as(&v, "v-out-deny", "hi");
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["type"], "error", "{}", r.body);
    let bedrock = vendor_calls(&v.vendors, "/guardrail/gr-out/version/2/apply");
    assert_eq!(bedrock.last().unwrap()["body"]["source"], "OUTPUT");

    answers(&["write dave@example.org soon"]);
    let r = chat_as(&v, "v-out-armor", "hi");
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "write [REDACTED:v-out-armor] soon"
    );
    assert!(!vendor_calls(
        &v.vendors,
        "/v1/projects/p1/locations/us-central1/templates/t1:sanitizeModelResponse"
    )
    .is_empty());

    // Each verdict in the record: the vendor, what it flagged, its latency.
    let records = poll_until(std::time::Duration::from_secs(30), "the records", || {
        let r = v.log.recent(50);
        r.iter().any(|r| r["client"] == "v-out-deny").then_some(r)
    });
    let denied = records
        .iter()
        .find(|r| r["client"] == "v-out-deny")
        .unwrap();
    let verdict = &denied["guardrails"][0];
    assert_eq!(denied["error"], "guardrail_denied", "{denied}");
    assert_eq!(verdict["stage"], "output", "{verdict}");
    assert_eq!(verdict["action"], "deny", "{verdict}");
    assert_eq!(
        verdict["vendor"]["vendor"], "bedrock_guardrails",
        "{verdict}"
    );
    assert_eq!(
        verdict["vendor"]["categories"],
        json!(["content:VIOLENCE"]),
        "{verdict}"
    );
    assert!(verdict["vendor"]["latency_ms"].is_u64(), "{verdict}");
    assert_eq!(verdict["vendor"]["sent"], 1, "{verdict}");
    let redacted = records
        .iter()
        .find(|r| r["client"] == "v-out-redact")
        .unwrap();
    assert_eq!(
        redacted["guardrails"][0]["vendor"]["categories"],
        json!(["pii/email"]),
        "{redacted}"
    );
    assert!(
        !records.iter().any(|r| r.to_string().contains("alice@")),
        "no matched text in the record"
    );

    // A clean answer is kept: the same answer again asks no vendor. The
    // same prompt is not answered from the cache either: a stored answer
    // would pass the vendor unread, so the provider is asked again.
    answers(&["all clear", "all clear"]);
    let before = vendor_calls(&v.vendors, "/v2/guard").len();
    let asked = v.s.primary.requests().len();
    for _ in 0..2 {
        let r = chat_as(&v, "v-out-redact", "the same prompt");
        assert_eq!(r.json()["choices"][0]["message"]["content"], "all clear");
        assert_ne!(
            r.header("x-portcullis-cache"),
            Some("hit"),
            "{:?}",
            r.headers
        );
    }
    assert_eq!(
        v.s.primary.requests().len(),
        asked + 2,
        "no answer from the cache"
    );
    assert_eq!(vendor_calls(&v.vendors, "/v2/guard").len(), before + 1);

    // A streamed answer is not read by vendors: with failure mode allow it
    // passes, counted and recorded, never silently.
    let errors =
        v.s.envoy
            .stat("wasmcustom.portcullis.guardrail.guard_errors")
            .unwrap_or(0);
    let r = v.s.chat(
        &key_of("v-out-deny"),
        &json!({"model": "mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    v.s.envoy
        .wait_stat_at_least("wasmcustom.portcullis.guardrail.guard_errors", errors + 1);
}

#[test]
fn the_vendors_sdks_read_what_the_gateway_sends_and_what_the_fakes_answer() {
    let v = start();
    for (client, text) in [
        ("v-bedrock-deny", "hello there"),
        ("v-bedrock-deny", "please vendor:block it"),
        ("v-bedrock-redact", "mail alice@example.com"),
        ("v-azure-deny", "hello azure"),
        ("v-azure-deny", "vendor:block azure"),
    ] {
        chat_as(&v, client, text);
    }
    let log: Vec<Value> = v
        .vendors
        .requests()
        .into_iter()
        .filter(|r| {
            r["path"].as_str().is_some_and(|p| {
                p.starts_with("/guardrail/") || p.starts_with("/contentsafety/text:analyze")
            })
        })
        .collect();
    let dir = TempDir::new("vendor-sdk");
    let file = dir.0.join("requests.json");
    std::fs::write(&file, serde_json::to_vec(&log).unwrap()).unwrap();
    let out = sdk_script(
        "vendor_sdk_check.py",
        &[
            &v.vendors.url(""),
            VENDOR_KEY,
            KEY_ID,
            SECRET,
            file.to_str().unwrap(),
        ],
    );
    assert_eq!(out["bedrock"]["checked"], 3, "{out}");
    assert_eq!(out["bedrock"]["problems"], json!([]), "{out}");
    assert_eq!(
        out["bedrock"]["actions"],
        json!(["NONE", "GUARDRAIL_INTERVENED", "GUARDRAIL_INTERVENED"]),
        "{out}"
    );
    assert_eq!(out["azure"]["checked"], 2, "{out}");
    assert_eq!(out["azure"]["problems"], json!([]), "{out}");
    assert_eq!(out["azure"]["severities"][1]["Violence"], 6, "{out}");
}

#[test]
fn a_real_presidio_analyzer_redacts_what_its_recognizers_find() {
    let port = dead_port();
    let _presidio = presidio_server(port);
    let v = start_with_presidio(port);
    let r = chat_as(
        &v,
        "v-presidio-real",
        "mail alice@example.com or call 212-555-0199, card 4111 1111 1111 1111",
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let saw = provider_saw(&v.s.primary);
    for gone in ["alice@example.com", "212-555-0199", "4111 1111 1111 1111"] {
        assert!(!saw.contains(gone), "{gone} reached the provider: {saw}");
    }
    assert!(
        saw.contains("mail [REDACTED:v-presidio-real] or call [REDACTED:v-presidio-real]"),
        "{saw}"
    );
    let r = chat_as(&v, "v-presidio-real", "nothing personal here");
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(provider_saw(&v.s.primary).contains("nothing personal here"));
}

#[test]
fn a_team_monitors_what_the_check_denies_for_the_others() {
    let v = start();
    let r = chat_as(&v, "v-other", "vendor:attack now");
    assert_openai_error(&r, 400, "guardrail_denied");
    assert!(r.body.contains("rollout"), "{}", r.body);
    let flagged =
        v.s.envoy
            .stat("wasmcustom.portcullis.guardrail.vendor_flagged")
            .unwrap_or(0);
    let r = chat_as(&v, "v-pilot", "vendor:attack now");
    assert_eq!(r.status, 200, "the team's keys only monitor: {}", r.body);
    assert!(provider_saw(&v.s.primary).contains("vendor:attack"));
    v.s.envoy.wait_stat_at_least(
        "wasmcustom.portcullis.guardrail.vendor_flagged",
        flagged + 1,
    );
}

#[test]
fn a_conversation_sends_each_message_once_and_three_vendors_are_asked_at_once() {
    let v = start();
    let client = "v-three";
    let mut messages = vec![json!({"role": "system", "content": "You are terse."})];
    for turn in 0..20 {
        messages.push(json!({"role": "user", "content": format!("question number {turn}")}));
        let r = v.s.chat(
            &key_of(client),
            &json!({"model": "mini", "messages": messages}).to_string(),
        );
        assert_eq!(r.status, 200, "turn {turn}: {}", r.body);
        let answer = r.json()["choices"][0]["message"]["content"].clone();
        messages.push(json!({"role": "assistant", "content": answer}));
    }
    // Lakera takes one message per item: each call after the first carries
    // the turn's new question and the previous answer, never the history.
    let calls = vendor_calls(&v.vendors, "/v2/guard");
    assert_eq!(calls.len(), 20, "one call a turn");
    let sizes: Vec<usize> = calls
        .iter()
        .map(|c| c["body"]["messages"].as_array().map_or(0, Vec::len))
        .collect();
    assert_eq!(sizes[0], 2, "system and the first question: {sizes:?}");
    assert!(sizes[1..].iter().all(|&n| n <= 2), "O(1) a turn: {sizes:?}");
    let total: usize = sizes.iter().sum();
    let distinct: std::collections::HashSet<String> = messages[..messages.len() - 1]
        .iter()
        .map(|m| m["content"].to_string())
        .collect();
    assert_eq!(total, distinct.len(), "each message sent once: {sizes:?}");
    v.s.envoy
        .wait_stat_at_least("wasmcustom.portcullis.guardrail.vendor_texts_kept", 3 * 100);

    // Three vendors asked at once: each waits 400 ms to answer, and all
    // three had the request before the first of them answered.
    let r =
        v.s.chat(&key_of(client), &chat_body("mini", "vendor:wait please"));
    assert_eq!(r.status, 200, "{}", r.body);
    let log = v.vendors.requests();
    let at: Vec<u64> = log
        .iter()
        .filter(|c| c["body"].to_string().contains("vendor:wait"))
        .filter_map(|c| c["at_ms"].as_u64())
        .collect();
    assert_eq!(at.len(), 3, "three vendors asked: {log:?}");
    let (first, last) = (at.iter().min().unwrap(), at.iter().max().unwrap());
    assert!(
        last - first < 400,
        "asked at once, not one after another: {at:?}"
    );
}

#[test]
fn a_vendor_that_is_late_fails_or_answers_garbage_follows_the_failure_mode() {
    let v = start();
    let errors = "wasmcustom.portcullis.guardrail.guard_errors";
    for fault in [
        "vendor:slow",
        "vendor:500",
        "vendor:garbage",
        "vendor:shape",
    ] {
        let r = chat_as(&v, "v-fault", fault);
        assert_eq!(r.status, 200, "{fault}, failure mode allow: {}", r.body);
    }
    let r = chat_as(&v, "v-badkey", "hello");
    assert_eq!(
        r.status, 200,
        "a refused key, failure mode allow: {}",
        r.body
    );
    v.s.envoy.wait_stat(errors, 5);
    assert!(
        vendor_calls(&v.vendors, "/contentsafety/")
            .iter()
            .any(|c| c["headers"]["ocp-apim-subscription-key"] == "sk-not-the-vendors-key"),
        "the key from the environment was sent"
    );

    v.s.envoy.reload(&plugin("deny"));
    let r = poll_until(
        std::time::Duration::from_secs(30),
        "failure_mode deny",
        || {
            let r = chat_as(&v, "v-fault", "vendor:500");
            (r.status != 200).then_some(r)
        },
    );
    assert_openai_error(&r, 503, "guardrail_unavailable");
    for fault in ["vendor:slow", "vendor:garbage", "vendor:shape"] {
        let r = chat_as(&v, "v-fault", fault);
        assert_openai_error(&r, 503, "guardrail_unavailable");
    }
    let r = chat_as(&v, "v-badkey", "hello");
    assert_openai_error(&r, 503, "guardrail_unavailable");
    assert!(!r.body.contains("sk-not-the-vendors-key"), "{}", r.body);
    let r = chat_as(&v, "v-fault", "all fine");
    assert_eq!(r.status, 200, "{}", r.body);
    // An output vendor check with failure mode deny refuses a stream it
    // cannot read, before any provider is asked.
    let r = v.s.chat(
        &key_of("v-out-deny"),
        &json!({"model": "mini", "stream": true, "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    assert_openai_error(&r, 503, "guardrail_unavailable");
    assert!(r.body.contains("answer"), "{}", r.body);
}

/// (name, path, headers, body, status, what the refusal says).
type Case<'a> = (
    &'a str,
    &'a str,
    Vec<(&'a str, &'a str)>,
    Value,
    u16,
    &'a str,
);

#[test]
fn each_vendor_fake_refuses_what_the_vendor_refuses() {
    let m = vendors_mock();
    let bearer = format!("Bearer {VENDOR_KEY}");
    let az = "/contentsafety/text:analyze?api-version=2024-09-01";
    let armor = "/v1/projects/p/locations/l/templates/t:sanitizeUserPrompt";
    let long = "x".repeat(10_001);
    let cases: Vec<Case> = vec![
        (
            "Bedrock unsigned",
            "/guardrail/g/version/1/apply",
            vec![],
            json!({"source": "INPUT", "content": [{"text": {"text": "x"}}]}),
            403,
            "Missing Authentication Token",
        ),
        (
            "Azure wrong key",
            az,
            vec![("ocp-apim-subscription-key", "nope")],
            json!({"text": "x"}),
            401,
            "invalid subscription key",
        ),
        (
            "Azure no version",
            "/contentsafety/text:analyze",
            vec![("ocp-apim-subscription-key", VENDOR_KEY)],
            json!({"text": "x"}),
            404,
            "Resource not found",
        ),
        (
            "Azure too long",
            az,
            vec![("ocp-apim-subscription-key", VENDOR_KEY)],
            json!({"text": long}),
            400,
            "InvalidRequestBody",
        ),
        (
            "Model Armor wrong token",
            armor,
            vec![("authorization", "Bearer nope")],
            json!({"userPromptData": {"text": "x"}}),
            401,
            "UNAUTHENTICATED",
        ),
        (
            "Model Armor no text",
            armor,
            vec![("authorization", bearer.as_str())],
            json!({"userPromptData": {}}),
            400,
            "INVALID_ARGUMENT",
        ),
        (
            "Lakera wrong key",
            "/v2/guard",
            vec![("authorization", "Bearer nope")],
            json!({"messages": [{"role": "user", "content": "x"}]}),
            401,
            "Invalid API key",
        ),
        (
            "Lakera no messages",
            "/v2/guard",
            vec![("authorization", bearer.as_str())],
            json!({}),
            400,
            "messages: field required",
        ),
        (
            "Presidio no text",
            "/analyze",
            vec![],
            json!({"language": "en"}),
            400,
            "No text provided",
        ),
    ];
    for (name, path, headers, body, status, says) in cases {
        let r = post(&m.url(path), &headers, &body.to_string());
        assert_eq!(r.status, status, "{name}: {}", r.body);
        assert!(r.body.contains(says), "{name}: {}", r.body);
    }
}
