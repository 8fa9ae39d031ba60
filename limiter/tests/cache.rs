#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! The shared cache's entries against a real `redis-server`: what is kept
//! reads back whole (compressed when that pays), what is refused is not
//! kept, and nothing that does not check whole is ever an answer.

use portcullis_limiter::cache::{decode, encode, SharedCache, KEY_LEN};
use portcullis_limiter::cache_proto::{Entry, PutRequest};
use portcullis_tests::Redis;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

#[test]
fn entries_read_back_whole_or_not_at_all() {
    let key = [3u8; KEY_LEN];
    let short = b"{\"id\":\"short\"}".to_vec();
    let long = "the same words again, ".repeat(200).into_bytes();
    for answer in [&short, &long] {
        let e = encode(&key, answer, 77);
        assert_eq!(decode(&key, &e, 1 << 20), Some((answer.clone(), 77)));
        // Another key, any truncation: no answer. Any single flipped bit:
        // no answer, or (a compressed block spelled another way that
        // decompresses to the same bytes) the very answer kept: never
        // another.
        assert_eq!(decode(&[4u8; KEY_LEN], &e, 1 << 20), None);
        let mut same = 0;
        for i in 0..e.len() {
            for bit in [0x01u8, 0x80] {
                let mut bad = e.clone();
                bad[i] ^= bit;
                match decode(&key, &bad, 1 << 20) {
                    None => {}
                    Some((a, 77)) if &a == answer => same += 1,
                    Some(_) => panic!("byte {i} bit {bit:#x}: another answer"),
                }
            }
        }
        assert!(
            same * 50 < e.len(),
            "{same} flips of {} read the same",
            e.len() * 2
        );
        for cut in 0..e.len() {
            assert_eq!(decode(&key, &e[..cut], 1 << 20), None, "cut at {cut}");
        }
        // Larger than the reader allows.
        assert_eq!(decode(&key, &e, answer.len() - 1), None);
    }
    // Compression is used when it pays, not for a short answer.
    assert_eq!(encode(&key, &short, 1).len(), short.len() + 18);
    let packed = encode(&key, &long, 1).len();
    assert!(packed * 4 < long.len(), "{packed} of {}", long.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_entries_are_found_and_refused_ones_are_not() {
    let r = Redis::start();
    let c = SharedCache::new(
        &format!("redis://127.0.0.1:{}", r.port),
        "t:cache:",
        Duration::from_millis(500),
        1000,
    )
    .unwrap();
    let later = now_ms() + 60_000;
    let entry = |k: u8, len: usize, expires_ms: u64| Entry {
        key: vec![k; KEY_LEN],
        answer: vec![b'a'; len],
        expires_ms,
    };
    let put = c
        .put(&PutRequest {
            entries: vec![
                entry(1, 10, later),
                entry(2, 1000, later),
                // Over the bound, already expired, empty, a short key.
                entry(3, 1001, later),
                entry(4, 10, now_ms() - 1),
                entry(5, 0, later),
                Entry {
                    key: vec![6; 31],
                    answer: b"x".to_vec(),
                    expires_ms: later,
                },
            ],
        })
        .await
        .unwrap();
    assert_eq!((put.stored, put.refused), (2, 4));
    for k in [1u8, 2] {
        let got = c.get(&[k; KEY_LEN]).await.unwrap();
        assert!(got.found, "{k}");
        assert_eq!(got.key, vec![k; KEY_LEN]);
        assert_eq!(got.expires_ms, later);
    }
    for k in [3u8, 4, 5, 9] {
        assert!(!c.get(&[k; KEY_LEN]).await.unwrap().found, "{k}");
    }
    assert!(c.get(&[1; 31]).await.is_err(), "a short key is refused");
    // Redis drops an entry at its expiry too.
    let ttl = r
        .command(&["PTTL", &format!("t:cache:{}", "01".repeat(32))])
        .unwrap();
    let ttl: i64 = ttl.trim_start_matches(':').parse().unwrap();
    assert!(ttl > 50_000 && ttl <= 60_000, "{ttl}");
    // Something else under an entry's key is a miss, counted as damaged.
    assert!(r.set_raw(&format!("t:cache:{}", "02".repeat(32)), b"not an entry"));
    assert!(!c.get(&[2; KEY_LEN]).await.unwrap().found);
    let damaged = c.counts.damaged.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(damaged, 1);
    // Redis gone: an error (the gateway's miss), not a hang.
    drop(r);
    assert!(c.get(&[1; KEY_LEN]).await.is_err());
}

/// With a token, calls without it are refused and counted: nobody else on
/// the limiter's network reads the fleet's answers or plants one.
#[tokio::test]
async fn calls_without_the_token_are_refused() {
    use portcullis_limiter::cache_proto::cache_server::Cache;
    use portcullis_limiter::cache_proto::GetRequest;
    let c = SharedCache::new(
        "redis://127.0.0.1:1",
        "t:",
        Duration::from_millis(100),
        1000,
    )
    .unwrap()
    .with_token(Some("secret".into()));
    let get = || {
        tonic::Request::new(GetRequest {
            key: vec![1; KEY_LEN],
        })
    };
    let e = Cache::get(&c, get()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let e = Cache::put(&c, tonic::Request::new(PutRequest { entries: vec![] }))
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let mut wrong = get();
    wrong
        .metadata_mut()
        .insert("authorization", "Bearer other".parse().unwrap());
    assert_eq!(
        Cache::get(&c, wrong).await.unwrap_err().code(),
        tonic::Code::Unauthenticated
    );
    let mut right = get();
    right
        .metadata_mut()
        .insert("authorization", "Bearer secret".parse().unwrap());
    // Past the token: Redis is away (port 1), so UNAVAILABLE.
    assert_eq!(
        Cache::get(&c, right).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );
    assert_eq!(
        c.counts
            .unauthenticated
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
}
