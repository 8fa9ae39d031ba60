//! Long and many streams (#29), through real Envoy and the real filter.
//!
//! A stream has no overall bound of ours: the provider's `timeout_ms` bounds
//! only the wait for the answer to start, and Envoy's stream idle timeout
//! cuts a stream in which nothing moves. The times are scaled down so the
//! test stays short: a 1.5 s provider timeout, a 2 s route timeout (which
//! the filter turns off for streams) and a 3 s idle timeout, against a
//! stream that trickles one chunk a second for about 9 s.
//!
//! Many streams: 2,000 held open at once on one Envoy, each with its first
//! chunk delivered, then all released to finish; Envoy's memory per open
//! stream is reported.

mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

const PROVIDER_TIMEOUT_MS: u64 = 1500;

fn stream_body(text: &str) -> String {
    json!({"model": "gpt-4o-mini", "stream": true, "messages": [{"role": "user", "content": text}]})
        .to_string()
}

/// The text a client reads from a chat stream.
fn content_of(sse: &str) -> String {
    stream_text(sse).0
}

#[test]
fn a_stream_runs_past_every_timeout_but_the_idle_one_and_a_hung_provider_still_fails_over() {
    let plugin = test_plugin().replace(
        "timeout_ms: 30000",
        &format!("timeout_ms: {PROVIDER_TIMEOUT_MS}"),
    );
    let s = Stack::start_patched(
        &plugin,
        1,
        false,
        dead_port(),
        vec![
            ("stream_idle_timeout: 300s", "stream_idle_timeout: 3s"),
            (
                "                  timeout: 0s\n",
                "                  timeout: 2s\n",
            ),
        ],
    );
    let url = s.envoy.url("/v1/chat/completions");
    let auth = format!("Bearer {DEMO_KEY}");
    let hdrs = [("authorization", auth.as_str())];

    // A trickle: nine words, one a second. Longer than the provider's
    // timeout (x6), the route's (x4) and the idle timeout (x3); never idle.
    let words = "one two three four five six seven eight nine";
    s.primary
        .script(json!([{"content": words, "chunk_delay_ms": 1000}]));
    let r = post_streamed(
        &url,
        &hdrs,
        &stream_body("trickle"),
        Duration::from_secs(20),
    );
    assert_eq!(r.resp.status, 200, "{}", r.resp.body);
    assert_eq!(r.error, None, "the stream was cut: {:?}", r.resp.body);
    assert_eq!(r.resp.header("x-portcullis-provider"), Some("primary"));
    assert_eq!(content_of(&r.resp.body), words);
    assert!(r.resp.body.trim_end().ends_with("data: [DONE]"));
    assert!(
        r.elapsed >= Duration::from_millis(8 * 1000),
        "the stream should have trickled for 8 s at least: {:?}",
        r.elapsed
    );
    assert_eq!(s.backup.hits(), 0, "a slow stream is not a failure");

    // A stream that stops moving: its first chunk, then nothing. Envoy's
    // idle timeout ends it (the client sees the stream cut, no [DONE]).
    s.primary
        .script(json!([{"content": "never finished", "hold": true}]));
    let r = post_streamed(&url, &hdrs, &stream_body("stall"), Duration::from_secs(30));
    s.primary.release();
    assert_eq!(r.resp.status, 200);
    assert!(
        r.resp.body.starts_with("data: "),
        "the first chunk arrived: {:?}",
        r.resp.body
    );
    assert!(
        !r.resp.body.contains("[DONE]"),
        "a stalled stream cannot have finished: {:?}",
        r.resp.body
    );
    assert!(
        r.elapsed >= Duration::from_millis(2900),
        "cut by the 3 s idle timeout, not before: {:?}",
        r.elapsed
    );

    // A provider that never starts its answer: the provider's timeout still
    // bounds the wait for a stream to start, and the backup answers.
    s.primary.script(json!([{"delay_ms": 10_000}]));
    s.backup.script(json!([{"content": "from the backup"}]));
    let r = post_streamed(&url, &hdrs, &stream_body("hung"), Duration::from_secs(30));
    assert_eq!(r.resp.status, 200, "{}", r.resp.body);
    assert_eq!(r.resp.header("x-portcullis-provider"), Some("backup"));
    assert_eq!(content_of(&r.resp.body), "from the backup");
    assert!(
        r.elapsed < Duration::from_secs(9),
        "failed over after the provider's {PROVIDER_TIMEOUT_MS} ms, not after the hung answer: {:?}",
        r.elapsed
    );
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

const STREAMS: usize = 2000;

/// 2,000 streams open at once on one Envoy (two workers), each holding
/// after its first chunk until the mock lets them all finish: every one
/// completes, and Envoy's memory per open stream is printed (the figure
/// BENCHMARKS quotes) and must stay bounded.
#[test]
fn two_thousand_open_streams_all_complete() {
    let s = Stack::start(&test_plugin(), 2);
    let url = s.envoy.url("/v1/chat/completions");
    let auth = format!("Bearer {DEMO_KEY}");
    // Warm up both workers and the pools, then take Envoy's memory.
    for _ in 0..20 {
        let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "warm"));
        assert_eq!(r.status, 200, "{}", r.body);
    }
    let before = rss_kib(s.envoy.pid());
    s.primary
        .default_step(json!({"content": "held then finished", "hold": true}));
    let started = AtomicUsize::new(0);
    let (results, open): (Vec<Streamed>, u64) = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..STREAMS)
            .map(|i| {
                let (url, auth, started) = (&url, &auth, &started);
                std::thread::Builder::new()
                    .stack_size(256 << 10)
                    .spawn_scoped(sc, move || {
                        open_stream(url, auth, &format!("stream {i}"), started)
                    })
                    .expect("spawn a client thread")
            })
            .collect();
        // Every stream has its first chunk: all are open at once.
        poll_until(Duration::from_secs(120), "2,000 open streams", || {
            (started.load(Ordering::SeqCst) == STREAMS).then_some(())
        });
        let open = s
            .envoy
            .stat("http.gateway.downstream_rq_active")
            .unwrap_or(0);
        let during = rss_kib(s.envoy.pid());
        let per_stream = during.saturating_sub(before) as f64 / STREAMS as f64;
        eprintln!(
            "open streams: {open} active in Envoy; Envoy RSS {before} KiB before, {during} KiB with {STREAMS} open: {per_stream:.1} KiB per stream"
        );
        assert!(
            per_stream < 512.0,
            "memory per open stream should stay bounded: {per_stream:.1} KiB"
        );
        // Let them all finish.
        let deadline = Instant::now() + Duration::from_secs(60);
        while handles.iter().any(|h| !h.is_finished()) {
            assert!(Instant::now() < deadline, "streams did not finish");
            s.primary.release();
            std::thread::park_timeout(Duration::from_millis(100));
        }
        let results = handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect();
        (results, open)
    });
    let failed: Vec<_> = results
        .iter()
        .filter(|r| r.status != 200 || !r.done || r.error.is_some())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {STREAMS} streams did not complete, e.g. {:?}",
        failed.len(),
        failed.first()
    );
    // Every stream was held by the primary: one answered by another means
    // it ended before the release, and the count of open ones is short.
    let elsewhere: Vec<_> = results
        .iter()
        .filter(|r| r.provider.as_deref() != Some("primary"))
        .collect();
    assert!(
        elsewhere.is_empty(),
        "{} of {STREAMS} streams were not answered by the primary, e.g. {:?}",
        elsewhere.len(),
        elsewhere.first()
    );
    assert!(
        open >= STREAMS as u64,
        "Envoy counts {open} active requests"
    );
}

/// What one client saw of its stream.
#[derive(Debug)]
struct Streamed {
    status: u16,
    /// The stream ended with `data: [DONE]`.
    done: bool,
    error: Option<String>,
    /// `x-portcullis-provider`.
    provider: Option<String>,
}

/// One stream: count it open at its first chunk, then read to its end.
fn open_stream(url: &str, auth: &str, text: &str, started: &AtomicUsize) -> Streamed {
    use std::io::BufRead;
    let r = ureq::AgentBuilder::new()
        .timeout_read(Duration::from_secs(150))
        .build()
        .post(url)
        .set("content-type", "application/json")
        .set("authorization", auth)
        .send_string(&stream_body(text));
    let r = match r {
        Ok(r) | Err(ureq::Error::Status(_, r)) => r,
        Err(e) => {
            started.fetch_add(1, Ordering::SeqCst);
            return Streamed {
                status: 0,
                done: false,
                error: Some(e.to_string()),
                provider: None,
            };
        }
    };
    let status = r.status();
    let provider = r.header("x-portcullis-provider").map(str::to_string);
    let mut reader = std::io::BufReader::new(r.into_reader());
    let mut line = String::new();
    let mut counted = false;
    let mut done = false;
    let mut error = None;
    loop {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => {
                if !counted && line.starts_with("data: ") {
                    counted = true;
                    started.fetch_add(1, Ordering::SeqCst);
                }
                done |= line.trim_end() == "data: [DONE]";
            }
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
    }
    if !counted {
        started.fetch_add(1, Ordering::SeqCst);
    }
    Streamed {
        status,
        done,
        error,
        provider,
    }
}
