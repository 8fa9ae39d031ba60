//! `make bench-control`: how long a change takes to reach every Envoy, and
//! what a config with 10,000 keys costs on the wire and in Envoy.
//!
//! 1. For 1 and for 10 Envoys (one worker each, subscribed to one control
//!    plane on loopback): ROUNDS keys created one after another; for each,
//!    the time from sending the API call to the last Envoy's ACK of its
//!    version (`/v1/nodes` polled every millisecond). Median, p90, max.
//! 2. A config with 10 keys, then one with 10,000, imported (`PUT
//!    /v1/config`) into the one-Envoy setup: the YAML's and the xDS
//!    resource's size, the API call's time (the control plane's compile
//!    and write), the time to Envoy's ACK (decode, the filter's compile in
//!    its configure hook, on every worker), and the core's compile time
//!    alone natively (median of 5).
//!
//! Envoy's instructions per request with 10 and 10,000 keys are
//! `make bench-instructions` variants (keys10, keys10000).

use portcullis_tests::*;
use std::time::{Duration, Instant};

fn median(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |q: f64| {
        v.get(((v.len() as f64 - 1.0) * q).round() as usize)
            .copied()
            .unwrap_or(0.0)
    };
    (at(0.5), at(0.9), at(1.0))
}

fn envoys(control: &Control, mock: &Mock, n: usize) -> Vec<Envoy> {
    (0..n)
        .map(|i| {
            Envoy::start(EnvoyOpts {
                plugin_yaml: "{}",
                primary_port: mock.port,
                backup_port: mock.port,
                collector_port: dead_port(),
                ratelimit_port: dead_port(),
                workers: 1,
                env: vec![
                    ("OPENAI_API_KEY", "sk-bench"),
                    ("BACKUP_API_KEY", "sk-bench"),
                ],
                side_tls: None,
                bootstrap_patch: Vec::new(),
                control: Some((control.xds_port, &format!("bench-{i}"))),
                clusters: None,
            })
        })
        .collect()
}

/// Send a change, then poll until every node has acknowledged its version.
fn to_last_ack(
    control: &Control,
    nodes: &[String],
    send: impl FnOnce() -> i64,
) -> (Duration, Duration) {
    let started = Instant::now();
    let version = send();
    let answered = started.elapsed();
    let deadline = started + Duration::from_secs(60);
    let ids: Vec<&str> = nodes.iter().map(String::as_str).collect();
    loop {
        let n = control.nodes();
        if acked(&n, &ids, version) {
            return (answered, started.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "no ACK of version {version} within 60 s: {n}"
        );
        std::thread::park_timeout(Duration::from_millis(1));
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn with_keys(base: &str, n: usize) -> String {
    let mut extra = String::new();
    for i in 0..n.saturating_sub(2) {
        extra.push_str(&format!(
            "  - name: bench-{i}\n    key_sha256: {}\n",
            key_hash(&format!("sk-bench-{i}"))
        ));
    }
    base.replacen("clients:\n", &format!("clients:\n{extra}"), 1)
}

fn main() {
    let rounds: usize = std::env::var("BENCH_CONTROL_ROUNDS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    let mock = Mock::start(
        &repo_root()
            .join("target/release/portcullis-mock")
            .display()
            .to_string(),
        "bench",
        Some("sk-bench"),
    );
    println!("| Envoys | change → last ACK, median | p90 | max | API call alone, median |\n|---|---|---|---|---|");
    for n in [1usize, 10] {
        let control = Control::start(&test_plugin());
        let _envoys = envoys(&control, &mock, n);
        let nodes: Vec<String> = (0..n).map(|i| format!("bench-{i}")).collect();
        control.wait_acked(&nodes.iter().map(String::as_str).collect::<Vec<_>>(), 1);
        let (mut total, mut api) = (Vec::new(), Vec::new());
        for r in 0..rounds {
            let (a, t) = to_last_ack(&control, &nodes, || {
                control.write("POST", "/v1/keys", &format!(r#"{{"name":"k{r}"}}"#))["version"]
                    .as_i64()
                    .unwrap_or(0)
            });
            api.push(ms(a));
            total.push(ms(t));
        }
        let (p50, p90, max) = median(&mut total);
        let (a50, _, _) = median(&mut api);
        println!("| {n} | {p50:.1} ms | {p90:.1} ms | {max:.1} ms | {a50:.1} ms |");
    }

    println!("\n| keys | YAML | xDS resource | API call (control plane compiles, writes) | to Envoy's ACK | core compile alone (native) |\n|---|---|---|---|---|---|");
    let control = Control::start(&test_plugin());
    let _envoy = envoys(&control, &mock, 1);
    let nodes = vec!["bench-0".to_string()];
    control.wait_acked(&["bench-0"], 1);
    let resource =
        std::fs::read_to_string(control.dir.0.join("ecds/portcullis.yaml")).unwrap_or_default();
    let template = portcullis_control::xds::Template::from_resources_yaml(&resource)
        .unwrap_or_else(|e| panic!("{e}"));
    for keys in [10usize, 10_000] {
        let yaml = with_keys(&test_plugin(), keys);
        let wire = template.resource_len(&yaml);
        let mut compile = Vec::new();
        for _ in 0..5 {
            let t = Instant::now();
            portcullis_core::compile::compile(yaml.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
            compile.push(ms(t.elapsed()));
        }
        let (c50, _, _) = median(&mut compile);
        let (api, total) = to_last_ack(&control, &nodes, || {
            control.write("PUT", "/v1/config", &yaml)["version"]
                .as_i64()
                .unwrap_or(0)
        });
        println!(
            "| {keys} | {:.1} KB | {:.1} KB | {:.1} ms | {:.1} ms | {c50:.1} ms |",
            yaml.len() as f64 / 1024.0,
            wire as f64 / 1024.0,
            ms(api),
            ms(total)
        );
    }
}
