use super::*;
use crate::wire::pb;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

#[test]
fn dates_of_day_numbers() {
    assert_eq!(iso_date(0), "1970-01-01");
    assert_eq!(iso_date(20_787), "2026-11-30");
    assert_eq!(iso_date(11_016), "2000-02-29");
    assert_eq!(iso_date(47_541), "2100-03-01");
    // Far beyond any clock: saturates, never panics.
    assert!(iso_date(u64::MAX).len() >= 10);
}

#[test]
fn budget_units_round_up() {
    assert_eq!(budget_units(0), 0);
    assert_eq!(budget_units(1), 1);
    assert_eq!(budget_units(100), 1);
    assert_eq!(budget_units(101), 2);
    assert_eq!(budget_units(-5), 0);
}

#[test]
fn request_bytes_are_the_protocol() {
    let d = Limit::RequestsPerMinute.descriptor(Owner::Key("alice"), 600);
    let m = encode_request(&[d], 1);
    let mut want = Vec::new();
    pb::bytes(&mut want, 1, b"portcullis");
    let mut dm = Vec::new();
    for (k, v) in [("client", "alice"), ("limit", "requests_per_minute")] {
        let mut e = Vec::new();
        pb::bytes(&mut e, 1, k.as_bytes());
        pb::bytes(&mut e, 2, v.as_bytes());
        pb::message(&mut dm, 1, &e);
    }
    pb::message(&mut dm, 2, &[0x08, 0xd8, 0x04, 0x10, 0x02]);
    pb::message(&mut want, 2, &dm);
    want.extend_from_slice(&[0x18, 0x01]);
    assert_eq!(m, want);
    let b = Limit::Budget(Period::Day, 20_787).descriptor(Owner::Key("alice"), 5);
    assert_eq!(b.entries.last(), Some(&("day", "2026-11-30".to_string())));
    assert_eq!(b.unit, Unit::Day);
}

#[test]
fn team_and_period_descriptors_name_their_window() {
    let week = Period::Week.index(1_796_196_600_000, 0);
    let d = Limit::Budget(Period::Week, week).descriptor(Owner::Team("research"), 9);
    assert_eq!(
        d.entries,
        vec![
            ("team", "research".to_string()),
            ("limit", "budget_usd_per_week".to_string()),
            ("week", "2026-11-30".to_string()),
        ]
    );
    assert_eq!(d.unit, Unit::Week);
    let m = Limit::Budget(Period::Month, 2026 * 12 + 11).descriptor(Owner::Key("a"), 9);
    assert_eq!(m.entries.last(), Some(&("month", "2026-12".to_string())));
    assert_eq!(m.unit, Unit::Month);
    let t = Limit::Budget(Period::Total, 0).descriptor(Owner::Key("a"), 9);
    assert_eq!(t.entries.len(), 2, "a total budget names no window");
    assert_eq!(t.unit, Unit::Year);
}

fn answer(overall: u64, statuses: &[(u64, u32, u32, u64)]) -> Vec<u8> {
    let mut out = Vec::new();
    pb::uint(&mut out, 1, overall);
    for &(code, limit, remaining, reset_s) in statuses {
        let mut s = Vec::new();
        pb::uint(&mut s, 1, code);
        let mut l = Vec::new();
        pb::uint(&mut l, 1, u64::from(limit));
        pb::uint(&mut l, 2, 2);
        pb::message(&mut s, 2, &l);
        pb::uint(&mut s, 3, u64::from(remaining));
        let mut d = Vec::new();
        pb::uint(&mut d, 1, reset_s);
        pb::uint(&mut d, 2, 500_000_000);
        pb::message(&mut s, 4, &d);
        pb::message(&mut out, 2, &s);
    }
    out
}

#[test]
fn answers_become_verdicts() {
    let ok = answer(1, &[(1, 10, 7, 3)]);
    assert_eq!(
        verdict(&ok, 1),
        Verdict::Ok(Some((
            0,
            Status {
                code: Code::Ok,
                limit: Some(10),
                remaining: 7,
                reset_ms: 3500
            }
        )))
    );
    let over = answer(2, &[(1, 10, 3, 1), (2, 100, 0, 12)]);
    match verdict(&over, 2) {
        Verdict::OverLimit(Some((1, s))) => {
            assert_eq!((s.limit, s.reset_ms), (Some(100), 12_500))
        }
        v => panic!("{v:?}"),
    }
    // Admitted at every level: the tightest one is shown.
    let ok = answer(1, &[(1, 10, 7, 3), (1, 50, 2, 3), (1, 9, 5, 1)]);
    assert!(matches!(verdict(&ok, 3), Verdict::Ok(Some((1, s))) if s.remaining == 2));
    // The statuses may be left out.
    assert_eq!(verdict(&answer(1, &[]), 3), Verdict::Ok(None));
    assert_eq!(verdict(&answer(2, &[]), 3), Verdict::OverLimit(None));
}

#[test]
fn answers_the_gateway_cannot_use() {
    // An empty message: overall UNKNOWN.
    assert!(matches!(verdict(&[], 1), Verdict::Unusable(_)));
    assert!(matches!(verdict(&answer(7, &[]), 1), Verdict::Unusable(_)));
    // Statuses that do not match the descriptors.
    assert!(matches!(
        verdict(&answer(1, &[(1, 1, 1, 1)]), 2),
        Verdict::Unusable(_)
    ));
    // Garbage, truncation, wrong wire types, numbers out of range.
    assert!(matches!(verdict(b"<html>", 1), Verdict::Unusable(_)));
    let ok = answer(1, &[(1, 10, 7, 3)]);
    for cut in 1..ok.len() {
        let v = verdict(ok.get(..cut).unwrap_or_default(), 1);
        assert!(
            matches!(v, Verdict::Unusable(_) | Verdict::Ok(_)),
            "cut at {cut}: {v:?}"
        );
    }
    assert!(matches!(verdict(&[0x0a, 0x00], 1), Verdict::Unusable(_)));
    let mut big = Vec::new();
    let mut s = Vec::new();
    pb::uint(&mut s, 3, u64::from(u32::MAX) + 1);
    pb::uint(&mut big, 1, 1);
    pb::message(&mut big, 2, &s);
    assert!(matches!(verdict(&big, 1), Verdict::Unusable(_)));
    // A negative duration reads as 0, not as centuries.
    let mut neg = Vec::new();
    let mut s = Vec::new();
    pb::uint(&mut s, 1, 1);
    let mut d = Vec::new();
    pb::uint(&mut d, 1, (-5i64) as u64);
    pb::message(&mut s, 4, &d);
    pb::uint(&mut neg, 1, 1);
    pb::message(&mut neg, 2, &s);
    assert!(matches!(
        verdict(&neg, 1),
        Verdict::Ok(Some((_, Status { reset_ms: 0, .. })))
    ));
}

/// One call for every kind of limit (#34): each descriptor carries its own
/// hits as Envoy's `RateLimitDescriptor.hits_addend` (field 3, a
/// `UInt64Value`), and the answer splits back into a verdict per kind.
#[test]
fn one_call_carries_each_descriptors_hits_and_splits_its_answer() {
    let rpm = Limit::RequestsPerMinute.descriptor(Owner::Key("a"), 10);
    let tpm = Limit::TokensPerMinute.descriptor(Owner::Key("a"), 1000);
    let m = encode_weighted([(&rpm, 1), (&tpm, 600)]);
    let mut hits = Vec::new();
    let mut r = pb::Reader::new(&m);
    while let Ok(Some((n, v))) = r.field() {
        if let (2, pb::Value::Bytes(d)) = (n, v) {
            let mut dr = pb::Reader::new(d);
            while let Ok(Some((dn, dv))) = dr.field() {
                if let (3, pb::Value::Bytes(w)) = (dn, dv) {
                    let mut wr = pb::Reader::new(w);
                    if let Ok(Some((1, pb::Value::Varint(h)))) = wr.field() {
                        hits.push(h);
                    }
                }
            }
        }
        assert_ne!(n, 3, "no request-level hits: each descriptor has its own");
    }
    assert_eq!(hits, [1, 600]);
    // Admitted: each group its own tightest status.
    let ok = answer(1, &[(1, 10, 9, 6), (1, 1000, 400, 60), (1, 5, 1, 60)]);
    let v = verdicts(&ok, &[1, 2]);
    assert!(
        matches!(v[0], Verdict::Ok(Some((0, s))) if s.remaining == 9),
        "{v:?}"
    );
    assert!(
        matches!(v[1], Verdict::Ok(Some((1, s))) if s.remaining == 1),
        "{v:?}"
    );
    // Refused by the second group's first descriptor: that group refuses,
    // at its own index; the first reads as admitted.
    let over = answer(2, &[(1, 10, 9, 6), (2, 1000, 0, 60), (1, 5, 1, 60)]);
    let v = verdicts(&over, &[1, 2]);
    assert!(matches!(v[0], Verdict::Ok(_)), "{v:?}");
    assert!(
        matches!(v[1], Verdict::OverLimit(Some((0, s))) if s.limit == Some(1000)),
        "{v:?}"
    );
    // No statuses: the first group refuses; a status count that does not
    // match the descriptors is unusable for every group.
    assert_eq!(
        verdicts(&answer(2, &[]), &[1, 2]),
        [Verdict::OverLimit(None), Verdict::Ok(None)]
    );
    assert!(verdicts(&answer(1, &[(1, 1, 1, 1)]), &[1, 2])
        .iter()
        .all(|v| matches!(v, Verdict::Unusable(_))));
}
