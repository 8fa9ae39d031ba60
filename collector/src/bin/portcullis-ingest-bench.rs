//! Collector ingest benchmark (`make bench-collector`): records/s into SQLite
//! through the real gRPC service and writer thread, on loopback.
//! Prints a markdown table; batch size and client concurrency are stated.

use portcullis_collector::grpc::Ingest;
use portcullis_collector::proto::collector_client::CollectorClient;
use portcullis_collector::proto::collector_server::CollectorServer;
use portcullis_collector::proto::{Attempt, RecordBatch, RequestRecord};
use portcullis_collector::store::{count, migrate, open, Writer};
use std::time::Instant;

fn record(i: u64) -> RequestRecord {
    RequestRecord {
        request_id: format!("bench-{i:012}"),
        time_ms: 1_800_000_000_000 + i,
        client: "demo".into(),
        requested_model: "auto".into(),
        model: "gpt-4o-mini".into(),
        provider: "primary".into(),
        cache: "miss".into(),
        attempts: vec![Attempt {
            provider: "primary".into(),
            status: 200,
            cause: String::new(),
        }],
        status: 200,
        latency_ms: 120 + i % 50,
        prompt_tokens: 42,
        completion_tokens: 17,
        cost_micros: 16,
        ..Default::default()
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let total: u64 = std::env::var("BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let dir = std::env::temp_dir().join(format!("portcullis-ingest-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("| batch size | clients | records | seconds | records/s |");
    println!("|---|---|---|---|---|");
    for (batch, clients) in [(500u64, 4u64), (100, 4), (1000, 2)] {
        let db = dir.join(format!("b{batch}-c{clients}.db"));
        let mut conn = open(&db)?;
        migrate(&mut conn)?;
        let writer = Writer::start(conn, 256, None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CollectorServer::new(Ingest { writer }))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        let per_client = total / clients;
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            tasks.push(tokio::spawn(async move {
                let mut client = CollectorClient::connect(format!("http://{addr}")).await?;
                let mut sent = 0;
                while sent < per_client {
                    let n = batch.min(per_client - sent);
                    let records = (0..n).map(|i| record(c * per_client + sent + i)).collect();
                    loop {
                        match client
                            .ingest(RecordBatch {
                                records: Vec::clone(&records),
                            })
                            .await
                        {
                            Ok(_) => break,
                            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                                tokio::task::yield_now().await
                            }
                            Err(s) => {
                                return Err(Box::<dyn std::error::Error + Send + Sync>::from(
                                    s.to_string(),
                                ))
                            }
                        }
                    }
                    sent += n;
                }
                Ok::<u64, Box<dyn std::error::Error + Send + Sync>>(sent)
            }));
        }
        let mut sent = 0;
        for t in tasks {
            sent += t.await?.map_err(|e| e.to_string())?;
        }
        let secs = started.elapsed().as_secs_f64();
        server.abort();
        let stored = count(&open(&db)?)?;
        if stored as u64 != sent {
            return Err(format!("stored {stored} of {sent}").into());
        }
        println!(
            "| {batch} | {clients} | {sent} | {secs:.2} | {:.0} |",
            sent as f64 / secs
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
