//! Tests of `ratelimit`.

use super::*;
use crate::shared::store::{update, MemStore};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn fresh_bucket_is_full_and_refills_continuously() {
    let b = Bucket::default();
    let (b, t) = take(&b, 60, 1, 1_000);
    assert_eq!((t.admitted, t.remaining), (true, 59));
    assert_eq!(t.wait_ms, 1_000, "one unit back a second later at 60/min");
    let (b, _) = take(&b, 60, 59, 1_000);
    let (b2, t) = take(&b, 60, 1, 1_000);
    assert!(!t.admitted);
    assert_eq!((t.remaining, t.wait_ms), (0, 1_000));
    assert_eq!(b2.level_milli, 0);
    let (_, t) = take(&b, 60, 1, 2_000);
    assert!(t.admitted, "refilled after a second");
    let full = b.refilled(60, 1_000_000);
    assert_eq!(full.level_milli, 60_000, "capped at capacity");
}

#[test]
fn level_reads_without_taking() {
    let (b, _) = take(&Bucket::default(), 60, 30, 0);
    assert_eq!(
        level(&b, 60, 0),
        Take {
            admitted: true,
            remaining: 30,
            wait_ms: 30_000
        }
    );
    assert_eq!(level(&b, 60, 10_000).remaining, 40);
    assert_eq!(
        level(&Bucket::default(), 60, 5).remaining,
        60,
        "a fresh bucket is full"
    );
}

#[test]
fn slow_rates_refill_exactly() {
    // 1 per minute: 1/60000 per ms; after 30 s half a unit.
    let (b, _) = take(&Bucket::default(), 1, 1, 0);
    assert_eq!(b.refilled(1, 30_000).level_milli, 500);
    let (_, t) = take(&b, 1, 1, 30_000);
    assert_eq!((t.admitted, t.wait_ms), (false, 30_000));
}

#[test]
fn settlement_refunds_and_debt() {
    let (b, _) = take(&Bucket::default(), 1000, 300, 0);
    assert_eq!(adjust(&b, 1000, 250, 0).level_milli, 950_000);
    let debt = adjust(&b, 1000, -800, 0);
    assert_eq!(debt.level_milli, -100_000);
    let (_, t) = take(&debt, 1000, 1, 0);
    assert!(!t.admitted);
    assert_eq!(
        adjust(&b, 1000, 10_000, 0).level_milli,
        1_000_000,
        "never above capacity"
    );
}

#[test]
fn encoding_round_trips() {
    let b = Bucket {
        level_milli: -5,
        updated_ms: 99,
        initialized: true,
        cap_milli: 2000,
    };
    assert_eq!(Bucket::decode(Some(&b.encode())), b);
    assert_eq!(Bucket::decode(Some(b"x")), Bucket::default());
    // A value written before the capacity was kept reads, capacity unknown.
    let old = &b.encode()[..17];
    assert_eq!(Bucket::decode(Some(old)), Bucket { cap_milli: 0, ..b });
}

#[test]
fn a_raised_limit_admits_at_once_and_a_lowered_one_grants_no_burst() {
    // 2 a minute, both used.
    let (b, _) = take(&Bucket::default(), 2, 1, 0);
    let (b, t) = take(&b, 2, 1, 10);
    assert!(t.admitted);
    let (b, t) = take(&b, 2, 1, 20);
    assert!(!t.admitted, "the old limit is spent");
    // Raised to 100: what was used stays used, the rest is there at once.
    let (b, t) = take(&b, 100, 1, 30);
    assert!(t.admitted, "a raised limit admits at once");
    assert_eq!(t.remaining, 97);
    // Lowered to 3 with 97 left: capped at 3, no burst past it.
    let (mut b, _) = take(&b, 3, 0, 40);
    let mut admitted = 0;
    for i in 0..10 {
        let (next, t) = take(&b, 3, 1, 50 + i);
        b = next;
        admitted += u32::from(t.admitted);
    }
    assert_eq!(admitted, 3, "a lowered limit grants at most its capacity");
    // A bucket from before the capacity was kept refills as it did.
    let old = Bucket {
        level_milli: 0,
        updated_ms: 0,
        initialized: true,
        cap_milli: 0,
    };
    assert!(!take(&old, 100, 1, 1).1.admitted);
}

#[test]
fn concurrency_counter() {
    let (v, ok) = acquire(None, 1);
    assert!(ok);
    assert_eq!(acquire(v.as_deref(), 1), (None, false));
    assert_eq!(decode_u32(release(v.as_deref()).as_deref()), 0);
    assert_eq!(release(None), None);
}

#[test]
fn budget_reserves_and_settles_in_micro_dollars() {
    let p = Price {
        input: 0.15,
        output: 0.60,
        cached_input: 0.075,
        cache_write: 0.15,
        reasoning: 0.0,
        ..Default::default()
    };
    assert_eq!(p.cost(1_000_000, 0, 0), 150_000);
    assert_eq!(p.cost(1000, 1000, 400), 90 + 30 + 600);
}

#[test]
fn completion_room_is_what_a_budget_still_pays_for() {
    let p = Price {
        input: 0.15,
        output: 0.60,
        cached_input: 0.15,
        cache_write: 0.15,
        reasoning: 0.0,
        ..Default::default()
    };
    // 1000 micro-USD left, a prompt of 100 tokens (15 micro-USD): 984 / 0.6.
    let room = p.completion_room(1000, 100);
    assert_eq!(room, 1640);
    assert!(p.cost(100, room, 0) <= 1000, "the clamped request fits");
    assert!(p.cost(100, room + 2, 0) > 1000);
    assert_eq!(
        p.completion_room(10, 100),
        0,
        "the prompt alone does not fit"
    );
    assert_eq!(p.completion_room(-5, 0), 0, "in debt");
    let free = Price { output: 0.0, ..p };
    assert_eq!(free.completion_room(1000, 1), u64::MAX);
}

#[test]
fn reset_text_is_openais_format() {
    assert_eq!(reset_text(250), "250ms");
    assert_eq!(reset_text(1_000), "1s");
    assert_eq!(reset_text(360_000), "6m0s");
    assert_eq!(reset_text(3_723_000), "1h2m3s");
    assert_eq!(reset_text(0), "0ms");
    assert_eq!(reset_text(3_600_000), "1h0m0s");
    // Written by hand, it says what the formatter said, to the largest.
    let formatted = |ms: u64| {
        if ms < 1000 {
            return format!("{ms}ms");
        }
        let s = ms.div_ceil(1000);
        let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
        if h > 0 {
            format!("{h}h{m}m{s}s")
        } else if m > 0 {
            format!("{m}m{s}s")
        } else {
            format!("{s}s")
        }
    };
    let mut ms = 0u64;
    while ms < u64::MAX / 3 {
        assert_eq!(reset_text(ms), formatted(ms), "{ms}");
        ms = ms.saturating_mul(3).saturating_add(7);
    }
    for ms in [999, 1_000, 1_001, 59_999, 60_000, 3_599_001, u64::MAX] {
        assert_eq!(reset_text(ms), formatted(ms), "{ms}");
    }
}

/// 2^63 wrapped to a negative take (the bucket grew past its cap and
/// later takes were refused); 2^64-1 wrapped to a tiny one.
#[test]
fn huge_amounts_saturate_and_are_refused_without_touching_the_bucket() {
    let (b, _) = take(&Bucket::default(), 1_000, 10, 0);
    for amount in [1u64 << 63, u64::MAX, u64::MAX / 1000 + 1] {
        let (next, t) = take(&b, 1_000, amount, 0);
        assert!(!t.admitted, "{amount}");
        assert_eq!(next, b, "a refused take leaves the level as it was");
        assert!(t.wait_ms > 0);
    }
    let (_, t) = take(&b, 1_000, 1, 0);
    assert!(t.admitted, "the bucket still serves small requests");
    assert_eq!(t.remaining, 989);
    let back = adjust(&b, 1_000, signed(u64::MAX), 0);
    assert_eq!(
        back.level_milli, 1_000_000,
        "a huge give-back stops at capacity"
    );
    let debt = adjust(&b, 1_000, signed(u64::MAX).saturating_neg(), 0);
    assert!(
        debt.level_milli < 0,
        "a huge settlement is debt, not a wrap"
    );
    let p = Price {
        input: 2.5,
        output: 10.0,
        cached_input: 1.25,
        cache_write: 2.5,
        reasoning: 0.0,
        ..Default::default()
    };
    assert_eq!(p.cost(u64::MAX, u64::MAX, 0), Micros::MAX);
    let mut c = crate::limits::counters::Counters::default();
    let day = crate::limits::period::Period::Day;
    assert_eq!(c.spend(day, 1, 5_000_000, Micros::MAX), None);
    assert_eq!(reservation(usize::MAX, Some(u64::MAX), 0).1, u64::MAX);
}

#[test]
fn reservation_estimates() {
    assert_eq!(reservation(400, Some(50), 1024), (100, 50));
    assert_eq!(reservation(401, None, 1024), (101, 1024));
}

#[test]
fn concurrent_takes_never_admit_past_the_limit() {
    // Before each of our writes another worker takes a token of its own
    // between our read and our write; together only capacity is admitted.
    let s = MemStore::default();
    let theirs = std::rc::Rc::new(std::cell::Cell::new(0u32));
    let mut ours = 0;
    for _ in 0..20 {
        let count = theirs.clone();
        s.inject_conflicts(1, move |v| {
            let (next, t) = take(&Bucket::decode(Some(v)), 10, 1, 0);
            count.set(count.get() + u32::from(t.admitted));
            next.encode()
        });
        let ok = update(&s, "b", |cur| {
            let (next, t) = take(&Bucket::decode(cur), 10, 1, 0);
            (Some(next.encode()), t.admitted)
        })
        .unwrap();
        ours += u32::from(ok);
    }
    // The very first write creates the key (nobody races it), then each
    // round the other worker takes first: 1 + 5 + 4 or so, exactly 10.
    assert!(
        theirs.get() > 0 && ours > 1,
        "ours {ours}, theirs {}",
        theirs.get()
    );
    assert_eq!(
        ours + theirs.get(),
        10,
        "ours {ours}, theirs {}",
        theirs.get()
    );
}
