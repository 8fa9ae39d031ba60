//! A replica's share of a global limit while the rate limit service does
//! not answer (#34, `limits.global.failure_mode: local_share`): each
//! descriptor the service would have counted is counted here, in Envoy's
//! shared data, against the limit divided by the replicas that share it
//! (at least 1). The fleet then admits about the limit (plus what was in
//! flight), and a replica never refuses a request its share has room for.
//!
//! Limits of an hour or less are token buckets, as the service's are; a day
//! or longer is a fixed window named by the descriptor's window entry
//! (`day=…`, `week=…`, `month=…`): the count starts again when it changes.
// Untrusted numbers (config, reservations) meet here.
#![deny(clippy::arithmetic_side_effects)]

use crate::limits::ratelimit::{self, Bucket};
use crate::limits::rls::{Descriptor, Unit};

/// The entries naming a fixed window (its value changes with the window).
const WINDOW_KEYS: &[&str] = &["day", "week", "month"];

/// Where a descriptor's share is kept: its entries but the window.
pub fn key(d: &Descriptor) -> String {
    let mut k = String::from("portcullis:share");
    for (name, value) in d.entries.iter().filter(|(n, _)| !WINDOW_KEYS.contains(n)) {
        k.push('|');
        k.push_str(name);
        k.push('=');
        k.push_str(value);
    }
    k
}

/// This replica's share of the descriptor's limit.
pub fn of(d: &Descriptor, replicas: u32) -> u64 {
    u64::from(
        d.requests_per_unit
            .checked_div(replicas)
            .unwrap_or(d.requests_per_unit),
    )
    .max(1)
}

/// A bucket's rate per minute for a share over the descriptor's unit.
fn per_minute(share: u64, unit: Unit) -> u64 {
    match unit {
        Unit::Second => share.saturating_mul(60),
        Unit::Hour => (share / 60).max(1),
        _ => share,
    }
}

fn fixed(unit: Unit) -> bool {
    matches!(unit, Unit::Day | Unit::Week | Unit::Month | Unit::Year)
}

/// The window a fixed count belongs to, as a number (its entry hashed).
fn window(d: &Descriptor) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    for (name, value) in d.entries.iter().filter(|(n, _)| WINDOW_KEYS.contains(n)) {
        h.write(name.as_bytes());
        h.write(value.as_bytes());
    }
    h.finish()
}

fn decode_fixed(cur: Option<&[u8]>, d: &Descriptor) -> u64 {
    let Some(b) = cur.filter(|b| b.len() == 16) else {
        return 0;
    };
    if crate::wire::le::u64_at(b, 0) == Some(window(d)) {
        crate::wire::le::u64_at(b, 8).unwrap_or(0)
    } else {
        0
    }
}

fn encode_fixed(d: &Descriptor, used: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(16);
    v.extend_from_slice(&window(d).to_le_bytes());
    v.extend_from_slice(&used.to_le_bytes());
    v
}

/// Take `hits` from the share: the bytes to write and whether it fit.
pub fn take(
    cur: Option<&[u8]>,
    d: &Descriptor,
    replicas: u32,
    hits: u64,
    now_ms: u64,
) -> (Option<Vec<u8>>, bool) {
    let share = of(d, replicas);
    if fixed(d.unit) {
        let used = decode_fixed(cur, d);
        let next = used.saturating_add(hits);
        return if next <= share {
            (Some(encode_fixed(d, next)), true)
        } else {
            (None, false)
        };
    }
    let (b, t) = ratelimit::take(
        &Bucket::decode(cur),
        per_minute(share, d.unit),
        hits,
        now_ms,
    );
    (Some(b.encode()), t.admitted)
}

/// Give back `hits` taken from the share (another limit of the request
/// refused it).
pub fn give_back(
    cur: Option<&[u8]>,
    d: &Descriptor,
    replicas: u32,
    hits: u64,
    now_ms: u64,
) -> Option<Vec<u8>> {
    let share = of(d, replicas);
    if fixed(d.unit) {
        let used = decode_fixed(cur, d);
        return Some(encode_fixed(d, used.saturating_sub(hits)));
    }
    let b = ratelimit::adjust(
        &Bucket::decode(cur),
        per_minute(share, d.unit),
        ratelimit::signed(hits),
        now_ms,
    );
    Some(b.encode())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::period::Period;
    use crate::limits::rls::Limit;
    use crate::shared::keys::Owner;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// Take until refused, writing each state: how many fit.
    fn fill(d: &Descriptor, replicas: u32, hits: u64, now_ms: u64) -> (u64, Option<Vec<u8>>) {
        let mut cur: Option<Vec<u8>> = None;
        for n in 0..10_000u64 {
            let (next, ok) = take(cur.as_deref(), d, replicas, hits, now_ms);
            if !ok {
                return (n, cur);
            }
            cur = next;
        }
        (10_000, cur)
    }

    #[test]
    fn a_replica_admits_its_share_of_the_limit_and_at_least_one() {
        let rpm = Limit::RequestsPerMinute.descriptor(Owner::Key("a"), 20);
        assert_eq!(fill(&rpm, 2, 1, 1_000).0, 10);
        assert_eq!(fill(&rpm, 3, 1, 1_000).0, 6);
        assert_eq!(fill(&rpm, 40, 1, 1_000).0, 1, "never nobody");
        // A minute later the bucket is full again.
        let (_, cur) = fill(&rpm, 2, 1, 1_000);
        assert!(!take(cur.as_deref(), &rpm, 2, 1, 1_000).1);
        assert!(take(cur.as_deref(), &rpm, 2, 10, 61_000).1);
        // Weighted: 1000 tokens a minute over 2 replicas, 300 a request.
        let tpm = Limit::TokensPerMinute.descriptor(Owner::Key("a"), 1000);
        assert_eq!(fill(&tpm, 2, 300, 1_000).0, 1);
    }

    #[test]
    fn a_budgets_share_is_a_window_that_starts_again_with_the_next() {
        let day = |n| Limit::Budget(Period::Day, n).descriptor(Owner::Team("t"), 100);
        let today = day(20_789);
        assert_eq!(key(&today), key(&day(20_790)), "one key across windows");
        let (n, cur) = fill(&today, 4, 5, 0);
        assert_eq!(n, 5, "a quarter of 100 units, 5 at a time");
        assert!(
            take(cur.as_deref(), &day(20_790), 4, 5, 0).1,
            "the next day"
        );
        // Given back, it fits again.
        let back = give_back(cur.as_deref(), &today, 4, 5, 0);
        assert!(take(back.as_deref(), &today, 4, 5, 0).1);
        // Nonsense bytes read as an empty count.
        assert!(take(Some(b"junk"), &today, 4, 5, 0).1);
    }
}
