//! The control plane (portcullis-control) with real Envoys subscribed over
//! gRPC (no ECDS file): keys created, revoked and rotated through the admin
//! API take effect in every Envoy within a second; a change the filter's
//! core refuses never reaches Envoy; a config Envoy refuses is a NACK the
//! API shows; Envoys keep serving while the control plane is down; the
//! admin API's tokens, concurrent writers, and import/export.

mod common;

use common::{mock, BACKUP_KEY, PRIMARY_KEY};
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const DEMO: &str = "sk-portcullis-demo";

fn envoy_of(
    control: &Control,
    primary: &Mock,
    backup: &Mock,
    node: &str,
    env: Vec<(&str, &str)>,
) -> Envoy {
    let mut all = vec![
        ("OPENAI_API_KEY", PRIMARY_KEY),
        ("BACKUP_API_KEY", BACKUP_KEY),
    ];
    all.extend(env);
    Envoy::start(EnvoyOpts {
        // Not read: the config comes from the control plane.
        plugin_yaml: "{}",
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 2,
        env: all,
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: Some((control.xds_port, node)),
        clusters: None,
    })
}

fn chat(envoy: &Envoy, key: &str) -> u16 {
    post(
        &envoy.url("/v1/chat/completions"),
        &[("authorization", &format!("Bearer {key}"))],
        &chat_body("gpt-4o-mini", "hello"),
    )
    .status
}

/// Poll until `key` gets `status` from `envoy`; how long it took.
fn until_status(envoy: &Envoy, key: &str, status: u16, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        let got = chat(envoy, key);
        if got == status {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "{key}: still {got} after {:?}, wanted {status}",
            started.elapsed()
        );
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

struct Setup {
    control: Control,
    primary: Mock,
    backup: Mock,
}

fn setup() -> Setup {
    Setup {
        control: Control::start(&test_plugin()),
        primary: mock("primary", Some(PRIMARY_KEY)),
        backup: mock("backup", Some(BACKUP_KEY)),
    }
}

#[test]
fn keys_created_revoked_and_rotated_through_the_api_take_effect_within_a_second() {
    let s = setup();
    let envoy = envoy_of(&s.control, &s.primary, &s.backup, "gw-a", vec![]);
    assert_eq!(chat(&envoy, DEMO), 200, "the imported config serves");

    // Created: the key is shown once, and works within a second.
    let created = s.control.write(
        "POST",
        "/v1/keys",
        r#"{"name":"app","models":["gpt-4o-mini"]}"#,
    );
    let key = created["key"].as_str().expect("the new key").to_string();
    assert!(key.starts_with("sk-pc-"), "{created}");
    assert_eq!(created["key_sha256"], key_hash(&key));
    let took = until_status(&envoy, &key, 200, Duration::from_secs(1));
    eprintln!("created key answered 200 after {took:?}");
    s.control
        .wait_acked(&["gw-a"], created["version"].as_i64().unwrap());
    // The key is listed, without its secret.
    let listed = s
        .control
        .call("GET", "/v1/keys/app", Some(&s.control.read_token), None);
    assert_eq!(listed.status, 200);
    assert!(!listed.body.contains(&key), "the key is never shown again");
    assert_eq!(listed.json()["config"]["models"], json!(["gpt-4o-mini"]));

    // Rotated with a grace period: both keys work, then only the new one.
    let rotated = s
        .control
        .write("POST", "/v1/keys/app/rotate", r#"{"grace_s":2}"#);
    let new_key = rotated["key"].as_str().unwrap().to_string();
    until_status(&envoy, &new_key, 200, Duration::from_secs(1));
    assert_eq!(
        chat(&envoy, &key),
        200,
        "the old key works in its grace period"
    );
    let until = rotated["previous_key_valid_until"].as_u64().unwrap();
    let refused_after = until_status(&envoy, &key, 401, Duration::from_secs(5));
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    assert!(
        now_s >= until,
        "refused at {now_s}, before the grace period's end {until}"
    );
    assert!(now_s <= until + 1, "refused at {now_s}, late for {until}");
    eprintln!("old key refused {refused_after:?} after the check began");
    assert_eq!(chat(&envoy, &new_key), 200);
    // The control plane then drops the expired key from the config (its
    // check runs every 5 s), with a line in the audit log.
    poll_until(Duration::from_secs(15), "the expired key pruned", || {
        let k = s
            .control
            .call("GET", "/v1/keys/app", Some(&s.control.read_token), None)
            .json();
        (k["previous_keys"] == json!([])).then_some(())
    });
    let audit = s
        .control
        .call(
            "GET",
            "/v1/audit?limit=1",
            Some(&s.control.read_token),
            None,
        )
        .json();
    assert_eq!(audit["entries"][0]["action"], "key.expire", "{audit}");

    // Revoked: 401 within a second, for both the DELETE and POST spelling.
    let revoked = s.control.write("POST", "/v1/keys/app/revoke", "");
    assert_eq!(revoked["revoked"], true);
    let took = until_status(&envoy, &new_key, 401, Duration::from_secs(1));
    eprintln!("revoked key refused after {took:?}");
    let listed = s
        .control
        .call("GET", "/v1/keys/app", Some(&s.control.read_token), None)
        .json();
    assert_eq!(listed["active"], false);

    // The audit log has every change, with who made it.
    let audit = s
        .control
        .call("GET", "/v1/audit", Some(&s.control.read_token), None)
        .json();
    let actions: Vec<&str> = audit["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["actor"] == "test-writer")
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(actions, ["key.revoke", "key.rotate", "key.create"]);
}

#[test]
fn a_change_the_core_refuses_never_reaches_envoy_and_one_envoy_refuses_is_a_nack() {
    let s = setup();
    // This Envoy refuses configs over its own limit (as an older or
    // differently configured filter would): the control plane's core
    // accepts them, Envoy does not.
    let initial = s
        .control
        .call("GET", "/v1/config", Some(&s.control.read_token), None);
    assert_eq!(initial.status, 200);
    let limit = (initial.body.len() + 300).to_string();
    let envoy = envoy_of(
        &s.control,
        &s.primary,
        &s.backup,
        "gw-skewed",
        vec![("PORTCULLIS_MAX_CONFIG_BYTES", &limit)],
    );
    s.control.wait_acked(&["gw-skewed"], 1);

    // Refused by the core: 422 with the problems, no new version.
    let r = s.control.call(
        "POST",
        "/v1/keys",
        Some(&s.control.write_token),
        Some(r#"{"name":"bad","models":["no-such-model"],"team":"nobody"}"#),
    );
    assert_eq!(r.status, 422, "{}", r.body);
    let problems = r.json()["error"]["problems"].clone();
    assert_eq!(problems.as_array().map(Vec::len), Some(2), "{problems}");
    assert!(problems.to_string().contains("no-such-model"), "{problems}");
    let nodes = s.control.nodes();
    assert_eq!(nodes["version"], 1, "{nodes}");
    assert_eq!(nodes["nodes"][0]["sent_version"], "1", "{nodes}");
    let keys = s
        .control
        .call("GET", "/v1/keys", Some(&s.control.read_token), None)
        .json();
    assert!(!keys.to_string().contains("\"bad\""), "nothing was kept");

    // Accepted by the core, refused by Envoy: a NACK, visible in the API,
    // and Envoy keeps serving the previous config.
    let mut version = 1;
    let mut extra = Vec::new();
    for i in 0..4 {
        let c = s.control.write(
            "POST",
            "/v1/keys",
            &format!(r#"{{"name":"extra-{i}","models":["gpt-4o-mini","gpt-4o"]}}"#),
        );
        version = c["version"].as_i64().unwrap();
        extra.push(c["key"].as_str().unwrap().to_string());
    }
    let nack = poll_until(Duration::from_secs(10), "a NACK", || {
        let n = s.control.nodes();
        let node = n["nodes"][0].clone();
        (node["nacked_version"] == version.to_string().as_str()).then_some(node)
    });
    // Envoy's NACK says the filter could not be created ("Unable to
    // create Wasm plugin portcullis", "Failed to initialize dynamic
    // module"); its log has the filter's reason.
    assert!(
        nack["nack"]
            .as_str()
            .is_some_and(|m| m.contains("Wasm plugin") || m.contains("dynamic module")),
        "{nack}"
    );
    assert!(
        envoy.log().contains("PORTCULLIS_MAX_CONFIG_BYTES"),
        "{}",
        envoy.log()
    );
    let acked: i64 = nack["acked_version"].as_str().unwrap().parse().unwrap();
    assert!(
        (2..version).contains(&acked),
        "the configs under the limit applied: {nack}"
    );
    assert!(
        envoy
            .stat("extension_config_discovery.http_filter.portcullis.update_rejected")
            .unwrap()
            >= 1
    );
    assert_eq!(chat(&envoy, DEMO), 200, "the previous config still serves");
    assert_eq!(
        chat(&envoy, extra.last().unwrap()),
        401,
        "the refused config is not applied"
    );
}

#[test]
fn two_envoys_get_a_revoke_and_keep_serving_while_the_control_plane_is_down() {
    let mut s = setup();
    let a = envoy_of(&s.control, &s.primary, &s.backup, "gw-1", vec![]);
    let b = envoy_of(&s.control, &s.primary, &s.backup, "gw-2", vec![]);
    let created = s.control.write("POST", "/v1/keys", r#"{"name":"fleet"}"#);
    let key = created["key"].as_str().unwrap().to_string();
    for e in [&a, &b] {
        until_status(e, &key, 200, Duration::from_secs(1));
    }
    let revoked = s.control.write("DELETE", "/v1/keys/fleet", "");
    for e in [&a, &b] {
        until_status(e, &key, 401, Duration::from_secs(1));
    }
    s.control
        .wait_acked(&["gw-1", "gw-2"], revoked["version"].as_i64().unwrap());

    // Down: both keep their last config.
    s.control.stop();
    poll_until(
        Duration::from_secs(10),
        "Envoy to see the control plane gone",
        || {
            (a.stat(
                "extension_config_discovery.http_filter.portcullis.control_plane.connected_state",
            ) == Some(0))
            .then_some(())
        },
    );
    for e in [&a, &b] {
        assert_eq!(chat(e, DEMO), 200);
        assert_eq!(chat(e, &key), 401);
    }
    // Back: they reconnect and take the next change.
    s.control.restart();
    let again = s
        .control
        .write("POST", "/v1/keys", r#"{"name":"after-restart"}"#);
    let key2 = again["key"].as_str().unwrap().to_string();
    for e in [&a, &b] {
        until_status(e, &key2, 200, Duration::from_secs(5));
        assert_eq!(chat(e, &key), 401, "the revoke survived the restart");
    }
    s.control
        .wait_acked(&["gw-1", "gw-2"], again["version"].as_i64().unwrap());
}

#[test]
fn the_admin_api_wants_a_token_and_a_write_role_to_change() {
    let c = Control::start(&test_plugin());
    for (method, path, body) in [
        ("GET", "/v1/keys", None),
        ("GET", "/v1/keys/demo", None),
        ("POST", "/v1/keys", Some(r#"{"name":"x"}"#)),
        ("PATCH", "/v1/keys/demo", Some("{}")),
        ("POST", "/v1/keys/demo/rotate", Some("{}")),
        ("POST", "/v1/keys/demo/revoke", Some("")),
        ("DELETE", "/v1/keys/demo", None),
        ("GET", "/v1/teams", None),
        ("PUT", "/v1/teams/t", Some("{}")),
        ("PATCH", "/v1/teams/t", Some("{}")),
        ("DELETE", "/v1/teams/t", None),
        ("GET", "/v1/config", None),
        ("PUT", "/v1/config", Some("clients: []")),
        ("GET", "/v1/nodes", None),
        ("GET", "/v1/audit", None),
    ] {
        for token in [None, Some("pct-not-a-token")] {
            let r = c.call(method, path, token, body);
            assert_eq!(r.status, 401, "{method} {path} with {token:?}: {}", r.body);
            assert!(r.json()["error"]["message"].is_string(), "{}", r.body);
        }
        let r = c.call(method, path, Some(&c.read_token), body);
        if method == "GET" {
            assert_eq!(r.status, 200, "{method} {path}: {}", r.body);
        } else {
            assert_eq!(
                r.status, 403,
                "{method} {path} with a read token: {}",
                r.body
            );
        }
    }
    let r = c.call("GET", "/v1/keys", Some(&c.read_token), None).json();
    assert_eq!(
        r["keys"].as_array().map(Vec::len),
        Some(2),
        "nothing changed: {r}"
    );
    // Bad bodies get a clear 400 or 404, never a 500.
    for (method, path, body, status) in [
        ("POST", "/v1/keys", "not json", 400),
        ("POST", "/v1/keys", "[1]", 400),
        ("POST", "/v1/keys", r#"{"models":[]}"#, 400),
        ("POST", "/v1/keys", r#"{"name":"demo"}"#, 409),
        (
            "POST",
            "/v1/keys",
            r#"{"name":"x","previous_keys":[]}"#,
            400,
        ),
        ("PATCH", "/v1/keys/nobody", "{}", 404),
        ("POST", "/v1/keys/demo/rotate", r#"{"grace_s":-1}"#, 400),
        ("PATCH", "/v1/teams/nobody", "{}", 404),
        ("PUT", "/v1/config", "clients: [", 422),
    ] {
        let r = c.call(method, path, Some(&c.write_token), Some(body));
        assert_eq!(r.status, status, "{method} {path} {body}: {}", r.body);
    }
}

/// 20 writers at once on one team (each adding a key to it, each setting
/// the team's limit): every write is kept, in order, none lost.
fn twenty_writers(c: &Control) {
    c.write(
        "PUT",
        "/v1/teams/crowd",
        r#"{"limits":{"requests_per_minute":100}}"#,
    );
    let before = c
        .call("GET", "/v1/audit?limit=1", Some(&c.read_token), None)
        .json()["entries"][0]["version"]
        .as_i64()
        .unwrap();
    let results: Vec<(Value, Value)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..20)
            .map(|i| {
                scope.spawn(move || {
                    let k = c.write(
                        "POST",
                        "/v1/keys",
                        &format!(r#"{{"name":"member-{i}","team":"crowd"}}"#),
                    );
                    let t = c.write(
                        "PATCH",
                        "/v1/teams/crowd",
                        &format!(r#"{{"limits":{{"requests_per_minute":{}}}}}"#, 1000 + i),
                    );
                    (k, t)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let team = c
        .call("GET", "/v1/teams/crowd", Some(&c.read_token), None)
        .json();
    let mut members: Vec<String> = team["keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap().to_string())
        .collect();
    members.sort();
    let mut want: Vec<String> = (0..20).map(|i| format!("member-{i}")).collect();
    want.sort();
    assert_eq!(members, want, "every key kept");
    // Every write made its own version, one after another.
    let mut versions: Vec<i64> = results
        .iter()
        .flat_map(|(k, t)| {
            [
                k["version"].as_i64().unwrap(),
                t["version"].as_i64().unwrap(),
            ]
        })
        .collect();
    versions.sort();
    assert_eq!(versions, ((before + 1)..=(before + 40)).collect::<Vec<_>>());
    // The team holds the last writer's limit.
    let last = c
        .call("GET", "/v1/audit?limit=1", Some(&c.read_token), None)
        .json()["entries"][0]
        .clone();
    assert_eq!(last["action"], "team.update");
    let rpm = team["config"]["limits"]["requests_per_minute"]
        .as_i64()
        .unwrap();
    assert_eq!(
        last["detail"],
        format!(r#"{{"limits":{{"requests_per_minute":{rpm}}}}}"#)
    );
    // Every key is in the config served.
    let yaml = c.call("GET", "/v1/config", Some(&c.read_token), None).body;
    for m in &want {
        assert!(
            yaml.contains(&format!("name: {m}")),
            "{m} not in the config"
        );
    }
}

#[test]
fn twenty_concurrent_writers_lose_nothing_on_sqlite() {
    twenty_writers(&Control::start(&test_plugin()));
}

#[test]
fn twenty_concurrent_writers_lose_nothing_on_postgres_and_the_state_survives_a_restart() {
    let pg = Postgres::start();
    let dir = TempDir::new("control-pg");
    let mut c = Control::start_in(dir, pg.url().into(), &test_plugin(), &[]);
    twenty_writers(&c);
    let before = c.call("GET", "/v1/config", Some(&c.read_token), None).body;
    c.stop();
    c.restart();
    let after = c.call("GET", "/v1/config", Some(&c.read_token), None).body;
    assert_eq!(before, after);
    assert_eq!(
        c.nodes()["version"],
        42,
        "serves the newest version at start"
    );
}

#[test]
fn import_then_export_round_trips_the_shipped_plugin_yaml() {
    let c = Control::start(&test_plugin());
    let shipped = shipped_plugin();
    let r = c.call("PUT", "/v1/config", Some(&c.write_token), Some(&shipped));
    assert_eq!(r.status, 200, "{}", r.body);
    let exported = c.call("GET", "/v1/config", Some(&c.read_token), None);
    assert_eq!(exported.header("content-type"), Some("application/yaml"));
    let a: serde_yaml::Value = serde_yaml::from_str(&shipped).unwrap();
    let b: serde_yaml::Value = serde_yaml::from_str(&exported.body).unwrap();
    assert_eq!(a, b);
    // Sections stay in the document's order.
    let order = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with([' ', '#', '-']) && l.contains(':'))
            .map(|l| l.split(':').next().unwrap().to_string())
            .collect()
    };
    assert_eq!(order(&shipped), order(&exported.body));
    // The filter accepts what is exported.
    portcullis_core::compile::compile(exported.body.as_bytes()).unwrap();
    // Importing the same again changes nothing: no new version.
    let again = c
        .call(
            "PUT",
            "/v1/config",
            Some(&c.write_token),
            Some(&exported.body),
        )
        .json();
    assert_eq!(again["version"], r.json()["version"]);
}

/// The admin API answers only its own host names (a DNS-rebinding page
/// gets 421, token or not; `/healthz` stays open to probes) and takes a
/// config import up to the filter's own limit (4 MiB by default): at the
/// bound it is applied, one byte past it is a 413 in the API's JSON shape.
#[test]
fn the_admin_api_answers_its_own_host_names_and_configs_up_to_the_filters_limit() {
    let c = Control::start(&test_plugin());
    let write = format!("Bearer {}", c.write_token);
    for path in ["/v1/keys", "/v1/config", "/dashboard", "/v1/nodes"] {
        let (status, _, body) = raw_http(
            c.admin_port,
            "GET",
            path,
            &[("host", "attacker.example:9400"), ("authorization", &write)],
            "",
        );
        assert_eq!(status, 421, "{path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--allowed-hosts"),
            "{body}"
        );
    }
    for host in ["localhost:9400", "127.0.0.1", "[::1]:9400"] {
        let (status, _, body) = raw_http(
            c.admin_port,
            "GET",
            "/v1/keys",
            &[("host", host), ("authorization", &write)],
            "",
        );
        assert_eq!(status, 200, "{host}: {body}");
    }
    let (status, _, _) = raw_http(
        c.admin_port,
        "GET",
        "/healthz",
        &[("host", "10.1.2.3:9400")],
        "",
    );
    assert_eq!(status, 200, "a probe by address");

    // The shipped config padded with a comment to exactly the limit.
    let limit = portcullis_core::config::DEFAULT_MAX_CONFIG_BYTES;
    let padded = |size: usize| {
        let mut text = shipped_plugin();
        text.push_str("\n# ");
        let pad = size - text.len() - 1;
        text.push_str(&"x".repeat(pad));
        text.push('\n');
        assert_eq!(text.len(), size);
        text
    };
    let at = c.call(
        "PUT",
        "/v1/config",
        Some(&c.write_token),
        Some(&padded(limit)),
    );
    assert_eq!(
        at.status,
        200,
        "at the bound: {}",
        &at.body[..at.body.len().min(300)]
    );
    let past = c.call(
        "PUT",
        "/v1/config",
        Some(&c.write_token),
        Some(&padded(limit + 1)),
    );
    assert_eq!(
        past.status,
        413,
        "{}",
        &past.body[..past.body.len().min(300)]
    );
    let message = past.json()["error"]["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        message.contains("4194304 bytes") && message.contains("--max-config-bytes"),
        "{message}"
    );
    // The config at the bound is the one served.
    let exported = c.call("GET", "/v1/config", Some(&c.read_token), None);
    assert_eq!(exported.status, 200);
    portcullis_core::compile::compile(exported.body.as_bytes()).unwrap();
}

/// A key's per-minute limit raised through the API admits the key's next
/// request at once: what it used stays used, the rest of the new limit is
/// there (docs/limits.md); lowered again, it grants no burst past it.
#[test]
fn a_limit_raised_through_the_api_admits_the_next_request_at_once() {
    let s = setup();
    let envoy = envoy_of(&s.control, &s.primary, &s.backup, "gw-limit", vec![]);
    let created = s.control.write(
        "POST",
        "/v1/keys",
        r#"{"name":"tight","models":["gpt-4o-mini"],"limits":{"requests_per_minute":2}}"#,
    );
    let key = created["key"].as_str().unwrap().to_string();
    s.control
        .wait_acked(&["gw-limit"], created["version"].as_i64().unwrap());
    assert_eq!(chat(&envoy, &key), 200);
    assert_eq!(chat(&envoy, &key), 200);
    assert_eq!(chat(&envoy, &key), 429, "2 a minute, both used");
    let raised = s.control.write(
        "PATCH",
        "/v1/keys/tight",
        r#"{"limits":{"requests_per_minute":100}}"#,
    );
    s.control
        .wait_acked(&["gw-limit"], raised["version"].as_i64().unwrap());
    assert_eq!(chat(&envoy, &key), 200, "the raised limit admits at once");
    let lowered = s.control.write(
        "PATCH",
        "/v1/keys/tight",
        r#"{"limits":{"requests_per_minute":2}}"#,
    );
    s.control
        .wait_acked(&["gw-limit"], lowered["version"].as_i64().unwrap());
    let admitted = (0..5).filter(|_| chat(&envoy, &key) == 200).count();
    assert!(admitted <= 2, "lowered to 2: {admitted} admitted");
}

/// A provider is one API call (#46 item 8): a config whose new provider has
/// an `upstream` reaches every Envoy as a cluster over CDS beside the
/// filter's config, and the provider serves at once, with no edit of the
/// bootstrap; a TLS upstream is a cluster Envoy accepts (SNI, the system CA
/// bundle, the name checked); gone from the config, the cluster goes.
#[test]
fn a_provider_with_an_upstream_gets_its_cluster_over_cds() {
    let s = setup();
    let envoy = envoy_of(&s.control, &s.primary, &s.backup, "gw-cds", vec![]);
    let third = mock("third", Some(PRIMARY_KEY));
    assert_eq!(chat(&envoy, DEMO), 200);
    let base = test_plugin();
    let chain = base
        .lines()
        .find(|l| l.starts_with("  chain: ["))
        .expect("a routing chain")
        .to_string();
    let added = base
        .replacen(
            "providers:\n",
            &format!(
                "providers:\n  - name: third\n    cluster: third_cds\n    host: third.mock\n    base_path: /v1\n    api_key_env: OPENAI_API_KEY\n    upstream: {{address: 127.0.0.1, port: {}, tls: false}}\n    models: [{{name: third-model}}]\n  - name: tls_only\n    cluster: tls_cds\n    host: api.openai.com\n    api_key_env: OPENAI_API_KEY\n    upstream: {{}}\n    models: [{{name: tls-model}}]\n",
                third.port
            ),
            1,
        )
        .replace(&chain, &chain.replace(']', ", third, tls_only]"));
    let v = s.control.write("PUT", "/v1/config", &added);
    s.control
        .wait_acked(&["gw-cds"], v["version"].as_i64().unwrap());
    let body = chat_body("third-model", "hello");
    let auth = format!("Bearer {DEMO}");
    let r = poll_until(Duration::from_secs(10), "the new provider's answer", || {
        let r = post(
            &envoy.url("/v1/chat/completions"),
            &[("authorization", &auth)],
            &body,
        );
        (r.status == 200).then_some(r)
    });
    assert_eq!(r.header("x-portcullis-provider"), Some("third"));
    assert_eq!(third.hits(), 1);
    // Both clusters are Envoy's, from CDS (not the bootstrap).
    let dump = get(
        &envoy.admin("/config_dump?resource=dynamic_active_clusters"),
        &[],
    )
    .json();
    let names: Vec<&str> = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|c| c["cluster"]["name"].as_str())
        .collect();
    assert!(
        names.contains(&"third_cds") && names.contains(&"tls_cds"),
        "{names:?}"
    );
    let tls = dump["configs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["cluster"]["name"] == "tls_cds")
        .unwrap();
    let ctx = &tls["cluster"]["transport_socket"]["typed_config"];
    assert_eq!(ctx["sni"], "api.openai.com", "{tls}");
    assert_eq!(
        ctx["common_tls_context"]["validation_context"]["trusted_ca"]["filename"],
        "/etc/ssl/certs/ca-certificates.crt"
    );
    assert_eq!(
        ctx["common_tls_context"]["validation_context"]["match_typed_subject_alt_names"][0]
            ["matcher"]["exact"],
        "api.openai.com"
    );
    assert_eq!(tls["cluster"]["type"], "LOGICAL_DNS");
    // Gone from the config: gone from Envoy.
    let v = s.control.write("PUT", "/v1/config", &base);
    s.control
        .wait_acked(&["gw-cds"], v["version"].as_i64().unwrap());
    poll_until(Duration::from_secs(10), "the clusters removed", || {
        let clusters = get(&envoy.admin("/clusters"), &[]).body;
        (!clusters.contains("third_cds::") && !clusters.contains("tls_cds::")).then_some(())
    });
}
