//! The prompt cache's fleet tier (`cache.shared`, #50): Envoy processes (2
//! workers each) sharing one `portcullis-limiter` and one Redis, all real,
//! on loopback. A prompt answered by one replica is a `hit-shared` on
//! another, streamed or not, and on a replica started afresh; Redis away
//! or slow is a miss within the lookup's timeout, and back is a hit again;
//! entries a client key owns (`scope: client`) are never served to another
//! key and never name one; a damaged or misplaced entry in Redis is a miss,
//! never a wrong answer or a 500; an answer over the size bound is not
//! shared.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::collections::HashSet;
use std::time::{Duration, Instant};

const KEY_A: &str = "sk-shared-cache-a";
const KEY_B: &str = "sk-shared-cache-b";
const KEY_C: &str = "sk-shared-cache-c";
const PREFIX: &str = "portcullis:cache:";

/// The test plugin with the cache on and shared through the limiter's
/// cluster, answers up to `max_entry` bytes, and three more clients.
fn plugin(scope: &str, max_entry: usize, timeout_ms: u64) -> String {
    let p = test_plugin();
    let clients = format!(
        "clients:
  - name: shared-a
    key_sha256: {}
  - name: shared-b
    key_sha256: {}
  - name: shared-c
    key_sha256: {}
",
        key_hash(KEY_A),
        key_hash(KEY_B),
        key_hash(KEY_C)
    );
    let cache = format!(
        "cache:\n  enabled: true\n  max_entry_bytes: {max_entry}\n  scope: {scope}\n  shared: {{cluster: portcullis_ratelimit, timeout_ms: {timeout_ms}}}\n"
    );
    assert!(p.contains("cache:\n  enabled: false\n") && p.contains("clients:\n"));
    with_cache_section(&p.replacen("clients:\n", &clients, 1), &cache)
}

fn envoy(plugin: &str, primary: &Mock, backup: &Mock, limiter_port: u16) -> Envoy {
    fleet_envoy(plugin, primary, backup, limiter_port, dead_port())
}

fn question(text: &str, stream: bool) -> String {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}],
           "temperature": 0, "stream": stream})
    .to_string()
}

fn ask(e: &Envoy, key: &str, text: &str) -> Resp {
    e_chat(e, key, &question(text, false))
}

fn e_chat(e: &Envoy, key: &str, body: &str) -> Resp {
    let auth = format!("Bearer {key}");
    post(
        &e.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        body,
    )
}

fn tier(r: &Resp) -> &str {
    r.header("x-portcullis-cache").unwrap_or("")
}

fn content(r: &Resp) -> String {
    let v: Value = serde_json::from_str(&r.body).unwrap_or(Value::Null);
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn entries(redis: &Redis) -> HashSet<String> {
    redis.keys(&format!("{PREFIX}*")).into_iter().collect()
}

/// Poll until the fleet's tier holds one more entry than `before`; that
/// entry's Redis key.
fn new_entry(redis: &Redis, before: &HashSet<String>) -> String {
    poll_until(
        Duration::from_secs(10),
        "an entry in the shared tier",
        || entries(redis).difference(before).next().cloned(),
    )
}

/// Ask `e` (a miss), and wait until its answer is in the fleet's tier
/// (it goes at the replica's next tick).
fn answer_and_share(redis: &Redis, e: &Envoy, key: &str, body: &str) -> Resp {
    let before = entries(redis);
    let r = e_chat(e, key, body);
    assert_eq!((r.status, tier(&r)), (200, "miss"), "{}", r.body);
    new_entry(redis, &before);
    r
}

#[test]
fn a_prompt_answered_by_one_replica_is_a_shared_hit_on_another_and_on_one_started_afresh() {
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let (primary, backup) = (
        mock("primary", Some(PRIMARY_KEY)),
        mock("backup", Some(BACKUP_KEY)),
    );
    let p = plugin("shared", 4096, 200);
    let a = envoy(&p, &primary, &backup, limiter.port);
    let b = envoy(&p, &primary, &backup, limiter.port);

    // A plain answer: a miss on A, then B's first ask after A's tick is
    // the fleet's, with A's answer, and B's next is its own.
    primary.script(json!([{"content": "the fleet remembers"}]));
    let q = question("what does the fleet remember?", false);
    answer_and_share(&redis, &a, KEY_A, &q);
    let hit = e_chat(&b, KEY_A, &q);
    assert_eq!(
        (hit.status, tier(&hit)),
        (200, "hit-shared"),
        "{}",
        hit.body
    );
    assert_eq!(content(&hit), "the fleet remembers");
    assert_eq!(hit.header("content-type"), Some("application/json"));
    let again = ask(&b, KEY_B, "what does the fleet remember?");
    assert_eq!(tier(&again), "hit-local", "B keeps what the fleet answered");
    // Kept and counted as a store of B's own table (its bytes gauge too).
    b.wait_stat_at_least("wasmcustom.portcullis.cache.stores", 1);
    b.wait_stat_at_least("wasmcustom.portcullis.cache.bytes", 1);
    assert_eq!(content(&again), "the fleet remembers");
    assert_eq!(
        primary.requests().len(),
        1,
        "one answer from the provider in all"
    );
    // A's own repeat is a local hit.
    assert_eq!(
        tier(&ask(&a, KEY_C, "what does the fleet remember?")),
        "hit-local"
    );

    // A stream answered on A replays as a stream on B.
    primary.script(json!([{"content": "streamed once, replayed twice"}]));
    let body = question("stream it across the fleet", true);
    let first = answer_and_share(&redis, &a, KEY_A, &body);
    let (text, _, _) = stream_text(&first.body);
    assert_eq!(text, "streamed once, replayed twice");
    let replay = e_chat(&b, KEY_A, &body);
    assert_eq!(
        (replay.status, tier(&replay)),
        (200, "hit-shared"),
        "{}",
        replay.body
    );
    assert_eq!(replay.header("content-type"), Some("text/event-stream"));
    let (replayed, _, _) = stream_text(&replay.body);
    assert_eq!(replayed, text);
    assert!(
        replay.body.trim_end().ends_with("data: [DONE]"),
        "{}",
        replay.body
    );
    assert_eq!(primary.requests().len(), 2);

    // An answer over the size bound is not shared (nor kept): after a
    // small answer sent later is in Redis, the large one is not.
    let before = entries(&redis);
    let big = "x".repeat(6000);
    primary.script(json!([{"content": big}]));
    let r = ask(&a, KEY_A, "a long answer, please");
    assert_eq!((r.status, content(&r).len()), (200, 6000));
    let r = ask(&a, KEY_A, "and a short one");
    assert_eq!(r.status, 200);
    let small = new_entry(&redis, &before);
    assert_eq!(
        entries(&redis).difference(&before).count(),
        1,
        "only {small}"
    );

    // A replica started afresh answers from the fleet at once.
    drop(b);
    let c = envoy(&p, &primary, &backup, limiter.port);
    let r = ask(&c, KEY_B, "what does the fleet remember?");
    assert_eq!((r.status, tier(&r)), (200, "hit-shared"), "{}", r.body);
    assert_eq!(content(&r), "the fleet remembers");
    let r = ask(&c, KEY_A, "a long answer, please");
    assert_eq!(
        (r.status, tier(&r)),
        (200, "miss"),
        "the large answer was never shared"
    );
    c.wait_stat_at_least("wasmcustom.portcullis.cache.shared_hits", 1);
    c.wait_stat_at_least("wasmcustom.portcullis.cache.shared_misses", 1);
    a.wait_stat_at_least("wasmcustom.portcullis.cache.shared_stores", 3);
    assert_eq!(
        a.stat("wasmcustom.portcullis.cache.shared_errors")
            .unwrap_or(0),
        0
    );
}

#[test]
fn a_damaged_or_misplaced_entry_in_redis_is_a_miss_never_a_wrong_answer() {
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let (primary, backup) = (
        mock("primary", Some(PRIMARY_KEY)),
        mock("backup", Some(BACKUP_KEY)),
    );
    let p = plugin("shared", 65536, 200);
    let a = envoy(&p, &primary, &backup, limiter.port);
    let b = envoy(&p, &primary, &backup, limiter.port);

    // Store one entry per case through A, long enough to be compressed in
    // Redis for half of them; note each one's Redis key.
    let mut stored = Vec::new();
    for i in 0..8 {
        let before = entries(&redis);
        let answer = if i % 2 == 0 {
            format!("short answer {i}")
        } else {
            format!("answer {i}: {}", "compressible text ".repeat(100))
        };
        primary.script(json!([{ "content": answer }]));
        let prompt = format!("case {i}");
        assert_eq!(tier(&ask(&a, KEY_A, &prompt)), "miss");
        stored.push((prompt, answer, new_entry(&redis, &before)));
    }
    let raw = |k: &str| redis.get_raw(k).unwrap();
    let (k0, k1) = (stored[0].2.clone(), stored[1].2.clone());
    let good1 = raw(&k1);
    let damages: Vec<(&str, Vec<u8>)> = vec![
        ("truncated", raw(&k0)[..raw(&k0).len() - 3].to_vec()),
        ("a payload byte flipped (compressed)", {
            let mut v = good1.clone();
            let n = v.len();
            v[n - 5] ^= 0x20;
            v
        }),
        ("an expiry byte flipped", {
            let mut v = raw(&stored[2].2);
            v[3] ^= 1;
            v
        }),
        ("another entry's bytes under this key", good1.clone()),
        (
            "not an entry at all",
            b"{\"choices\":[{\"message\":{\"content\":\"forged\"}}]}".to_vec(),
        ),
        ("empty", Vec::new()),
        ("an unknown version", {
            let mut v = raw(&stored[6].2);
            v[0] = 9;
            v
        }),
        ("a compressed length over the bound", {
            let mut v = raw(&stored[7].2);
            v[18..22].copy_from_slice(&u32::MAX.to_le_bytes());
            v
        }),
    ];
    let targets = [0usize, 1, 2, 3, 4, 5, 6, 7];
    for ((what, bytes), i) in damages.iter().zip(targets) {
        assert!(redis.set_raw(&stored[i].2, bytes), "{what}: SET");
    }
    for ((what, _), i) in damages.iter().zip(targets) {
        let (prompt, answer, _) = &stored[i];
        primary.script(json!([{ "content": format!("fresh {i}") }]));
        let r = ask(&b, KEY_B, prompt);
        assert_eq!(r.status, 200, "{what}: {}", r.body);
        assert_eq!(tier(&r), "miss", "{what}: served from a damaged entry");
        assert_eq!(content(&r), format!("fresh {i}"), "{what}");
        assert_ne!(&content(&r), answer);
    }
    // The damaged entries are written again by B's fresh answers; A's own
    // copies still answer A (its table never read Redis for them).
    assert_eq!(tier(&ask(&a, KEY_A, "case 3")), "hit-local");
    assert_eq!(
        a.stat("wasmcustom.portcullis.cache.shared_errors")
            .unwrap_or(0),
        0
    );
    b.wait_stat_at_least("wasmcustom.portcullis.cache.shared_misses", 8);
}

#[test]
fn redis_away_or_slow_is_a_miss_within_the_timeout_and_back_is_a_hit() {
    let mut redis = Redis::start();
    let redis_port = redis.port;
    // The limiter waits for Redis up to 5 s: the filter's 100 ms lookup
    // timeout is what keeps a request from waiting that long.
    let limiter = Limiter::start_args(redis.port, 0, &["--redis-timeout-ms", "5000"]);
    let (primary, backup) = (
        mock("primary", Some(PRIMARY_KEY)),
        mock("backup", Some(BACKUP_KEY)),
    );
    let p = plugin("shared", 65536, 100);
    let a = envoy(&p, &primary, &backup, limiter.port);
    let b = envoy(&p, &primary, &backup, limiter.port);
    answer_and_share(&redis, &a, KEY_A, &question("before the outage", false));
    assert_eq!(tier(&ask(&b, KEY_A, "before the outage")), "hit-shared");

    // Redis stopped: every request is answered, a miss, the failed
    // lookups counted.
    redis.stop();
    for i in 0..10 {
        let r = ask(&b, KEY_A, &format!("during the outage {i}"));
        assert_eq!((r.status, tier(&r)), (200, "miss"), "{}", r.body);
    }
    b.wait_stat_at_least("wasmcustom.portcullis.cache.shared_errors", 10);
    // What B holds itself still answers.
    assert_eq!(tier(&ask(&b, KEY_A, "before the outage")), "hit-local");

    // Redis back on its port: shared again, without a restart.
    let redis = Redis::start_on(redis_port);
    // Stores fail until the limiter's connection is made again: ask
    // new prompts on A until one is in Redis, then B hits it.
    let mut n = 0;
    let back = poll_until(Duration::from_secs(30), "the fleet's tier again", || {
        n += 1;
        let prompt = format!("after the outage {n}");
        let r = ask(&a, KEY_A, &prompt);
        assert_eq!((r.status, tier(&r)), (200, "miss"));
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if !entries(&redis).is_empty() {
                return Some(prompt);
            }
            std::thread::park_timeout(Duration::from_millis(50));
        }
        None
    });
    assert_eq!(tier(&ask(&b, KEY_A, &back)), "hit-shared");
    eprintln!("shared again with {back:?}");

    // Redis paused (it answers nobody for 8 s): a lookup is a miss after
    // the filter's 100 ms, not after the limiter's 5 s.
    assert_eq!(
        redis
            .command(&["CLIENT", "PAUSE", "8000", "ALL"])
            .as_deref(),
        Some("+OK")
    );
    let errors = b
        .stat("wasmcustom.portcullis.cache.shared_errors")
        .unwrap_or(0);
    let started = Instant::now();
    let r = ask(&b, KEY_A, "while Redis is paused");
    let took = started.elapsed();
    assert_eq!((r.status, tier(&r)), (200, "miss"), "{}", r.body);
    assert!(
        took < Duration::from_millis(2500),
        "a paused Redis held the request {took:?}"
    );
    b.wait_stat_at_least("wasmcustom.portcullis.cache.shared_errors", errors + 1);
    let _ = redis.command(&["CLIENT", "UNPAUSE"]);
}

/// `scope: client`: random (key, prompt) pairs over two replicas. A pair
/// never asked before is never a hit, whoever asked its prompt; a repeat
/// is. Nothing in Redis names a client, its key or its key's hash.
#[test]
fn entries_a_key_owns_are_never_served_to_another_key_nor_name_one() {
    let redis = Redis::start();
    let limiter = Limiter::start(redis.port, 0);
    let (primary, backup) = (
        mock("primary", Some(PRIMARY_KEY)),
        mock("backup", Some(BACKUP_KEY)),
    );
    let p = plugin("client", 65536, 200);
    let a = envoy(&p, &primary, &backup, limiter.port);
    let b = envoy(&p, &primary, &backup, limiter.port);
    let keys = [KEY_A, KEY_B, KEY_C];
    let prompts = ["alpha", "beta", "gamma", "delta"];
    let mut seen: HashSet<(usize, usize)> = HashSet::new();
    let mut rng: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    let mut hits = 0;
    for round in 0..40 {
        let (k, q) = (next(keys.len()), next(prompts.len()));
        let e = if round % 2 == 0 { &a } else { &b };
        let calls = primary.requests().len();
        let r = ask(e, keys[k], prompts[q]);
        assert_eq!(r.status, 200, "{}", r.body);
        if !seen.contains(&(k, q)) {
            assert_eq!(
                tier(&r),
                "miss",
                "round {round}: key {k} got prompt {q} from another key"
            );
            assert_eq!(primary.requests().len(), calls + 1);
        } else if tier(&r).starts_with("hit") {
            hits += 1;
        }
        seen.insert((k, q));
        // Let this replica's tick share the answer before the next round.
        poll_until(Duration::from_secs(5), "the entry shared", || {
            (entries(&redis).len() >= seen.len()).then_some(())
        });
    }
    assert!(hits > 0, "repeats of a key's own prompts hit");
    let stored = entries(&redis);
    assert_eq!(stored.len(), seen.len(), "one entry per key and prompt");
    let mut forbidden: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    forbidden.extend(keys.iter().map(|k| key_hash(k)));
    forbidden.extend(["shared-a", "shared-b", "shared-c"].map(String::from));
    for k in &stored {
        let value = redis.get_raw(k).unwrap_or_default();
        for f in &forbidden {
            assert!(!k.contains(f.as_str()), "{k} names {f}");
            assert!(
                !value.windows(f.len()).any(|w| w == f.as_bytes()),
                "{k}'s value holds {f}"
            );
        }
    }
}
