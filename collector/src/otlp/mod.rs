//! OTLP export: every stored record becomes spans (when its trace is
//! sampled) and measurements (always), sent to an OpenTelemetry endpoint
//! from a thread of their own. The writer hands committed records over
//! without waiting: the queue is bounded (in spans), what does not fit is
//! dropped and counted, so an unreachable endpoint never slows ingest into
//! the database. Spans go in batches (up to `batch` spans, at least every
//! `flush`), each retried with backoff on OTLP's retryable errors, then
//! dropped and counted; metrics go every `metrics_every`, cumulative.

pub mod metrics;
pub mod send;
pub mod spans;

use crate::otlp_proto::{
    ExportMetricsServiceRequest, ExportTraceServiceRequest, InstrumentationScope, Resource,
    ResourceMetrics, ResourceSpans, ScopeMetrics, ScopeSpans,
};
use crate::proto::RequestRecord;
use portcullis_service::flag_value;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::mpsc::{channel, error::TrySendError, Receiver, Sender};

/// The exporter's settings, from the collector's `--otlp-*` flags.
#[derive(Debug, Clone)]
pub struct Config {
    /// `http(s)://host:port` (gRPC), or the base of `/v1/traces` (HTTP).
    pub endpoint: String,
    /// HTTP/protobuf instead of gRPC.
    pub http: bool,
    /// Sent with every export (`--otlp-header name=value`, repeatable).
    pub headers: Vec<(String, String)>,
    /// The CA that signs the endpoint's certificate (PEM), and this
    /// collector's certificate and key for mutual TLS.
    pub ca: Option<Vec<u8>>,
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
    /// Spans waiting at most; past this new ones are dropped (and counted).
    pub queue_spans: u64,
    /// Spans per export at most.
    pub batch: usize,
    /// The longest a span waits for its batch to fill.
    pub flush: Duration,
    pub metrics_every: Duration,
    /// Tries per batch (the first and its retries).
    pub tries: u32,
    pub timeout: Duration,
    /// Prompts and completions as the conventions' events, when records
    /// carry them (`log.include_content` in the plugin config).
    pub content: bool,
    pub service_name: String,
}

fn ms_flag(args: &[String], flag: &str, default: u64) -> Result<Duration, String> {
    Ok(Duration::from_millis(num_flag(args, flag, default)?))
}

fn num_flag(args: &[String], flag: &str, default: u64) -> Result<u64, String> {
    flag_value(args, flag)
        .map(|v| v.parse::<u64>().map_err(|e| format!("{flag} `{v}`: {e}")))
        .transpose()
        .map(|v| v.unwrap_or(default))
}

fn read(flag: &str, path: Option<String>) -> Result<Option<Vec<u8>>, String> {
    path.map(|p| std::fs::read(&p).map_err(|e| format!("{flag} {p}: {e}")))
        .transpose()
}

impl Config {
    /// The export's settings, or `None` without an endpoint; every
    /// problem with the flags in one message. The endpoint and protocol
    /// may also come from the environment (`PORTCULLIS_OTLP_ENDPOINT`,
    /// `PORTCULLIS_OTLP_PROTOCOL`; a flag wins), as the compose fleet
    /// passes them.
    pub fn from_args(args: &[String]) -> Result<Option<Config>, String> {
        Self::from_args_env(args, |k| std::env::var(k).ok())
    }

    pub fn from_args_env(
        args: &[String],
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<Config>, String> {
        let from_env = |flag: &str, var: &str| {
            flag_value(args, flag).or_else(|| env(var).filter(|v| !v.trim().is_empty()))
        };
        let Some(endpoint) = from_env("--otlp-endpoint", "PORTCULLIS_OTLP_ENDPOINT") else {
            return Ok(None);
        };
        let protocol = from_env("--otlp-protocol", "PORTCULLIS_OTLP_PROTOCOL");
        let mut problems = Vec::new();
        let mut note = |r: Result<(), String>| {
            if let Err(e) = r {
                problems.push(e);
            }
        };
        let http = match protocol.as_deref() {
            None | Some("grpc") => false,
            Some("http/protobuf" | "http") => true,
            Some(other) => {
                note(Err(format!(
                    "--otlp-protocol `{other}`: grpc or http/protobuf"
                )));
                false
            }
        };
        let mut headers = Vec::new();
        for (i, a) in args.iter().enumerate() {
            if a != "--otlp-header" {
                continue;
            }
            match args.get(i + 1).and_then(|h| h.split_once('=')) {
                Some((k, v)) if !k.trim().is_empty() => {
                    headers.push((k.trim().to_ascii_lowercase(), v.trim().to_string()))
                }
                _ => note(Err("--otlp-header takes name=value".into())),
            }
        }
        let ca = read("--otlp-ca", flag_value(args, "--otlp-ca")).unwrap_or_else(|e| {
            problems.push(e);
            None
        });
        let cert = read("--otlp-cert", flag_value(args, "--otlp-cert"));
        let key = read("--otlp-key", flag_value(args, "--otlp-key"));
        let identity = match (cert, key) {
            (Ok(Some(c)), Ok(Some(k))) => Some((c, k)),
            (Ok(None), Ok(None)) => None,
            (Err(e), _) | (_, Err(e)) => {
                problems.push(e);
                None
            }
            _ => {
                problems.push("--otlp-cert and --otlp-key go together".into());
                None
            }
        };
        let mut num = |flag, default| {
            num_flag(args, flag, default).unwrap_or_else(|e| {
                problems.push(e);
                default
            })
        };
        let queue_spans = num("--otlp-queue", 100_000);
        let batch = num("--otlp-batch", 512).max(1) as usize;
        let tries = num("--otlp-tries", 5).clamp(1, 100) as u32;
        let mut dur = |flag, default| {
            ms_flag(args, flag, default).unwrap_or_else(|e| {
                problems.push(e);
                Duration::from_millis(default)
            })
        };
        let flush = dur("--otlp-flush-ms", 1000);
        let metrics_every = dur("--otlp-metrics-ms", 10_000);
        let timeout = dur("--otlp-timeout-ms", 10_000);
        if !problems.is_empty() {
            return Err(problems.join("; "));
        }
        Ok(Some(Config {
            endpoint,
            http,
            headers,
            ca,
            identity,
            queue_spans,
            batch,
            flush,
            metrics_every,
            tries,
            timeout,
            content: args.iter().any(|a| a == "--otlp-content"),
            service_name: flag_value(args, "--otlp-service-name")
                .unwrap_or_else(|| "portcullis".into()),
        }))
    }
}

/// What the export did, for `/metrics`.
#[derive(Default)]
pub struct Stats {
    pub exported_spans: AtomicU64,
    /// Spans dropped: the queue was full, or their batch failed every try.
    pub dropped_spans: AtomicU64,
    pub queued_spans: AtomicU64,
    /// Export calls that failed (each try counts).
    pub failed_exports: AtomicU64,
    pub metric_exports: AtomicU64,
    pub failed_metric_exports: AtomicU64,
}

impl Stats {
    /// `n` spans left the queue (exported or dropped); never below zero.
    fn unqueue(&self, n: u64) {
        let _ = self
            .queued_spans
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(n))
            });
    }
}

/// Where the writer hands committed records.
#[derive(Clone)]
pub struct Sink {
    tx: Sender<Vec<RequestRecord>>,
    pub stats: Arc<Stats>,
    cap: u64,
}

impl Sink {
    /// Hand over records just stored; never waits. What does not fit in
    /// the queue is dropped and counted.
    pub fn offer(&self, records: Vec<RequestRecord>) {
        let spans: u64 = records.iter().map(spans::span_count).sum::<usize>() as u64;
        let queued = self.stats.queued_spans.load(Ordering::Relaxed);
        if queued.saturating_add(spans) > self.cap {
            self.stats.dropped_spans.fetch_add(spans, Ordering::Relaxed);
            return;
        }
        self.stats.queued_spans.fetch_add(spans, Ordering::Relaxed);
        match self.tx.try_send(records) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Closed(_)) => {
                self.stats.queued_spans.fetch_sub(spans, Ordering::Relaxed);
                self.stats.dropped_spans.fetch_add(spans, Ordering::Relaxed);
            }
        }
    }
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Start the exporter's thread.
pub fn start(config: Config) -> Result<Sink, String> {
    // Batches of records; the span count bounds the queue, this only
    // bounds how many hand-overs wait.
    let (tx, rx) = channel(4096);
    let stats = Arc::new(Stats::default());
    let s = stats.clone();
    let cap = config.queue_spans;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("OTLP exporter runtime: {e}"))?;
    let transport = send::Transport::new(&config)?;
    std::thread::Builder::new()
        .name("otlp-export".into())
        .spawn(move || runtime.block_on(run(config, transport, rx, s)))
        .map_err(|e| format!("OTLP exporter thread: {e}"))?;
    Ok(Sink { tx, stats, cap })
}

fn resource(c: &Config) -> Resource {
    Resource {
        attributes: vec![
            spans::text("service.name", &c.service_name),
            spans::text("service.version", env!("CARGO_PKG_VERSION")),
        ],
    }
}

fn scope() -> InstrumentationScope {
    InstrumentationScope {
        name: "portcullis-collector".into(),
        version: env!("CARGO_PKG_VERSION").into(),
    }
}

async fn run(
    c: Config,
    mut transport: send::Transport,
    mut rx: Receiver<Vec<RequestRecord>>,
    stats: Arc<Stats>,
) {
    let start_ns = now_ns();
    let mut agg = metrics::Aggregator::default();
    let mut next_metrics = Instant::now() + c.metrics_every;
    let mut pending = Vec::new();
    let mut oldest: Option<Instant> = None;
    let mut measured = false;
    loop {
        // Gather until the batch is full, its oldest span is due, or the
        // metrics are.
        let due = oldest.map_or(next_metrics, |o| (o + c.flush).min(next_metrics));
        let wait = due.saturating_duration_since(Instant::now());
        match tokio::time::timeout(wait, rx.recv()).await {
            Ok(Some(records)) => {
                for r in &records {
                    agg.record(r);
                    spans::spans_of(r, c.content, &mut pending);
                }
                measured = true;
                if oldest.is_none() && !pending.is_empty() {
                    oldest = Some(Instant::now());
                }
            }
            Err(_) => {}
            Ok(None) => {
                // The writer is gone (the collector stops): what is held
                // goes now, then the metrics a last time.
                while !pending.is_empty() {
                    let take = pending.len().min(c.batch);
                    let batch: Vec<_> = pending.drain(..take).collect();
                    export_spans(&c, &mut transport, batch, &stats).await;
                }
                if measured {
                    export_metrics(&c, &mut transport, &agg, start_ns, &stats).await;
                }
                return;
            }
        }
        let flush_due = oldest.is_some_and(|o| o.elapsed() >= c.flush);
        while pending.len() >= c.batch || (flush_due && !pending.is_empty()) {
            let take = pending.len().min(c.batch);
            let batch: Vec<_> = pending.drain(..take).collect();
            export_spans(&c, &mut transport, batch, &stats).await;
        }
        if pending.is_empty() {
            oldest = None;
        }
        if Instant::now() >= next_metrics {
            next_metrics = Instant::now() + c.metrics_every;
            if measured {
                export_metrics(&c, &mut transport, &agg, start_ns, &stats).await;
            }
        }
    }
}

/// One batch of spans, tried up to `tries` times with doubling waits
/// (100 ms, 200 ms, ... at most 5 s); then dropped and counted.
async fn export_spans(
    c: &Config,
    transport: &mut send::Transport,
    batch: Vec<crate::otlp_proto::Span>,
    stats: &Stats,
) {
    let n = batch.len() as u64;
    let req = ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(resource(c)),
            scope_spans: vec![ScopeSpans {
                scope: Some(scope()),
                spans: batch,
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    let req = send::Encoded::of(&req);
    let mut wait = Duration::from_millis(100);
    for attempt in 1..=c.tries {
        match transport.send(c, &req, false).await {
            Ok(()) => {
                stats.exported_spans.fetch_add(n, Ordering::Relaxed);
                stats.unqueue(n);
                return;
            }
            Err(e) => {
                stats.failed_exports.fetch_add(1, Ordering::Relaxed);
                if !e.retryable || attempt == c.tries {
                    eprintln!(
                        "portcullis-collector: OTLP export of {n} spans dropped: {}",
                        e.message
                    );
                    break;
                }
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    }
    stats.dropped_spans.fetch_add(n, Ordering::Relaxed);
    stats.unqueue(n);
}

/// Every series, once (cumulative: a failed export's counts go with the
/// next one).
async fn export_metrics(
    c: &Config,
    transport: &mut send::Transport,
    agg: &metrics::Aggregator,
    start_ns: u64,
    stats: &Stats,
) {
    let req = ExportMetricsServiceRequest {
        resource_metrics: vec![ResourceMetrics {
            resource: Some(resource(c)),
            scope_metrics: vec![ScopeMetrics {
                scope: Some(scope()),
                metrics: agg.metrics(start_ns, now_ns()),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        }],
    };
    match transport.send(c, &send::Encoded::of(&req), true).await {
        Ok(()) => stats.metric_exports.fetch_add(1, Ordering::Relaxed),
        Err(_) => stats.failed_metric_exports.fetch_add(1, Ordering::Relaxed),
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &[&str]) -> Vec<String> {
        a.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_and_the_environment_make_the_config_and_every_problem_is_named() {
        let none = |_: &str| None;
        assert!(Config::from_args_env(&args(&["x"]), none)
            .unwrap()
            .is_none());
        let env = |k: &str| match k {
            "PORTCULLIS_OTLP_ENDPOINT" => Some("http://otel:4318".to_string()),
            "PORTCULLIS_OTLP_PROTOCOL" => Some("http/protobuf".to_string()),
            _ => None,
        };
        let c = Config::from_args_env(&args(&["x", "--otlp-header", "a=b"]), env)
            .unwrap()
            .unwrap();
        assert_eq!((c.endpoint.as_str(), c.http), ("http://otel:4318", true));
        assert_eq!(c.headers, vec![("a".to_string(), "b".to_string())]);
        // An empty variable is no endpoint (compose passes `${VAR:-}`).
        let empty = |_: &str| Some(String::new());
        assert!(Config::from_args_env(&args(&["x"]), empty)
            .unwrap()
            .is_none());
        let err = Config::from_args_env(
            &args(&[
                "x",
                "--otlp-endpoint",
                "http://o:4317",
                "--otlp-protocol",
                "thrift",
                "--otlp-batch",
                "many",
                "--otlp-header",
                "novalue",
                "--otlp-cert",
                "/nonexistent",
            ]),
            none,
        )
        .unwrap_err();
        for part in [
            "--otlp-protocol",
            "--otlp-batch",
            "--otlp-header",
            "--otlp-cert",
        ] {
            assert!(err.contains(part), "{err}");
        }
    }

    /// The writer stopping (its sink dropped) sends what the exporter
    /// held, a partial batch included, before the exporter ends.
    #[test]
    fn a_partial_batch_goes_when_the_writer_stops() {
        let rt = tokio::runtime::Runtime::new().unwrap();
        let (addr, got) = rt.block_on(async {
            let got = Arc::new(AtomicU64::new(0));
            let g = got.clone();
            let app = axum::Router::new().route(
                "/v1/{signal}",
                axum::routing::post(move |body: axum::body::Bytes| {
                    g.fetch_add(body.len() as u64, Ordering::Relaxed);
                    async { "" }
                }),
            );
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(async move { axum::serve(listener, app).await });
            (addr, got)
        });
        let endpoint = format!("http://{addr}");
        let c = Config::from_args_env(
            &args(&[
                "x",
                "--otlp-endpoint",
                &endpoint,
                "--otlp-protocol",
                "http/protobuf",
            ]),
            |_| None,
        )
        .unwrap()
        .unwrap();
        let sink = start(c).unwrap();
        let stats = sink.stats.clone();
        let record = |n: u8| RequestRecord {
            request_id: format!("r{n}"),
            trace_id: vec![n; 16],
            span_id: vec![n; 8],
            trace_flags: 1,
            ..RequestRecord::default()
        };
        // Three spans: far from a batch of 512, and the flush a second away.
        sink.offer(vec![record(1), record(2), record(3)]);
        drop(sink);
        let deadline = Instant::now() + Duration::from_secs(10);
        while stats.exported_spans.load(Ordering::Relaxed) < 3 {
            assert!(Instant::now() < deadline, "the held spans never went");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(stats.queued_spans.load(Ordering::Relaxed), 0);
        assert!(got.load(Ordering::Relaxed) > 0);
    }
}
