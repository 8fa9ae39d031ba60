//! The side services over mutual TLS: the collector's ingest and the
//! limiter started with `--tls-cert`, `--tls-key` and `--tls-client-ca`
//! (certificates from `scripts/make-certs.sh`), Envoy's clusters for them
//! given a TLS transport socket by `envoy/side-tls.sh`. The gateway's
//! records arrive and its global limits are decided (never failed) over
//! TLS; a caller without a client certificate, or without TLS, is refused
//! by the handshake before any gRPC.
mod common;
use common::*;
use portcullis_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const TLS_KEY: &str = "sk-tls-limited";

fn tls_args(certs: &Path) -> Vec<String> {
    let f = |n: &str| certs.join(n).display().to_string();
    vec![
        "--tls-cert".into(),
        f("server.pem"),
        "--tls-key".into(),
        f("server-key.pem"),
        "--tls-client-ca".into(),
        f("ca.pem"),
    ]
}

/// A TLS client that trusts the CA but presents no certificate (curl over
/// HTTP/2) gets no HTTP answer from `port`: the handshake refuses it (how
/// curl words the refusal depends on timing: `certificate required`, or the
/// connection already closed). Its error.
fn without_client_cert(certs: &Path, port: u16) -> String {
    let out = Command::new("curl")
        .args([
            "-sS",
            "--http2",
            "--max-time",
            "5",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code}",
            "--cacert",
        ])
        .arg(certs.join("ca.pem"))
        .arg(format!("https://localhost:{port}/"))
        .output()
        .expect("run curl");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "served without a client certificate");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        "000",
        "an HTTP answer without a client certificate: {err}"
    );
    err
}

#[test]
fn the_gateway_reaches_collector_and_limiter_over_mutual_tls_and_strangers_are_refused() {
    let certs = side_certs();
    let args = tls_args(&certs.0);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let redis = Redis::start();
    let limiter = Limiter::start_args(redis.port, 0, &args);
    let dir = TempDir::new("tls-collector");
    let collector = Collector::start_args(dir.0.join("log.db").as_os_str(), 0, &args);

    // Strangers: no client certificate, or no TLS at all.
    for port in [collector.grpc_port, limiter.port] {
        let err = without_client_cert(&certs.0, port);
        assert!(!err.is_empty());
    }
    let port = collector.grpc_port;
    let plain = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            use portcullis_collector::proto::{collector_client::CollectorClient, RecordBatch};
            let mut c = CollectorClient::connect(format!("http://127.0.0.1:{port}")).await?;
            c.ingest(RecordBatch::default())
                .await
                .map(|_| ())
                .map_err(|e| e.into())
        });
    let plain: Result<(), Box<dyn std::error::Error>> = plain;
    assert!(plain.is_err(), "a plaintext call was served");

    let plugin = test_plugin()
        .replace("flush_interval_ms: 250", "flush_interval_ms: 100")
        .replacen(
            "clients:\n",
            &format!(
                "clients:\n  - name: tls-limited\n    key_sha256: {}\n    limits: {{requests_per_minute: 3, scope: global}}\n",
                key_hash(TLS_KEY)
            ),
            1,
        )
        .replacen(
            "  max_body_bytes: 33554432\n",
            "  max_body_bytes: 33554432\n  global: {cluster: portcullis_ratelimit, timeout_ms: 3000, failure_mode: deny}\n",
            1,
        );
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port: collector.grpc_port,
        ratelimit_port: limiter.port,
        workers: 1,
        side_tls: Some(&certs.0),
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("BACKUP_API_KEY", BACKUP_KEY),
            ("PORTCULLIS_LIMITER_TOKEN", LIMITER_TOKEN),
        ],
    });
    let auth = format!("Bearer {TLS_KEY}");
    let statuses: Vec<u16> = (0..5)
        .map(|_| {
            post(
                &envoy.url("/v1/chat/completions"),
                &[("authorization", &auth)],
                &chat_body("gpt-4o-mini", "hi"),
            )
            .status
        })
        .collect();
    // Decided by the limiter (a failure would be a 503 under `deny`).
    assert_eq!(statuses, [200, 200, 200, 429, 429]);
    let rows = poll_until(Duration::from_secs(20), "the records over TLS", || {
        let r = collector.recent(10);
        (r.len() >= 5).then_some(r)
    });
    assert!(
        rows.iter().all(|r| r["client"] == "tls-limited"),
        "{rows:?}"
    );
    for cluster in ["portcullis_collector", "portcullis_ratelimit"] {
        let handshakes = envoy
            .stat(&format!("cluster.{cluster}.ssl.handshake"))
            .unwrap_or(0);
        assert!(handshakes >= 1, "{cluster}: {handshakes} TLS handshakes");
    }
}
