//! Collector benchmark (`make bench-collector`): records/s into SQLite (and
//! PostgreSQL with `BENCH_PG_URL`)
//! through the real gRPC service and writer thread (rollups included), on
//! loopback; then the summary's latency for windows from 5 minutes to 30
//! days over stores of 1 million and 10 million records spread over 30
//! days (`BENCH_SUMMARY_RECORDS`, comma-separated). Prints markdown tables.
//! One SQLite run exports every record over OTLP too (HTTP/protobuf, to a
//! sink on loopback that reads and acknowledges each export): ingest with
//! the export on, and the spans exported and dropped once it drained.

use portcullis_collector::db;
use portcullis_collector::grpc::Ingest;
use portcullis_collector::proto::collector_client::CollectorClient;
use portcullis_collector::proto::collector_server::CollectorServer;
use portcullis_collector::proto::{Attempt, RecordBatch, RequestRecord};
use portcullis_collector::store::{Retention, Writer};
use portcullis_collector::summary::summary;
use std::sync::atomic::Ordering;
use std::time::Instant;

/// An OTLP/HTTP endpoint on loopback that reads each export whole and
/// acknowledges it (`live`), or a port nobody listens on; the export to
/// it, as the collector's flags make it.
async fn otlp_sink(
    live: bool,
) -> Result<portcullis_collector::otlp::Sink, Box<dyn std::error::Error>> {
    let app = axum::Router::new().route(
        "/v1/{signal}",
        axum::routing::post(|body: axum::body::Bytes| async move {
            std::hint::black_box(body.len());
            ""
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    if live {
        tokio::spawn(async move { axum::serve(listener, app).await });
    } else {
        drop(listener);
    }
    let args: Vec<String> = [
        "--otlp-endpoint",
        &format!("http://{addr}"),
        "--otlp-protocol",
        "http/protobuf",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let config = portcullis_collector::otlp::Config::from_args(&args)?.ok_or("no endpoint")?;
    Ok(portcullis_collector::otlp::start(config)?)
}

const PROVIDERS: [&str; 2] = ["primary", "backup"];
const MODELS: [&str; 3] = ["gpt-4o-mini", "gpt-4o", "llama-3.1-8b"];
const CLIENTS: [&str; 5] = ["demo", "web", "batch", "mobile", "ops"];

/// Record `i`, at `time_ms`, with its dimensions varied (60 combinations).
fn record_at(i: u64, time_ms: u64) -> RequestRecord {
    let pick = |names: &[&str], salt: u64| -> String {
        let n = names.len().max(1) as u64;
        names
            .get(((i / salt) % n) as usize)
            .copied()
            .unwrap_or_default()
            .to_string()
    };
    RequestRecord {
        request_id: format!("bench-{i:012}"),
        time_ms,
        client: pick(&CLIENTS, 1),
        requested_model: "auto".into(),
        model: pick(&MODELS, 5),
        provider: pick(&PROVIDERS, 15),
        experiment: "ab".into(),
        arm: pick(&["control", "treatment"], 7),
        cache: "miss".into(),
        attempts: vec![Attempt {
            provider: "primary".into(),
            status: 200,
            cause: String::new(),
            span_id: (i ^ 0x5EED).to_be_bytes().to_vec(),
            start_ms: time_ms + 2,
            end_ms: time_ms + 120,
        }],
        // Every record traced, as with `tracing.sample_rate: 1` (the
        // export's worst case).
        trace_id: [i.to_be_bytes(), time_ms.to_be_bytes()].concat(),
        span_id: (i | 1 << 63).to_be_bytes().to_vec(),
        trace_flags: 1,
        api: "chat_completions".into(),
        provider_format: "openai".into(),
        server_address: "api.openai.com".into(),
        max_tokens: 256,
        temperature: Some(0.7),
        response_id: format!("chatcmpl-{i}"),
        response_model: "gpt-4o-mini-2024-07-18".into(),
        finish_reasons: vec!["stop".into()],
        status: 200,
        latency_ms: 120 + (i * 7919) % 2000,
        prompt_tokens: 42,
        completion_tokens: 17,
        cost_micros: 16,
        ..Default::default()
    }
}

/// A thousand records a second, as a busy gateway sends them.
/// `BENCH_UNTRACED=1`: records as they were before the trace fields (no
/// trace, no request parameters, no answer facts), to tell the records'
/// growth from the collector's own cost.
fn record(i: u64) -> RequestRecord {
    let r = record_at(i, 1_800_000_000_000 + i);
    if std::env::var_os("BENCH_UNTRACED").is_none() {
        return r;
    }
    RequestRecord {
        attempts: r
            .attempts
            .iter()
            .map(|a| Attempt {
                provider: a.provider.clone(),
                status: a.status,
                cause: a.cause.clone(),
                ..Attempt::default()
            })
            .collect(),
        trace_id: Vec::new(),
        span_id: Vec::new(),
        trace_flags: 0,
        api: String::new(),
        provider_format: String::new(),
        server_address: String::new(),
        max_tokens: 0,
        temperature: None,
        response_id: String::new(),
        response_model: String::new(),
        finish_reasons: Vec::new(),
        ..r
    }
}

const DAY_MS: u64 = 86_400_000;

/// Fill a store with `n` records spread evenly over the 30 days before
/// `now`, through the writer (rollups included), then time summaries.
fn summary_at_scale(
    dir: &std::path::Path,
    n: u64,
    now: u64,
) -> Result<(), Box<dyn std::error::Error>> {
    let db = dir.join(format!("summary-{n}.db")).display().to_string();
    let mut conn = db::connect(&db)?;
    db::migrate(&mut conn)?;
    let writer = Writer::start(conn, 64, Retention::default());
    let span = 30 * DAY_MS;
    let started = Instant::now();
    let mut i = 0;
    while i < n {
        let batch: Vec<_> = (i..(i + 1000).min(n))
            .map(|j| record_at(j, now - span + j * span / n))
            .collect();
        i += batch.len() as u64;
        loop {
            match writer.submit(batch.clone()) {
                Ok(rx) => {
                    if i % 100_000 == 0 || i == n {
                        rx.blocking_recv().map_err(|e| e.to_string())??;
                    }
                    break;
                }
                Err(_) => std::thread::yield_now(),
            }
        }
    }
    let fill = started.elapsed().as_secs_f64();
    let mut reader = db::connect(&db)?;
    let windows = [
        ("5m", 5 * 60_000),
        ("1h", 3_600_000),
        ("24h", DAY_MS),
        ("30d", 30 * DAY_MS),
    ];
    let mut row = format!("| {n} | {:.0} |", n as f64 / fill);
    for (_, w) in windows {
        // The fastest of 5 (the first reads from disk into the page cache).
        let best = (0..5)
            .map(|_| {
                let t = Instant::now();
                let s = summary(&mut reader, (now - w) as i64);
                (t.elapsed().as_secs_f64() * 1000.0, s.map(|s| s.total))
            })
            .fold((f64::INFINITY, Ok(0)), |a, b| if b.0 < a.0 { b } else { a });
        let total = best.1?;
        row.push_str(&format!(" {:.1} ms ({total}) |", best.0));
    }
    println!("{row}");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let total: u64 = std::env::var("BENCH_RECORDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(400_000);
    let dir = std::env::temp_dir().join(format!("portcullis-ingest-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    println!("| database | batch size | clients | records | seconds | records/s | OTLP export |");
    println!("|---|---|---|---|---|---|---|");
    // BENCH_PG_URL: also into PostgreSQL (scripts/bench-collector.sh
    // starts one); its tables are emptied first.
    let pg = std::env::var("BENCH_PG_URL").ok();
    // Export: None off, Some(true) to a live sink, Some(false) to a port
    // nobody listens on.
    let mut runs: Vec<(String, u64, u64, Option<bool>)> = [
        (500u64, 4u64, None),
        (500, 4, Some(true)),
        (500, 4, Some(false)),
        (100, 4, None),
        (1000, 2, None),
    ]
    .iter()
    .map(|&(b, c, export)| {
        (
            dir.join(format!("b{b}-c{c}-{export:?}.db"))
                .display()
                .to_string(),
            b,
            c,
            export,
        )
    })
    .collect();
    if let Some(url) = &pg {
        runs.push((url.clone(), 500, 4, None));
        runs.push((url.clone(), 1000, 2, None));
    }
    for (db, batch, clients, export) in runs {
        let kind = if db::is_postgres(&db) {
            "PostgreSQL"
        } else {
            "SQLite"
        };
        let conn = tokio::task::block_in_place(|| -> Result<db::Db, db::DbError> {
            let mut conn = db::connect(&db)?;
            db::migrate(&mut conn)?;
            if let db::Db::Postgres(c) = &mut conn {
                c.batch_execute("TRUNCATE requests, rollup_minute, rollup_hour")?;
            }
            Ok(conn)
        })?;
        let sink = match export {
            Some(live) => Some(otlp_sink(live).await?),
            None => None,
        };
        let stats = sink.as_ref().map(|s| s.stats.clone());
        let writer = Writer::start_with(conn, 256, Retention::default(), sink);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(CollectorServer::new(Ingest {
                    writer,
                    token: None,
                }))
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
        let stored = tokio::task::block_in_place(|| db::connect(&db)?.count())?;
        if stored as u64 != sent {
            return Err(format!("stored {stored} of {sent}").into());
        }
        let export = match stats {
            None => "off".to_string(),
            Some(s) => {
                let to = if export == Some(true) {
                    "to a live sink: "
                } else {
                    "to a closed port: "
                };
                // Wait for the export queue to drain (or a minute); an
                // endpoint that is down drains only by its retries: not
                // waited for.
                let t = Instant::now();
                while export == Some(true)
                    && s.queued_spans.load(Ordering::Relaxed) > 0
                    && t.elapsed().as_secs() < 60
                {
                    tokio::time::sleep(std::time::Duration::from_millis(20)).await;
                }
                let drained = if export == Some(true) {
                    format!("drained {:.1} s after ingest", t.elapsed().as_secs_f64())
                } else {
                    format!(
                        "{} still queued (retried)",
                        s.queued_spans.load(Ordering::Relaxed)
                    )
                };
                format!(
                    "{to}{} spans exported, {} dropped; {drained}",
                    s.exported_spans.load(Ordering::Relaxed),
                    s.dropped_spans.load(Ordering::Relaxed),
                )
            }
        };
        println!(
            "| {kind} | {batch} | {clients} | {sent} | {secs:.2} | {:.0} | {export} |",
            sent as f64 / secs
        );
    }
    let sizes =
        std::env::var("BENCH_SUMMARY_RECORDS").unwrap_or_else(|_| "1000000,10000000".into());
    println!();
    println!("| stored records | fill records/s | summary 5m (records) | 1h | 24h | 30d |");
    println!("|---|---|---|---|---|---|");
    let now = 1_900_000_000_000;
    for n in sizes
        .split(',')
        .filter_map(|s| s.trim().parse::<u64>().ok())
    {
        tokio::task::block_in_place(|| summary_at_scale(&dir, n, now))?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
