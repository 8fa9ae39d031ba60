//! The collector on PostgreSQL (`--db postgres://...`), for fleets: two
//! collectors writing into one real PostgreSQL (Debian's, started here),
//! each acknowledging after its commit; re-sends to either one store
//! nothing twice; the rollups they share are exact; the API answers the
//! same from both; a restarted collector keeps going where it was.
use portcullis_collector::proto::{
    collector_client::CollectorClient, Ack, Attempt, RecordBatch, RequestRecord,
};
use portcullis_tests::*;

fn record(id: &str, client: &str, latency_ms: u64, now: u64) -> RequestRecord {
    // gamma's requests fell back from a primary that timed out.
    let failed = (client == "gamma")
        .then(|| Attempt {
            provider: "primary".into(),
            status: 0,
            cause: "timeout".into(),
            ..Attempt::default()
        })
        .into_iter();
    RequestRecord {
        request_id: id.into(),
        time_ms: now,
        client: client.into(),
        requested_model: "auto".into(),
        model: "gpt-4o-mini".into(),
        provider: "primary".into(),
        cache: "miss".into(),
        attempts: failed
            .chain([Attempt {
                provider: "primary".into(),
                status: 200,
                cause: String::new(),
                ..Attempt::default()
            }])
            .collect(),
        status: 200,
        latency_ms,
        prompt_tokens: 10,
        completion_tokens: 5,
        cost_micros: 7,
        limited_by: String::new(),
        guardrails: String::new(),
        ..Default::default()
    }
}

/// Send `batches` to a collector, concurrently with whatever else runs;
/// the acknowledgements.
async fn send(port: u16, batches: Vec<Vec<RequestRecord>>) -> Vec<Ack> {
    let mut client = CollectorClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .unwrap();
    let mut acks = Vec::new();
    for records in batches {
        acks.push(
            client
                .ingest(RecordBatch { records })
                .await
                .unwrap()
                .into_inner(),
        );
    }
    acks
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn two_collectors_share_one_postgres_exactly() {
    let pg = Postgres::start();
    let url = pg.url();
    let a = Collector::start_db(url.as_ref(), 0);
    let b = Collector::start_db(url.as_ref(), 0);
    let now = now_ms();
    // 400 requests for each collector, and 200 more sent to both (a node
    // that re-sends to another collector after a timeout); all in one
    // minute, so both writers merge into the same rollup rows at once.
    let batch =
        |prefix: &str, range: std::ops::Range<u64>, client: &str| -> Vec<Vec<RequestRecord>> {
            let recs: Vec<RequestRecord> = range
                .map(|i| record(&format!("{prefix}-{i}"), client, 100 + i % 50, now))
                .collect();
            recs.chunks(50).map(|c| c.to_vec()).collect()
        };
    let (acks_a, acks_b) = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(async {
            let mut to_a = batch("a", 0..400, "alpha");
            let mut to_b = batch("b", 0..400, "beta");
            to_a.extend(batch("both", 0..200, "gamma"));
            to_b.extend(batch("both", 0..200, "gamma"));
            let (pa, pb) = (a.grpc_port, b.grpc_port);
            let ta = tokio::spawn(send(pa, to_a));
            let tb = tokio::spawn(send(pb, to_b));
            (ta.await.unwrap(), tb.await.unwrap())
        });
    let stored: u32 = acks_a.iter().chain(&acks_b).map(|k| k.stored).sum();
    let dups: u32 = acks_a.iter().chain(&acks_b).map(|k| k.duplicates).sum();
    assert_eq!(
        (stored, dups),
        (1000, 200),
        "each request stored once, whichever collector got it"
    );

    // Both collectors answer the same, from the shared rollups, exactly.
    for c in [&a, &b] {
        let s = get(&c.url("/v1/metrics/summary?since=1h"), &[]).json();
        assert_eq!(s["total"], 1000, "{s}");
        assert_eq!(s["prompt_tokens"], 10_000);
        assert_eq!(s["latency_quantiles"], "exact");
        let clients: Vec<(String, i64)> = s["by_client"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| {
                (
                    g["key"].as_str().unwrap().to_string(),
                    g["requests"].as_i64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            clients,
            [
                ("alpha".to_string(), 400),
                ("beta".to_string(), 400),
                ("gamma".to_string(), 200)
            ]
        );
        let ts = get(&c.url("/v1/metrics/timeseries?since=1h"), &[]).json();
        let points: i64 = ts["points"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["requests"].as_i64().unwrap())
            .sum();
        assert_eq!(points, 1000);
        assert_eq!(s["fallbacks"], 200);
        assert_eq!(
            s["failed_attempts"],
            serde_json::json!([{"provider": "primary", "cause": "timeout", "count": 200}])
        );
        assert_eq!(c.recent(5).len(), 5);
    }

    // Another request reusing an id is kept, under its fingerprint; a
    // collector killed and started again goes on; a re-send is still one.
    let b_port = b.grpc_port;
    b.kill();
    let b = Collector::start_db(url.as_ref(), b_port);
    let mut reused = record("a-1", "alpha", 999, now);
    reused.status = 500;
    let acks = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(send(
            b.grpc_port,
            vec![
                vec![reused.clone(), record("a-2", "alpha", 102, now)],
                vec![reused],
            ],
        ));
    let got: Vec<(u32, u32)> = acks.iter().map(|k| (k.stored, k.duplicates)).collect();
    assert_eq!(got, [(1, 1), (0, 1)]);
    let s = get(&a.url("/v1/metrics/summary?since=1h"), &[]).json();
    assert_eq!(s["total"], 1001);
    let recent = a.recent(1000);
    assert!(recent
        .iter()
        .any(|r| r["request_id"].as_str().unwrap().starts_with("a-1~") && r["status"] == 500));

    // Retention by size on PostgreSQL: a collector that keeps at most 600
    // records prunes the oldest (in small steps) down to that.
    let _pruner = Collector::start_args(url.as_ref(), 0, &["--retention-records", "600"]);
    poll_until(
        std::time::Duration::from_secs(20),
        "pruned to 600 records",
        || (a.recent(1000).len() == 600).then_some(()),
    );
}
