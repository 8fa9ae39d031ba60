//! Limits scoped `global` across a fleet: two Envoy processes (2 workers
//! each) sharing one `portcullis-limiter` and one Redis, all real, on
//! loopback. Bursts split across both Envoys admit what one limit allows;
//! Redis or the limiter going away (or answering too slowly) follows the
//! failure mode and recovers without a restart; answers that are not
//! answers never trap the filter.
mod common;
use common::*;
use portcullis_core::limits::ratelimit::Price;
use portcullis_core::limits::rls::budget_units;
use portcullis_tests::*;
use serde_json::Value;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

const FLEET_KEY: &str = "sk-fleet-requests";
const TOKENS_KEY: &str = "sk-fleet-tokens";
const BUDGET_KEY: &str = "sk-fleet-budget";
const SECOND_KEY: &str = "sk-fleet-requests-b";
const TEAM_A: &str = "sk-fleet-team-a";
const TEAM_B: &str = "sk-fleet-team-b";

/// The shipped plugin (cache off) with three clients whose limits are
/// counted by the rate limit service, under `failure_mode`.
fn fleet_plugin(
    failure_mode: &str,
    timeout_ms: u64,
    rpm: u64,
    tpm: u64,
    budget_usd: f64,
) -> String {
    let p = test_plugin();
    let clients = format!(
        "clients:
  - name: fleet-requests
    key_sha256: {}
    limits: {{requests_per_minute: {rpm}, scope: global}}
  - name: fleet-tokens
    key_sha256: {}
    limits: {{tokens_per_minute: {tpm}, scope: global}}
  - name: fleet-budget
    key_sha256: {}
    limits: {{budget_usd_per_day: {budget_usd}, scope: global}}
  - name: fleet-requests-b
    key_sha256: {}
    limits: {{requests_per_minute: {rpm}, scope: global}}
",
        key_hash(FLEET_KEY),
        key_hash(TOKENS_KEY),
        key_hash(BUDGET_KEY),
        key_hash(SECOND_KEY)
    );
    assert!(p.contains("clients:\n") && p.contains("  max_body_bytes: 33554432\n"));
    p.replacen("clients:\n", &clients, 1).replacen(
        "  max_body_bytes: 33554432\n",
        &format!(
            "  max_body_bytes: 33554432\n  global: {{cluster: portcullis_ratelimit, timeout_ms: {timeout_ms}, failure_mode: {failure_mode}}}\n"
        ),
        1,
    )
}

fn chat(e: &Envoy, key: &str, body: &str) -> Resp {
    let auth = format!("Bearer {key}");
    post(
        &e.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        body,
    )
}

/// `n` requests at once, alternating between the Envoys; the answers and
/// how long the burst took.
fn burst(envoys: &[&Envoy], key: &str, body: &str, n: usize) -> (Vec<Resp>, Duration) {
    let urls: Vec<String> = envoys
        .iter()
        .map(|e| e.url("/v1/chat/completions"))
        .collect();
    let gate = Arc::new(Barrier::new(n));
    let start = Instant::now();
    let threads: Vec<_> = (0..n)
        .map(|i| {
            let (url, gate, body) = (urls[i % urls.len()].clone(), gate.clone(), body.to_string());
            let auth = format!("Bearer {key}");
            std::thread::spawn(move || {
                gate.wait();
                post(&url, &[("authorization", &auth)], &body)
            })
        })
        .collect();
    let out = threads.into_iter().map(|t| t.join().unwrap()).collect();
    (out, start.elapsed())
}

fn count(rs: &[Resp], status: u16) -> usize {
    rs.iter().filter(|r| r.status == status).count()
}

/// Per-minute buckets refill during a burst: at most this many more.
fn refill(limit: u64, took: Duration) -> usize {
    (limit as f64 * took.as_secs_f64() / 60.0).ceil() as usize
}

#[test]
fn global_limits_hold_across_two_envoys() {
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let collector_dir = TempDir::new("fleet-collector");
    let collector = Collector::start(&collector_dir.0.join("log.db"), 0);
    // `deny` and a generous timeout: every admission below is a decision
    // of the service, none a failure let through.
    let (rpm, tpm) = (20u64, 2_000u64);
    let plugin = fleet_plugin("deny", 3000, rpm, tpm, 0.0049);
    let a = fleet_envoy(
        &plugin,
        &primary,
        &backup,
        limiter.port,
        collector.grpc_port,
    );
    let b = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    let before = primary.hits() + backup.hits();

    // Requests per minute: 5 x L at once, half through each Envoy.
    let body = chat_body("gpt-4o-mini", "hello");
    let (rs, took) = burst(&[&a, &b], FLEET_KEY, &body, 5 * rpm as usize);
    let ok = count(&rs, 200);
    assert_eq!(count(&rs, 503), 0, "no service failures");
    assert!(
        ok >= rpm as usize && ok <= rpm as usize + refill(rpm, took),
        "admitted {ok} of {} for a fleet limit of {rpm} (burst took {took:?})",
        rs.len()
    );
    assert_eq!(ok + count(&rs, 429), rs.len());
    assert_eq!(
        primary.hits() + backup.hits() - before,
        ok as u64,
        "only admitted requests reached a provider"
    );
    let refused = rs.iter().find(|r| r.status == 429).unwrap();
    assert_openai_error(refused, 429, "rate_limit_exceeded");
    assert!(refused.json()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("across the fleet"));
    assert!(refused.header_u64("retry-after") >= 1);
    let admitted = rs.iter().find(|r| r.status == 200).unwrap();
    assert_eq!(admitted.header("x-ratelimit-limit-requests"), Some("20"));
    assert!(admitted.header_u64("x-ratelimit-remaining-requests") < rpm);
    // Both Envoys served some of the admitted requests (and refused some).
    for e in [&a, &b] {
        e.wait_stat_at_least("wasmcustom.portcullis.global.over_limit", 1);
    }

    // Tokens per minute: each request reserves its prompt estimate plus
    // max_tokens; the admitted reservations never exceed the limit.
    let body = serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 150,
        "messages": [{"role": "user", "content": "tokens"}]})
    .to_string();
    let reserve = body.len().div_ceil(4) as u64 + 150;
    let (rs, took) = burst(&[&a, &b], TOKENS_KEY, &body, 40);
    let ok = count(&rs, 200) as u64;
    assert_eq!(count(&rs, 503), 0);
    let fits = tpm / reserve;
    assert!(
        ok >= fits && ok * reserve <= tpm + refill(tpm, took) as u64,
        "admitted {ok} reservations of {reserve} tokens for a fleet limit of {tpm} (burst took {took:?})"
    );
    // What the admitted requests really used: never more than the limit;
    // the rest of the reservations is how early the limit refused.
    let used: u64 = rs
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| r.json()["usage"]["total_tokens"].as_u64().unwrap())
        .sum();
    assert!(used <= tpm);
    eprintln!(
        "tokens: {ok} admitted, reserving {} of {tpm}, using {used}",
        ok * reserve
    );

    // A day's budget: a window that does not refill, in units of $0.0001.
    let body = serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 1000,
        "messages": [{"role": "user", "content": "budget"}]})
    .to_string();
    let price = Price {
        input: 0.15,
        output: 0.60,
        cached_input: 0.075,
        cache_write: 0.15,
        reasoning: 0.60,
        ..Price::default()
    };
    let per_request = budget_units(price.cost(body.len().div_ceil(4) as u64, 1000, 0));
    let cap = budget_units(4900);
    let (rs, _) = burst(&[&a, &b], BUDGET_KEY, &body, 30);
    assert_eq!(count(&rs, 503), 0);
    assert_eq!(
        count(&rs, 200) as u64,
        cap / per_request,
        "budget of {cap} units, {per_request} per request"
    );
    let refused = rs.iter().find(|r| r.status == 429).unwrap();
    assert_openai_error(refused, 429, "budget_exceeded");

    // The request record says which scope refused.
    let records = poll_until(Duration::from_secs(10), "records of refusals", || {
        let r = collector.recent(500);
        r.iter()
            .any(|x| x["limited_by"] == "global" && x["status"] == 429)
            .then_some(r)
    });
    assert!(records
        .iter()
        .filter(|x| x["status"] == 200)
        .all(|x| x["limited_by"] == ""));
    drop(redis);
}

/// Two keys of one team whose daily budget is counted across the fleet: 50
/// requests at once, split across two Envoys and the two keys, against a
/// team budget of five reservations admit five, and no key-level counter
/// stops them (the keys have no budgets).
/// A Realtime session's usage counts against a fleet's limit: each
/// `response.done` is counted by the service as it passes, the session
/// ends when the service refuses, and the other Envoy refuses the key.
#[test]
fn a_realtime_sessions_usage_counts_across_the_fleet() {
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let plugin = fleet_plugin("deny", 3000, 20, 1_000, 1.0);
    let a = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    let b = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    // Each answer reports 400 output tokens: the fleet's 1,000 a minute
    // are spent by the third, and the session ends at its next event.
    let v = sdk_script(
        "realtime_check.py",
        &["limit", &a.url("/v1"), TOKENS_KEY, "gpt-4o-mini"],
    );
    let turns = v["turns"].as_array().unwrap();
    let done = turns.iter().filter(|t| t["status"] == "completed").count();
    assert!((3..=4).contains(&done), "{v}");
    let errors: Vec<&Value> = turns
        .iter()
        .filter_map(|t| t.get("error"))
        .chain(v["after"].as_array().unwrap().iter().map(|e| &e["error"]))
        .filter(|e| !e.is_null())
        .collect();
    assert_eq!(errors.len(), 1, "{v}");
    assert_eq!(errors[0]["code"], "rate_limit_exceeded", "{v}");
    assert!(
        errors[0]["message"]
            .as_str()
            .unwrap()
            .contains("across the fleet"),
        "{v}"
    );
    assert_eq!(v["closed"]["code"], 1008, "{v}");
    // The other Envoy knows: a chat request is refused, and a session
    // there ends after its first response (the fleet's count is over).
    let r = chat(&b, TOKENS_KEY, &chat_body("gpt-4o-mini", "hello"));
    assert_openai_error(&r, 429, "rate_limit_exceeded");
    let v = sdk_script(
        "realtime_check.py",
        &["limit", &b.url("/v1"), TOKENS_KEY, "gpt-4o-mini"],
    );
    let turns = v["turns"].as_array().unwrap();
    let done = turns.iter().filter(|t| t["status"] == "completed").count();
    assert_eq!(done, 1, "{v}");
    assert_eq!(v["closed"]["code"], 1008, "{v}");
    b.wait_stat_at_least("wasmcustom.portcullis.global.over_limit", 1);
}

#[test]
fn a_team_budget_counted_across_the_fleet_admits_what_it_holds() {
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let body = serde_json::json!({"model": "gpt-4o-mini", "max_tokens": 10,
        "messages": [{"role": "user", "content": "team"}]})
    .to_string();
    // At $1000 per 1M tokens a token is 10 units of $0.0001; every answer
    // uses exactly its reservation, so nothing is settled after it.
    let reserve = body.len().div_ceil(4) as u64 + 10;
    primary.default_step(
        serde_json::json!({"usage": {"prompt_tokens": reserve - 10, "completion_tokens": 10}}),
    );
    let cap_usd = (5 * reserve) as f64 / 1000.0;
    let shipped = "  gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}\n";
    let p = fleet_plugin("deny", 3000, 1000, 1_000_000, 100.0);
    assert!(p.contains(shipped));
    let keys = format!(
        "clients:
  - name: team-a
    key_sha256: {}
    team: research
  - name: team-b
    key_sha256: {}
    team: research
",
        key_hash(TEAM_A),
        key_hash(TEAM_B)
    );
    let plugin = p
        .replace(shipped, "  gpt-4o-mini: {input: 1000, output: 1000}\n")
        .replacen("clients:\n", &keys, 1)
        + &format!(
            "teams:\n  - name: research\n    limits: {{budget_usd_per_day: {cap_usd}, scope: global}}\n"
        );
    let a = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    let b = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    // Both keys at once, each through both Envoys.
    let (ra, rb) = std::thread::scope(|sc| {
        let ra = sc.spawn(|| burst(&[&a, &b], TEAM_A, &body, 25).0);
        let rb = burst(&[&b, &a], TEAM_B, &body, 25).0;
        (ra.join().unwrap(), rb)
    });
    let rs: Vec<Resp> = ra.into_iter().chain(rb).collect();
    assert_eq!(count(&rs, 503), 0, "no service failures");
    assert_eq!((count(&rs, 200), count(&rs, 429)), (5, 45));
    let refused = rs.iter().find(|r| r.status == 429).unwrap();
    let msg = openai_error_message(refused, 429, "budget_exceeded");
    assert!(
        msg.contains("team `research`") && msg.contains("across the fleet"),
        "{msg}"
    );
    assert_eq!(primary.hits(), 5);
}

#[test]
fn redis_or_the_limiter_away_follows_the_failure_mode_and_recovers() {
    let mut redis = Redis::start();
    let redis_port = redis.port;
    let mut limiter = Limiter::start(redis.port, 0);
    let limiter_port = limiter.port;
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let allow = fleet_envoy(
        &fleet_plugin("allow", 100, 1000, 100_000, 100.0),
        &primary,
        &backup,
        limiter.port,
        dead_port(),
    );
    let deny = fleet_envoy(
        &fleet_plugin("deny", 100, 1000, 100_000, 100.0),
        &primary,
        &backup,
        limiter.port,
        dead_port(),
    );
    let body = chat_body("gpt-4o-mini", "hello");
    let both_serve = || {
        poll_until(
            Duration::from_secs(15),
            "both Envoys admitting again",
            || {
                (chat(&allow, FLEET_KEY, &body).status == 200
                    && chat(&deny, FLEET_KEY, &body).status == 200)
                    .then_some(())
            },
        )
    };
    let check_failing = |what: &str| {
        for _ in 0..4 {
            let r = chat(&allow, FLEET_KEY, &body);
            assert_eq!(r.status, 200, "{what}, allow: {}", r.body);
            let r = chat(&deny, FLEET_KEY, &body);
            assert_openai_error(&r, 503, "rate_limit_unavailable");
            assert_eq!(r.header("retry-after"), Some("1"), "{what}");
        }
    };
    both_serve();

    // Redis stopped, then started again on its port.
    redis.stop();
    check_failing("redis stopped");
    allow.wait_stat_at_least("wasmcustom.portcullis.global.errors.allow", 4);
    deny.wait_stat_at_least("wasmcustom.portcullis.global.errors.deny", 4);
    let redis = Redis::start_on(redis_port);
    both_serve();

    // The limiter killed, then started again on its port.
    limiter.kill();
    check_failing("limiter killed");
    let _limiter = Limiter::start(redis.port, limiter_port);
    both_serve();

    // A limiter slower than the timeout (100 ms): Redis pauses its clients.
    // Each of the 4 checks per Envoy fails (its failure mode decides): as a
    // timeout, or, on a loaded machine, as an error of the connection the
    // restarted limiter's answer came too late on; counted from here.
    let failures = |e: &Envoy, mode: &str| {
        ["timeouts", "errors"]
            .iter()
            .map(|k| {
                e.stat(&format!("wasmcustom.portcullis.global.{k}.{mode}"))
                    .unwrap_or(0)
            })
            .sum::<u64>()
    };
    let before = (failures(&allow, "allow"), failures(&deny, "deny"));
    assert_eq!(
        redis
            .command(&["CLIENT", "PAUSE", "3000", "ALL"])
            .as_deref(),
        Some("+OK")
    );
    check_failing("limiter slower than the timeout");
    poll_until(
        Duration::from_secs(10),
        "4 failures counted by each Envoy",
        || {
            (failures(&allow, "allow") >= before.0 + 4 && failures(&deny, "deny") >= before.1 + 4)
                .then_some(())
        },
    );
    assert!(
        allow
            .stat("wasmcustom.portcullis.global.timeouts.allow")
            .is_some_and(|t| t >= 1),
        "a paused limiter times out"
    );
    both_serve();
    for e in [&allow, &deny] {
        assert!(!e.log().contains("panic"), "{}", e.log());
    }
}

/// `local_share` (#34, the default): while the limiter is away (killed, or
/// slower than the timeout), each of two Envoys counts its share of a
/// global limit of 20 (`replicas: 2`, so 10) itself: a burst of 60 split
/// across them admits at most the limit fleet-wide (plus what the bucket
/// refills during the burst) and at least one on each, never everyone and
/// never no one. Back to exact counting when the limiter answers again,
/// each switch counted.
#[test]
fn local_shares_hold_the_fleet_to_the_limit_while_the_limiter_is_away() {
    let redis = Redis::start();
    let mut limiter = Limiter::start(redis.port, 0);
    let limiter_port = limiter.port;
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let rpm = 20u64;
    let plugin = fleet_plugin("local_share", 100, rpm, 100_000, 100.0).replace(
        "failure_mode: local_share}",
        "failure_mode: local_share, replicas: 2}",
    );
    assert!(plugin.contains("replicas: 2"));
    let a = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    let b = fleet_envoy(&plugin, &primary, &backup, limiter.port, dead_port());
    let body = chat_body("gpt-4o-mini", "hello");
    assert_eq!(chat(&a, FLEET_KEY, &body).status, 200);
    assert_eq!(chat(&b, FLEET_KEY, &body).status, 200);
    let check = |what: &str, rs: &[Resp], took: Duration| {
        let per = |i: usize| {
            rs.iter()
                .skip(i)
                .step_by(2)
                .filter(|r| r.status == 200)
                .count()
        };
        let ok = count(rs, 200);
        assert!(
            ok <= rpm as usize + refill(rpm, took) && per(0) >= 1 && per(1) >= 1,
            "{what}: admitted {ok} of {} ({} through one Envoy, {} through the other) for a fleet limit of {rpm} (burst took {took:?})",
            rs.len(),
            per(0),
            per(1)
        );
        for r in rs.iter().filter(|r| r.status != 200) {
            let m = openai_error_message(r, 429, "rate_limit_exceeded");
            assert!(m.contains("counted locally"), "{what}: {m}");
        }
        eprintln!("{what}: {ok} of {} admitted in {took:?}", rs.len());
    };

    // The limiter killed: every call fails at once.
    limiter.kill();
    let (rs, took) = burst(&[&a, &b], FLEET_KEY, &body, 3 * rpm as usize);
    check("limiter killed", &rs, took);
    for e in [&a, &b] {
        e.wait_stat_at_least("wasmcustom.portcullis.global.to_shares", 1);
        e.wait_stat_at_least("wasmcustom.portcullis.global.share_refused", 1);
    }

    // Back: exact counting again, each worker's switch counted.
    let restarted = Instant::now();
    let _limiter = Limiter::start(redis.port, limiter_port);
    let back = poll_until(
        Duration::from_secs(20),
        "the limiter answering again",
        || {
            let _ = chat(&a, SECOND_KEY, &body);
            a.stat("wasmcustom.portcullis.global.to_service")
                .is_some_and(|n| n >= 1)
                .then(|| restarted.elapsed())
        },
    );
    eprintln!("exact counting again {back:?} after the limiter restarted");

    // The limiter slower than the timeout (Redis pauses its clients): the
    // same bounds, on a key whose shares are untouched.
    assert_eq!(
        redis
            .command(&["CLIENT", "PAUSE", "4000", "ALL"])
            .as_deref(),
        Some("+OK")
    );
    let (rs, took) = burst(&[&a, &b], SECOND_KEY, &body, 3 * rpm as usize);
    let unpaused = redis.command(&["CLIENT", "UNPAUSE"]);
    check("limiter slower than the timeout", &rs, took);
    assert!(unpaused.is_some());
    for e in [&a, &b] {
        assert!(!e.log().contains("panic"), "{}", e.log());
    }
}

/// A rate limit service that answers what it is told to: gRPC over h2c
/// with a body that is not a `RateLimitResponse`, an unknown code, a
/// truncated frame, or an error status.
struct FakeService {
    port: u16,
    mode: Arc<AtomicU8>,
    _rt: tokio::runtime::Runtime,
}

mod fake_service {
    use bytes::Bytes;
    use http_body::{Body, Frame};
    use std::collections::VecDeque;
    use std::pin::Pin;
    use std::task::{Context, Poll};

    pub struct Frames(pub VecDeque<Frame<Bytes>>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }
}

impl FakeService {
    fn start() -> FakeService {
        use hyper::body::Incoming;
        use hyper::service::service_fn;
        use hyper::{HeaderMap, Request, Response};
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let mode = Arc::new(AtomicU8::new(0));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let m = mode.clone();
        rt.spawn(async move {
            loop {
                let Ok((sock, _)) = listener.accept().await else {
                    return;
                };
                let m = m.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |_req: Request<Incoming>| {
                        let mode = m.load(Ordering::SeqCst);
                        async move {
                            // 0: garbage, 1: overall code 9, 2: a frame that
                            // claims more bytes than it has, 3: INTERNAL.
                            let message: &[u8] = match mode {
                                0 => b"\xff\xff\xff not protobuf",
                                1 => &[0x08, 0x09],
                                _ => b"",
                            };
                            let mut frame = vec![0u8];
                            let claimed = if mode == 2 {
                                100u32
                            } else {
                                message.len() as u32
                            };
                            frame.extend_from_slice(&claimed.to_be_bytes());
                            frame.extend_from_slice(message);
                            let mut trailers = HeaderMap::new();
                            let status = if mode == 3 { "13" } else { "0" };
                            trailers.insert("grpc-status", status.parse().unwrap());
                            let frames = [
                                http_body::Frame::data(bytes::Bytes::from(frame)),
                                http_body::Frame::trailers(trailers),
                            ];
                            let body = fake_service::Frames(frames.into_iter().collect());
                            Ok::<_, std::convert::Infallible>(
                                Response::builder()
                                    .header("content-type", "application/grpc")
                                    .body(body)
                                    .unwrap(),
                            )
                        }
                    });
                    let _ = hyper::server::conn::http2::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(sock), svc)
                    .await;
                });
            }
        });
        FakeService {
            port,
            mode,
            _rt: rt,
        }
    }
}

#[test]
fn answers_that_are_not_answers_follow_the_failure_mode_and_never_trap_the_filter() {
    let service = FakeService::start();
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let allow = fleet_envoy(
        &fleet_plugin("allow", 1000, 10, 100_000, 100.0),
        &primary,
        &backup,
        service.port,
        dead_port(),
    );
    let deny = fleet_envoy(
        &fleet_plugin("deny", 1000, 10, 100_000, 100.0),
        &primary,
        &backup,
        service.port,
        dead_port(),
    );
    let body = chat_body("gpt-4o-mini", "hello");
    for mode in 0..4u8 {
        service.mode.store(mode, Ordering::SeqCst);
        // More requests than workers: every worker meets the answer.
        for _ in 0..6 {
            let r = chat(&allow, FLEET_KEY, &body);
            assert_eq!(r.status, 200, "mode {mode}, allow: {}", r.body);
            let r = chat(&deny, FLEET_KEY, &body);
            assert_openai_error(&r, 503, "rate_limit_unavailable");
        }
    }
    allow.wait_stat_at_least("wasmcustom.portcullis.global.errors.allow", 24);
    for e in [&allow, &deny] {
        // Still serving on every worker: models list needs no service.
        for _ in 0..4 {
            let r = get(
                &e.url("/v1/models"),
                &[("authorization", &format!("Bearer {FLEET_KEY}"))],
            );
            assert_eq!(r.status, 200);
        }
        assert!(!e.log().contains("panic"), "{}", e.log());
    }
}

/// The limiter serves only callers with its token: anybody else on its
/// network cannot spend a client's limit (the Envoys above send it).
#[test]
fn the_limiter_refuses_a_caller_without_its_token() {
    use portcullis_limiter::proto::rate_limit_service_client::RateLimitServiceClient;
    use portcullis_limiter::proto::RateLimitRequest;
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let port = limiter.port;
    let codes = tokio::runtime::Runtime::new()
        .unwrap()
        .block_on(async move {
            let mut client = RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
                .await
                .unwrap();
            let ask = || RateLimitRequest {
                domain: "portcullis".into(),
                hits_addend: 1,
                ..Default::default()
            };
            let bare = client.should_rate_limit(ask()).await.unwrap_err().code();
            let mut wrong = tonic::Request::new(ask());
            wrong
                .metadata_mut()
                .insert("authorization", "Bearer not-the-token".parse().unwrap());
            let wrong = client.should_rate_limit(wrong).await.unwrap_err().code();
            let mut right = tonic::Request::new(ask());
            right.metadata_mut().insert(
                "authorization",
                format!("Bearer {LIMITER_TOKEN}").parse().unwrap(),
            );
            let right = client
                .should_rate_limit(right)
                .await
                .map(|_| ())
                .map_err(|e| e.code());
            (bare, wrong, right)
        });
    assert_eq!(codes.0, tonic::Code::Unauthenticated);
    assert_eq!(codes.1, tonic::Code::Unauthenticated);
    assert_eq!(codes.2, Ok(()), "the token's holder is served");
}
