//! Every shipped Envoy YAML passes `envoy --mode validate`, and the shipped
//! plugin config compiles.
use portcullis_tests::*;
use std::process::Command;

#[test]
fn shipped_plugin_config_compiles() {
    portcullis_core::compile::compile(shipped_plugin().as_bytes()).unwrap();
}

/// `envoy --mode validate` on a bootstrap (as `envoy/<name>` in a scratch
/// directory: its relative paths point there, and the ECDS file it watches
/// is rendered into the scratch `.run/ecds`). Returns Envoy's log.
fn validate(name: &str, bootstrap: &str) -> String {
    let scratch = TempDir::new("validate");
    std::fs::create_dir_all(scratch.0.join("envoy")).unwrap();
    std::fs::write(scratch.0.join("envoy").join(name), bootstrap).unwrap();
    let status = Command::new("bash")
        .arg(repo_root().join("envoy/render-ecds.sh"))
        .arg(repo_root().join("envoy/plugin.yaml"))
        .arg(scratch.0.join(".run/ecds/portcullis.yaml"))
        .arg(wasm_path())
        .status()
        .unwrap();
    assert!(status.success());
    let out = Command::new(envoy_bin())
        .current_dir(&scratch.0)
        .args(["--mode", "validate", "--disable-hot-restart", "-c"])
        .arg(format!("envoy/{name}"))
        .output()
        .unwrap();
    let log = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(out.status.success(), "{name} failed validation:\n{log}");
    log
}

#[test]
fn shipped_envoy_yamls_pass_envoy_validate() {
    let root = repo_root();
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("envoy")).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !(name.ends_with(".yaml") && name != "plugin.yaml") {
            continue;
        }
        validate(&name, &std::fs::read_to_string(&path).unwrap());
        checked += 1;
    }
    assert!(
        checked >= 2,
        "expected envoy.yaml and bare.yaml, validated {checked}"
    );
}

/// The documented cluster for a real provider over TLS is valid Envoy
/// config: envoy.yaml with it appended passes `envoy --mode validate`.
#[test]
fn the_documented_tls_provider_cluster_passes_envoy_validate() {
    let root = repo_root();
    let mut text = std::fs::read_to_string(root.join("envoy/envoy.yaml")).unwrap();
    let snippet = std::fs::read_to_string(root.join("envoy/snippets/openai-cluster.yaml")).unwrap();
    // Envoy checks that the CA file exists: the check is part of what is
    // validated, so a machine without Debian's bundle fails here (`make
    // integration` installs `ca-certificates` when it is missing).
    let ca = "/etc/ssl/certs/ca-certificates.crt";
    assert!(
        std::path::Path::new(ca).exists(),
        "{ca} is missing: install Debian's ca-certificates (make integration does)"
    );
    assert!(
        snippet.contains(ca),
        "the snippet names the bundle it needs"
    );
    text.push_str(&snippet);
    let stderr = validate("envoy.yaml", &text);
    assert!(
        stderr.contains("loading 8 cluster(s)"),
        "the snippet's cluster was not loaded"
    );
}

#[test]
fn plugin_config_in_the_istio_manifest_compiles() {
    let text = std::fs::read_to_string(repo_root().join("envoy/istio/portcullis-envoyfilter.yaml"))
        .unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let config = doc["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]["config"]
        ["configuration"]["value"]
        .as_str()
        .expect("plugin config text in the EnvoyFilter");
    let gw = portcullis_core::compile::compile(config.as_bytes()).unwrap();
    assert_eq!(gw.providers[0].cluster, "outbound|443||api.openai.com");
    assert_eq!(
        doc["spec"]["configPatches"][0]["patch"]["value"]["typed_config"]["config"]
            ["allow_on_headers_stop_iteration"],
        true
    );
}

/// The shipped HCM's `local_reply_config` (Envoy's own 413 in the client's
/// shape), as JSON, after checking an Istio manifest's NETWORK_FILTER patch
/// carries the same.
fn istio_local_reply(patch: &serde_yaml::Value) -> String {
    assert_eq!(patch["applyTo"], "NETWORK_FILTER");
    assert_eq!(patch["patch"]["operation"], "MERGE");
    let theirs = &patch["patch"]["value"]["typed_config"]["local_reply_config"];
    let shipped: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(repo_root().join("envoy/envoy.yaml")).unwrap(),
    )
    .unwrap();
    let ours = &shipped["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["local_reply_config"];
    assert!(
        ours.is_mapping(),
        "envoy/envoy.yaml has a local_reply_config"
    );
    assert_eq!(
        theirs, ours,
        "the Istio manifest's local_reply_config is envoy.yaml's"
    );
    serde_json::to_string(theirs).unwrap()
}

/// The Wasm filter config the Istio manifest carries is valid Envoy config:
/// a bootstrap built from the patch (the EXTENSION_CONFIG's filter placed
/// where the HTTP_FILTER patch puts it, before the router; the clusters the
/// manifest names) passes `envoy --mode validate`.
#[test]
fn the_istio_manifests_wasm_filter_passes_envoy_validate() {
    let text = std::fs::read_to_string(repo_root().join("envoy/istio/portcullis-envoyfilter.yaml"))
        .unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let patches = doc["spec"]["configPatches"].as_sequence().unwrap();
    let ext = &patches[0];
    assert_eq!(ext["applyTo"], "EXTENSION_CONFIG");
    let insert = &patches[1];
    assert_eq!(insert["applyTo"], "HTTP_FILTER");
    assert_eq!(insert["patch"]["operation"], "INSERT_BEFORE");
    assert_eq!(
        insert["match"]["listener"]["filterChain"]["filter"]["subFilter"]["name"],
        "envoy.filters.http.router"
    );
    let name = ext["patch"]["value"]["name"].as_str().unwrap();
    assert_eq!(
        insert["patch"]["value"]["name"], name,
        "the reference names the extension"
    );
    // The gateway's listeners buffer more than the plugin's default limit,
    // so an oversized upload gets the gateway's 413, not Envoy's.
    let listener = &patches[2];
    assert_eq!(listener["applyTo"], "LISTENER");
    assert_eq!(listener["patch"]["operation"], "MERGE");
    let buffer = listener["patch"]["value"]["per_connection_buffer_limit_bytes"]
        .as_u64()
        .unwrap();
    assert!(buffer > 32 << 20, "{buffer}");
    let local_reply = istio_local_reply(&patches[3]);
    let wasm = serde_json::to_string(&ext["patch"]["value"]["typed_config"]).unwrap();
    let wasm_cluster = ext["patch"]["value"]["typed_config"]["config"]["vm_config"]["code"]
        ["remote"]["http_uri"]["cluster"]
        .as_str()
        .unwrap()
        .to_string();
    let cluster = |n: &str| {
        format!(
            "  - name: \"{n}\"\n    type: STATIC\n    load_assignment:\n      cluster_name: \"{n}\"\n      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 443}}}}}}}}]}}]\n"
        )
    };
    let bootstrap = format!(
        "static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: 10000}}}}
    per_connection_buffer_limit_bytes: {buffer}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          local_reply_config: {local_reply}
          route_config: {{name: r, virtual_hosts: [{{name: v, domains: [\"*\"], routes: [{{match: {{prefix: /}}, route: {{cluster_header: x-portcullis-cluster}}}}]}}]}}
          http_filters:
          - name: {name}
            typed_config: {wasm}
          - name: envoy.filters.http.router
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
{}{}",
        cluster(&wasm_cluster),
        cluster("outbound|443||api.openai.com"),
    );
    let log = validate("istio-bootstrap.yaml", &bootstrap);
    assert!(log.contains("loading 2 cluster(s)"), "{log}");
}

/// The container configs: the front Envoy's, and the replica's as
/// docker/render-replica.sh makes it from envoy/envoy.yaml.
#[test]
fn the_container_envoy_configs_pass_envoy_validate() {
    let front = std::fs::read_to_string(repo_root().join("docker/envoy-front.yaml")).unwrap();
    validate("front.yaml", &front);
    let scratch = TempDir::new("replica");
    let out = scratch.0.join("replica.yaml");
    let status = Command::new("bash")
        .arg(repo_root().join("docker/render-replica.sh"))
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    // The ECDS file and the certificates are mounted in the container;
    // here they are scratch ones.
    let certs = side_certs();
    let bootstrap = std::fs::read_to_string(&out).unwrap();
    assert_eq!(
        bootstrap.matches("/etc/portcullis/tls/client.pem").count(),
        2,
        "the replica reaches the collector and the limiter over mutual TLS"
    );
    let replica = bootstrap
        .replace("/etc/portcullis/ecds", ".run/ecds")
        .replace("/etc/portcullis/tls", &certs.0.display().to_string());
    let log = validate("replica.yaml", &replica);
    assert!(log.contains("loading 7 cluster(s)"), "{log}");
}

/// The Istio manifest for the control plane: the filter's config comes
/// over gRPC from the control plane's cluster, with its token; a bootstrap
/// built from the patch (the reference before the router, that cluster as
/// HTTP/2) passes `envoy --mode validate`.
#[test]
fn the_istio_control_plane_manifest_passes_envoy_validate() {
    let text = std::fs::read_to_string(
        repo_root().join("envoy/istio/portcullis-control-envoyfilter.yaml"),
    )
    .unwrap();
    let doc: serde_yaml::Value = serde_yaml::from_str(&text).unwrap();
    let patches = doc["spec"]["configPatches"].as_sequence().unwrap();
    let insert = &patches[0];
    assert_eq!(insert["applyTo"], "HTTP_FILTER");
    assert_eq!(insert["patch"]["operation"], "INSERT_BEFORE");
    let source = &insert["patch"]["value"]["config_discovery"]["config_source"];
    let grpc = &source["api_config_source"]["grpc_services"][0];
    let cluster = grpc["envoy_grpc"]["cluster_name"].as_str().unwrap();
    assert!(
        cluster.starts_with("outbound|18000||portcullis-control."),
        "{cluster}"
    );
    assert_eq!(grpc["initial_metadata"][0]["key"], "authorization");
    let filter = serde_json::to_string(&insert["patch"]["value"]).unwrap();
    let local_reply = istio_local_reply(&patches[2]);
    let bootstrap = format!(
        "node: {{id: gw, cluster: gw}}
static_resources:
  listeners:
  - name: gateway
    address: {{socket_address: {{address: 127.0.0.1, port_value: 10000}}}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          \"@type\": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: gateway
          local_reply_config: {local_reply}
          route_config: {{name: r, virtual_hosts: [{{name: v, domains: [\"*\"], routes: [{{match: {{prefix: /}}, route: {{cluster_header: x-portcullis-cluster}}}}]}}]}}
          http_filters:
          - {filter}
          - name: envoy.filters.http.router
            typed_config:
              \"@type\": type.googleapis.com/envoy.extensions.filters.http.router.v3.Router
  clusters:
  - name: \"{cluster}\"
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: \"{cluster}\"
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: 18000}}}}}}}}]}}]
"
    );
    let log = validate("istio-control-bootstrap.yaml", &bootstrap);
    assert!(log.contains("loading 1 cluster(s)"), "{log}");
}

/// `envoy/use-control.sh` makes a valid bootstrap from the shipped one:
/// the filter's config from the control plane over gRPC, with the xDS
/// token in every stream's metadata, and the control plane's cluster.
#[test]
fn the_control_plane_bootstrap_passes_envoy_validate() {
    let scratch = TempDir::new("use-control");
    let out = scratch.0.join("envoy-control.yaml");
    std::fs::copy(repo_root().join("envoy/envoy.yaml"), &out).unwrap();
    let token = scratch.0.join("xds-token");
    std::fs::write(&token, "xds-token-for-tests\n").unwrap();
    let status = Command::new("bash")
        .arg(repo_root().join("envoy/use-control.sh"))
        .arg(&out)
        .arg("127.0.0.1:18000")
        .arg(&token)
        .status()
        .unwrap();
    assert!(status.success());
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(!text.contains("path_config_source"), "{text}");
    assert!(
        text.contains("value: \"Bearer xds-token-for-tests\""),
        "{text}"
    );
    let log = validate("envoy-control.yaml", &text);
    assert!(log.contains("loading 8 cluster(s)"), "{log}");
    // A second run finds no file source to replace, and says so.
    let again = Command::new("bash")
        .arg(repo_root().join("envoy/use-control.sh"))
        .arg(&out)
        .arg("127.0.0.1:18000")
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("no path_config_source"));
}
