#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::panic
)]
//! The limiter against a real `redis-server` (Debian's, started here on a
//! free port): the script's decisions, atomic under concurrency, and what
//! happens when Redis goes away and comes back.

use portcullis_limiter::proto::{Entry, RateLimitDescriptor, RateLimitOverride, RateLimitRequest};
use portcullis_limiter::service::Limiter;
// The suite's Redis (tests/src/lib.rs): Debian's redis-server on a free port.
use portcullis_tests::Redis;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn descriptor(client: &str, limit: &str, per_unit: u32, unit: u32) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: vec![
            Entry {
                key: "client".into(),
                value: client.into(),
            },
            Entry {
                key: "limit".into(),
                value: limit.into(),
            },
        ],
        limit: Some(RateLimitOverride {
            requests_per_unit: per_unit,
            unit,
        }),
        hits_addend: None,
    }
}

fn request(descriptors: Vec<RateLimitDescriptor>, hits: u32) -> RateLimitRequest {
    RateLimitRequest {
        domain: "portcullis".into(),
        descriptors,
        hits_addend: hits,
    }
}

fn limiter(r: &Redis) -> Limiter {
    Limiter::new(
        &format!("redis://127.0.0.1:{}", r.port),
        "t:",
        Duration::from_millis(300),
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_admit_exactly_the_limit() {
    let redis = Redis::start();
    let l = Arc::new(limiter(&redis));
    let mut tasks = Vec::new();
    for _ in 0..200 {
        let l = l.clone();
        tasks.push(tokio::spawn(async move {
            let r = l
                .decide(&request(vec![descriptor("a", "rpm", 40, 2)], 1))
                .await
                .unwrap();
            r.overall_code == 1
        }));
    }
    let mut admitted = 0;
    for t in tasks {
        admitted += usize::from(t.await.unwrap());
    }
    // A burst well under a second: refill adds at most 40/60 per second.
    assert!(
        (40..=41).contains(&admitted),
        "admitted {admitted} of 200 for a limit of 40"
    );
}

#[tokio::test]
async fn weighted_hits_windows_and_all_or_nothing() {
    let redis = Redis::start();
    let l = limiter(&redis);
    // Tokens: 1000 per minute, reservations of 400.
    let tpm = || descriptor("b", "tpm", 1000, 2);
    let r1 = l.decide(&request(vec![tpm()], 400)).await.unwrap();
    assert_eq!(r1.overall_code, 1);
    assert!((599..=600).contains(&r1.statuses[0].limit_remaining));
    assert_eq!(
        l.decide(&request(vec![tpm()], 400))
            .await
            .unwrap()
            .overall_code,
        1
    );
    let refused = l.decide(&request(vec![tpm()], 400)).await.unwrap();
    assert_eq!(refused.overall_code, 2);
    let wait = refused.statuses[0].duration_until_reset.unwrap();
    assert!(wait.seconds >= 10 && wait.seconds <= 13, "{wait:?}");
    // A day's budget: a fixed window that does not refill.
    let day = || {
        let mut d = descriptor("b", "budget", 10, 4);
        d.entries.push(Entry {
            key: "day".into(),
            value: "2026-11-30".into(),
        });
        d
    };
    assert_eq!(
        l.decide(&request(vec![day()], 10))
            .await
            .unwrap()
            .overall_code,
        1
    );
    assert_eq!(
        l.decide(&request(vec![day()], 1))
            .await
            .unwrap()
            .overall_code,
        2
    );
    // All or nothing: the refused budget leaves the request count untouched.
    let rpm = || descriptor("c", "rpm", 1, 2);
    let mut both = request(vec![rpm(), day()], 1);
    both.hits_addend = 1;
    assert_eq!(l.decide(&both).await.unwrap().overall_code, 2);
    assert_eq!(
        l.decide(&request(vec![rpm()], 1))
            .await
            .unwrap()
            .overall_code,
        1
    );
    // No limit on a descriptor: not counted here.
    let mut free = descriptor("d", "x", 1, 2);
    free.limit = None;
    let r = l
        .decide(&request(vec![free.clone(), free], 1))
        .await
        .unwrap();
    assert_eq!((r.overall_code, r.statuses.len()), (1, 2));
    // Nonsense limits are refused as arguments, not counted.
    assert!(l
        .decide(&request(vec![descriptor("e", "x", 1, 42)], 1))
        .await
        .is_err());
    assert!(l
        .decide(&request(vec![descriptor("e", "x", 0, 2)], 1))
        .await
        .is_err());
}

/// One call for every kind of limit (#34): each descriptor counts its own
/// `hits_addend` (Envoy's descriptor-level field, overriding the
/// request's), and the call is admitted whole or not at all.
#[tokio::test]
async fn each_descriptor_counts_its_own_hits_in_one_call() {
    let redis = Redis::start();
    let l = limiter(&redis);
    let with_hits = |mut d: RateLimitDescriptor, hits: u64| {
        d.hits_addend = Some(portcullis_limiter::proto::Hits { value: hits });
        d
    };
    let rpm = || descriptor("w", "rpm", 10, 2);
    let tpm = || descriptor("w", "tpm", 1000, 2);
    // The request's own hits_addend (7) is overridden by each descriptor's.
    let call = || request(vec![with_hits(rpm(), 1), with_hits(tpm(), 600)], 7);
    let r = l.decide(&call()).await.unwrap();
    assert_eq!(r.overall_code, 1);
    assert!((9..=9).contains(&r.statuses[0].limit_remaining), "{r:?}");
    assert!(
        (399..=400).contains(&r.statuses[1].limit_remaining),
        "{r:?}"
    );
    // The tokens no longer fit: neither limit is counted.
    let refused = l.decide(&call()).await.unwrap();
    assert_eq!(
        (
            refused.overall_code,
            refused.statuses[0].code,
            refused.statuses[1].code
        ),
        (2, 1, 2)
    );
    let after = l
        .decide(&request(vec![with_hits(rpm(), 0)], 1))
        .await
        .unwrap();
    assert_eq!(
        after.statuses[0].limit_remaining, 9,
        "the refused call took no request"
    );
    // Without a descriptor's own hits, the request's apply.
    let r = l.decide(&request(vec![rpm()], 3)).await.unwrap();
    assert_eq!(r.statuses[0].limit_remaining, 6);
}

#[tokio::test]
async fn redis_away_is_unavailable_and_its_return_is_noticed() {
    let mut redis = Redis::start();
    let port = redis.port;
    let l = limiter(&redis);
    let d = || request(vec![descriptor("f", "rpm", 100, 2)], 1);
    assert_eq!(l.decide(&d()).await.unwrap().overall_code, 1);
    redis.stop();
    let e = l.decide(&d()).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    let _back = Redis::start_on(port);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match l.decide(&d()).await {
            Ok(r) => {
                assert_eq!(r.overall_code, 1);
                break;
            }
            Err(e) => assert!(Instant::now() < deadline, "no recovery: {e:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_limiter_starts_before_redis() {
    let port = portcullis_tests::dead_port();
    let l = Limiter::new(
        &format!("redis://127.0.0.1:{port}"),
        "t:",
        Duration::from_millis(200),
    )
    .unwrap();
    let d = request(vec![descriptor("g", "rpm", 5, 2)], 1);
    assert_eq!(
        l.decide(&d).await.unwrap_err().code(),
        tonic::Code::Unavailable
    );
    let _redis = Redis::start_on(port);
    assert_eq!(l.decide(&d).await.unwrap().overall_code, 1);
}
