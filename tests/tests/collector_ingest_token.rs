//! With an ingest token, the collector takes records only from the
//! gateway: a forged batch (any client, any cost) from another process is
//! refused (`UNAUTHENTICATED`) and counted, while Envoy's filter, which
//! sends the token from its environment, gets every record stored.
mod common;
use common::*;
use portcullis_collector::proto::{collector_client::CollectorClient, RecordBatch, RequestRecord};
use portcullis_tests::*;
use std::time::Duration;

#[test]
fn a_forged_ingest_is_refused_and_the_gateways_records_arrive() {
    let dir = TempDir::new("ingest-token");
    let token_file = dir.0.join("ingest-token");
    std::fs::write(&token_file, format!("{INGEST_TOKEN}\n")).unwrap();
    let c = Collector::start_args(
        dir.0.join("log.db").as_os_str(),
        0,
        &["--ingest-token-file", token_file.to_str().unwrap()],
    );
    let port = c.grpc_port;
    let forged = RecordBatch {
        records: vec![RequestRecord {
            request_id: "forged-1".into(),
            client: "victim".into(),
            cost_micros: 1_000_000_000,
            status: 200,
            ..Default::default()
        }],
    };
    let code = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let mut client = CollectorClient::connect(format!("http://127.0.0.1:{port}"))
                .await
                .unwrap();
            client.ingest(forged).await.unwrap_err().code()
        });
    assert_eq!(code, tonic::Code::Unauthenticated);
    let metrics = get(&c.url("/metrics"), &[]).body;
    assert!(
        metrics.contains("portcullis_collector_ingest_unauthenticated_total 1"),
        "{metrics}"
    );

    // The gateway's filter sends the token (PORTCULLIS_INGEST_TOKEN).
    let s = Stack::start_full(
        &test_plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100"),
        1,
        false,
        c.grpc_port,
    );
    for _ in 0..3 {
        assert_eq!(s.chat(DEMO_KEY, &chat_body("mini", "hi")).status, 200);
    }
    let rows = poll_until(Duration::from_secs(20), "the gateway's records", || {
        let r = c.recent(10);
        (r.len() >= 3).then_some(r)
    });
    assert!(rows.iter().all(|r| r["request_id"] != "forged-1"));
    assert!(rows.iter().all(|r| r["client"] == "demo"));
}
