//! The request log and metrics with real Envoy, the real collector binary
//! and SQLite.
mod common;
use common::*;
use portcullis_collector::proto::{collector_client::CollectorClient, RecordBatch, RequestRecord};
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

fn logging_plugin(extra_log: &str) -> String {
    let base = test_plugin().replace("flush_interval_ms: 250", "flush_interval_ms: 100");
    let base = base.replace(
        "  include_content: false        # true: keep prompt and completion text\n",
        extra_log,
    );
    base.replace("cache:\n  enabled: false", "cache:\n  enabled: true")
}

fn records_for(c: &Collector, n: usize) -> Vec<Value> {
    poll_until(
        Duration::from_secs(15),
        &format!("{n} records in the collector"),
        || {
            let r = c.recent(1000);
            (r.len() >= n).then_some(r)
        },
    )
}

fn by_id<'a>(records: &'a [Value], id: &str) -> &'a Value {
    records
        .iter()
        .find(|r| r["request_id"] == id)
        .unwrap_or_else(|| panic!("no record {id} in {records:?}"))
}

fn ask(s: &Stack, id: &str, key: &str, body: &str) -> Resp {
    let auth = format!("Bearer {key}");
    post(
        &s.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth), ("x-request-id", id)],
        body,
    )
}

/// A 35 MB answer (over the listener's 33 MiB buffer limit) with the log and
/// the cache on: the filter copies it as it passes instead of holding it, so
/// the client gets all of it, the record has its usage (read from its tail),
/// and it is not stored (over max_entry_bytes).
#[test]
fn an_answer_larger_than_envoys_buffers_reaches_the_client_whole_with_its_usage_recorded() {
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(&logging_plugin(""), 1, false, c.grpc_port);
    let content = "z".repeat(35_000_000);
    let step = json!({"content": content, "usage": {"prompt_tokens": 3, "completion_tokens": 4}});
    s.primary.script(json!([step.clone(), step]));
    for id in ["big-1", "big-2"] {
        let r = ask(&s, id, DEMO_KEY, &chat_body("gpt-4o-mini", "a lot"));
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-portcullis-cache"), Some("miss"), "never stored");
        assert_eq!(
            r.json()["choices"][0]["message"]["content"]
                .as_str()
                .map(str::len),
            Some(35_000_000)
        );
    }
    assert_eq!(s.primary.hits(), 2);
    let records = records_for(&c, 2);
    let big = by_id(&records, "big-1");
    assert_eq!(
        (
            big["prompt_tokens"].as_i64(),
            big["completion_tokens"].as_i64()
        ),
        (Some(3), Some(4)),
        "{big}"
    );
    s.envoy
        .wait_stat("wasmcustom.portcullis.cache.too_large", 2);
}

#[test]
fn records_for_misses_hits_fallbacks_and_errors_arrive_with_the_right_fields() {
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(&logging_plugin(""), 2, false, c.grpc_port);
    s.primary
        .default_step(json!({"usage": {"prompt_tokens": 11, "completion_tokens": 7}}));
    assert_eq!(
        ask(&s, "miss-1", DEMO_KEY, &chat_body("gpt-4o-mini", "log me")).status,
        200
    );
    assert_eq!(
        ask(&s, "hit-1", DEMO_KEY, &chat_body("gpt-4o-mini", "log me"))
            .header("x-portcullis-cache"),
        Some("hit")
    );
    s.primary.script(json!([{"status": 503}]));
    s.backup
        .default_step(json!({"usage": {"prompt_tokens": 5, "completion_tokens": 5}}));
    assert_eq!(
        ask(
            &s,
            "fallback-1",
            DEMO_KEY,
            &chat_body("gpt-4o-mini", "fall back")
        )
        .status,
        200
    );
    assert_eq!(
        ask(&s, "error-1", DEMO_KEY, &chat_body("gpt-9", "x")).status,
        404
    );
    assert_eq!(
        ask(&s, "auth-1", "sk-nobody", &chat_body("gpt-4o-mini", "x")).status,
        401
    );
    // A client that reuses its x-request-id loses no record.
    for model in ["gpt-4o-mini", "gpt-4o"] {
        let r = ask(&s, "reused", DEMO_KEY, &chat_body(model, "reused"));
        assert_eq!(r.status, 200);
    }

    let recs = records_for(&c, 7);
    let reused: Vec<_> = recs
        .iter()
        .filter(|r| {
            let id = r["request_id"].as_str().unwrap_or("");
            id == "reused"
                || id
                    .strip_prefix("reused~")
                    .is_some_and(|fp| fp.len() == 16 && fp.bytes().all(|b| b.is_ascii_hexdigit()))
        })
        .map(|r| r["model"].as_str().unwrap_or("").to_string())
        .collect();
    assert_eq!(reused.len(), 2, "{recs:?}");
    assert_ne!(reused[0], reused[1], "both requests kept: {reused:?}");
    let miss = by_id(&recs, "miss-1");
    assert_eq!(
        (
            miss["client"].as_str(),
            miss["model"].as_str(),
            miss["provider"].as_str()
        ),
        (Some("demo"), Some("gpt-4o-mini"), Some("primary"))
    );
    assert_eq!(
        (miss["cache"].as_str(), miss["status"].as_i64()),
        (Some("miss"), Some(200))
    );
    assert_eq!(
        (
            miss["prompt_tokens"].as_i64(),
            miss["completion_tokens"].as_i64()
        ),
        (Some(11), Some(7))
    );
    assert_eq!(
        miss["attempts"],
        json!([{"provider": "primary", "status": 200, "cause": ""}])
    );
    let hit = by_id(&recs, "hit-1");
    assert_eq!(
        (
            hit["cache"].as_str(),
            hit["provider"].as_str(),
            hit["status"].as_i64()
        ),
        (Some("hit"), Some("primary"), Some(200))
    );
    assert_eq!(hit["attempts"], json!([]));
    let fb = by_id(&recs, "fallback-1");
    assert_eq!(fb["provider"], "backup");
    assert_eq!(
        fb["attempts"],
        json!([{"provider": "primary", "status": 503, "cause": "overloaded"}, {"provider": "backup", "status": 200, "cause": ""}])
    );
    assert_eq!(fb["completion_tokens"], 5);
    let err = by_id(&recs, "error-1");
    assert_eq!(
        (
            err["status"].as_i64(),
            err["error"].as_str(),
            err["requested_model"].as_str()
        ),
        (Some(404), Some("model_not_found"), Some(""))
    );
    let auth = by_id(&recs, "auth-1");
    assert_eq!(
        (
            auth["status"].as_i64(),
            auth["error"].as_str(),
            auth["client"].as_str()
        ),
        (Some(401), Some("invalid_api_key"), Some(""))
    );
    for r in &recs {
        assert!(
            r["latency_ms"].as_i64().unwrap() >= 0
                && r["time_ms"].as_i64().unwrap() > 1_700_000_000_000
        );
    }
    // No prompt or completion text unless the config asks for it.
    let db = rusqlite::Connection::open(&c.db).unwrap();
    let with_text: i64 = db
        .query_row(
            "SELECT COUNT(*) FROM requests WHERE prompt IS NOT NULL OR completion IS NOT NULL",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(with_text, 0);
}

#[test]
fn content_is_kept_only_when_configured() {
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(
        &logging_plugin("  include_content: true\n"),
        1,
        false,
        c.grpc_port,
    );
    s.primary
        .script(json!([{"content": "secret answer"}, {"status": 500}]));
    s.backup.default_step(json!({"content": "fallback answer"}));
    assert_eq!(
        ask(
            &s,
            "content-1",
            DEMO_KEY,
            &chat_body("gpt-4o-mini", "secret question")
        )
        .status,
        200
    );
    // The text of an answer that came by fallback is kept too.
    assert_eq!(
        ask(
            &s,
            "content-2",
            DEMO_KEY,
            &chat_body("gpt-4o-mini", "second question")
        )
        .status,
        200
    );
    records_for(&c, 2);
    let db = rusqlite::Connection::open(&c.db).unwrap();
    let text = |id: &str| -> (String, String) {
        db.query_row(
            "SELECT prompt, completion FROM requests WHERE request_id = ?1",
            [id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap()
    };
    let (p, comp) = text("content-1");
    assert!(p.contains("secret question"), "{p}");
    assert_eq!(comp, "secret answer");
    let (p, comp) = text("content-2");
    assert!(p.contains("second question"), "{p}");
    assert_eq!(comp, "fallback answer");
}

#[test]
fn collector_down_never_fails_a_request_drops_are_counted_and_records_flow_when_it_is_back() {
    let grpc_port = dead_port();
    let plugin = logging_plugin("").replace("buffer_records: 10000", "buffer_records: 5");
    let s = Stack::start_full(&plugin, 1, false, grpc_port);
    for i in 0..20 {
        let r = ask(
            &s,
            &format!("down-{i}"),
            DEMO_KEY,
            &chat_body("gpt-4o-mini", &format!("down {i}")),
        );
        assert_eq!(r.status, 200, "{}", r.body);
    }
    poll_until(
        Duration::from_secs(10),
        "dropped records to be counted",
        || {
            (s.envoy
                .stat("wasmcustom.portcullis.log.dropped")
                .unwrap_or(0)
                >= 15)
                .then_some(())
        },
    );
    poll_until(
        Duration::from_secs(10),
        "failed flushes on several ticks to be counted",
        || {
            (s.envoy
                .stat("wasmcustom.portcullis.log.flush_failures")
                .unwrap_or(0)
                >= 3)
                .then_some(())
        },
    );
    // Every failure is counted, but the log says it once a minute, not at
    // every tick.
    let warnings = s.envoy.log().matches("request log not sent").count();
    assert_eq!(warnings, 1, "{}", s.envoy.log());

    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), grpc_port);
    // What was buffered while it was down (at most 5 records) arrives first...
    let kept = poll_until(Duration::from_secs(20), "the buffered records", || {
        let n = c.recent(100).len();
        (n > 0).then_some(n)
    });
    assert!(
        kept <= 5,
        "{kept} buffered records delivered, the buffer holds 5"
    );
    // ...then new records flow again.
    for i in 0..3 {
        assert_eq!(
            ask(
                &s,
                &format!("up-{i}"),
                DEMO_KEY,
                &chat_body("gpt-4o-mini", &format!("up {i}"))
            )
            .status,
            200
        );
    }
    poll_until(
        Duration::from_secs(20),
        "records after the collector came back",
        || {
            let r = c.recent(100);
            (r.iter()
                .filter(|x| x["request_id"].as_str().unwrap_or("").starts_with("up-"))
                .count()
                == 3)
                .then_some(())
        },
    );
}

#[test]
fn requests_are_labelled_metrics_in_prometheus() {
    let s = Stack::start(&logging_plugin(""), 1);
    s.primary
        .default_step(json!({"usage": {"prompt_tokens": 11, "completion_tokens": 7}}));
    for _ in 0..3 {
        assert_eq!(
            s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "metrics"))
                .status,
            200
        );
    }
    let want = [
        r#"portcullis_requests_total{client="demo",provider="primary",model="gpt-4o-mini",status="2xx",cache="miss"} 1"#,
        r#"portcullis_requests_total{client="demo",provider="primary",model="gpt-4o-mini",status="2xx",cache="hit"} 2"#,
        r#"portcullis_tokens_in_total{provider="primary",model="gpt-4o-mini"} 11"#,
        r#"portcullis_tokens_out_total{provider="primary",model="gpt-4o-mini"} 7"#,
    ];
    // Counters reach Envoy at the next tick; wait for all of them.
    let prom = poll_until(
        Duration::from_secs(10),
        "request metrics with their labels",
        || {
            let p = s.envoy.prometheus();
            want.iter()
                .all(|w| p.lines().any(|l| sorted_labels(l) == sorted_labels(w)))
                .then_some(p)
        },
    );
    assert!(prom.contains("portcullis_config_generation"), "{prom}");
    assert!(
        prom.contains("portcullis_latency_ms_bucket{provider=\"primary\""),
        "{prom}"
    );
}

/// Label values are escaped in every metric name: an experiment arm named
/// `v1.2` once went into the name raw, and `stats_tags` cut it at the dot.
#[test]
fn an_experiment_arm_with_a_dot_is_one_prometheus_label() {
    let experiment = "experiments:\n  - name: exp-2026\n    salt: s\n    applies_to: [gpt-4o-mini]\n    arms:\n      - {name: v1.2, weight: 1, model: gpt-4o-mini}\n      - {name: v2.0, weight: 0, model: gpt-4o}\n";
    let s = Stack::start(&format!("{}{experiment}", test_plugin()), 1);
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "which arm?"));
    assert_eq!(
        r.header("x-portcullis-experiment"),
        Some("exp-2026/v1.2"),
        "{r:?}"
    );
    let want = r#"portcullis_experiment_requests_total{experiment="exp-2026",arm="v1_2"} 1"#;
    poll_until(Duration::from_secs(10), "the experiment counter", || {
        let p = s.envoy.prometheus();
        p.lines()
            .any(|l| sorted_labels(l) == sorted_labels(want))
            .then_some(())
    });
}

/// A Prometheus line with its labels in a fixed order (Envoy orders them by
/// tag extractor).
fn sorted_labels(line: &str) -> String {
    let Some((name, rest)) = line.split_once('{') else {
        return line.to_string();
    };
    let Some((labels, value)) = rest.split_once('}') else {
        return line.to_string();
    };
    let mut ls: Vec<&str> = labels.split(',').collect();
    ls.sort();
    format!("{name}{{{}}}{value}", ls.join(","))
}

fn record(
    id: &str,
    provider: &str,
    status: u32,
    latency: u64,
    cache: &str,
    attempts: usize,
) -> RequestRecord {
    RequestRecord {
        request_id: id.into(),
        time_ms: 1_800_000_000_000,
        client: "demo".into(),
        model: if provider == "primary" {
            "gpt-4o-mini".into()
        } else {
            "llama".into()
        },
        provider: provider.into(),
        cache: cache.into(),
        status,
        latency_ms: latency,
        prompt_tokens: 10,
        completion_tokens: 5,
        cost_micros: 1500,
        attempts: (0..attempts).map(|_| Default::default()).collect(),
        experiment: if (latency / 10).is_multiple_of(2) {
            "ab".into()
        } else {
            String::new()
        },
        arm: if (latency / 10).is_multiple_of(2) {
            "control".into()
        } else {
            String::new()
        },
        ..Default::default()
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn summary_figures_match_a_known_set_of_records() {
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    // 10 records: latencies 10..=100, 8 successes, 3 hits, 2 fallbacks.
    let mut recs = Vec::new();
    for i in 1..=10u64 {
        let status = if i <= 8 { 200 } else { 502 };
        let cache = if i <= 3 { "hit" } else { "miss" };
        let provider = if i <= 6 { "primary" } else { "backup" };
        recs.push(record(
            &format!("s-{i}"),
            provider,
            status,
            i * 10,
            cache,
            if i >= 9 { 2 } else { 1 },
        ));
    }
    rt().block_on(async {
        let mut client = CollectorClient::connect(format!("http://127.0.0.1:{}", c.grpc_port))
            .await
            .unwrap();
        let ack = client
            .ingest(RecordBatch { records: recs })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((ack.stored, ack.duplicates), (10, 0));
    });
    let s = get(&c.url("/v1/metrics/summary?since=0"), &[]).json();
    assert_eq!(s["total"], 10);
    assert_eq!(s["success_rate"], 0.8);
    assert_eq!(s["cache_hit_rate"], 0.3);
    assert_eq!(s["fallbacks"], 2);
    assert_eq!(s["avg_latency_ms"], 55.0);
    assert_eq!(s["p50_latency_ms"], 50);
    assert_eq!(s["p95_latency_ms"], 100);
    assert_eq!(
        (s["prompt_tokens"].as_i64(), s["completion_tokens"].as_i64()),
        (Some(100), Some(50))
    );
    assert_eq!(s["cost_usd"], 0.015);
    let providers = s["by_provider"].as_array().unwrap();
    assert_eq!(providers[0]["key"], "primary");
    assert_eq!(providers[0]["requests"], 6);
    assert_eq!(providers[1]["success_rate"], 0.5);
    let arms = s["by_experiment"].as_array().unwrap();
    assert_eq!(
        (
            arms.len(),
            arms[0]["key"].as_str(),
            arms[0]["requests"].as_i64()
        ),
        (1, Some("ab/control"), Some(5))
    );
    let metrics = get(&c.url("/metrics"), &[]).body;
    assert!(
        metrics
            .lines()
            .any(|l| l == "portcullis_collector_ingested_total 10"),
        "{metrics}"
    );
    assert!(
        metrics
            .lines()
            .any(|l| l == "portcullis_collector_queue_depth 0"),
        "{metrics}"
    );
    // A window after all of them is empty.
    assert_eq!(
        get(&c.url("/v1/metrics/summary?since=1900000000000"), &[]).json()["total"],
        0
    );
    assert_eq!(
        get(&c.url("/v1/metrics/summary?since=soon"), &[]).status,
        400
    );
}

#[test]
fn sigkill_during_ingest_loses_no_acknowledged_record_and_resends_are_harmless() {
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let port = c.grpc_port;
    let acked_count = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = acked_count.clone();
    let acked: Vec<Vec<String>> = rt().block_on(async move {
        let mut tasks = Vec::new();
        for w in 0..4 {
            let counter = counter.clone();
            tasks.push(tokio::spawn(async move {
                let mut acked = Vec::new();
                let Ok(mut client) =
                    CollectorClient::connect(format!("http://127.0.0.1:{port}")).await
                else {
                    return acked;
                };
                for b in 0..10_000 {
                    let ids: Vec<String> = (0..50).map(|i| format!("w{w}-b{b}-r{i}")).collect();
                    let batch = RecordBatch {
                        records: ids
                            .iter()
                            .map(|id| record(id, "primary", 200, 5, "miss", 1))
                            .collect(),
                    };
                    match client.ingest(batch).await {
                        Ok(_) => {
                            counter.fetch_add(ids.len(), std::sync::atomic::Ordering::SeqCst);
                            acked.push(ids);
                        }
                        Err(_) => break,
                    }
                }
                acked
                    .into_iter()
                    .flatten()
                    .collect::<Vec<String>>()
                    .chunks(50)
                    .map(|c| c.to_vec())
                    .collect::<Vec<_>>()
            }));
        }
        // Kill once ingest is well under way (while batches are in flight).
        poll_until(Duration::from_secs(30), "2000 acknowledged records", || {
            (counter.load(std::sync::atomic::Ordering::SeqCst) >= 2000).then_some(())
        });
        c.kill();
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap_or_default());
        }
        all
    });
    let total_acked: usize = acked.iter().map(Vec::len).sum();
    assert!(
        total_acked >= 2000,
        "only {total_acked} acknowledged before the kill"
    );
    assert_eq!(
        total_acked,
        acked_count.load(std::sync::atomic::Ordering::SeqCst)
    );
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let conn = rusqlite::Connection::open(&c.db).unwrap();
    let mut missing = 0;
    for id in acked.iter().flatten() {
        if !portcullis_collector::store::exists(&conn, id).unwrap() {
            missing += 1;
        }
    }
    assert_eq!(
        missing, 0,
        "{missing} of {total_acked} acknowledged records lost"
    );
    let before = portcullis_collector::store::count(&conn).unwrap();
    let again = acked[0].clone();
    let port = c.grpc_port;
    let ack = rt().block_on(async move {
        let mut client = CollectorClient::connect(format!("http://127.0.0.1:{port}"))
            .await
            .unwrap();
        let batch = RecordBatch {
            records: again
                .iter()
                .map(|id| record(id, "primary", 200, 5, "miss", 1))
                .collect(),
        };
        client.ingest(batch).await.unwrap().into_inner()
    });
    assert_eq!((ack.stored, ack.duplicates), (0, 50));
    assert_eq!(portcullis_collector::store::count(&conn).unwrap(), before);
}
