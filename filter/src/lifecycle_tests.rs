//! The request lifecycle with a fake host: a scripted sequence of callbacks
//! and host answers in, the host calls and the reply out. Real Envoy runs
//! the same paths in `tests/`; these pin each step's decisions natively.

use crate::bindings::fake::FakeHost;
use crate::host::Action;
use crate::host::{Host, Part};
use crate::loaded::Loaded;
use crate::request::RequestContext;
use portcullis_core::compile::compile;
use portcullis_core::limits::counters::Counters;
use portcullis_core::limits::period::Period;
use portcullis_core::limits::ratelimit::decode_u32;
use portcullis_core::shared::keys::{self, Owner};
use portcullis_core::shared::store::Store;
use serde_json::Value;
use std::collections::HashMap;
use std::rc::Rc;

const DEMO_KEY: &str = "sk-portcullis-demo";
const DEMO_HASH: &str = "1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8";

/// Two providers serving `gpt-4o-mini`; the demo client with `limits` and
/// the given extra top-level sections.
fn config(limits: &str, extra: &str) -> String {
    format!(
        "providers:
  - name: primary
    cluster: primary
    host: primary.mock
    base_path: /v1
    models:
      - name: gpt-4o-mini
  - name: backup
    cluster: backup
    host: backup.mock
    base_path: /v1
    models:
      - name: gpt-4o-mini
        id: openai/gpt-4o-mini
clients:
  - name: demo
    key_sha256: {DEMO_HASH}
    limits: {limits}
prices:
  gpt-4o-mini: {{input: 0.15, output: 0.60}}
{extra}"
    )
}

struct Gateway {
    host: FakeHost,
    loaded: Rc<Loaded>,
}

impl Gateway {
    fn new(yaml: &str) -> Self {
        let gw = compile(yaml.as_bytes()).unwrap();
        // Each provider's key in its schema's header, as `Loaded` does.
        let secrets: Vec<Option<String>> = gw
            .providers
            .iter()
            .map(|p| Some(format!("sk-{}", p.name)))
            .collect();
        let credentials = gw
            .providers
            .iter()
            .zip(&secrets)
            .map(|(p, k)| {
                k.as_ref()
                    .map(|k| portcullis_core::providers::credential(p, k))
            })
            .collect();
        let host = FakeHost::default();
        host.state.borrow_mut().now_ms = 1_700_000_000_000;
        Self {
            host,
            loaded: Rc::new(Loaded {
                gw,
                credentials,
                secrets,
                limiter_credential: Some(b"Bearer limiter-token".to_vec()),
                signing: Vec::new(),
                mcp_credentials: Vec::new(),
                guard_credentials: Vec::new(),
                guard_output_credentials: Vec::new(),
                seal: Ok(portcullis_core::credentials::seal::Seal::with_secret(
                    "the lifecycle tests' seal secret",
                )),
            }),
        }
    }

    /// A new request: its headers and body are the host's request.
    fn context(&self) -> RequestContext<FakeHost> {
        let host = FakeHost {
            state: Rc::new(std::cell::RefCell::new(crate::bindings::fake::State {
                now_ms: self.host.now_ms(),
                ..Default::default()
            })),
            store: self.host.store.clone(),
            worker: self.host.worker.clone(),
        };
        RequestContext::new(host, Some(self.loaded.clone()), 7)
    }

    /// Send a chat request's headers and body; the actions returned.
    fn chat(&self, headers: &[(&str, &str)], body: &str) -> (RequestContext<FakeHost>, Action) {
        self.send_chat(headers, body, false)
    }

    fn send_chat(
        &self,
        headers: &[(&str, &str)],
        body: &str,
        tracing: bool,
    ) -> (RequestContext<FakeHost>, Action) {
        let mut ctx = self.context();
        ctx.host.state.borrow_mut().tracing = tracing;
        let auth = format!("Bearer {DEMO_KEY}");
        let mut all = vec![
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "gateway.local"),
            ("authorization", auth.as_str()),
        ];
        all.extend_from_slice(headers);
        ctx.host.set_headers(Part::Request, &all);
        ctx.host.set_body_bytes(Part::Request, body.as_bytes());
        let a = ctx.on_request_headers(false);
        if a != Action::Pause || ctx.host.sent().is_some() {
            return (ctx, a);
        }
        let a = ctx.on_request_body(body.len(), true);
        (ctx, a)
    }

    fn concurrency(&self) -> u32 {
        self.counters(Owner::Key("demo")).in_flight
    }

    fn tokens_level(&self) -> i64 {
        self.counters(Owner::Key("demo")).tokens.level_milli / 1000
    }

    /// A level's counters as they stand.
    fn counters(&self, owner: Owner<'_>) -> Counters {
        let (v, _) = self.host.store.get(&keys::counters(owner)).unwrap();
        Counters::decode(v.as_deref())
    }
}

fn body(text: &str) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"{text}"}}],"max_tokens":100}}"#
    )
}

const ANSWER: &str = r#"{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15}}"#;

/// The provider answers `status` with `body` through Envoy's router.
fn router_answers(ctx: &mut RequestContext<FakeHost>, status: &str, body: &str) -> Action {
    ctx.host.set_headers(
        Part::Response,
        &[(":status", status), ("content-type", "application/json")],
    );
    let a = ctx.on_response_headers(false);
    if a == Action::Continue {
        ctx.host.set_body_bytes(Part::Response, body.as_bytes());
        ctx.on_response_body(body.len(), true);
    }
    a
}

fn sent_json(ctx: &RequestContext<FakeHost>) -> (u16, Value) {
    let (status, _, body) = ctx.host.sent().expect("the filter answered");
    (status, serde_json::from_slice(&body).unwrap())
}

fn sent_header(ctx: &RequestContext<FakeHost>, name: &str) -> Option<String> {
    let (_, headers, _) = ctx.host.sent()?;
    let (_, v) = headers.into_iter().find(|(k, _)| k == name)?;
    Some(String::from_utf8(v).unwrap())
}

#[test]
fn a_missing_key_is_a_401_before_the_body_and_nothing_goes_upstream() {
    let g = Gateway::new(&config("{}", ""));
    let mut ctx = g.context();
    ctx.host.set_headers(
        Part::Request,
        &[(":method", "POST"), (":path", "/v1/chat/completions")],
    );
    assert_eq!(ctx.on_request_headers(false), Action::Pause);
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (401, Some("invalid_api_key"))
    );
    assert!(ctx.host.callouts().is_empty());
    assert_eq!(
        ctx.on_request_body(10, true),
        Action::Continue,
        "no second answer"
    );
}

#[test]
fn a_routed_request_is_rewritten_for_its_provider_and_keeps_the_clients_headers() {
    let g = Gateway::new(&config("{}", ""));
    let (ctx, a) = g.chat(
        &[
            ("user-agent", "OpenAI/Python"),
            ("cookie", "s=1"),
            ("x-portcullis-cache", "hit"),
            ("x-envoy-retry-on", "5xx"),
        ],
        &body("hello"),
    );
    assert_eq!(a, Action::Continue);
    let h = |n: &str| ctx.host.header(Part::Request, n);
    assert_eq!(h("x-portcullis-cluster").as_deref(), Some("primary"));
    assert_eq!(h(":authority").as_deref(), Some("primary.mock"));
    assert_eq!(h("authorization").as_deref(), Some("Bearer sk-primary"));
    assert_eq!(
        h("x-envoy-upstream-rq-timeout-ms").as_deref(),
        Some("60000")
    );
    assert_eq!(h("user-agent").as_deref(), Some("OpenAI/Python"));
    for gone in ["cookie", "x-portcullis-cache", "x-envoy-retry-on"] {
        assert_eq!(h(gone), None, "{gone}");
    }
    assert_eq!(
        ctx.host.body_of(Part::Request),
        body("hello").as_bytes(),
        "same model id: untouched"
    );
}

/// The first attempt and the fallback send the same client headers: the
/// fallback once sent only `:method`, `:path`, `:authority`, `content-type`
/// and `authorization`.
#[test]
fn a_fallback_after_503_carries_the_same_client_headers_and_answers_with_the_backup() {
    let g = Gateway::new(&config("{}", ""));
    let client_headers = [
        ("user-agent", "OpenAI/Python 1.0"),
        ("openai-organization", "org-1"),
        ("x-request-id", "req-1"),
        ("traceparent", "00-abc-def-01"),
        ("content-type", "application/json"),
        ("cookie", "secret=1"),
    ];
    let (mut ctx, _) = g.chat(&client_headers, &body("hello"));
    assert_eq!(router_answers(&mut ctx, "503", "down"), Action::Pause);
    let calls = ctx.host.callouts();
    assert_eq!(calls.len(), 1);
    let call = &calls[0];
    assert_eq!((call.cluster.as_str(), call.timeout_ms), ("backup", 60_000));
    for (k, v) in &client_headers[..5] {
        assert_eq!(call.header(k), Some(*v), "{k}");
        assert_eq!(
            ctx.host.header(Part::Request, k).as_deref(),
            Some(*v),
            "first attempt: {k}"
        );
    }
    assert_eq!(call.header("cookie"), None);
    assert_eq!(call.header("authorization"), Some("Bearer sk-backup"));
    assert_eq!(call.header(":authority"), Some("backup.mock"));
    assert_eq!(call.header("x-portcullis-cluster"), None);
    let sent: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(sent["model"], "openai/gpt-4o-mini");
    assert_eq!(sent["messages"][0]["content"], "hello");
    // The backup answers; the client gets it with the gateway's headers.
    ctx.host.set_headers(
        Part::CallResponse,
        &[(":status", "200"), ("x-backup", "yes")],
    );
    ctx.host
        .set_body_bytes(Part::CallResponse, ANSWER.as_bytes());
    ctx.on_call_response(1, ANSWER.len());
    assert_eq!(sent_json(&ctx).0, 200);
    assert_eq!(
        sent_header(&ctx, "x-portcullis-provider").as_deref(),
        Some("backup")
    );
    assert_eq!(
        sent_header(&ctx, "x-portcullis-attempts").as_deref(),
        Some("2")
    );
    assert_eq!(sent_header(&ctx, "x-backup").as_deref(), Some("yes"));
    ctx.on_log();
    assert_eq!(ctx.host.counter("portcullis.fallbacks"), 1);
}

/// A stream has no overall bound through the router (#29): the route's
/// timeout is turned off and the provider's `timeout_ms` bounds only the
/// wait for the answer to start (a per-try timeout, which Envoy ignores once
/// the answer reaches the client). A fallback's stream arrives whole by
/// callout: bounded by `stream_timeout_ms`.
#[test]
fn a_stream_is_bounded_until_it_starts_and_its_fallback_by_the_stream_timeout() {
    let g = Gateway::new(&config("{}", ""));
    let stream_body = body("hello").replacen('{', r#"{"stream":true,"#, 1);
    let (mut ctx, a) = g.chat(&[], &stream_body);
    assert_eq!(a, Action::Continue);
    let h =
        |ctx: &crate::request::RequestContext<FakeHost>, n: &str| ctx.host.header(Part::Request, n);
    assert_eq!(
        h(&ctx, "x-envoy-upstream-rq-timeout-ms").as_deref(),
        Some("0")
    );
    assert_eq!(
        h(&ctx, "x-envoy-upstream-rq-per-try-timeout-ms").as_deref(),
        Some("60000")
    );
    assert_eq!(router_answers(&mut ctx, "503", "down"), Action::Pause);
    let calls = ctx.host.callouts();
    assert_eq!(
        calls.iter().map(|c| c.timeout_ms).collect::<Vec<_>>(),
        [300_000]
    );
    // An answer sent whole keeps one bound, and no per-try timeout.
    let (ctx, _) = g.chat(&[], &body("hello"));
    assert_eq!(
        h(&ctx, "x-envoy-upstream-rq-timeout-ms").as_deref(),
        Some("60000")
    );
    assert_eq!(h(&ctx, "x-envoy-upstream-rq-per-try-timeout-ms"), None);
}

#[test]
fn a_second_identical_request_is_a_cache_hit_that_reaches_no_provider() {
    let g = Gateway::new(&config("{}", "cache: {enabled: true}"));
    let (mut first, a) = g.chat(&[], &body("cache me"));
    assert_eq!(a, Action::Continue);
    router_answers(&mut first, "200", ANSWER);
    first.on_log();
    let (hit, a) = g.chat(&[], &body("cache me"));
    assert_eq!(a, Action::Pause, "answered by the filter");
    let (status, v) = sent_json(&hit);
    assert_eq!(
        (status, v["choices"][0]["message"]["content"].as_str()),
        (200, Some("hi"))
    );
    assert_eq!(
        sent_header(&hit, "x-portcullis-cache").as_deref(),
        Some("hit")
    );
    assert_eq!(hit.host.header(Part::Request, "x-portcullis-cluster"), None);
    let (_, a) = g.chat(&[], &body("something else"));
    assert_eq!(a, Action::Continue, "a different question is a miss");
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// The fleet tier's `GetResponse` for `key`: found, with `answer`.
fn fleet_found(key: &[u8], answer: &str, expires_ms: u64) -> Vec<u8> {
    let mut m = vec![0x08, 1, 0x12, key.len() as u8];
    m.extend_from_slice(key);
    m.push(0x1a);
    varint(&mut m, answer.len() as u64);
    m.extend_from_slice(answer.as_bytes());
    m.push(0x20);
    varint(&mut m, expires_ms);
    m
}

const SHARED: &str = "cache: {enabled: true, shared: {cluster: fleet, timeout_ms: 30}}";

#[test]
fn a_local_miss_asks_the_fleets_tier_whose_hit_answers_and_is_kept_here() {
    let g = Gateway::new(&config("{}", SHARED));
    let (mut ctx, a) = g.chat(&[], &body("ask the fleet"));
    assert_eq!(a, Action::Pause, "waits for the fleet's tier");
    let calls = ctx.host.callouts();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, "fleet");
    assert_eq!(
        calls[0].header("grpc-service"),
        Some("portcullis.cache.v1.Cache")
    );
    assert_eq!(calls[0].header("grpc-method"), Some("Get"));
    assert_eq!(calls[0].timeout_ms, 30);
    assert_eq!(&calls[0].body[..2], &[0x0a, 32]);
    let key = calls[0].body[2..].to_vec();
    // An answer for another key is a miss; this key's answers.
    let now = ctx.host.now_ms();
    let answer = fleet_found(&key, ANSWER, now + 60_000);
    ctx.host.state.borrow_mut().grpc_answer = answer.clone();
    ctx.on_grpc_answer(1, 0, answer.len());
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["choices"][0]["message"]["content"].as_str()),
        (200, Some("hi"))
    );
    assert_eq!(
        sent_header(&ctx, "x-portcullis-cache").as_deref(),
        Some("hit-shared")
    );
    assert_eq!(ctx.host.header(Part::Request, "x-portcullis-cluster"), None);
    // Kept here: the next one asks nobody.
    let (again, a) = g.chat(&[], &body("ask the fleet"));
    assert_eq!(a, Action::Pause, "answered by the filter");
    assert!(again.host.callouts().is_empty());
    assert_eq!(
        sent_header(&again, "x-portcullis-cache").as_deref(),
        Some("hit-local")
    );
}

#[test]
fn a_miss_or_a_failure_in_the_fleets_tier_goes_to_the_provider_and_its_answer_is_queued() {
    let g = Gateway::new(&config("{}", SHARED));
    for (i, (grpc_status, answer)) in [
        (0u32, Vec::new()),
        // Found, but for another key.
        (0, fleet_found(&[9; 32], ANSWER, u64::MAX / 2)),
        // Not an answer at all.
        (0, vec![0xff, 0xff, 0xff]),
        // Late (DEADLINE_EXCEEDED) or failed (UNAVAILABLE).
        (4, Vec::new()),
        (14, Vec::new()),
    ]
    .into_iter()
    .enumerate()
    {
        let (mut ctx, a) = g.chat(&[], &body(&format!("nobody has this {i}")));
        assert_eq!(a, Action::Pause);
        ctx.host.state.borrow_mut().grpc_answer = answer.clone();
        ctx.on_grpc_answer(1, grpc_status, answer.len());
        assert_eq!(ctx.host.state.borrow().resumed, 1, "case {i}");
        assert!(ctx.host.state.borrow().sent.is_none(), "case {i}");
        assert_eq!(
            ctx.host
                .header(Part::Request, "x-portcullis-cluster")
                .as_deref(),
            Some("primary"),
            "case {i}"
        );
        assert_eq!(router_answers(&mut ctx, "200", ANSWER), Action::Continue);
        ctx.on_log();
        assert_eq!(
            g.host.worker().shared_puts.borrow().0.len(),
            i + 1,
            "the fresh answer is queued for the fleet"
        );
    }
    // An answer for a token this request did not send changes nothing.
    let (mut ctx, _) = g.chat(&[], &body("one more"));
    ctx.on_grpc_answer(7, 0, 0);
    assert_eq!(ctx.host.state.borrow().resumed, 0);
}

/// Every way a request can end gives back or settles what it took: the
/// concurrency slot always, the token reservation unless an answer used it.
#[test]
fn limits_are_released_or_settled_on_every_exit_path() {
    let g = Gateway::new(&config(
        "{tokens_per_minute: 100000, max_concurrent: 1}",
        "",
    ));
    let full = 100_000;
    // The client goes away before any answer.
    let (mut ctx, a) = g.chat(&[], &body("bye"));
    assert_eq!((a, g.concurrency()), (Action::Continue, 1));
    assert!(g.tokens_level() < full);
    ctx.on_log();
    assert_eq!((g.concurrency(), g.tokens_level()), (0, full), "disconnect");
    // The provider refuses the request (a 400 passes through).
    let (mut ctx, _) = g.chat(&[], &body("bad"));
    router_answers(&mut ctx, "400", r#"{"error":{}}"#);
    ctx.on_log();
    assert_eq!(
        (g.concurrency(), g.tokens_level()),
        (0, full),
        "provider 4xx"
    );
    // Every provider fails: the gateway's 502.
    let (mut ctx, _) = g.chat(&[], &body("down"));
    router_answers(&mut ctx, "503", "");
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "500")]);
    ctx.on_call_response(1, 0);
    assert_eq!(sent_json(&ctx).0, 502);
    ctx.on_log();
    assert_eq!((g.concurrency(), g.tokens_level()), (0, full), "all failed");
    // A fallback that cannot be sent.
    let (mut ctx, _) = g.chat(&[], &body("no route"));
    ctx.host.state.borrow_mut().refuse_callouts = true;
    router_answers(&mut ctx, "503", "");
    assert_eq!(sent_json(&ctx).0, 502);
    ctx.on_log();
    assert_eq!(
        (g.concurrency(), g.tokens_level()),
        (0, full),
        "callout refused"
    );
    // An answer with usage settles: 15 tokens used, the rest given back.
    let (mut ctx, _) = g.chat(&[], &body("ok"));
    router_answers(&mut ctx, "200", ANSWER);
    ctx.on_log();
    assert_eq!(
        (g.concurrency(), g.tokens_level()),
        (0, full - 15),
        "settled"
    );
    // Refused by the concurrency limit while one is in flight: that refusal
    // holds nothing, and the one in flight still holds its slot.
    let (mut busy, _) = g.chat(&[], &body("busy"));
    let (refused, _) = g.chat(&[], &body("second"));
    assert_eq!(sent_json(&refused).0, 429);
    assert_eq!(
        refused.log.limited_by, "local",
        "the record says which scope refused"
    );
    assert_eq!(
        busy.log.limited_by, "",
        "an admitted request was refused by no scope"
    );
    assert_eq!(g.concurrency(), 1);
    busy.on_log();
    assert_eq!(g.concurrency(), 0);
}

#[test]
fn the_record_names_every_attempt_and_the_answer() {
    let g = Gateway::new(&config("{}", "log: {collector_cluster: c}"));
    let (mut ctx, _) = g.chat(&[("x-request-id", "r-1")], &body("hi"));
    router_answers(&mut ctx, "503", "");
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "200")]);
    ctx.host
        .set_body_bytes(Part::CallResponse, ANSWER.as_bytes());
    ctx.on_call_response(1, ANSWER.len());
    ctx.on_log();
    let records = ctx.host.state.borrow().records.clone();
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(
        (r.request_id.as_str(), r.provider.as_str(), r.status),
        ("r-1", "backup", 200)
    );
    let attempts: Vec<_> = r
        .attempts
        .iter()
        .map(|a| (a.provider.as_str(), a.status, a.cause.as_str()))
        .collect();
    assert_eq!(
        attempts,
        [("primary", 503, "overloaded"), ("backup", 200, "")]
    );
    assert_eq!((r.prompt_tokens, r.completion_tokens), (10, 5));
}

/// A client's `traceparent` is continued (#31): each attempt sends the
/// provider a child of the gateway's span with its own span id (the first
/// through the router, the fallback by callout), and the record carries the
/// ids the providers saw.
#[test]
fn each_attempt_sends_its_own_span_of_the_clients_trace_and_the_record_has_them() {
    let g = Gateway::new(&config("{}", "log: {collector_cluster: c}"));
    let client = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let (mut ctx, _) = g.chat(
        &[
            ("x-request-id", "t-1"),
            ("traceparent", client),
            ("tracestate", "v=1"),
        ],
        &body("hi"),
    );
    let first = ctx.host.header(Part::Request, "traceparent").unwrap();
    router_answers(&mut ctx, "503", "");
    let call = ctx.host.callouts()[0].clone();
    let second = call.header("traceparent").unwrap().to_string();
    assert_eq!(call.header("tracestate"), Some("v=1"));
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "200")]);
    ctx.host
        .set_body_bytes(Part::CallResponse, ANSWER.as_bytes());
    ctx.on_call_response(1, ANSWER.len());
    ctx.on_log();
    let r = ctx.host.state.borrow().records[0].clone();
    let hex = |b: &[u8]| portcullis_core::wire::text::hex(b);
    assert_eq!(hex(&r.trace_id), "4bf92f3577b34da6a3ce929d0e0e4736");
    assert_eq!(hex(&r.parent_span_id), "00f067aa0ba902b7");
    assert_eq!((r.trace_flags, r.tracestate.as_str()), (1, "v=1"));
    let spans: Vec<String> = r.attempts.iter().map(|a| hex(&a.span_id)).collect();
    assert_eq!(spans.len(), 2);
    for (sent, span) in [&first, &second].into_iter().zip(&spans) {
        assert_eq!(
            sent,
            &format!("00-4bf92f3577b34da6a3ce929d0e0e4736-{span}-01")
        );
    }
    assert_ne!(spans[0], spans[1]);
    assert!(!spans.contains(&hex(&r.span_id)) && hex(&r.span_id) != "00f067aa0ba902b7");
    let a = &r.attempts;
    assert!(a[0].start_ms <= a[0].end_ms && a[0].end_ms <= a[1].start_ms);
    assert_eq!((r.api, r.provider_format), ("chat_completions", "openai"));
    assert_eq!(r.server_address, "backup.mock");
}

/// Without a `traceparent` and without a `tracing` section the gateway
/// starts no trace and sends none; with `tracing.sample_rate: 1` every
/// request starts one, a root.
#[test]
fn a_trace_is_started_only_when_the_config_samples() {
    let g = Gateway::new(&config("{}", "log: {collector_cluster: c}"));
    let (mut ctx, _) = g.chat(&[("x-request-id", "t-2")], &body("hi"));
    assert_eq!(ctx.host.header(Part::Request, "traceparent"), None);
    router_answers(&mut ctx, "200", ANSWER);
    ctx.on_log();
    assert!(ctx.host.state.borrow().records[0].trace_id.is_empty());
    let g = Gateway::new(&config(
        "{}",
        "log: {collector_cluster: c}\ntracing: {sample_rate: 1}",
    ));
    let (mut ctx, _) = g.chat(&[("x-request-id", "t-3")], &body("hi"));
    let sent = ctx.host.header(Part::Request, "traceparent").unwrap();
    router_answers(&mut ctx, "200", ANSWER);
    ctx.on_log();
    let r = ctx.host.state.borrow().records[0].clone();
    assert_eq!(r.trace_id.len(), 16);
    assert!(r.parent_span_id.is_empty());
    assert!(sent.contains(&portcullis_core::wire::text::hex(&r.trace_id)));
    assert!(sent.contains(&portcullis_core::wire::text::hex(&r.attempts[0].span_id)));
}

/// Shared data has no atomic create: a key two workers create at once on
/// first use could lose one's reservation (a burst once let 4 requests
/// through a budget that holds 3). The limit keys exist before traffic, so
/// every reservation is a CAS, and a racing worker's write is never lost.
#[test]
fn limit_keys_exist_before_traffic_so_a_racing_reservation_is_never_lost() {
    let g = Gateway::new(&config(
        "{requests_per_minute: 5, tokens_per_minute: 100000, max_concurrent: 3, budget_usd_per_day: 1}",
        "",
    ));
    let now = g.host.now_ms();
    let day = Period::Day.index(now, 0);
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    let key = keys::counters(Owner::Key("demo"));
    assert!(g.host.store.get(&key).unwrap().0.is_some(), "{key}");
    // A budget alone: its reservation is the request's first write. Another
    // worker reserves 500 micro-USD between our read and our write.
    let g = Gateway::new(&config("{budget_usd_per_day: 1}", ""));
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    g.host.store.inject_conflicts(1, move |v| {
        let mut c = Counters::decode(Some(v));
        c.spend(Period::Day, day, i64::MAX, 500).unwrap();
        c.encode()
    });
    let (_ctx, a) = g.chat(&[], &body("racing"));
    assert_eq!(a, Action::Continue);
    let spent = g.counters(Owner::Key("demo")).spent(Period::Day, day);
    assert!(spent > 500, "both reservations stand: {spent}");
}

/// A `RateLimitResponse`: overall code, one status (code, limit,
/// remaining, seconds to reset).
fn rls_answer(overall: u64, status: (u64, u64, u64, u64)) -> Vec<u8> {
    rls_answers(overall, &[status])
}

/// A `RateLimitResponse` with a status per descriptor.
fn rls_answers(overall: u64, statuses: &[(u64, u64, u64, u64)]) -> Vec<u8> {
    fn varint(out: &mut Vec<u8>, mut v: u64) {
        while v >= 0x80 {
            out.push((v as u8) | 0x80);
            v >>= 7;
        }
        out.push(v as u8);
    }
    fn field(out: &mut Vec<u8>, n: u64, v: u64) {
        varint(out, n << 3);
        varint(out, v);
    }
    fn msg(out: &mut Vec<u8>, n: u64, m: &[u8]) {
        varint(out, (n << 3) | 2);
        varint(out, m.len() as u64);
        out.extend_from_slice(m);
    }
    let mut out = Vec::new();
    field(&mut out, 1, overall);
    for &(code, limit, remaining, reset) in statuses {
        let mut lim = Vec::new();
        field(&mut lim, 1, limit);
        let mut dur = Vec::new();
        field(&mut dur, 1, reset);
        let mut s = Vec::new();
        field(&mut s, 1, code);
        msg(&mut s, 2, &lim);
        field(&mut s, 3, remaining);
        msg(&mut s, 4, &dur);
        msg(&mut out, 2, &s);
    }
    out
}

const GLOBAL: &str = "limits:\n  global: {cluster: rls, timeout_ms: 25}\n";

/// The descriptors of a `RateLimitRequest`: each one's `limit` entry and
/// its own `hits_addend` (0 when it has none).
fn rls_request(bytes: &[u8]) -> Vec<(String, u64)> {
    use portcullis_core::wire::pb::{Reader, Value as Pb};
    let mut out = Vec::new();
    let mut r = Reader::new(bytes);
    while let Ok(Some((n, v))) = r.field() {
        let (2, Pb::Bytes(d)) = (n, v) else { continue };
        let (mut limit, mut hits) = (String::new(), 0);
        let mut dr = Reader::new(d);
        while let Ok(Some((dn, dv))) = dr.field() {
            match (dn, dv) {
                (1, Pb::Bytes(e)) => {
                    let mut er = Reader::new(e);
                    let mut kv = Vec::new();
                    while let Ok(Some((_, Pb::Bytes(b)))) = er.field() {
                        kv.push(String::from_utf8_lossy(b).into_owned());
                    }
                    if kv.first().map(String::as_str) == Some("limit") {
                        limit = kv.get(1).cloned().unwrap_or_default();
                    }
                }
                (3, Pb::Bytes(w)) => {
                    if let Ok(Some((1, Pb::Varint(h)))) = Reader::new(w).field() {
                        hits = h;
                    }
                }
                _ => {}
            }
        }
        out.push((limit, hits));
    }
    out
}

/// Answer every call in flight with `answer` (or a gRPC error status).
fn service_answers(ctx: &mut RequestContext<FakeHost>, grpc_status: u32, answer: &[u8]) {
    ctx.host.state.borrow_mut().grpc_answer = answer.to_vec();
    let calls: Vec<u32> = (1..=ctx.host.callouts().len() as u32).collect();
    for token in calls {
        ctx.on_global_answer(token, grpc_status, answer.len());
    }
}

#[test]
fn a_global_request_limit_waits_for_the_service_then_routes_with_its_headers() {
    let g = Gateway::new(&config("{requests_per_minute: 10, scope: global}", GLOBAL));
    let (mut ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Pause);
    let calls = ctx.host.callouts();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, "rls");
    assert_eq!(
        calls[0].header("grpc-service"),
        Some("envoy.service.ratelimit.v3.RateLimitService")
    );
    assert_eq!(calls[0].timeout_ms, 25);
    // The service's token, from the VM environment, in the call's metadata.
    assert_eq!(
        calls[0].header("authorization"),
        Some("Bearer limiter-token")
    );
    // The local bucket is not touched: the scope is global only.
    assert!(!g.counters(Owner::Key("demo")).requests.initialized);
    service_answers(&mut ctx, 0, &rls_answer(1, (1, 10, 9, 6)));
    assert_eq!(ctx.host.state.borrow().resumed, 1);
    assert_eq!(
        ctx.host
            .header(Part::Request, "x-portcullis-cluster")
            .as_deref(),
        Some("primary")
    );
    assert_eq!(router_answers(&mut ctx, "200", ANSWER), Action::Continue);
    let rate = ctx.limits.headers().to_vec();
    assert!(
        rate.contains(&("x-ratelimit-remaining-requests", "9".into())),
        "{rate:?}"
    );
}

#[test]
fn a_global_refusal_is_the_local_429_and_the_record_says_global() {
    let g = Gateway::new(&config(
        "{requests_per_minute: 10, tokens_per_minute: 5000, scope: {requests_per_minute: global, tokens_per_minute: both}}",
        GLOBAL,
    ));
    let (mut ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Pause);
    // Both limits go to the service in one call (#34), each descriptor
    // with its own hits; the local tokens were taken first.
    let calls = ctx.host.callouts();
    assert_eq!(calls.len(), 1);
    let sent = rls_request(&calls[0].body);
    assert_eq!(
        sent.iter()
            .map(|(limit, hits)| (limit.as_str(), *hits > 1))
            .collect::<Vec<_>>(),
        [("requests_per_minute", false), ("tokens_per_minute", true)]
    );
    assert!(g.tokens_level() < 5000);
    service_answers(
        &mut ctx,
        0,
        &rls_answers(2, &[(2, 10, 0, 7), (1, 5000, 4000, 60)]),
    );
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("across the fleet"));
    assert_eq!(sent_header(&ctx, "retry-after").as_deref(), Some("7"));
    assert_eq!(
        sent_header(&ctx, "x-ratelimit-remaining-requests").as_deref(),
        Some("0")
    );
    assert_eq!(
        sent_header(&ctx, "x-ratelimit-reset-requests").as_deref(),
        Some("7s")
    );
    assert_eq!(ctx.log.limited_by, "global");
    assert_eq!(ctx.host.state.borrow().resumed, 0);
    // The local reservation was given back.
    assert_eq!(g.tokens_level(), 5000);
}

#[test]
fn failure_modes_allow_and_deny() {
    for (mode, want) in [("allow", None), ("deny", Some(503))] {
        let extra = format!("limits:\n  global: {{cluster: rls, failure_mode: {mode}}}\n");
        let g = Gateway::new(&config("{requests_per_minute: 10, scope: global}", &extra));
        // A timeout, an error status, and an answer that is not one.
        for (grpc, answer) in [
            (4, vec![]),
            (14, vec![]),
            (0, b"<html>".to_vec()),
            (0, rls_answer(9, (1, 1, 1, 1))),
        ] {
            let (mut ctx, _) = g.chat(&[], &body("hello"));
            service_answers(&mut ctx, grpc, &answer);
            let errors = format!("portcullis.global.errors.{mode}");
            assert_eq!(ctx.host.state.borrow().counters.get(&errors), Some(&1));
            match want {
                None => assert_eq!(ctx.host.state.borrow().resumed, 1, "{mode} {grpc}"),
                Some(code) => {
                    let (status, v) = sent_json(&ctx);
                    assert_eq!(status, code);
                    assert_eq!(v["error"]["code"], "rate_limit_unavailable");
                    assert_eq!(sent_header(&ctx, "retry-after").as_deref(), Some("1"));
                }
            }
        }
    }
}

/// `local_share` (#34, the default mode): a request whose call failed is
/// counted against this replica's share of the limit (4 over 2 replicas:
/// 2), all-or-nothing; the first failure switches the worker to its shares
/// and the next answer back, each switch counted once.
#[test]
fn a_failed_call_counts_the_replicas_share_and_an_answer_ends_it() {
    let extra = "limits:\n  global: {cluster: rls, replicas: 2}\n";
    let g = Gateway::new(&config("{requests_per_minute: 4, scope: global}", extra));
    // Counters are per request here: summed over the requests.
    let mut counted: HashMap<String, u64> = HashMap::new();
    let mut add = |ctx: &RequestContext<FakeHost>| {
        for (k, v) in &ctx.host.state.borrow().counters {
            *counted.entry(k.clone()).or_default() += *v as u64;
        }
    };
    for _ in 0..2 {
        let (mut ctx, _) = g.chat(&[], &body("hello"));
        service_answers(&mut ctx, 14, &[]);
        assert_eq!(ctx.host.state.borrow().resumed, 1, "within the share");
        add(&ctx);
    }
    let (mut ctx, _) = g.chat(&[], &body("hello"));
    service_answers(&mut ctx, 14, &[]);
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("counted locally"),
        "{v}"
    );
    assert_eq!(ctx.log.limited_by, "global");
    add(&ctx);
    // The service answers again: exact counting, the switch counted once.
    let (mut ctx, _) = g.chat(&[], &body("hello"));
    service_answers(&mut ctx, 0, &rls_answer(1, (1, 4, 3, 6)));
    assert_eq!(ctx.host.state.borrow().resumed, 1);
    add(&ctx);
    for (name, want) in [
        ("portcullis.global.to_shares", 1),
        ("portcullis.global.to_service", 1),
        ("portcullis.global.share_admitted", 2),
        ("portcullis.global.share_refused", 1),
        ("portcullis.global.errors.local_share", 3),
    ] {
        assert_eq!(counted.get(name), Some(&want), "{name}: {counted:?}");
    }
}

#[test]
fn a_hit_asks_only_for_the_request_rate_and_usage_above_the_reservation_is_settled() {
    let cache = "cache: {enabled: true}\nlimits:\n  global: {cluster: rls}\n";
    let g = Gateway::new(&config(
        "{requests_per_minute: 10, tokens_per_minute: 100000, budget_usd_per_day: 5, scope: global}",
        cache,
    ));
    let (mut ctx, _) = g.chat(&[], &body("hello"));
    // A miss: requests, tokens and budget, in one call (#34).
    assert_eq!(ctx.host.callouts().len(), 1);
    assert_eq!(
        rls_request(&ctx.host.callouts()[0].body)
            .iter()
            .map(|(l, _)| l.as_str())
            .collect::<Vec<_>>(),
        [
            "requests_per_minute",
            "tokens_per_minute",
            "budget_usd_per_day"
        ]
    );
    service_answers(
        &mut ctx,
        0,
        &rls_answers(
            1,
            &[(1, 10, 9, 6), (1, 100_000, 99_000, 60), (1, 500, 499, 600)],
        ),
    );
    // The answer used more tokens than the 100 + prompt estimate reserved.
    let big = ANSWER.replace(
        r#""completion_tokens":5,"total_tokens":15"#,
        r#""completion_tokens":500,"total_tokens":510"#,
    );
    router_answers(&mut ctx, "200", &big);
    ctx.on_log();
    let later = ctx.host.state.borrow().later.clone();
    assert_eq!(later.len(), 2, "tokens and budget settled");
    // The same request again: a hit, one call for the request rate.
    let (mut hit, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Pause);
    assert_eq!(hit.host.callouts().len(), 1);
    service_answers(&mut hit, 0, &rls_answer(1, (1, 10, 8, 6)));
    let (status, _, _) = hit.host.sent().unwrap();
    assert_eq!(status, 200);
    assert_eq!(
        sent_header(&hit, "x-portcullis-cache").as_deref(),
        Some("hit")
    );
}

const GUARDS: &str = "guardrails:
  input:
    - {name: no-email, pii: [email], action: redact}
    - {name: no-secret, regex: '(?i)password', action: deny}
MODERATION
  output:
    - {name: no-card, pii: [card], action: redact}
    - {name: forbidden, regex: 'forbidden', action: deny}
";

/// The guardrails, with or without an external guard.
fn guarded(external: bool) -> Gateway {
    let moderation = if external {
        "    - {name: moderation, external: {cluster: guard, timeout_ms: 50, failure_mode: deny}}"
    } else {
        ""
    };
    Gateway::new(&config("{}", &GUARDS.replace("MODERATION", moderation)))
}

#[test]
fn an_input_deny_answers_before_any_provider_and_a_redaction_reaches_the_provider() {
    let g = guarded(false);
    let (ctx, _) = g.chat(&[], &body("my password is x"));
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("guardrail_denied"))
    );
    assert!(!v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("password is"));
    assert!(ctx
        .host
        .header(Part::Request, "x-portcullis-cluster")
        .is_none());
    assert_eq!(
        ctx.host
            .counter("portcullis.guardrail.stage.input.check.no-secret.deny"),
        1
    );

    let (ctx, a) = g.chat(&[], &body("mail me at a@b.io"));
    assert_eq!(a, Action::Continue);
    let sent: Value = serde_json::from_slice(&ctx.host.body_of(Part::Request)).unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "mail me at [REDACTED:email]"
    );
    assert_eq!(
        ctx.host.header(Part::Request, "content-length"),
        Some(ctx.host.body_of(Part::Request).len().to_string())
    );
    assert_eq!(ctx.log.guardrails.len(), 1);
}

#[test]
fn a_whole_answer_is_held_then_redacted_or_replaced_by_the_denial() {
    let g = guarded(false);
    let answer =
        |content: &str| ANSWER.replace(r#""content":"hi""#, &format!(r#""content":"{content}""#));
    for (content, denied) in [
        ("card 4111 1111 1111 1111", false),
        ("a forbidden answer", true),
    ] {
        let (mut ctx, _) = g.chat(&[], &body("hello"));
        ctx.host.set_headers(
            Part::Response,
            &[
                (":status", "200"),
                ("content-type", "application/json"),
                ("content-length", "10"),
            ],
        );
        assert_eq!(ctx.on_response_headers(false), Action::Pause, "held");
        assert!(ctx.host.header(Part::Response, "content-length").is_none());
        let body = answer(content);
        ctx.host
            .set_body_bytes(Part::Response, &body.as_bytes()[..20]);
        assert_eq!(ctx.on_response_body(20, false), Action::Pause);
        ctx.host.set_body_bytes(Part::Response, body.as_bytes());
        let a = ctx.on_response_body(body.len(), true);
        if denied {
            let (status, v) = sent_json(&ctx);
            assert_eq!(
                (status, v["error"]["code"].as_str()),
                (400, Some("guardrail_denied"))
            );
        } else {
            assert_eq!(a, Action::Continue);
            let v: Value = serde_json::from_slice(&ctx.host.body_of(Part::Response)).unwrap();
            assert_eq!(
                v["choices"][0]["message"]["content"],
                "card [REDACTED:card]"
            );
        }
        assert_eq!(ctx.log.guardrails.len(), 1);
    }
}

#[test]
fn an_external_guard_is_asked_and_its_verdict_or_failure_mode_decides() {
    let g = guarded(true);
    // Deny by the guard.
    let (mut ctx, a) = g.chat(&[], &body("hello there"));
    assert_eq!(a, Action::Pause);
    let call = ctx.host.callouts().pop().unwrap();
    assert_eq!(call.cluster, "guard");
    let sent: Value = serde_json::from_slice(&call.body).unwrap();
    assert_eq!(
        (sent["stage"].as_str(), sent["text"].as_str()),
        (Some("input"), Some("hello there"))
    );
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "200")]);
    let verdict = br#"{"verdict":"deny","reason":"rude"}"#;
    ctx.host.set_body_bytes(Part::CallResponse, verdict);
    ctx.on_call_response(1, verdict.len());
    let (status, v) = sent_json(&ctx);
    assert_eq!(status, 400);
    assert!(v["error"]["message"].as_str().unwrap().contains("rude"));
    assert_eq!(ctx.host.state.borrow().resumed, 0);

    // Redact by the guard: the request goes on, rewritten.
    let (mut ctx, _) = g.chat(&[], &body("hello there"));
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "200")]);
    let verdict = br#"{"verdict":"redact","redact":["there"]}"#;
    ctx.host.set_body_bytes(Part::CallResponse, verdict);
    ctx.on_call_response(1, verdict.len());
    assert_eq!(ctx.host.state.borrow().resumed, 1);
    let sent: Value = serde_json::from_slice(&ctx.host.body_of(Part::Request)).unwrap();
    assert_eq!(
        sent["messages"][0]["content"],
        "hello [REDACTED:moderation]"
    );

    // No answer (a timeout): failure mode deny is a 503.
    let (mut ctx, _) = g.chat(&[], &body("hello"));
    ctx.host.state.borrow_mut().now_ms += 60;
    ctx.host.set_headers(Part::CallResponse, &[]);
    ctx.host.set_body_bytes(Part::CallResponse, b"");
    ctx.on_call_response(1, 0);
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (503, Some("guardrail_unavailable"))
    );
    assert_eq!(ctx.host.counter(crate::host::metrics::GUARD_ERRORS), 1);
    assert!(ctx.log.guardrails[0]
        .reason
        .contains("no answer within 50 ms"));
}

/// The request's steps pause twice, each pause data saying where the
/// request resumes: for the external guard (at the cache), then for the
/// rate limit service (at dispatch); the provider is reached once both
/// waits end, and Envoy is told to resume once.
#[test]
fn the_steps_pause_for_the_guard_then_the_rate_limit_service_and_resume_where_each_said() {
    use crate::request::exchange::Step;
    let moderation =
        "    - {name: moderation, external: {cluster: guard, timeout_ms: 50, failure_mode: deny}}";
    let g = Gateway::new(&config(
        "{requests_per_minute: 10, scope: global}",
        &format!("{GLOBAL}{}", GUARDS.replace("MODERATION", moderation)),
    ));
    let (mut ctx, a) = g.chat(&[], &body("hello there"));
    assert_eq!(a, Action::Pause);
    assert_eq!(ctx.paused.as_ref().map(|(s, _)| *s), Some(Step::Cache));
    let calls = ctx.host.callouts();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, "guard");

    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "200")]);
    let verdict = br#"{"verdict":"allow"}"#;
    ctx.host.set_body_bytes(Part::CallResponse, verdict);
    ctx.on_call_response(1, verdict.len());
    assert_eq!(ctx.paused.as_ref().map(|(s, _)| *s), Some(Step::Dispatch));
    let calls = ctx.host.callouts();
    assert_eq!(calls.len(), 2);
    assert_eq!(calls[1].cluster, "rls");
    assert_eq!(ctx.host.state.borrow().resumed, 0);
    assert_eq!(ctx.host.header(Part::Request, "x-portcullis-cluster"), None);

    let answer = rls_answer(1, (1, 10, 9, 6));
    ctx.host.state.borrow_mut().grpc_answer = answer.clone();
    ctx.on_global_answer(2, 0, answer.len());
    assert!(ctx.paused.is_none());
    assert_eq!(ctx.host.state.borrow().resumed, 1);
    assert_eq!(
        ctx.host
            .header(Part::Request, "x-portcullis-cluster")
            .as_deref(),
        Some("primary")
    );
}

/// The backup speaks Anthropic's Messages API.
fn anthropic_backup() -> Gateway {
    let yaml = config("{}", "").replace(
        "  - name: backup\n    cluster: backup\n    host: backup.mock\n    base_path: /v1\n",
        "  - name: backup\n    cluster: backup\n    host: backup.mock\n    base_path: /v1\n    schema: anthropic\n",
    );
    assert!(yaml.contains("schema: anthropic"));
    Gateway::new(&yaml.replace("clients:", "routing: {chain: [backup, primary]}\nclients:"))
}

#[test]
fn an_anthropic_provider_gets_a_messages_request_and_its_answer_comes_back_as_openai() {
    let g = anthropic_backup();
    let (mut ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Continue);
    assert_eq!(
        ctx.host.header(Part::Request, ":path").as_deref(),
        Some("/v1/messages")
    );
    assert_eq!(
        ctx.host
            .header(Part::Request, "anthropic-version")
            .as_deref(),
        Some("2023-06-01")
    );
    assert_eq!(
        ctx.host.header(Part::Request, "x-api-key").as_deref(),
        Some("sk-backup")
    );
    let sent: Value = serde_json::from_slice(&ctx.host.body_of(Part::Request)).unwrap();
    assert_eq!(sent["model"], "openai/gpt-4o-mini");
    assert_eq!(sent["max_tokens"], 100);
    assert_eq!(sent["messages"][0]["content"][0]["text"], "hello");
    ctx.host.set_headers(
        Part::Response,
        &[(":status", "200"), ("content-type", "application/json")],
    );
    assert_eq!(
        ctx.on_response_headers(false),
        Action::Pause,
        "held for the translation"
    );
    let answer = r#"{"id":"msg_1","type":"message","role":"assistant","model":"claude","content":[{"type":"text","text":"hi there"}],"stop_reason":"end_turn","usage":{"input_tokens":3,"output_tokens":2}}"#;
    ctx.host.set_body_bytes(Part::Response, answer.as_bytes());
    assert_eq!(ctx.on_response_body(answer.len(), true), Action::Continue);
    let v: Value = serde_json::from_slice(&ctx.host.body_of(Part::Response)).unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["content"], "hi there");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 5);
}

const SHIPPED_BODY: &str = r#"{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hi."}],"temperature":0.2,"max_tokens":16}"#;

/// The shipped config, its cache on or off.
fn shipped(cache: bool) -> Gateway {
    // Without the fleet's tier (the tour's `shared:` line): no limiter here.
    let shared = "  shared: {cluster: portcullis_ratelimit, timeout_ms: 50}\n";
    let yaml = include_str!("../../envoy/plugin.yaml");
    assert!(
        yaml.contains(shared),
        "envoy/plugin.yaml: the shared line changed"
    );
    let yaml = yaml.replace(shared, "");
    let yaml = if cache {
        yaml.to_string()
    } else {
        yaml.replace("  enabled: true", "  enabled: false")
    };
    Gateway::new(&yaml)
}

/// One request of the shipped config through its answer (from the cache
/// or the router) and its log.
fn serve(g: &Gateway, tracing: bool) -> RequestContext<FakeHost> {
    let (mut ctx, a) = g.send_chat(
        &[("content-type", "application/json"), ("user-agent", "wrk")],
        SHIPPED_BODY,
        tracing,
    );
    if ctx.host.sent().is_none() {
        assert_eq!(a, Action::Continue);
        router_answers(&mut ctx, "200", ANSWER);
    } else {
        assert_eq!(sent_json(&ctx).0, 200, "a cache hit");
    }
    ctx.on_log();
    ctx
}

/// The calls one request made into Envoy.
fn traced(g: &Gateway) -> Vec<String> {
    serve(g, true).host.host_calls()
}

/// Each call into Envoy costs about a microsecond (issue 15): a routed
/// request of the shipped config makes these and no more. The VM trusts a
/// clean breaker it read for 100 ms, so the second request's admission
/// reads none; every success reads it once (#46: another worker may have
/// counted failures since).
#[test]
fn a_routed_request_of_the_shipped_config_makes_these_host_calls() {
    let g = shipped(false);
    let first = vec![
        "get_map request",
        "get_current_time ",
        "get_buffer request",
        "get_current_time ",
        "get_shared_data portcullis:breaker:primary",
        "set_map_value :authority",
        "set_map_value x-portcullis-cluster",
        "set_map_value x-envoy-upstream-rq-timeout-ms",
        "set_map_value authorization",
        "get_map response",
        // The success: the breaker read again, in case another worker
        // counted failures since (failures in a row across workers).
        "get_shared_data portcullis:breaker:primary",
        "add_map_value x-portcullis-model",
        "add_map_value x-portcullis-provider",
        "add_map_value x-portcullis-attempts",
        "add_map_value x-portcullis-cache",
        "get_buffer response",
        "get_current_time ",
        "record_metric portcullis.latency.provider.primary.ms",
    ];
    assert_eq!(traced(&g), first);
    // The admission's read is trusted; the success's is not.
    let mut trusted = first.clone();
    trusted.remove(4);
    assert_eq!(traced(&g), trusted, "the breaker's clean read is trusted");
    // For 100 ms: then it is read again.
    g.host.state.borrow_mut().now_ms += crate::health::breakers::CLEAN_TTL_MS;
    assert_eq!(traced(&g), first, "read again after 100 ms");
    assert_eq!(traced(&g), trusted);
    // A failure this worker sees ends the trust at once.
    primary_fails_backup_answers(&g);
    let after = traced(&g);
    assert_eq!(after[4], first[4], "read again after a failure: {after:#?}");
    assert!(
        after.contains(&"set_shared_data portcullis:breaker:primary".to_string()),
        "the success clears the failure it counted: {after:#?}"
    );
    assert_eq!(traced(&g), first, "clean again: read once more");
    assert_eq!(traced(&g), trusted, "then trusted");
}

/// The shipped config's request: the primary answers 503, the backup (by
/// callout) 200.
fn primary_fails_backup_answers(g: &Gateway) {
    let (mut ctx, _) = g.chat(&[], SHIPPED_BODY);
    assert_eq!(router_answers(&mut ctx, "503", "down"), Action::Pause);
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", "200")]);
    ctx.host
        .set_body_bytes(Part::CallResponse, ANSWER.as_bytes());
    ctx.on_call_response(1, ANSWER.len());
    assert_eq!(sent_json(&ctx).0, 200, "the backup answered");
}

/// A miss reads the set's index once (the store starts from that read);
/// a repeated request is answered from the worker's copy without any
/// shared-data read.
#[test]
fn a_miss_reads_the_cache_index_once_and_a_repeat_reads_no_shared_data() {
    let g = shipped(true);
    let cfg = g.loaded.gw.cache.as_ref().unwrap();
    crate::cache::configure(&g.host, Some(cfg));
    let miss = traced(&g);
    let shared: Vec<&String> = miss.iter().filter(|c| c.contains("shared_data")).collect();
    assert_eq!(shared.len(), 5, "{miss:#?}");
    assert!(shared[0].starts_with("get_shared_data portcullis:cache:"));
    // Admission, then the success's read.
    assert!(shared[1].contains("breaker") && shared[2].contains("breaker"));
    assert!(shared[3].starts_with("set_shared_data portcullis:cache:"));
    assert!(shared[4].starts_with("set_shared_data portcullis:cache:"));
    let hit = traced(&g);
    assert!(hit.iter().all(|c| !c.contains("shared_data")), "{hit:#?}");
    assert!(hit.contains(&"send_http_response ".to_string()), "{hit:#?}");
}

/// For profiling the routed path natively (`valgrind --tool=callgrind` on
/// the test binary): the request of the test above, many times.
#[test]
#[ignore]
fn profile_routed_requests() {
    // PROFILE_CACHE=1: the cache on, so all but the first are hits.
    let g = shipped(std::env::var("PROFILE_CACHE").is_ok_and(|v| v == "1"));
    crate::cache::configure(&g.host, g.loaded.gw.cache.as_ref());
    for _ in 0..2000 {
        serve(&g, false);
    }
}

/// `worker_bytes: 0`: no copies, so a repeat is a hit from the shared table.
#[test]
fn without_worker_copies_a_repeat_reads_the_shared_table() {
    let yaml = include_str!("../../envoy/plugin.yaml")
        .replace(
            "  shared: {cluster: portcullis_ratelimit, timeout_ms: 50}\n",
            "",
        )
        .replace("  scope: shared", "  scope: shared\n  worker_bytes: 0");
    let g = Gateway::new(&yaml);
    let cfg = g.loaded.gw.cache.as_ref().unwrap();
    assert_eq!(cfg.worker_bytes, 0);
    crate::cache::configure(&g.host, Some(cfg));
    traced(&g);
    let hit = traced(&g);
    let reads = hit
        .iter()
        .filter(|c| c.starts_with("get_shared_data portcullis:cache:"));
    assert_eq!(reads.count(), 2, "the index and the slot: {hit:#?}");
    assert!(hit.contains(&"send_http_response ".to_string()), "{hit:#?}");
}

mod tenancy;
mod tokens;

/// Failures *in a row*, across workers (#46 item 4): worker A reads the
/// primary's breaker clean and trusts that read; worker B counts four
/// failures; A's next request succeeds, within its trusted 100 ms. The
/// success ends the run, so B's next failure is the first of a new one and
/// the breaker (5 in a row) stays closed.
#[test]
fn a_success_on_one_worker_ends_a_run_of_failures_counted_on_another() {
    let a = shipped(false);
    let b = Gateway {
        host: FakeHost {
            state: Rc::new(std::cell::RefCell::new(crate::bindings::fake::State {
                now_ms: a.host.now_ms(),
                ..Default::default()
            })),
            store: a.host.store.clone(),
            worker: Rc::new(crate::host::worker::Worker::default()),
        },
        loaded: a.loaded.clone(),
    };
    let breaker = || {
        let v = a.host.store.get(&keys::breaker("primary")).unwrap().0;
        portcullis_core::health::breaker::Breaker::decode(v.as_deref())
    };
    serve(&a, false);
    assert!(
        traced(&a)
            .iter()
            .all(|c| c != "set_shared_data portcullis:breaker:primary"),
        "a clean read: nothing written"
    );
    for _ in 0..4 {
        primary_fails_backup_answers(&b);
    }
    assert_eq!(breaker().consecutive_failures, 4);
    // A, still trusting its clean read, answers from the primary.
    serve(&a, false);
    assert_eq!(breaker().consecutive_failures, 0, "the run ended");
    primary_fails_backup_answers(&b);
    let after = breaker();
    assert_eq!(
        (after.state, after.consecutive_failures),
        (portcullis_core::health::breaker::State::Closed, 1),
        "one failure since the success, not five in a row"
    );
}
