//! The MCP core's tests: reading messages, the errors, access, the answer
//! rewrites, the config.
use super::access::{matches, Access};
use super::answer::{keep_tools, result_strings, rewrite_json, Events};
use super::message::{error_body, Message, Method, INVALID_PARAMS, INVALID_REQUEST, PARSE_ERROR};
use crate::error::GatewayError;
use serde_json::{json, Value};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn refusal(body: &str) -> (i64, String) {
    let r = Message::read(body.as_bytes()).expect_err(body);
    (r.code, r.message)
}

#[test]
fn a_tool_call_is_read_in_place_with_its_name_and_arguments() {
    let body = br#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}"#;
    let m = Message::read(body).unwrap();
    assert_eq!(m.id.map(|i| i.get()), Some("7"));
    match m.method {
        Method::ToolCall { name, arguments } => {
            assert_eq!(name, "echo");
            assert_eq!(arguments.map(|a| a.get()), Some(r#"{"text":"hi"}"#));
        }
        other => panic!("{other:?}"),
    }
    let m = Message::read(br#"{"jsonrpc":"2.0","id":"a","method":"tools/list"}"#).unwrap();
    assert!(matches!(m.method, Method::ToolsList));
    let m = Message::read(br#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#).unwrap();
    assert!(matches!(m.method, Method::Notification(ref n) if n == "notifications/initialized"));
    assert_eq!(m.method_name(), "notifications/initialized");
    let m = Message::read(br#"{"jsonrpc":"2.0","id":3,"result":{}}"#).unwrap();
    assert!(matches!(m.method, Method::Response));
    let m = Message::read(
        br#"{"jsonrpc":"2.0","id":4,"method":"resources/read","params":{"uri":"x"}}"#,
    )
    .unwrap();
    assert!(matches!(m.method, Method::Other(ref n) if n == "resources/read"));
}

#[test]
fn bad_messages_are_refused_with_the_json_rpc_code_that_says_why() {
    assert_eq!(refusal("not json").0, PARSE_ERROR);
    assert_eq!(refusal("").0, PARSE_ERROR);
    assert_eq!(refusal("\u{0}").0, PARSE_ERROR);
    assert_eq!(
        refusal(r#"[{"jsonrpc":"2.0","id":1,"method":"ping"}]"#).0,
        INVALID_REQUEST
    );
    assert_eq!(refusal("  [1]").0, INVALID_REQUEST);
    assert_eq!(refusal(r#"{"id":1,"method":"ping"}"#).0, INVALID_REQUEST);
    assert_eq!(
        refusal(r#"{"jsonrpc":"1.0","id":1,"method":"ping"}"#).0,
        INVALID_REQUEST
    );
    assert_eq!(refusal(r#"{"jsonrpc":"2.0","id":1}"#).0, INVALID_REQUEST);
    assert_eq!(
        refusal(r#"{"jsonrpc":"2.0","id":1,"method":5}"#).0,
        INVALID_REQUEST
    );
    assert_eq!(
        refusal(r#"{"jsonrpc":"2.0","id":{},"method":"ping"}"#).0,
        INVALID_REQUEST
    );
    assert_eq!(
        refusal(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#).0,
        INVALID_PARAMS
    );
    assert_eq!(
        refusal(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":""}}"#).0,
        INVALID_PARAMS
    );
    assert_eq!(
        refusal(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":3}}"#).0,
        INVALID_PARAMS
    );
    assert_eq!(
        refusal(r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"a","arguments":[1]}}"#).0,
        INVALID_PARAMS
    );
    let (_, why) = refusal("[]");
    assert!(why.contains("batches"), "{why}");
}

#[test]
fn a_gateway_error_is_a_json_rpc_error_to_the_request_id_with_the_status_and_wait_in_data() {
    let m = Message::read(
        br#"{"jsonrpc":"2.0","id":"req-1","method":"tools/call","params":{"name":"x"}}"#,
    )
    .unwrap();
    let e = GatewayError::new(
        429,
        "requests",
        "rate_limit_exceeded",
        "Too many tool calls",
    )
    .with_retry_after(7);
    let v: Value = serde_json::from_slice(&error_body(m.id, &e)).unwrap();
    assert_eq!(
        v,
        json!({"jsonrpc": "2.0", "id": "req-1", "error": {"code": -32000, "message": "Too many tool calls",
            "data": {"status": 429, "type": "requests", "code": "rate_limit_exceeded", "retry_after_seconds": 7}}})
    );
    let r = Message::read(b"nope").unwrap_err().into_error();
    let v: Value = serde_json::from_slice(&error_body(None, &r)).unwrap();
    assert_eq!(v["id"], Value::Null);
    assert_eq!(v["error"]["code"], PARSE_ERROR);
    assert_eq!(v["error"]["data"]["status"], 400);
}

#[test]
fn patterns_match_whole_names_with_stars_for_any_run() {
    for (p, n, want) in [
        ("alpha__echo", "alpha__echo", true),
        ("alpha__echo", "alpha__echo2", false),
        ("alpha__*", "alpha__echo", true),
        ("alpha__*", "beta__echo", false),
        ("*__echo", "beta__echo", true),
        ("*", "anything", true),
        ("a*b*c", "aXXbYYc", true),
        ("a*b*c", "aXXbYYcZ", false),
        ("a**", "a", true),
        ("", "", true),
        ("", "a", false),
        ("*a*a*a*a*b", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", false),
    ] {
        assert_eq!(matches(p, n), want, "{p} ~ {n}");
    }
}

#[test]
fn a_caller_passes_only_what_every_level_allows() {
    let key = Access {
        tools: Some(vec!["alpha__*".into(), "beta__echo".into()]),
        ..Access::default()
    };
    let team = Access {
        servers: Some(vec!["alpha".into()]),
        ..Access::default()
    };
    assert!(key.calls("alpha", "add") && key.calls("beta", "echo") && !key.calls("beta", "add"));
    let both = super::access::Levels([Some(&key), Some(&team)]);
    assert!(both.calls("alpha", "add"));
    assert!(!both.calls("beta", "echo"), "the team does not reach beta");
    assert!(!both.reaches("beta"));
    let none = super::access::Levels([None, None]);
    assert!(none.calls("gamma", "anything"));
}

/// A pattern is a (server, tool) pair: `alpha__*` is alpha's tools and no
/// other server's, whatever the joined names would spell.
#[test]
fn a_tool_pattern_matches_the_server_and_the_tool_apart() {
    let key = Access {
        tools: Some(vec![
            "alpha__*".into(),
            "*__read".into(),
            "gamma__a*b".into(),
        ]),
        ..Access::default()
    };
    // `alpha_` + `__` + `echo` spells `alpha___echo`, which the joined
    // pattern `alpha__*` matched.
    assert!(!key.calls("alpha_", "echo"));
    assert!(!key.calls("alphabet", "echo"));
    assert!(key.calls("alpha", "_echo") && key.calls("alpha", "x__y"));
    assert!(key.calls("beta", "read") && !key.calls("beta", "read2"));
    assert!(key.calls("gamma", "a__b") && !key.calls("gamma__a", "b"));
    for (pattern, server, tool, want) in [
        ("*", "any", "thing", true),
        ("alpha", "alpha", "", false),
        ("alpha__", "alpha", "", true),
        ("alpha__", "alpha", "x", false),
        ("a*__*", "alpha", "x", true),
        ("a*__*", "beta", "x", false),
    ] {
        assert_eq!(
            super::access::pair_matches(pattern, server, tool),
            want,
            "{pattern} against ({server}, {tool})"
        );
    }
}

/// Server names that could make two qualified names read alike are
/// refused at load, each with the reason.
#[test]
fn server_names_that_make_qualified_names_ambiguous_are_refused() {
    for bad in ["alpha_", "al__pha", "_", "a b"] {
        let config = CONFIG.replace(
            "{name: alpha, cluster: mcp_alpha}",
            &format!("{{name: \"{bad}\", cluster: mcp_alpha}}"),
        );
        let e = crate::compile::compile(config.as_bytes()).unwrap_err();
        assert!(
            e.contains(&format!("mcp.servers[0] ({bad}): `name` must be"))
                && e.contains("not ending with `_`"),
            "{bad}: {e}"
        );
    }
    let beside = CONFIG.replace(
        "{name: alpha, cluster: mcp_alpha}",
        "{name: alpha, cluster: mcp_alpha}\n    - {name: alpha_, cluster: mcp_alpha}",
    );
    let e = crate::compile::compile(beside.as_bytes()).unwrap_err();
    assert!(e.contains("(alpha_): `name` must be"), "{e}");
    let fine = CONFIG.replace(
        "{name: alpha, cluster: mcp_alpha}",
        "{name: _alpha-1_b, cluster: mcp_alpha}",
    );
    assert!(
        !crate::compile::compile(fine.as_bytes())
            .err()
            .unwrap_or_default()
            .contains("`name` must be"),
        "a name with inner `_` and a leading one reads one way"
    );
}

#[test]
fn a_tools_list_answer_keeps_only_the_callers_tools() {
    let body = br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"echo","inputSchema":{}},{"name":"secret"},{"noname":1}]}}"#;
    let out = rewrite_json(body, &mut |m| keep_tools(m, &mut |n| n == "echo")).unwrap();
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(
        v["result"]["tools"],
        json!([{"name": "echo", "inputSchema": {}}])
    );
    assert_eq!(v["id"], 2);
    // Nothing dropped: the bytes pass as sent.
    assert!(rewrite_json(
        br#"{"jsonrpc":"2.0","id":2,"result":{"tools":[{"name":"a"}]}}"#,
        &mut |m| keep_tools(m, &mut |_| true)
    )
    .is_none());
    assert!(rewrite_json(b"not json", &mut |m| keep_tools(m, &mut |_| false)).is_none());
}

#[test]
fn an_sse_answer_is_rewritten_event_by_event_however_it_is_split() {
    let stream = "event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\nevent: message\nid: 2\ndata: {\"jsonrpc\":\"2.0\",\"id\":2,\"result\":{\"tools\":[{\"name\":\"echo\"},{\"name\":\"secret\"}]}}\n\n";
    let want = "event: message\nid: 1\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/progress\",\"params\":{\"progress\":1}}\n\nevent: message\nid: 2\ndata: {\"id\":2,\"jsonrpc\":\"2.0\",\"result\":{\"tools\":[{\"name\":\"echo\"}]}}\n\n";
    for cut in 0..=stream.len() {
        let (a, b) = stream.as_bytes().split_at(cut);
        let mut ev = Events::default();
        let mut edit = |m: &mut serde_json::Map<String, Value>| keep_tools(m, &mut |n| n == "echo");
        let mut out = ev.chunk(a, &mut edit);
        out.extend(ev.chunk(b, &mut edit));
        out.extend(ev.finish());
        let out = String::from_utf8(out).unwrap();
        let got: Vec<Value> = data_of(&out);
        assert_eq!(got, data_of(want), "cut at {cut}");
        assert!(out.contains("id: 2\n"), "other fields kept: {out}");
    }
}

fn data_of(s: &str) -> Vec<Value> {
    s.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[test]
fn a_tool_results_texts_are_its_text_blocks_then_its_structured_content() {
    let mut r: serde_json::Map<String, Value> = serde_json::from_value(json!({
        "content": [{"type": "text", "text": "one"}, {"type": "image", "data": "x"}, {"type": "text", "text": "two"}],
        "structuredContent": {"a": ["three", 4, {"b": "five"}]},
        "isError": false
    }))
    .unwrap();
    let got: Vec<String> = result_strings(&mut r)
        .into_iter()
        .map(|s| s.clone())
        .collect();
    assert_eq!(got, ["one", "two", "three", "five"]);
}

const CONFIG: &str = r#"
providers:
  - {name: p, cluster: c, host: h, models: [{name: m}]}
clients:
  - name: alice
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"
    team: research
    mcp: {tools: ["alpha__*"], calls_per_minute: 5, max_concurrent_calls: 2}
  - name: bob
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000002"
teams:
  - name: research
    mcp: {servers: [alpha, beta]}
mcp:
  servers:
    - {name: alpha, cluster: mcp_alpha}
    - name: beta
      cluster: mcp_beta
      path: /v2/mcp
      credential: {header: Authorization, env: BETA_TOKEN, prefix: "Bearer "}
      price_per_call_usd: 0.002
      timeout_ms: 1000
"#;

#[test]
fn the_mcp_section_compiles_with_each_keys_and_teams_access() {
    let gw = crate::compile::compile(CONFIG.as_bytes()).unwrap();
    let m = gw.mcp.as_ref().unwrap();
    assert_eq!(m.config.path, "/mcp");
    let beta = m.config.server("beta").unwrap();
    assert_eq!(beta.path, "/v2/mcp");
    assert_eq!(beta.price_micros, 2000);
    assert_eq!(beta.timeout_ms, 1000);
    assert_eq!(
        beta.credential,
        super::Credential::Header {
            name: "authorization".into(),
            env: "BETA_TOKEN".into(),
            prefix: "Bearer ".into()
        }
    );
    assert_eq!(m.config.server("alpha").unwrap().timeout_ms, 300_000);
    let alice = m.levels("alice", Some("research"));
    assert!(alice.calls("alpha", "echo") && !alice.calls("beta", "echo"));
    assert_eq!(m.keys["alice"].calls_per_minute, Some(5));
    let bob = m.levels("bob", None);
    assert!(bob.calls("beta", "anything"));
    assert!(matches!(m.config.server_of_path("/mcp/beta"), Some(Some(s)) if s.name == "beta"));
    assert!(matches!(
        m.config.server_of_path("/mcp/beta/"),
        Some(Some(_))
    ));
    assert!(matches!(m.config.server_of_path("/mcp/gamma"), Some(None)));
    assert!(matches!(m.config.server_of_path("/mcp/a/b"), Some(None)));
    assert!(m.config.server_of_path("/mcpx").is_none());
    assert!(m.config.server_of_path("/v1/chat/completions").is_none());
}

#[test]
fn every_problem_of_the_mcp_section_is_listed_at_once() {
    let bad = CONFIG
        .replace(
            "{name: alpha, cluster: mcp_alpha}",
            "{name: al__pha, cluster: \"\", path: mcp, price_per_call_usd: -1, timeout_ms: 0}",
        )
        .replace(
            "header: Authorization, env: BETA_TOKEN",
            "header: \":path\", env: \"\"",
        )
        .replace(
            "tools: [\"alpha__*\"], calls_per_minute: 5",
            "tools: [\"echo\", \"\"], calls_per_minute: 0, servers: [gamma]",
        )
        .replace("mcp:\n  servers:", "mcp:\n  path: /v1/mcp\n  servers:");
    let e = crate::compile::compile(bad.as_bytes()).unwrap_err();
    for want in [
        "mcp.path `/v1/mcp` is under /v1",
        "mcp.servers[0] (al__pha): `name` must be",
        "mcp.servers[0] (al__pha): `cluster` is empty",
        "mcp.servers[0] (al__pha): `path` must start with `/`",
        "`price_per_call_usd` must be",
        "`timeout_ms` must be at least 1",
        "mcp.servers[1] (beta).credential: `header` must name a header",
        "mcp.servers[1] (beta).credential: `env` must name",
        "clients[0] (alice).mcp.servers: `gamma` is not in mcp.servers",
        "clients[0] (alice).mcp.tools: `echo` names no server",
        "clients[0] (alice).mcp.tools: a pattern is empty",
        "clients[0] (alice).mcp.calls_per_minute must be at least 1",
    ] {
        assert!(e.contains(want), "missing {want:?} in {e}");
    }
    let unknown = CONFIG.replace("timeout_ms: 1000", "timeout_ms: 1000\n      colour: red");
    let e = crate::compile::compile(unknown.as_bytes()).unwrap_err();
    assert!(e.contains("colour"), "{e}");
    let orphan = CONFIG.split("mcp:\n  servers:").next().unwrap().to_string();
    let e = crate::compile::compile(orphan.as_bytes()).unwrap_err();
    assert!(
        e.contains("clients[0] (alice).mcp: there is no `mcp` section"),
        "{e}"
    );
    assert!(
        e.contains("teams[0] (research).mcp: there is no `mcp` section"),
        "{e}"
    );
}

#[test]
fn a_gateway_session_holds_each_servers_session_for_its_holder_alone() {
    use super::aggregate::{session_id, sessions_of, Holder};
    use crate::credentials::seal::Seal;
    let seal = Seal::with_secret("the gateway's own secret");
    let pairs = vec![
        ("alpha".to_string(), "s-1~=x".to_string()),
        ("beta".to_string(), "2".to_string()),
    ];
    let alice = Holder {
        key: "alice",
        user: None,
    };
    let id = session_id(&pairs, alice, 5_000, &seal);
    assert!(
        id.bytes().all(|b| (0x21..=0x7e).contains(&b)),
        "visible ASCII: {id}"
    );
    assert_eq!(sessions_of(&id, alice, 4_999, &seal), Some(pairs.clone()));
    // Another key, another user of a login, the same key logged in as a
    // user: none opens it.
    for other in [
        Holder {
            key: "bob",
            user: None,
        },
        Holder {
            key: "alice",
            user: Some("u1"),
        },
    ] {
        assert_eq!(sessions_of(&id, other, 1, &seal), None, "{other:?}");
    }
    let u1 = Holder {
        key: "login",
        user: Some("u1"),
    };
    let logged = session_id(&pairs, u1, 5_000, &seal);
    assert_eq!(sessions_of(&logged, u1, 1, &seal), Some(pairs.clone()));
    assert_eq!(
        sessions_of(
            &logged,
            Holder {
                key: "login",
                user: Some("u2")
            },
            1,
            &seal
        ),
        None
    );
    // Expired; another gateway's secret.
    assert_eq!(sessions_of(&id, alice, 5_000, &seal), None);
    assert_eq!(
        sessions_of(&id, alice, 1, &Seal::with_secret("another gateway secret")),
        None
    );
    // A client that changes any byte of it (its servers' sessions, the
    // expiry, the MAC) is refused.
    use base64::Engine as _;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let raw = b64.decode(id.strip_prefix("pcs3-").unwrap()).unwrap();
    for i in 0..raw.len() {
        let mut forged = raw.clone();
        forged[i] ^= 1;
        let forged = format!("pcs3-{}", b64.encode(&forged));
        assert_eq!(sessions_of(&forged, alice, 1, &seal), None, "byte {i}");
    }
    for forged in [
        "",
        "pcs3-",
        "pcs3-!!",
        "pcs2-7b7d.1.00",
        &format!("pcs3-{}", b64.encode(&raw[..raw.len() - 1])),
    ] {
        assert_eq!(sessions_of(forged, alice, 1, &seal), None, "{forged}");
    }
    // The bytes hold the pairs as written here, then the expiry.
    let mut want = Vec::new();
    for part in ["alpha", "s-1~=x", "beta", "2"] {
        want.extend_from_slice(&(part.len() as u16).to_le_bytes());
        want.extend_from_slice(part.as_bytes());
    }
    want.extend_from_slice(&5_000u64.to_le_bytes());
    assert_eq!(&raw[..raw.len() - 16], want.as_slice());
}

#[test]
fn the_servers_answers_merge_into_one_initialize_and_qualified_lists() {
    use super::aggregate::{answer_to, initialize, merged_list, renamed, split};
    let a = answer_to(br#"{"jsonrpc":"2.0","id":1,"result":{"protocolVersion":"2025-11-25","capabilities":{"tools":{}}}}"#, "1").unwrap();
    let sse = b"event: message\ndata: {\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\"}\n\nevent: message\ndata: {\"jsonrpc\":\"2.0\",\"id\":1,\"result\":{\"protocolVersion\":\"2025-06-18\",\"capabilities\":{\"prompts\":{}}}}\n\n";
    let b = answer_to(sse, "1").unwrap();
    assert!(answer_to(sse, "2").is_none());
    let v: Value = serde_json::from_slice(&initialize("1", &[a, b])).unwrap();
    assert_eq!(v["result"]["protocolVersion"], "2025-06-18");
    assert_eq!(v["result"]["serverInfo"]["name"], "portcullis");
    assert!(v["result"]["capabilities"]["prompts"].is_object());
    let la = answer_to(br#"{"jsonrpc":"2.0","id":"x","result":{"tools":[{"name":"echo","inputSchema":{}},{"name":"secret"}]}}"#, r#""x""#).unwrap();
    let lb = answer_to(
        br#"{"jsonrpc":"2.0","id":"x","result":{"tools":[{"name":"echo"}]}}"#,
        r#""x""#,
    )
    .unwrap();
    let out = merged_list(
        r#""x""#,
        "tools",
        &[("alpha", la), ("beta", lb)],
        &|s, n| !(s == "alpha" && n == "secret"),
    );
    let v: Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(v["id"], "x");
    assert_eq!(
        v["result"]["tools"],
        json!([{"name": "alpha__echo", "inputSchema": {}}, {"name": "beta__echo"}])
    );
    assert_eq!(split("alpha__do__it"), Some(("alpha", "do__it")));
    assert_eq!(split("alpha"), None);
    assert_eq!(split("__x"), None);
    let body = renamed(br#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"alpha__echo","arguments":{}}}"#, "echo").unwrap();
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["params"]["name"], "echo");
    assert_eq!(v["params"]["arguments"], json!({}));
}

#[test]
fn a_logins_claims_name_its_team_and_user_and_the_metadata_says_where_to_log_in() {
    use super::oauth::{claims, Oauth};
    let o = Oauth {
        payload_header: "x-portcullis-jwt-payload".into(),
        client: "logins".into(),
        client_key: [0; 32],
        team_claim: "groups".into(),
        user_claim: "sub".into(),
        resource: "https://gw.example.com/tools/mcp".into(),
        authorization_servers: vec!["https://idp.example.com".into()],
        scopes: vec!["mcp".into()],
    };
    // base64url without padding, as jwt_authn forwards it.
    let c = claims("eyJzdWIiOiJhZGEiLCJncm91cHMiOlsic3RhZmYiLCJyZWFkZXJzIl19").unwrap();
    assert_eq!(o.user(&c).as_deref(), Some("ada"));
    assert_eq!(o.team(&c, &["agents", "readers"]), Some(1));
    assert_eq!(o.team(&c, &["agents"]), None);
    let scoped = serde_json::from_value(json!({"groups": "x readers"})).unwrap();
    assert_eq!(o.team(&scoped, &["readers"]), Some(0));
    assert!(claims("not base64!").is_none());
    assert!(claims("bm90IGpzb24").is_none(), "not JSON");
    assert_eq!(
        o.metadata_path(),
        "/.well-known/oauth-protected-resource/tools/mcp"
    );
    assert_eq!(
        o.www_authenticate(),
        "Bearer resource_metadata=\"https://gw.example.com/.well-known/oauth-protected-resource/tools/mcp\""
    );
    let m: Value = serde_json::from_slice(&o.metadata()).unwrap();
    assert_eq!(m["resource"], "https://gw.example.com/tools/mcp");
    assert_eq!(
        m["authorization_servers"],
        json!(["https://idp.example.com"])
    );
    assert_eq!(m["scopes_supported"], json!(["mcp"]));
}

#[test]
fn the_oauth_section_names_a_client_an_endpoint_and_an_issuer() {
    let good = CONFIG.replace(
        "mcp:\n  servers:",
        "mcp:\n  oauth: {client: bob, resource: \"https://gw/mcp\", authorization_servers: [\"https://idp\"]}\n  servers:",
    );
    let gw = crate::compile::compile(good.as_bytes()).unwrap();
    let o = gw.mcp.unwrap().oauth.unwrap();
    assert_eq!(
        (
            o.client.as_str(),
            o.team_claim.as_str(),
            o.payload_header.as_str()
        ),
        ("bob", "groups", "x-portcullis-jwt-payload")
    );
    assert_eq!(o.client_key[31], 2);
    let bad = CONFIG.replace(
        "mcp:\n  servers:",
        "mcp:\n  oauth: {client: carol, resource: gw/mcp, authorization_servers: [], payload_header: authorization, team_claim: \"\"}\n  servers:",
    );
    let e = crate::compile::compile(bad.as_bytes()).unwrap_err();
    for want in [
        "mcp.oauth.client: `carol` is not in `clients`",
        "mcp.oauth.resource: `gw/mcp` must be the MCP endpoint's URL",
        "mcp.oauth.authorization_servers: name at least one issuer",
        "mcp.oauth.payload_header: `authorization` must be a header of its own",
        "mcp.oauth.team_claim is empty",
    ] {
        assert!(e.contains(want), "missing {want:?} in {e}");
    }
}
