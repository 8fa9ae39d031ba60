//! Tests of `breaker`.

use super::*;
use crate::shared::store::{update, MemStore, Store};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const CFG: BreakerConfig = BreakerConfig {
    consecutive_failures: 3,
    failure_ratio: Some(0.5),
    min_requests: 10,
    window_ms: 1_000,
    cooldown_ms: 5_000,
    half_open_probes: 2,
    probe_timeout_ms: 30_000,
};

fn fail(b: &Breaker, now: u64) -> (Breaker, Option<Transition>) {
    let (n, t) = on_result(b, &CFG, now, false, false);
    (n.unwrap_or(*b), t)
}

#[test]
fn encoding_round_trips_and_garbage_reads_as_closed() {
    let b = Breaker {
        state: State::HalfOpen,
        consecutive_failures: 2,
        window_start_ms: 77,
        window_total: 9,
        window_failures: 4,
        since_ms: u64::MAX - 1,
        probes_in_flight: 3,
    };
    assert_eq!(b.encode().len(), ENCODED_LEN);
    assert_eq!(Breaker::decode(Some(&b.encode())), b);
    assert_eq!(Breaker::decode(Some(b"short")), Breaker::default());
    assert_eq!(Breaker::decode(None), Breaker::default());
}

#[test]
fn transitions_table() {
    let open = Breaker {
        state: State::Open,
        since_ms: 100,
        ..Breaker::default()
    };
    let half = |probes| Breaker {
        state: State::HalfOpen,
        since_ms: 200,
        probes_in_flight: probes,
        ..Breaker::default()
    };
    // (state, now, admission expected)
    let cases: &[(Breaker, u64, Admission)] = &[
        (Breaker::default(), 0, Admission::Allowed),
        (
            open,
            100,
            Admission::Refused {
                retry_after_ms: 5_000,
            },
        ),
        (open, 5_099, Admission::Refused { retry_after_ms: 1 }),
        (open, 5_100, Admission::Probe),
        (half(0), 300, Admission::Probe),
        (half(1), 300, Admission::Probe),
        (
            half(2),
            300,
            Admission::Refused {
                retry_after_ms: 5_000,
            },
        ),
        (
            half(2),
            29_000,
            Admission::Refused {
                retry_after_ms: 1_200,
            },
        ),
        (half(2), 30_200, Admission::Probe),
    ];
    for (b, now, want) in cases {
        assert_eq!(admit(b, &CFG, *now).1, *want, "{b:?} at {now}");
    }
    assert_eq!(
        admit(&open, &CFG, 5_100).2,
        Some(Transition {
            from: State::Open,
            to: State::HalfOpen
        })
    );
}

#[test]
fn consecutive_failures_open_and_a_success_resets_the_count() {
    let mut b = Breaker::default();
    (b, _) = fail(&b, 0);
    (b, _) = fail(&b, 1);
    b = on_result(&b, &CFG, 2, true, false).0.unwrap();
    assert_eq!(b.consecutive_failures, 0);
    (b, _) = fail(&b, 3);
    (b, _) = fail(&b, 4);
    let (b, t) = fail(&b, 5);
    assert_eq!(
        (b.state, t),
        (
            State::Open,
            Some(Transition {
                from: State::Closed,
                to: State::Open
            })
        )
    );
    assert_eq!(b.since_ms, 5);
}

#[test]
fn failure_ratio_opens_only_past_min_requests_within_the_window() {
    let mut b = Breaker::default();
    // Alternate success/failure: never 3 in a row, ratio 0.5.
    for i in 0..9u64 {
        b = on_result(&b, &CFG, i, i % 2 == 1, false).0.unwrap();
    }
    assert_eq!(b.state, State::Closed, "9 requests < min_requests");
    let (b2, t) = fail(&b, 9);
    assert_eq!(b2.state, State::Open, "{t:?}");
    // The same pattern spread over windows never reaches min_requests.
    let mut b = Breaker::default();
    for i in 0..30u64 {
        b = on_result(&b, &CFG, i * 300, i % 2 == 1, false).0.unwrap();
    }
    assert_eq!(b.state, State::Closed);
}

#[test]
fn probe_success_closes_and_probe_failure_reopens() {
    let half = Breaker {
        state: State::HalfOpen,
        since_ms: 10,
        probes_in_flight: 1,
        ..Breaker::default()
    };
    let (n, t) = on_result(&half, &CFG, 20, true, true);
    assert_eq!(n.unwrap().state, State::Closed);
    assert_eq!(
        t,
        Some(Transition {
            from: State::HalfOpen,
            to: State::Closed
        })
    );
    let (n, _) = on_result(&half, &CFG, 20, false, true);
    assert_eq!(
        n.unwrap(),
        Breaker {
            state: State::Open,
            since_ms: 20,
            ..Breaker::default()
        }
    );
    // Results of non-probe requests while half-open or open are ignored.
    assert_eq!(on_result(&half, &CFG, 20, false, false), (None, None));
    let open = Breaker {
        state: State::Open,
        since_ms: 10,
        ..Breaker::default()
    };
    assert_eq!(on_result(&open, &CFG, 20, true, false), (None, None));
}

#[test]
fn released_probe_frees_its_slot() {
    let half = Breaker {
        state: State::HalfOpen,
        since_ms: 10,
        probes_in_flight: 2,
        ..Breaker::default()
    };
    assert_eq!(release_probe(&half).unwrap().probes_in_flight, 1);
    assert_eq!(release_probe(&Breaker::default()), None);
}

fn admit_in(store: &MemStore, now: u64) -> Admission {
    update(store, "b", |cur| {
        let (next, adm, _) = admit(&Breaker::decode(cur), &CFG, now);
        (next.map(|n| n.encode()), adm)
    })
    .unwrap()
}

#[test]
fn probe_limit_holds_when_other_workers_race_for_probes() {
    let store = MemStore::default();
    let open = Breaker {
        state: State::Open,
        since_ms: 0,
        ..Breaker::default()
    };
    store.set("b", &open.encode(), None).unwrap();
    // Another worker takes the first probe between our read and write.
    store.inject_conflicts(1, |_| {
        Breaker {
            state: State::HalfOpen,
            since_ms: 5_000,
            probes_in_flight: 1,
            ..Breaker::default()
        }
        .encode()
    });
    assert_eq!(admit_in(&store, 5_000), Admission::Probe);
    let b = Breaker::decode(store.get("b").unwrap().0.as_deref());
    assert_eq!(
        b.probes_in_flight, 2,
        "our probe is counted on top of theirs"
    );
    assert!(
        matches!(admit_in(&store, 5_001), Admission::Refused { .. }),
        "limit of 2 reached"
    );
}

#[test]
fn failures_recorded_under_contention_are_all_counted() {
    let store = MemStore::default();
    store.inject_conflicts(2, |v| {
        let b = Breaker::decode(Some(v));
        on_result(&b, &CFG, 0, false, false).0.unwrap().encode()
    });
    store.set("b", &Breaker::default().encode(), None).unwrap();
    store.inject_conflicts(2, |v| {
        let b = Breaker::decode(Some(v));
        on_result(&b, &CFG, 0, false, false).0.unwrap().encode()
    });
    let t = update(&store, "b", |cur| {
        let (n, t) = on_result(&Breaker::decode(cur), &CFG, 0, false, false);
        (n.map(|n| n.encode()), t)
    })
    .unwrap();
    // Two interfering failures + ours = 3 in a row: ours is the one that opens it.
    assert_eq!(
        t,
        Some(Transition {
            from: State::Closed,
            to: State::Open
        })
    );
}
