//! What Envoy 1.40's own MCP filters do, before the gateway adds its policy
//! (#47's first step): `envoy.filters.http.mcp` then
//! `envoy.filters.http.mcp_router` (terminal) in front of two MCP servers
//! built with the official `mcp` SDK, and its client through them. No
//! filter of ours: this pins the behaviour the MCP gateway will build on,
//! and the gaps it will fill (docs: the closing note of #46 and #47).

mod common;

use common::{mcp_server, sdk_script};
use portcullis_tests::*;
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

fn bootstrap(listen: u16, admin: u16, alpha: u16, beta: u16) -> String {
    let cluster = |name: &str, port: u16| {
        format!("  - name: {name}\n    type: STATIC\n    load_assignment: {{cluster_name: {name}, endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {port}}}}}}}}}]}}]}}\n")
    };
    format!(
        "admin:\n  address: {{socket_address: {{address: 127.0.0.1, port_value: {admin}}}}}\n\
static_resources:\n  listeners:\n  - name: mcp\n    address: {{socket_address: {{address: 127.0.0.1, port_value: {listen}}}}}\n    filter_chains:\n    - filters:\n      - name: envoy.filters.network.http_connection_manager\n        typed_config:\n          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager\n          stat_prefix: mcp\n          route_config: {{name: r, virtual_hosts: [{{name: v, domains: [\"*\"], routes: [{{match: {{prefix: /}}, route: {{cluster: alpha, timeout: 0s}}}}]}}]}}\n          http_filters:\n          - name: envoy.filters.http.mcp\n            typed_config: {{\"@type\": type.googleapis.com/envoy.extensions.filters.http.mcp.v3.Mcp}}\n          - name: envoy.filters.http.mcp_router\n            typed_config:\n              \"@type\": type.googleapis.com/envoy.extensions.filters.http.mcp_router.v3.McpRouter\n              servers:\n              - {{name: alpha, mcp_cluster: {{cluster: alpha, path: /mcp}}}}\n              - {{name: beta, mcp_cluster: {{cluster: beta, path: /mcp}}}}\n  clusters:\n{}{}",
        cluster("alpha", alpha),
        cluster("beta", beta)
    )
}

#[test]
fn envoys_mcp_router_aggregates_two_servers_for_the_official_client() {
    let (alpha_port, beta_port) = (dead_port(), dead_port());
    let _alpha = mcp_server("alpha", alpha_port, false);
    let _beta = mcp_server("beta", beta_port, false);
    let (listen, admin) = (dead_port(), dead_port());
    let dir = TempDir::new("mcp-envoy");
    let config = dir.0.join("envoy.yaml");
    std::fs::write(&config, bootstrap(listen, admin, alpha_port, beta_port)).unwrap();
    let log = std::fs::File::create(dir.0.join("envoy.log")).unwrap();
    let _envoy = Proc(
        Command::new(envoy_bin())
            .arg("-c")
            .arg(&config)
            .args([
                "--disable-hot-restart",
                "--concurrency",
                "1",
                "-l",
                "warning",
            ])
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start Envoy"),
    );
    poll_until(Duration::from_secs(30), "Envoy ready", || {
        try_get(&format!("http://127.0.0.1:{admin}/ready"))
            .filter(|r| r.status == 200)
            .map(|_| ())
    });
    let url = format!("http://127.0.0.1:{listen}/mcp");
    // The official client: one endpoint, both servers' tools, prefixed.
    let v = sdk_script("mcp_check.py", &[&url]);
    assert_eq!(
        v,
        json!({"server": "envoy-mcp-gateway",
            "tools": ["alpha__add", "alpha__card", "alpha__count", "alpha__echo", "alpha__headers", "alpha__secret", "alpha__wait",
                "beta__add", "beta__card", "beta__count", "beta__echo", "beta__headers", "beta__secret", "beta__wait"],
            "call": ["5"], "echo": ["beta: hi"],
            // The router forwards none of the client's headers: no
            // credential, no trace reaches a server through it.
            "forwarded": []})
    );
    // The gaps the gateway's filter fills: errors that are not JSON-RPC's,
    // no session end, no server stream.
    let mcp = [
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ];
    let r = post(
        &url,
        &mcp,
        r#"{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"gamma__echo","arguments":{}}}"#,
    );
    assert_eq!(r.status, 400);
    assert!(r.body.contains("cannot determine backend"), "{}", r.body);
    assert!(
        serde_json::from_str::<serde_json::Value>(&r.body).is_err(),
        "plain text: {}",
        r.body
    );
    let r = post(&url, &mcp, "not json");
    assert_eq!(
        (r.status, r.body.as_str()),
        (400, "Invalid or missing MCP request")
    );
    let (status, _, _) = raw_http(listen, "DELETE", "/mcp", &[("mcp-session-id", "x")], "");
    assert_eq!(status, 400, "no session end");
    let (status, _, body) = raw_http(
        listen,
        "GET",
        "/mcp",
        &[("accept", "text/event-stream"), ("mcp-session-id", "x")],
        "",
    );
    assert!(
        (400..=405).contains(&status) && !body.contains("event:"),
        "no server stream: {status} {body}"
    );
}
