//! The MCP gateway (#47) through real Envoy and the gateway's filter (the
//! build `PORTCULLIS_BUILD` names): two MCP servers built with the official
//! `mcp` SDK (one answering SSE streams, one JSON) behind
//! `/mcp/{server}`, the SDK's client with two keys that see different
//! tools; refusals in JSON-RPC's shape; a tool-call limit at exactly its
//! bound under 30 concurrent calls; a card number redacted in a tool's
//! arguments and in its streamed result; the credential the server gets
//! in place of the key; the request records.

mod common;

use common::{mcp_server, sdk_script, DEMO_KEY};
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

const ALICE_KEY: &str = "sk-mcp-alice";
const BURST_KEY: &str = "sk-mcp-burst";
const BETA_TOKEN: &str = "beta-server-token";
const PAYER_KEY: &str = "sk-mcp-payer";

fn plugin() -> String {
    let base = test_plugin();
    let clients = format!(
        "clients:\n  - name: alice\n    key_sha256: {}\n    team: agents\n    mcp: {{tools: [\"*__echo\", \"*__count\", \"*__card\", \"*__headers\", \"alpha__add\"]}}\n  - name: burst\n    key_sha256: {}\n    mcp: {{servers: [alpha], calls_per_minute: 10}}\n  - name: logins\n    key_sha256: {}\n  - name: payer\n    key_sha256: {}\n    limits: {{budget_usd_per_day: 0.005}}\n    mcp: {{servers: [beta], max_concurrent_calls: 1}}\n",
        key_hash(ALICE_KEY),
        key_hash(BURST_KEY),
        key_hash("sk-mcp-logins-never-sent"),
        key_hash(PAYER_KEY)
    );
    assert!(base.contains("\nclients:\n") && !base.contains("\nteams:"));
    assert!(
        !base.contains("\nguardrails:"),
        "the test plugin has no guardrails"
    );
    let mut p = base.replacen("\nclients:\n", &format!("\n{clients}"), 1);
    p.push_str(
        "teams:\n  - name: agents\n    mcp: {servers: [alpha, beta]}\n  - name: readers\n    mcp: {tools: [alpha__echo]}\n\
guardrails:\n  input:\n    - {name: cards, pii: [card], action: redact, clients: [alice]}\n  output:\n    - {name: cards-out, pii: [card], action: redact, clients: [alice]}\n\
mcp:\n  oauth: {client: logins, resource: \"https://gateway.test/mcp\", authorization_servers: [\"https://idp.test\"]}\n  servers:\n    - {name: alpha, cluster: mcp_alpha}\n    - {name: beta, cluster: mcp_beta, credential: {header: authorization, env: MCP_BETA_TOKEN, prefix: \"Bearer \"}, price_per_call_usd: 0.002}\n",
    );
    p
}

/// envoy/snippets/mcp-oauth.yaml's two filters with the test's issuer and
/// keys, then the gateway's filter.
fn jwt_filters(jwks: &str) -> String {
    let snippet =
        std::fs::read_to_string(repo_root().join("envoy/snippets/mcp-oauth.yaml")).unwrap();
    let remote = "        remote_jwks:\n          http_uri: {uri: \"https://idp.example.com/.well-known/jwks.json\", cluster: idp, timeout: 2s}\n          cache_duration: 300s\n";
    assert!(snippet.contains(remote), "the snippet's JWKS");
    let filters: String = snippet
        .replace(
            remote,
            &format!("        local_jwks: {{inline_string: '{jwks}'}}\n"),
        )
        .replace("https://idp.example.com", "https://idp.test")
        .replace(
            "https://gateway.example.com/mcp",
            "https://gateway.test/mcp",
        )
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| format!("          {l}\n"))
        .collect();
    format!("{filters}          - name: portcullis\n")
}

fn cluster_file(name: &str, port: u16) -> String {
    format!(
        "name: {name}\ntype: STATIC\nconnect_timeout: 2s\nload_assignment:\n  cluster_name: {name}\n  endpoints:\n  - lb_endpoints:\n    - endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}\n"
    )
}

fn mcp_post(url: &str, key: &str, body: &str, session: Option<&str>) -> Resp {
    let auth = format!("Bearer {key}");
    let mut headers = vec![
        ("authorization", auth.as_str()),
        ("accept", "application/json, text/event-stream"),
    ];
    if let Some(s) = session {
        headers.push(("mcp-session-id", s));
    }
    post(url, &headers, body)
}

fn rpc(r: &Resp) -> Value {
    let text = r
        .body
        .lines()
        .find_map(|l| l.strip_prefix("data: "))
        .unwrap_or(&r.body);
    serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {} {}", r.status, r.body))
}

#[test]
fn the_gateway_puts_keys_tools_limits_and_guardrails_in_front_of_mcp_servers() {
    let (alpha_port, beta_port) = (dead_port(), dead_port());
    let _alpha = mcp_server("alpha", alpha_port, false);
    let _beta = mcp_server("beta", beta_port, true);
    let log_dir = TempDir::new("mcp-log");
    let collector = Collector::start(&log_dir.0.join("log.db"), 0);
    let clusters = TempDir::new("mcp-clusters");
    std::fs::write(
        clusters.0.join("alpha.yaml"),
        cluster_file("mcp_alpha", alpha_port),
    )
    .unwrap();
    std::fs::write(
        clusters.0.join("beta.yaml"),
        cluster_file("mcp_beta", beta_port),
    )
    .unwrap();
    let primary = common::mock("primary", None);
    let tokens = sdk_script(
        "jwt_tokens.py",
        &["https://idp.test", "https://gateway.test/mcp"],
    );
    let jwt_filters = jwt_filters(tokens["jwks"].as_str().unwrap());
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin(),
        primary_port: primary.port,
        backup_port: dead_port(),
        collector_port: collector.grpc_port,
        ratelimit_port: dead_port(),
        workers: 2,
        env: vec![("MCP_BETA_TOKEN", BETA_TOKEN)],
        side_tls: None,
        // Logins verified by Envoy's jwt_authn (envoy/snippets/mcp-oauth.yaml,
        // its keys inline); keys pass it as they are.
        bootstrap_patch: vec![("          - name: portcullis\n", &jwt_filters)],
        control: None,
        clusters: Some(&clusters.0),
    });
    let alpha = envoy.url("/mcp/alpha");
    let beta = envoy.url("/mcp/beta");
    let traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    // The demo key has no MCP section: every tool. Alice's key sees only
    // hers (the SSE server, then the JSON one).
    let demo = sdk_script("mcp_gateway_check.py", &[&alpha, DEMO_KEY, "alpha"]);
    assert_eq!(
        demo["tools"],
        json!(["add", "card", "count", "echo", "headers", "secret", "wait"])
    );
    assert_eq!(demo["secret"], json!(["alpha: the secret"]));
    assert_eq!(
        demo["card"],
        json!(["paid with 5500 0000 0000 0004 4111 1111 1111 1111"]),
        "no guardrail for demo"
    );
    for (url, name) in [(&alpha, "alpha"), (&beta, "beta")] {
        let v = sdk_script("mcp_gateway_check.py", &[url, ALICE_KEY, name, traceparent]);
        let mut want_tools = vec!["card", "count", "echo", "headers"];
        if name == "alpha" {
            want_tools.insert(0, "add");
        }
        assert_eq!(v["server"], json!(name), "{v}");
        assert_eq!(v["tools"], json!(want_tools), "{name}: filtered per key");
        assert_eq!(v["echo"], json!([format!("{name}: hi")]));
        assert_eq!(v["count"], json!(["counted to 3"]));
        // Progress notifications pass in an SSE answer; a server answering
        // JSON sends none.
        let progress = if name == "alpha" {
            json!([1.0, 2.0, 3.0])
        } else {
            json!([])
        };
        assert_eq!(v["progress"], progress, "{name}: progress");
        // Refused in MCP's shape, never forwarded.
        assert_eq!(v["secret"]["code"], json!(-32602), "{v}");
        assert!(
            v["secret"]["message"]
                .as_str()
                .unwrap()
                .contains(&format!("{name}__secret")),
            "{v}"
        );
        // Redacted in the arguments (the server saw none) and in the result.
        let card = v["card"][0].as_str().unwrap();
        assert!(
            !card.contains("5500 0000") && !card.contains("4111 1111"),
            "{card}"
        );
        assert_eq!(card.matches("[REDACTED:").count(), 2, "{card}");
        // The server's credential, never the caller's key; the trace goes on.
        // The server echoes what it got: its credential comes back scrubbed
        // (only the exact token is replaced, so it got exactly that).
        let got: Value = serde_json::from_str(v["headers"][0].as_str().unwrap()).unwrap();
        let auth = got.get("authorization").and_then(Value::as_str);
        if name == "beta" {
            assert_eq!(auth, Some("Bearer [REDACTED]"));
            assert!(!v.to_string().contains(BETA_TOKEN), "{v}");
        } else {
            assert_eq!(auth, None, "{got}");
        }
        assert!(!got.to_string().contains(ALICE_KEY), "{got}");
        let tp = got["traceparent"].as_str().unwrap_or_default();
        assert!(
            tp.starts_with("00-0af7651916cd43dd8448eb211c80319c-")
                && !tp.contains("b7ad6b7169203331"),
            "{tp}"
        );
        assert_eq!(v["resource"], json!([format!("server {name}")]));
        assert_eq!(v["prompt"], json!([format!("Hello Ada, from {name}")]));
        // The session ends with DELETE through the gateway; after it the
        // server knows the session no more.
        let session = v["session"].as_str().expect("a session id");
        let auth = format!("Bearer {ALICE_KEY}");
        let path = if name == "alpha" {
            "/mcp/alpha"
        } else {
            "/mcp/beta"
        };
        let authority = format!("127.0.0.1:{}", envoy.port);
        let (status, _, body) = raw_http(
            envoy.port,
            "DELETE",
            path,
            &[
                ("host", &authority),
                ("authorization", &auth),
                ("mcp-session-id", session),
            ],
            "",
        );
        assert_eq!(status, 200, "DELETE {name}: {body}");
        let ping = r#"{"jsonrpc":"2.0","id":9,"method":"ping"}"#;
        let r = mcp_post(url, ALICE_KEY, ping, Some(session));
        assert_eq!(r.status, 404, "ended: {}", r.body);
    }

    // The aggregated endpoint: both servers behind /mcp, their tools and
    // prompts qualified, Alice's filtered; each call under its server's
    // credential and session; the session ended with DELETE on close.
    let v = sdk_script("mcp_aggregate_check.py", &[&envoy.url("/mcp"), ALICE_KEY]);
    assert_eq!(v["server"], "portcullis", "{v}");
    assert_eq!(
        v["tools"],
        json!([
            "alpha__add",
            "alpha__card",
            "alpha__count",
            "alpha__echo",
            "alpha__headers",
            "beta__card",
            "beta__count",
            "beta__echo",
            "beta__headers"
        ]),
        "{v}"
    );
    assert_eq!(v["prompts"], json!(["alpha__greet", "beta__greet"]), "{v}");
    assert_eq!(v["echo"], json!(["alpha: hi"]));
    assert_eq!(v["beta_echo"], json!(["beta: hi"]));
    let got: Value = serde_json::from_str(v["headers"][0].as_str().unwrap()).unwrap();
    assert_eq!(got["authorization"], json!("Bearer [REDACTED]"), "{got}");
    assert!(!v.to_string().contains(BETA_TOKEN), "{v}");
    assert!(!got.to_string().contains(ALICE_KEY), "{got}");
    assert_eq!(v["secret"]["code"], json!(-32602), "{v}");
    assert_eq!(v["unknown"]["code"], json!(-32602), "{v}");
    assert_eq!(v["prompt"], json!(["Hello Ada, from beta"]));
    assert_eq!(v["ping"], "ok");

    // An agent (the OpenAI Agents SDK) whose model is called through the
    // gateway and whose tools are reached through its MCP endpoint: the
    // model asks for alpha__echo, the agent calls it at /mcp, the model
    // answers; both under the client's one trace.
    primary.script(json!([
        {"content": "Calling.", "tool_call": {"name": "alpha__echo", "input": {"text": "agent"}}},
        {"content": "The tool said: alpha: agent"}
    ]));
    let agent_trace = "00-5bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let v = sdk_script(
        "agents_mcp_check.py",
        &[&envoy.url(""), ALICE_KEY, "gpt-4o-mini", agent_trace],
    );
    assert_eq!(v["final"], "The tool said: alpha: agent", "{v}");
    assert!(
        v["tools"]
            .as_array()
            .is_some_and(|t| t.contains(&json!("alpha__echo"))),
        "{v}"
    );
    let second = primary.requests().last().unwrap()["body"]["messages"].to_string();
    assert!(
        second.contains("alpha: agent"),
        "the tool's result went back to the model: {second}"
    );

    // Bad input: each a JSON-RPC error with the spec's status, none a 500.
    let cases: &[(&str, &str, &str, u16, i64)] = &[
        ("/mcp/alpha", ALICE_KEY, "not json", 400, -32700),
        (
            "/mcp/alpha",
            ALICE_KEY,
            r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#,
            400,
            -32600,
        ),
        (
            "/mcp/alpha",
            ALICE_KEY,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{}}"#,
            400,
            -32602,
        ),
        (
            "/mcp/alpha",
            ALICE_KEY,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"beta__secret"}}"#,
            403,
            -32602,
        ),
        (
            "/mcp/gamma",
            ALICE_KEY,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            404,
            -32601,
        ),
        // The aggregated endpoint without a session.
        (
            "/mcp",
            ALICE_KEY,
            r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#,
            404,
            -32600,
        ),
        (
            "/mcp",
            ALICE_KEY,
            r#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"info://alpha"}}"#,
            404,
            -32601,
        ),
        (
            "/mcp/beta",
            BURST_KEY,
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            403,
            -32000,
        ),
        (
            "/mcp/alpha",
            "sk-nobody",
            r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#,
            401,
            -32000,
        ),
    ];
    for (path, key, body, status, code) in cases {
        let r = mcp_post(&envoy.url(path), key, body, None);
        assert_eq!(r.status, *status, "{path} {body}: {}", r.body);
        let v = rpc(&r);
        assert_eq!(v["jsonrpc"], "2.0");
        assert_eq!(v["error"]["code"], json!(code), "{path} {body}: {v}");
        if *status == 401 {
            assert!(r
                .header("www-authenticate")
                .is_some_and(|h| h.starts_with("Bearer")));
        }
    }
    // An aggregated session ends with DELETE at every server: after it,
    // the servers know it no more and the client is told to start again.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let r = mcp_post(&envoy.url("/mcp"), ALICE_KEY, init, None);
    assert_eq!(r.status, 200, "{}", r.body);
    let session = r.header("mcp-session-id").expect("a session").to_string();
    let list = r#"{"jsonrpc":"2.0","id":5,"method":"tools/list"}"#;
    let r = mcp_post(&envoy.url("/mcp"), ALICE_KEY, list, Some(&session));
    assert_eq!(
        rpc(&r)["result"]["tools"].as_array().map(Vec::len),
        Some(9),
        "{}",
        r.body
    );
    let (authority, auth) = (
        format!("127.0.0.1:{}", envoy.port),
        format!("Bearer {ALICE_KEY}"),
    );
    let (status, _, body) = raw_http(
        envoy.port,
        "DELETE",
        "/mcp",
        &[
            ("host", &authority),
            ("authorization", &auth),
            ("mcp-session-id", &session),
        ],
        "",
    );
    assert_eq!(status, 200, "{body}");
    let r = mcp_post(&envoy.url("/mcp"), ALICE_KEY, list, Some(&session));
    assert_eq!(
        (r.status, rpc(&r)["error"]["code"].clone()),
        (404, json!(-32600)),
        "{}",
        r.body
    );
    // A forged session at the aggregated endpoint asks no server.
    for forged in ["not-ours", "pcs1-7b7d"] {
        let r = mcp_post(&envoy.url("/mcp"), ALICE_KEY, list, Some(forged));
        assert_eq!(r.status, 404, "{forged}: {}", r.body);
        assert_eq!(rpc(&r)["error"]["code"], json!(-32600));
        assert_eq!(rpc(&r)["id"], json!(5));
    }
    // A live session is its key's (#61): Alice's sessions, at /mcp and at
    // /mcp/alpha, replayed by another key, or moved to another server, or
    // read as the server's own id: MCP's 404, and no server is asked.
    let r = mcp_post(&envoy.url("/mcp"), ALICE_KEY, init, None);
    assert_eq!(r.status, 200, "{}", r.body);
    let aggregated = r.header("mcp-session-id").expect("a session").to_string();
    let r = mcp_post(&alpha, ALICE_KEY, init, None);
    assert_eq!(r.status, 200, "{}", r.body);
    let own_alpha = r.header("mcp-session-id").expect("a session").to_string();
    assert!(
        own_alpha.starts_with("pcs3-"),
        "sealed by the gateway: {own_alpha}"
    );
    let ping = r#"{"jsonrpc":"2.0","id":7,"method":"ping"}"#;
    let upstream = |c: &str| {
        envoy
            .stat(&format!("cluster.{c}.upstream_rq_total"))
            .unwrap_or(0)
    };
    let before = (upstream("mcp_alpha"), upstream("mcp_beta"));
    // The server's own session id, as the gateway read it from its answer
    // (the id's bytes: the name and the session, each after two bytes of
    // length, then the expiry and the MAC).
    let raw = {
        use base64::Engine as _;
        let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(own_alpha.trim_start_matches("pcs3-"))
            .unwrap();
        let name_len = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
        assert_eq!(&bytes[2..2 + name_len], b"alpha");
        let at = 2 + name_len;
        let len = u16::from_le_bytes([bytes[at], bytes[at + 1]]) as usize;
        assert_eq!(bytes.len(), at + 2 + len + 8 + 16, "one pair");
        String::from_utf8(bytes[at + 2..at + 2 + len].to_vec()).unwrap()
    };
    for (what, url, key, session, body) in [
        (
            "another key at /mcp",
            envoy.url("/mcp"),
            DEMO_KEY,
            &aggregated,
            list,
        ),
        (
            "another key at /mcp/alpha",
            alpha.clone(),
            DEMO_KEY,
            &own_alpha,
            ping,
        ),
        (
            "another key's call",
            alpha.clone(),
            BURST_KEY,
            &own_alpha,
            r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"add","arguments":{"a":1,"b":2}}}"#,
        ),
        (
            "alpha's session at beta",
            beta.clone(),
            ALICE_KEY,
            &own_alpha,
            ping,
        ),
        (
            "the aggregated one at alpha",
            alpha.clone(),
            ALICE_KEY,
            &aggregated,
            ping,
        ),
        ("the server's own id", alpha.clone(), ALICE_KEY, &raw, ping),
    ] {
        let r = mcp_post(&url, key, body, Some(session));
        assert_eq!(r.status, 404, "{what}: {}", r.body);
        assert_eq!(rpc(&r)["error"]["code"], json!(-32600), "{what}");
        assert_eq!(
            rpc(&r)["id"],
            json!(if body == list { 5 } else { 7 }),
            "{what}"
        );
    }
    assert_eq!(
        (upstream("mcp_alpha"), upstream("mcp_beta")),
        before,
        "no replayed session reached a server"
    );
    // Its own key still holds it, and the server gets its own id.
    let r = mcp_post(&alpha, ALICE_KEY, ping, Some(&own_alpha));
    assert_eq!(
        (r.status, rpc(&r)["result"].clone()),
        (200, json!({})),
        "{}",
        r.body
    );
    let r = mcp_post(&envoy.url("/mcp"), ALICE_KEY, list, Some(&aggregated));
    assert_eq!(r.status, 200, "{}", r.body);
    // A huge `params`: the body limit, in JSON-RPC's shape.
    let huge = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{}"}}}}}}"#,
        "x".repeat(33 << 20)
    );
    // Past Envoy's buffer (33 MiB) and past the key's limit (32 MiB): the
    // 413 is JSON-RPC's whichever answers it, Envoy's rewrite or ours.
    let over_limit = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"echo","arguments":{{"text":"{}"}}}}}}"#,
        "x".repeat((32 << 20) + 1024)
    );
    for body in [&huge, &over_limit] {
        let r = mcp_post(&alpha, ALICE_KEY, body, None);
        assert_eq!(r.status, 413, "{}", &r.body[..r.body.len().min(300)]);
        let v = rpc(&r);
        assert_eq!(v["jsonrpc"], "2.0", "{v}");
        assert_eq!(v["error"]["code"], json!(-32000), "{v}");
        assert_eq!(v["error"]["data"]["code"], "request_too_large", "{v}");
    }

    // 30 concurrent calls against a limit of 10 a minute: exactly 10 pass.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    let r = mcp_post(&alpha, BURST_KEY, init, None);
    assert_eq!(r.status, 200, "{}", r.body);
    let session = r.header("mcp-session-id").expect("session").to_string();
    let results: Vec<(u16, Value, Option<String>)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..30)
            .map(|i| {
                let (alpha, session) = (&alpha, &session);
                s.spawn(move || {
                    let call = format!(r#"{{"jsonrpc":"2.0","id":{},"method":"tools/call","params":{{"name":"add","arguments":{{"a":1,"b":2}}}}}}"#, 100 + i);
                    let r = mcp_post(alpha, BURST_KEY, &call, Some(session));
                    (r.status, rpc(&r), r.header("retry-after").map(String::from))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let ok = results
        .iter()
        .filter(|(s, v, _)| *s == 200 && v["result"].is_object())
        .count();
    let limited: Vec<_> = results.iter().filter(|(s, _, _)| *s == 429).collect();
    assert_eq!((ok, limited.len()), (10, 20), "{results:?}");
    for (_, v, retry) in limited {
        assert_eq!(v["error"]["code"], json!(-32000));
        assert_eq!(v["error"]["data"]["code"], json!("rate_limit_exceeded"));
        assert!(v["error"]["data"]["retry_after_seconds"]
            .as_u64()
            .is_some_and(|s| s >= 1));
        assert!(retry.is_some());
    }

    // Logins: the metadata MCP clients read; a verified token acts as the
    // `logins` client in the team its claims name (`readers`: alpha's echo
    // only); a token that is expired, not the issuer's or for another
    // audience, or a payload a client made up, gets MCP's 401.
    let r = get(&envoy.url("/.well-known/oauth-protected-resource/mcp"), &[]);
    assert_eq!(r.status, 200);
    assert_eq!(
        r.json(),
        json!({"resource": "https://gateway.test/mcp", "authorization_servers": ["https://idp.test"],
            "bearer_methods_supported": ["header"], "resource_name": "Portcullis MCP gateway"})
    );
    let valid = tokens["valid"].as_str().unwrap();
    let v = sdk_script("mcp_gateway_check.py", &[&alpha, valid, "alpha"]);
    assert_eq!(v["tools"], json!(["echo"]), "{v}");
    assert_eq!(v["echo"], json!(["alpha: hi"]));
    assert_eq!(v["headers"]["code"], json!(-32602), "{v}");
    let www = "Bearer resource_metadata=\"https://gateway.test/.well-known/oauth-protected-resource/mcp\"";
    let ping = r#"{"jsonrpc":"2.0","id":1,"method":"ping"}"#;
    let forged = {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(r#"{"sub":"eve","groups":["agents"]}"#)
    };
    for (what, token, extra) in [
        ("expired", tokens["expired"].as_str().unwrap(), None),
        ("foreign", tokens["foreign"].as_str().unwrap(), None),
        ("audience", tokens["audience"].as_str().unwrap(), None),
        ("made up", "not-a-key", Some(forged.as_str())),
    ] {
        let auth = format!("Bearer {token}");
        let mut headers = vec![
            ("authorization", auth.as_str()),
            ("accept", "application/json, text/event-stream"),
        ];
        if let Some(p) = extra {
            headers.push(("x-portcullis-jwt-payload", p));
        }
        let r = post(&alpha, &headers, ping);
        assert_eq!(r.status, 401, "{what}: {}", r.body);
        assert_eq!(r.header("www-authenticate"), Some(www), "{what}");
        assert_eq!(rpc(&r)["error"]["code"], json!(-32000), "{what}");
    }

    // Calls in flight: one at a time for the payer; three at once, the
    // first holds its slot while the others are refused.
    let r = mcp_post(&beta, PAYER_KEY, init, None);
    assert_eq!(r.status, 200, "{}", r.body);
    let session = r.header("mcp-session-id").expect("session").to_string();
    let call = |id: u32, tool: &str, args: &str| {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"tools/call","params":{{"name":"{tool}","arguments":{args}}}}}"#
        )
    };
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..3)
            .map(|i| {
                let (beta, session, body) =
                    (&beta, &session, call(300 + i, "wait", r#"{"seconds":3}"#));
                s.spawn(move || mcp_post(beta, PAYER_KEY, &body, Some(session)).status)
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let (ok, limited) = (
        statuses.iter().filter(|s| **s == 200).count(),
        statuses.iter().filter(|s| **s == 429).count(),
    );
    assert!(ok >= 1 && limited >= 1 && ok + limited == 3, "{statuses:?}");
    // Its budget: $0.005 a day at $0.002 a call: those that went, then
    // up to two in all, then a 429 naming the budget.
    let mut answers = Vec::new();
    for i in 0..3 {
        let r = mcp_post(
            &beta,
            PAYER_KEY,
            &call(400 + i, "echo", r#"{"text":"x"}"#),
            Some(&session),
        );
        answers.push((r.status, rpc(&r)));
    }
    let spent = ok + answers.iter().filter(|(s, _)| *s == 200).count();
    assert_eq!(spent, 2, "{statuses:?} {answers:?}");
    let (status, refused) = answers.last().unwrap();
    assert_eq!(*status, 429);
    assert_eq!(
        refused["error"]["data"]["code"],
        json!("budget_exceeded"),
        "{refused}"
    );

    // Records: one per request, the server as provider, the tool as model.
    let records = poll_until(Duration::from_secs(20), "the MCP records", || {
        let rows = collector.recent(500);
        let calls: Vec<Value> = rows
            .into_iter()
            .filter(|r| r["api"] == "mcp" && r["model"] == "beta__card")
            .collect();
        (!calls.is_empty()).then_some(calls)
    });
    let r = &records[0];
    assert_eq!(r["client"], "alice");
    assert_eq!(r["team"], "agents");
    assert_eq!(r["provider"], "beta");
    assert_eq!(r["status"], 200);
    assert_eq!(
        r["guardrails"],
        json!([{"action": "redact", "check": "cards", "hits": 1, "stage": "input"},
            {"action": "redact", "check": "cards-out", "hits": 2, "stage": "output"}]),
        "{r}"
    );
    assert_eq!(r["trace_id"], "0af7651916cd43dd8448eb211c80319c");
    assert_eq!(r["mcp_method"], "tools/call", "{r}");
    assert!(r["request_bytes"].as_u64().is_some_and(|n| n > 50), "{r}");
    assert!(r["response_bytes"].as_u64().is_some_and(|n| n > 50), "{r}");
    // A refused call: its JSON-RPC error.
    let refused = collector
        .recent(500)
        .into_iter()
        .find(|r| r["model"] == "alpha__secret" && r["client"] == "alice")
        .expect("the refused call's record");
    assert_eq!(
        (refused["status"].clone(), refused["rpc_error"].clone()),
        (json!(403), json!(-32602))
    );
    // The call to the server, the span its traceparent named.
    assert_eq!(r["attempts"][0]["provider"], "beta", "{r}");
    assert_eq!(r["attempts"][0]["status"], 200, "{r}");
    let login = poll_until(Duration::from_secs(20), "the login's record", || {
        collector
            .recent(500)
            .into_iter()
            .find(|r| r["api"] == "mcp" && r["client"] == "logins" && r["model"] == "alpha__echo")
    });
    assert_eq!(login["team"], "readers", "{login}");
    // Prometheus: requests by client, server (provider) and tool (model).
    let line = r#"portcullis_requests_total{client="alice",provider="beta",model="beta__card",status="2xx",cache="off"}"#;
    poll_until(Duration::from_secs(20), "the tool's request metric", || {
        envoy
            .prometheus()
            .lines()
            .any(|l| l.starts_with(line))
            .then_some(())
    });
    // The agent's LLM call and its tool call: one trace.
    let agent = poll_until(Duration::from_secs(20), "the agent's records", || {
        let rows: Vec<Value> = collector
            .recent(500)
            .into_iter()
            .filter(|r| r["trace_id"] == "5bf92f3577b34da6a3ce929d0e0e4736")
            .collect();
        let llm = rows.iter().any(|r| r["api"] == "chat_completions");
        let tool = rows
            .iter()
            .any(|r| r["api"] == "mcp" && r["model"] == "alpha__echo");
        (llm && tool).then_some(rows)
    });
    assert!(agent.len() >= 3, "{agent:?}");
}

/// An MCP server that echoes the credential the gateway gave it (the
/// mock's `credential` tool: in an answer header and in a 500 body) never
/// hands it to the client (#61), at `/mcp/{server}` and at `/mcp`.
#[test]
fn a_servers_credential_never_reaches_the_client() {
    const TOKEN: &str = "sk-notes-server-credential";
    let server = common::mock("notes", Some(TOKEN));
    // envoy/envoy.yaml's own `mcp_notes` cluster, at this mock.
    let notes_port = format!("port_value: {}", server.port);
    let mut plugin = test_plugin();
    plugin.push_str("mcp:\n  servers:\n    - {name: notes, cluster: mcp_notes, credential: {header: authorization, env: MCP_NOTES_TOKEN, prefix: \"Bearer \"}}\n");
    let primary = common::mock("primary", None);
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: primary.port,
        backup_port: dead_port(),
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 1,
        env: vec![("MCP_NOTES_TOKEN", TOKEN)],
        side_tls: None,
        bootstrap_patch: vec![("port_value: 18012", &notes_port)],
        control: None,
        clusters: None,
    });
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
    for (path, tool) in [("/mcp/notes", "credential"), ("/mcp", "notes__credential")] {
        let url = envoy.url(path);
        let r = mcp_post(&url, DEMO_KEY, init, None);
        assert_eq!(r.status, 200, "{path}: {}", r.body);
        let session = r.header("mcp-session-id").expect("a session").to_string();
        let call = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        );
        let r = mcp_post(&url, DEMO_KEY, &call, Some(&session));
        assert_eq!(r.status, 500, "{path}: {}", r.body);
        let headers = format!("{:?}", r.headers);
        assert!(
            !r.body.contains(TOKEN) && !headers.contains(TOKEN),
            "{path}: {headers} {}",
            r.body
        );
        assert_eq!(
            r.header("x-debug-authorization"),
            Some("Bearer [REDACTED]"),
            "{path}: the echo in a header"
        );
        let v = rpc(&r);
        assert_eq!(v["error"]["code"], json!(-32603), "{path}: {v}");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .ends_with("authorization `Bearer [REDACTED]`"),
            "{path}: the echo in the body: {v}"
        );
    }
    // The server did get its credential (a call without it is its 401).
    assert!(server.hits() >= 4);
}
