//! OpenTelemetry: W3C trace context through real Envoy to the mock
//! providers, and the real collector's OTLP export (gRPC and HTTP/protobuf)
//! into a test receiver that decodes it with the published OTLP protos
//! (the opentelemetry-proto crate), not the collector's own copy.
mod common;
use common::*;
use opentelemetry_proto::tonic::collector::metrics::v1::{
    metrics_service_server::{MetricsService, MetricsServiceServer},
    ExportMetricsServiceRequest, ExportMetricsServiceResponse,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    trace_service_server::{TraceService, TraceServiceServer},
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as Av;
use opentelemetry_proto::tonic::metrics::v1::{metric, Metric};
use opentelemetry_proto::tonic::trace::v1::Span;
use portcullis_collector::proto::{
    collector_client::CollectorClient, Attempt, RecordBatch, RequestRecord,
};
use portcullis_tests::*;
use prost::Message;
use serde_json::json;
use std::sync::{Arc, Mutex};
use std::time::Duration;

#[derive(Default)]
struct Received {
    spans: Vec<Span>,
    envoy_spans: Vec<Span>,
    metrics: Vec<Metric>,
    /// `authorization` of each export call, as sent.
    auth: Vec<String>,
}

type Shared = Arc<Mutex<Received>>;

struct Sink(Shared);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let auth = req
            .metadata()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string();
        let mut r = self.0.lock().unwrap();
        r.auth.push(auth);
        take_spans(&mut r, req.into_inner());
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        req: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        take_metrics(&mut self.0.lock().unwrap(), req.into_inner());
        Ok(tonic::Response::new(ExportMetricsServiceResponse::default()))
    }
}

fn take_spans(r: &mut Received, req: ExportTraceServiceRequest) {
    for rs in req.resource_spans {
        let service = rs.resource.as_ref().and_then(|res| {
            res.attributes
                .iter()
                .find(|a| a.key == "service.name")
                .and_then(|a| a.value.clone()?.value)
        });
        let ours = service == Some(Av::StringValue("portcullis".into()));
        for ss in rs.scope_spans {
            if ours {
                r.spans.extend(ss.spans);
            } else {
                // Envoy's own tracer's spans, when it exports here too.
                r.envoy_spans.extend(ss.spans);
            }
        }
    }
}

fn take_metrics(r: &mut Received, req: ExportMetricsServiceRequest) {
    for rm in req.resource_metrics {
        for sm in rm.scope_metrics {
            r.metrics.extend(sm.metrics);
        }
    }
}

/// A test OTLP receiver, gRPC or HTTP/protobuf, on a port it can be
/// stopped and started again on.
struct Receiver {
    port: u16,
    http: bool,
    /// gRPC over TLS with this directory's `server.pem`, requiring client
    /// certificates signed by its `ca.pem`.
    tls: Option<std::path::PathBuf>,
    got: Shared,
    rt: tokio::runtime::Runtime,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Receiver {
    fn start(http: bool) -> Receiver {
        Self::start_with(http, None)
    }

    fn start_with(http: bool, tls: Option<std::path::PathBuf>) -> Receiver {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mut r = Receiver {
            port: 0,
            http,
            tls,
            got: Shared::default(),
            rt,
            stop: None,
        };
        r.up();
        r
    }

    fn up(&mut self) {
        let addr = format!("127.0.0.1:{}", self.port);
        let listener = self
            .rt
            .block_on(tokio::net::TcpListener::bind(&addr))
            .unwrap();
        self.port = listener.local_addr().unwrap().port();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        self.stop = Some(tx);
        let got = self.got.clone();
        if self.http {
            self.rt.spawn(serve_http(listener, got, rx));
        } else {
            let mut builder = tonic::transport::Server::builder();
            if let Some(dir) = &self.tls {
                let read = |f: &str| std::fs::read(dir.join(f)).unwrap();
                builder = builder
                    .tls_config(
                        tonic::transport::ServerTlsConfig::new()
                            .identity(tonic::transport::Identity::from_pem(
                                read("server.pem"),
                                read("server-key.pem"),
                            ))
                            .client_ca_root(tonic::transport::Certificate::from_pem(read(
                                "ca.pem",
                            ))),
                    )
                    .unwrap();
            }
            self.rt.spawn(async move {
                builder
                    .add_service(TraceServiceServer::new(Sink(got.clone())))
                    .add_service(MetricsServiceServer::new(Sink(got)))
                    .serve_with_incoming_shutdown(
                        tonic::transport::server::TcpIncoming::from(listener),
                        async {
                            let _ = rx.await;
                        },
                    )
                    .await
                    .unwrap();
            });
        }
    }

    fn down(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        // Down when a connection is refused.
        poll_until(Duration::from_secs(10), "the receiver down", || {
            std::net::TcpStream::connect(("127.0.0.1", self.port))
                .is_err()
                .then_some(())
        });
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    fn spans(&self) -> Vec<Span> {
        self.got.lock().unwrap().spans.clone()
    }

    /// The spans of a trace, once `n` of them arrived.
    fn trace(&self, trace_id: &[u8], n: usize) -> Vec<Span> {
        poll_until(
            Duration::from_secs(20),
            &format!("{n} spans of trace {}", hex(trace_id)),
            || {
                let s: Vec<Span> = self
                    .spans()
                    .into_iter()
                    .filter(|s| s.trace_id == trace_id)
                    .collect();
                (s.len() >= n).then_some(s)
            },
        )
    }

    /// The last export of a metric that has a point matching `pred`.
    fn metric(&self, name: &str, pred: impl Fn(&Metric) -> bool) -> Metric {
        poll_until(Duration::from_secs(20), name, || {
            self.got
                .lock()
                .unwrap()
                .metrics
                .iter()
                .rev()
                .find(|m| m.name == name && pred(m))
                .cloned()
        })
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
    }
}

/// OTLP/HTTP: `POST /v1/traces` and `/v1/metrics`, protobuf bodies.
async fn serve_http(
    listener: tokio::net::TcpListener,
    got: Shared,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    use http_body_util::{BodyExt, Full};
    use hyper::body::Bytes;
    // Down means down: kept connections are closed too.
    let (closing, closed) = tokio::sync::watch::channel(false);
    loop {
        let (tcp, _) = tokio::select! {
            a = listener.accept() => match a { Ok(a) => a, Err(_) => return },
            _ = &mut stop => {
                let _ = closing.send(true);
                return;
            }
        };
        let got = got.clone();
        let mut closed = closed.clone();
        tokio::spawn(async move {
            let svc =
                hyper::service::service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let got = got.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let ct = req
                            .headers()
                            .get("content-type")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let auth = req
                            .headers()
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("")
                            .to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        assert_eq!(ct, "application/x-protobuf");
                        let mut r = got.lock().unwrap();
                        match path.as_str() {
                            "/v1/traces" => {
                                r.auth.push(auth);
                                take_spans(&mut r, ExportTraceServiceRequest::decode(body).unwrap())
                            }
                            "/v1/metrics" => take_metrics(
                                &mut r,
                                ExportMetricsServiceRequest::decode(body).unwrap(),
                            ),
                            other => panic!("OTLP/HTTP path {other}"),
                        }
                        Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::new())))
                    }
                });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tcp), svc);
            tokio::select! {
                _ = conn => {}
                _ = closed.changed() => {}
            }
        });
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

fn attr(s: &Span, key: &str) -> Option<Av> {
    s.attributes
        .iter()
        .find(|a| a.key == key)
        .and_then(|a| a.value.clone()?.value)
}

fn text(s: &Span, key: &str) -> Option<String> {
    match attr(s, key) {
        Some(Av::StringValue(v)) => Some(v),
        _ => None,
    }
}

fn int(s: &Span, key: &str) -> Option<i64> {
    match attr(s, key) {
        Some(Av::IntValue(v)) => Some(v),
        _ => None,
    }
}

/// The `traceparent` each request to a mock carried: (trace id, span id).
fn seen_parents(m: &Mock) -> Vec<(String, String)> {
    m.requests()
        .iter()
        .filter_map(|r| {
            let tp = r["headers"]["traceparent"].as_str()?;
            let parts: Vec<&str> = tp.split('-').collect();
            assert_eq!(parts.len(), 4, "{tp}");
            assert_eq!((parts[0], parts[3]), ("00", "01"), "{tp}");
            Some((parts[1].to_string(), parts[2].to_string()))
        })
        .collect()
}

fn otlp_plugin() -> String {
    let base = test_plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100");
    let base = base.replace("cache:\n  enabled: false", "cache:\n  enabled: true");
    format!("{base}\ntracing:\n  sample_rate: 1.0\n")
}

fn ask(s: &Stack, id: &str, traceparent: Option<&str>, body: &str) -> Resp {
    let auth = format!("Bearer {DEMO_KEY}");
    let mut h = vec![("authorization", auth.as_str()), ("x-request-id", id)];
    if let Some(tp) = traceparent {
        h.push(("traceparent", tp));
        h.push(("tracestate", "vendor=abc"));
    }
    post(&s.envoy.url("/v1/chat/completions"), &h, body)
}

const TRACE_A: &str = "0af7651916cd43dd8448eb211c80319c";
const TRACE_B: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const TRACE_C: &str = "1234567890abcdef1234567890abcdef";
const CLIENT_SPAN: &str = "b7ad6b7169203331";

/// A plain, a streamed (its first chunk 300 ms late), a fallback and a
/// cached request, each with the client's `traceparent`, and one without:
/// the spans the receiver gets, the ids the providers saw, and the
/// conventions' metrics.
#[test]
fn every_request_is_a_trace_in_the_genai_conventions_joined_to_the_clients() {
    let rx = Receiver::start(false);
    let dir = TempDir::new("otlp");
    let endpoint = rx.endpoint();
    let c = Collector::start_args(
        dir.0.join("log.db").as_os_str(),
        0,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-flush-ms",
            "100",
            "--otlp-metrics-ms",
            "200",
            "--otlp-header",
            "authorization=Bearer otlp-secret",
        ],
    );
    let s = Stack::start_full(&otlp_plugin(), 1, false, c.grpc_port);
    s.primary
        .default_step(json!({"usage": {"prompt_tokens": 11, "completion_tokens": 7}}));
    s.backup
        .default_step(json!({"usage": {"prompt_tokens": 5, "completion_tokens": 3}}));

    // Plain.
    let tp_a = format!("00-{TRACE_A}-{CLIENT_SPAN}-01");
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "plain"}],
        "max_tokens": 64, "temperature": 0.5})
    .to_string();
    assert_eq!(ask(&s, "plain", Some(&tp_a), &body).status, 200);
    let plain = rx.trace(&unhex(TRACE_A), 2);
    let gw = plain
        .iter()
        .find(|s| s.parent_span_id == unhex(CLIENT_SPAN))
        .expect("the gateway's span");
    let attempt = plain
        .iter()
        .find(|s| s.parent_span_id == gw.span_id)
        .expect("the attempt's span");
    assert_eq!(gw.name, "chat gpt-4o-mini");
    assert_eq!(gw.kind, 3, "CLIENT");
    assert_eq!(gw.trace_state, "vendor=abc");
    assert_eq!(text(gw, "gen_ai.operation.name").as_deref(), Some("chat"));
    assert_eq!(text(gw, "gen_ai.provider.name").as_deref(), Some("openai"));
    assert_eq!(
        text(gw, "gen_ai.request.model").as_deref(),
        Some("gpt-4o-mini")
    );
    assert_eq!(int(gw, "gen_ai.request.max_tokens"), Some(64));
    assert_eq!(
        attr(gw, "gen_ai.request.temperature"),
        Some(Av::DoubleValue(0.5))
    );
    assert_eq!(int(gw, "gen_ai.usage.input_tokens"), Some(11));
    assert_eq!(int(gw, "gen_ai.usage.output_tokens"), Some(7));
    assert!(
        text(gw, "gen_ai.response.id").is_some_and(|id| !id.is_empty()),
        "{gw:?}"
    );
    assert!(text(gw, "gen_ai.response.model").is_some(), "{gw:?}");
    match attr(gw, "gen_ai.response.finish_reasons") {
        Some(Av::ArrayValue(a)) => assert_eq!(a.values.len(), 1),
        other => panic!("finish reasons: {other:?}"),
    }
    assert_eq!(text(gw, "server.address").as_deref(), Some("primary.mock"));
    assert_eq!(text(gw, "portcullis.client").as_deref(), Some("demo"));
    assert_eq!(text(gw, "portcullis.cache").as_deref(), Some("miss"));
    assert_eq!(text(gw, "error.type"), None);
    assert!(gw.end_time_unix_nano >= gw.start_time_unix_nano);
    assert!(attempt.start_time_unix_nano >= gw.start_time_unix_nano);
    // The provider saw the attempt's span as its parent.
    assert_eq!(
        seen_parents(&s.primary),
        vec![(TRACE_A.to_string(), hex(&attempt.span_id))]
    );
    assert!(rx
        .got
        .lock()
        .unwrap()
        .auth
        .iter()
        .all(|a| a == "Bearer otlp-secret"));

    // Streamed, its first chunk 300 ms after its headers.
    s.primary.script(json!([{"first_chunk_delay_ms": 300, "chunk_delay_ms": 20, "usage": {"prompt_tokens": 4, "completion_tokens": 9}}]));
    let tp_b = format!("00-{TRACE_B}-{CLIENT_SPAN}-01");
    let stream = json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "stream"}]})
    .to_string();
    let r = ask(&s, "stream", Some(&tp_b), &stream);
    assert_eq!(r.status, 200);
    let streamed = rx.trace(&unhex(TRACE_B), 2);
    let gw = streamed
        .iter()
        .find(|s| s.parent_span_id == unhex(CLIENT_SPAN))
        .unwrap();
    let ttft = match attr(gw, "gen_ai.response.time_to_first_chunk") {
        Some(Av::DoubleValue(v)) => v,
        other => panic!("no time to first chunk: {other:?}"),
    };
    let total = (gw.end_time_unix_nano - gw.start_time_unix_nano) as f64 / 1e9;
    assert!(ttft >= 0.3 && total > ttft, "ttft {ttft} s of {total} s");
    let recs = c.recent(100);
    let rec = recs.iter().find(|r| r["request_id"] == "stream").unwrap();
    assert!(rec["ttft_ms"].as_i64().unwrap() >= 300, "{rec}");
    assert_eq!(rec["trace_id"], TRACE_B);

    // A fallback: one child span per attempt, each the parent its provider saw.
    s.primary.script(json!([{"status": 503}]));
    let tp_c = format!("00-{TRACE_C}-{CLIENT_SPAN}-01");
    assert_eq!(
        ask(
            &s,
            "fallback",
            Some(&tp_c),
            &chat_body("gpt-4o-mini", "fall back")
        )
        .status,
        200
    );
    let fb = rx.trace(&unhex(TRACE_C), 3);
    let gw = fb
        .iter()
        .find(|s| s.parent_span_id == unhex(CLIENT_SPAN))
        .unwrap();
    let children: Vec<&Span> = fb
        .iter()
        .filter(|s| s.parent_span_id == gw.span_id)
        .collect();
    assert_eq!(children.len(), 2, "{fb:?}");
    // What docs/opentelemetry.md shows (run with --nocapture).
    for span in std::iter::once(gw).chain(children.iter().copied()) {
        let attrs: Vec<String> = span
            .attributes
            .iter()
            .map(|a| {
                format!(
                    "{}={:?}",
                    a.key,
                    a.value.as_ref().and_then(|v| v.value.as_ref())
                )
            })
            .collect();
        eprintln!(
            "span {} parent {} name {:?} {} ms status {:?}\n  {}",
            hex(&span.span_id),
            hex(&span.parent_span_id),
            span.name,
            (span.end_time_unix_nano - span.start_time_unix_nano) / 1_000_000,
            span.status.as_ref().map(|s| s.code),
            attrs.join("\n  ")
        );
    }
    let failed = children
        .iter()
        .find(|s| text(s, "portcullis.provider").as_deref() == Some("primary"))
        .unwrap();
    let answered = children
        .iter()
        .find(|s| text(s, "portcullis.provider").as_deref() == Some("backup"))
        .unwrap();
    assert_eq!(int(failed, "http.response.status_code"), Some(503));
    assert!(
        text(failed, "error.type").is_some() && failed.status.as_ref().is_some_and(|s| s.code == 2)
    );
    assert_eq!(int(answered, "http.response.status_code"), Some(200));
    assert_ne!(failed.span_id, answered.span_id);
    assert!(failed.end_time_unix_nano <= answered.start_time_unix_nano + 1_000_000);
    assert_eq!(attr(gw, "portcullis.fallback"), Some(Av::BoolValue(true)));
    assert_eq!(text(gw, "portcullis.provider").as_deref(), Some("backup"));
    assert!(seen_parents(&s.primary).contains(&(TRACE_C.to_string(), hex(&failed.span_id))));
    assert_eq!(
        seen_parents(&s.backup),
        vec![(TRACE_C.to_string(), hex(&answered.span_id))]
    );

    // Cached: the gateway answered; its span and no attempt.
    let tp_d = format!("00-{}-{CLIENT_SPAN}-01", "d".repeat(32));
    let r = ask(&s, "cached", Some(&tp_d), &body);
    assert_eq!(r.header("x-portcullis-cache"), Some("hit"));
    let cached = rx.trace(&unhex(&"d".repeat(32)), 1);
    assert_eq!(cached.len(), 1, "{cached:?}");
    assert_eq!(text(&cached[0], "portcullis.cache").as_deref(), Some("hit"));

    // No traceparent: the gateway starts a trace (sample_rate 1), a root.
    assert_eq!(
        ask(&s, "fresh", None, &chat_body("gpt-4o-mini", "fresh")).status,
        200
    );
    let fresh = poll_until(Duration::from_secs(20), "the fresh trace", || {
        rx.spans().into_iter().find(|s| {
            s.parent_span_id.is_empty()
                && text(s, "portcullis.request_id").as_deref() == Some("fresh")
        })
    });
    let seen = seen_parents(&s.primary);
    assert!(
        seen.iter().any(|(t, _)| *t == hex(&fresh.trace_id)),
        "{seen:?}"
    );

    // The conventions' metrics, with their attributes and buckets.
    let usage = rx.metric("gen_ai.client.token.usage", |m| {
        points(m).iter().any(|(attrs, count)| {
            *count >= 1 && attrs.contains(&("gen_ai.token.type".into(), "input".into()))
        })
    });
    assert_eq!(usage.unit, "{token}");
    let duration = rx.metric("gen_ai.client.operation.duration", |m| {
        points(m).iter().map(|(_, c)| c).sum::<u64>() >= 5
    });
    assert_eq!(duration.unit, "s");
    let Some(metric::Data::Histogram(h)) = &duration.data else {
        panic!("a histogram")
    };
    assert_eq!(h.data_points[0].explicit_bounds.first(), Some(&0.01));
    assert_eq!(h.aggregation_temporality, 2, "cumulative");
    let ttft = rx.metric("gen_ai.server.time_to_first_token", |m| {
        !points(m).is_empty()
    });
    let Some(metric::Data::Histogram(h)) = &ttft.data else {
        panic!("a histogram")
    };
    assert!(h.data_points[0].sum.unwrap() >= 0.3);
    // And Prometheus has the filter's own TTFT histogram.
    let prom = s.envoy.prometheus();
    assert!(
        prom.contains("portcullis_ttft_ms_bucket"),
        "no TTFT histogram"
    );
    assert!(
        prom.contains("portcullis_output_token_us_bucket"),
        "no time per output token"
    );
}

/// Attribute pairs and count of each point of a histogram metric.
fn points(m: &Metric) -> Vec<(Vec<(String, String)>, u64)> {
    let Some(metric::Data::Histogram(h)) = &m.data else {
        return Vec::new();
    };
    h.data_points
        .iter()
        .map(|p| {
            let attrs = p
                .attributes
                .iter()
                .filter_map(|a| match a.value.clone()?.value? {
                    Av::StringValue(v) => Some((a.key.clone(), v)),
                    _ => None,
                })
                .collect();
            (attrs, p.count)
        })
        .collect()
}

fn record(id: &str, n: u8) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        time_ms: 1_800_000_000_000,
        client: "demo".into(),
        model: "m".into(),
        api: "chat_completions".into(),
        provider: "primary".into(),
        provider_format: "openai".into(),
        status: 200,
        latency_ms: 40,
        trace_id: vec![n; 16],
        span_id: vec![n; 8],
        trace_flags: 1,
        attempts: vec![Attempt {
            provider: "primary".into(),
            status: 200,
            span_id: vec![n ^ 0xFF; 8],
            start_ms: 1_800_000_000_001,
            end_ms: 1_800_000_000_040,
            ..Attempt::default()
        }],
        ..RequestRecord::default()
    }
}

fn prom_counter(body: &str, name: &str) -> u64 {
    body.lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {body}"))
}

/// OTLP/HTTP with the receiver down and back: every record is in the
/// database, the spans exported while it was down are dropped and counted,
/// and spans flow again once it is back.
#[test]
fn a_receiver_down_loses_spans_counted_never_records() {
    let mut rx = Receiver::start(true);
    let dir = TempDir::new("otlp-down");
    let endpoint = rx.endpoint();
    let c = Collector::start_args(
        dir.0.join("log.db").as_os_str(),
        0,
        &[
            "--otlp-endpoint",
            &endpoint,
            "--otlp-protocol",
            "http/protobuf",
            "--otlp-flush-ms",
            "50",
            "--otlp-tries",
            "2",
            "--otlp-header",
            "authorization=Bearer h",
        ],
    );
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |ids: &[(&str, u8)]| {
        let records = ids.iter().map(|(id, n)| record(id, *n)).collect();
        rt.block_on(async {
            let mut client = CollectorClient::connect(format!("http://127.0.0.1:{}", c.grpc_port))
                .await
                .unwrap();
            client.ingest(RecordBatch { records }).await.unwrap();
        });
    };
    let metrics = || get(&format!("http://127.0.0.1:{}/metrics", c.http_port), &[]).body;
    send(&[("up-1", 1), ("up-2", 2)]);
    rx.trace(&[2; 16], 2);
    assert!(rx.got.lock().unwrap().auth.iter().all(|a| a == "Bearer h"));

    rx.down();
    send(&[("down-1", 3), ("down-2", 4), ("down-3", 5)]);
    poll_until(Duration::from_secs(20), "6 spans dropped", || {
        (prom_counter(&metrics(), "portcullis_collector_otlp_dropped_spans_total") >= 6)
            .then_some(())
    });
    let m = metrics();
    assert!(
        prom_counter(&m, "portcullis_collector_otlp_failed_exports_total") >= 2,
        "{m}"
    );

    rx.up();
    send(&[("back-1", 6)]);
    rx.trace(&[6; 16], 2);
    let m = metrics();
    assert_eq!(
        prom_counter(&m, "portcullis_collector_otlp_exported_spans_total"),
        6,
        "{m}"
    );
    assert_eq!(
        prom_counter(&m, "portcullis_collector_otlp_dropped_spans_total"),
        6,
        "{m}"
    );
    assert_eq!(c.recent(100).len(), 6, "every record is in the database");
    assert!(rx.spans().iter().all(|s| s.trace_id != vec![3; 16]));
}

/// Envoy's own OpenTelemetry tracer beside the gateway's spans: both in the
/// client's trace, both children of the client's span; what the provider
/// sees as its parent is printed for docs/opentelemetry.md and pinned.
#[test]
fn envoys_own_tracer_and_the_gateways_spans_share_the_clients_trace() {
    let rx = Receiver::start(false);
    let dir = TempDir::new("otlp-envoy");
    let endpoint = rx.endpoint();
    let c = Collector::start_args(
        dir.0.join("log.db").as_os_str(),
        0,
        &["--otlp-endpoint", &endpoint, "--otlp-flush-ms", "100"],
    );
    let tracing = String::from(
        "stat_prefix: gateway
          tracing:
            provider:
              name: envoy.tracers.opentelemetry
              typed_config:
                \"@type\": type.googleapis.com/envoy.config.trace.v3.OpenTelemetryConfig
                grpc_service:
                  envoy_grpc: {cluster_name: otel}
                  timeout: 1s
                service_name: envoy
",
    );
    let cluster = format!(
        "clusters:
  - name: otel
    type: STATIC
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config: {{http2_protocol_options: {{}}}}
    load_assignment:
      cluster_name: otel
      endpoints: [{{lb_endpoints: [{{endpoint: {{address: {{socket_address: {{address: 127.0.0.1, port_value: {}}}}}}}}}]}}]
",
        rx.port
    );
    let s = Stack::start_patched(
        &otlp_plugin(),
        1,
        false,
        c.grpc_port,
        vec![
            ("stat_prefix: gateway\n", &tracing),
            ("clusters:\n", &cluster),
        ],
    );
    s.primary
        .default_step(json!({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}));
    // Envoy's tracer sends once it holds 5 spans (its default).
    let traces: Vec<String> = (0..5).map(|i| format!("{:032x}", 0xE0 + i)).collect();
    for (i, t) in traces.iter().enumerate() {
        let tp = format!("00-{t}-{CLIENT_SPAN}-01");
        // No x-request-id: Envoy makes one (a UUID), which its sampling
        // reads; a client's non-UUID id makes Envoy leave the request
        // untraced (it then sends the provider `-00`).
        let auth = format!("Bearer {DEMO_KEY}");
        let r = post(
            &s.envoy.url("/v1/chat/completions"),
            &[("authorization", &auth), ("traceparent", &tp)],
            &chat_body("gpt-4o-mini", &format!("q{i}")),
        );
        assert_eq!(r.status, 200);
    }
    let t0 = unhex(&traces[0]);
    let ours = rx.trace(&t0, 2);
    let gw = ours
        .iter()
        .find(|s| s.parent_span_id == unhex(CLIENT_SPAN))
        .unwrap();
    let attempt = ours
        .iter()
        .find(|s| s.parent_span_id == gw.span_id)
        .unwrap();
    let envoy = poll_until(Duration::from_secs(20), "Envoy's span of the trace", || {
        rx.got
            .lock()
            .unwrap()
            .envoy_spans
            .iter()
            .find(|s| s.trace_id == t0)
            .cloned()
    });
    assert_eq!(
        envoy.parent_span_id,
        unhex(CLIENT_SPAN),
        "Envoy's span continues the client's"
    );
    let seen = seen_parents(&s.primary);
    let (_, parent) = seen.iter().find(|(t, _)| *t == traces[0]).unwrap();
    eprintln!(
        "client {CLIENT_SPAN}; envoy span {} (parent {}); gateway span {}; attempt span {}; the provider saw parent {parent}",
        hex(&envoy.span_id),
        hex(&envoy.parent_span_id),
        hex(&gw.span_id),
        hex(&attempt.span_id)
    );
    // Envoy's router injects its own span's context after the filter: the
    // first attempt's provider is a child of Envoy's span.
    assert_eq!(*parent, hex(&envoy.span_id));
    assert_ne!(gw.span_id, envoy.span_id);
    // A fallback goes by callout, which Envoy does not trace: its provider
    // sees the gateway's attempt span.
    s.primary.script(json!([{"status": 503}]));
    s.backup
        .default_step(json!({"usage": {"prompt_tokens": 1, "completion_tokens": 1}}));
    let trace = format!("{:032x}", 0xF0);
    let auth = format!("Bearer {DEMO_KEY}");
    let r = post(
        &s.envoy.url("/v1/chat/completions"),
        &[
            ("authorization", &auth),
            ("traceparent", &format!("00-{trace}-{CLIENT_SPAN}-01")),
        ],
        &chat_body("gpt-4o-mini", "fall back"),
    );
    assert_eq!(r.status, 200);
    let fb = rx.trace(&unhex(&trace), 3);
    let answered = fb
        .iter()
        .find(|s| {
            text(s, "portcullis.provider").as_deref() == Some("backup")
                && s.parent_span_id != unhex(CLIENT_SPAN)
        })
        .unwrap();
    assert_eq!(
        seen_parents(&s.backup),
        vec![(trace.clone(), hex(&answered.span_id))]
    );
    eprintln!(
        "fallback: the backup saw parent {} (the gateway's attempt span)",
        hex(&answered.span_id)
    );
}

/// OTLP over gRPC with TLS and a client certificate, all from flags: spans
/// arrive; without the client certificate the receiver refuses the
/// collector, and its spans are dropped and counted.
#[test]
fn the_export_speaks_mutual_tls_from_its_flags() {
    let certs = side_certs();
    let rx = Receiver::start_with(false, Some(certs.0.clone()));
    let endpoint = format!("https://localhost:{}", rx.port);
    let f = |n: &str| certs.0.join(n).display().to_string();
    let dir = TempDir::new("otlp-tls");
    let flags = |with_cert: bool| {
        let mut v = vec![
            "--otlp-endpoint".to_string(),
            endpoint.clone(),
            "--otlp-ca".into(),
            f("ca.pem"),
            "--otlp-flush-ms".into(),
            "50".into(),
            "--otlp-tries".into(),
            "1".into(),
        ];
        if with_cert {
            v.extend([
                "--otlp-cert".into(),
                f("client.pem"),
                "--otlp-key".into(),
                f("client-key.pem"),
            ]);
        }
        v
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let send = |c: &Collector, id: &str, n: u8| {
        rt.block_on(async {
            let mut client = CollectorClient::connect(format!("http://127.0.0.1:{}", c.grpc_port))
                .await
                .unwrap();
            client
                .ingest(RecordBatch {
                    records: vec![record(id, n)],
                })
                .await
                .unwrap();
        });
    };
    let with: Vec<String> = flags(true);
    let c = Collector::start_args(
        dir.0.join("a.db").as_os_str(),
        0,
        &with.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    send(&c, "tls-1", 7);
    rx.trace(&[7; 16], 2);

    let without: Vec<String> = flags(false);
    let c2 = Collector::start_args(
        dir.0.join("b.db").as_os_str(),
        0,
        &without.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    send(&c2, "tls-2", 8);
    let metrics = || get(&format!("http://127.0.0.1:{}/metrics", c2.http_port), &[]).body;
    poll_until(Duration::from_secs(20), "the refused spans dropped", || {
        (prom_counter(&metrics(), "portcullis_collector_otlp_dropped_spans_total") == 2)
            .then_some(())
    });
    assert!(rx.spans().iter().all(|s| s.trace_id != vec![8; 16]));
}
