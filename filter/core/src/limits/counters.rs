//! One level's local counters (a key's, a team's or an end user's) in one
//! shared value: its request and token buckets, its requests in flight and
//! what it spent in each budget period. A request's step at a level (take
//! at the headers, admit, finish) is then one read and one compare-and-swap
//! whatever the number of limits, and the write still carries every
//! decision, so the level is exact across workers and all of it or none is
//! taken. Pure arithmetic over one fixed encoding; time is a parameter.
// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

use crate::limits::period::Period;
use crate::limits::ratelimit::{Bucket, Micros};

/// The encoding's first byte.
const VERSION: u8 = 1;
const BUCKET: usize = 25;
/// Version, two buckets, requests in flight, four budget periods (index
/// and spend each).
const ENCODED: usize = 1 + 2 * BUCKET + 4 + 4 * 16;

/// A level's counters as one value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counters {
    /// Requests per minute.
    pub requests: Bucket,
    /// Tokens per minute.
    pub tokens: Bucket,
    /// Requests in flight.
    pub in_flight: u32,
    /// Per budget period (day, week, month, total): the period's index and
    /// what was spent or reserved in it.
    budgets: [(u64, Micros); 4],
}

fn slot(p: Period) -> usize {
    match p {
        Period::Day => 0,
        Period::Week => 1,
        Period::Month => 2,
        Period::Total => 3,
    }
}

impl Counters {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENCODED);
        v.push(VERSION);
        self.requests.encode_into(&mut v);
        self.tokens.encode_into(&mut v);
        v.extend_from_slice(&self.in_flight.to_le_bytes());
        for (index, spent) in self.budgets {
            v.extend_from_slice(&index.to_le_bytes());
            v.extend_from_slice(&spent.to_le_bytes());
        }
        v
    }

    /// The counters a value holds; anything else (unset, another version,
    /// another size) is a fresh level.
    pub fn decode(b: Option<&[u8]>) -> Counters {
        let Some(b) = b.filter(|b| b.len() == ENCODED && b.first() == Some(&VERSION)) else {
            return Counters::default();
        };
        let bucket = |at: usize| Bucket::decode(b.get(at..at.saturating_add(BUCKET)));
        let mut budgets = [(0, 0); 4];
        for (i, slot) in budgets.iter_mut().enumerate() {
            let at = 1usize
                .saturating_add(2 * BUCKET + 4)
                .saturating_add(i.saturating_mul(16));
            *slot = (
                crate::wire::le::u64_at(b, at).unwrap_or(0),
                crate::wire::le::i64_at(b, at.saturating_add(8)).unwrap_or(0),
            );
        }
        Counters {
            requests: bucket(1),
            tokens: bucket(1 + BUCKET),
            in_flight: crate::wire::le::u32_at(b, 1 + 2 * BUCKET).unwrap_or(0),
            budgets,
        }
    }

    /// What was spent in the period `index` of `p` (nothing when the value
    /// holds an older period: this one has not been spent in yet).
    pub fn spent(&self, p: Period, index: u64) -> Micros {
        match self.budgets.get(slot(p)) {
            Some(&(at, spent)) if at >= index => spent,
            _ => 0,
        }
    }

    /// Reserve `amount` in period `index` of `p` if the budget `cap` holds
    /// it: a newer period starts from nothing. A period older than the one
    /// held (another worker's clock already past the boundary) counts in
    /// the held one. The index counted in and what it then holds, or `None`
    /// (nothing changed) when it does not fit.
    pub fn spend(
        &mut self,
        p: Period,
        index: u64,
        cap: Micros,
        amount: Micros,
    ) -> Option<(u64, Micros)> {
        let s = self.budgets.get_mut(slot(p))?;
        let (at, spent) = if index > s.0 { (index, 0) } else { *s };
        let next = spent.saturating_add(amount);
        if next > cap {
            return None;
        }
        *s = (at, next);
        Some((at, next))
    }

    /// Correct a reservation counted in period `index` of `p` by `delta`
    /// (negative gives back), never below nothing. Once a newer period is
    /// held the reservation's is over: nothing to correct. What the held
    /// period then holds.
    pub fn settle(&mut self, p: Period, index: u64, delta: Micros) -> Micros {
        let Some(s) = self.budgets.get_mut(slot(p)) else {
            return 0;
        };
        if s.0 == index {
            s.1 = s.1.saturating_add(delta).max(0);
        }
        s.1
    }

    /// Count `amount` spent now (usage after the fact, over any cap) in
    /// period `index` of `p`, as [`Counters::spend`] counts it: what the
    /// period then holds.
    pub fn charge(&mut self, p: Period, index: u64, amount: Micros) -> Micros {
        self.spend(p, index, Micros::MAX, amount)
            .map_or(0, |(_, spent)| spent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::ratelimit;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_counter_round_trips_and_anything_else_is_a_fresh_level() {
        let mut c = Counters::default();
        c.requests = ratelimit::take(&c.requests, 10, 3, 5_000).0;
        c.tokens = ratelimit::take(&c.tokens, 1000, 250, 5_000).0;
        c.in_flight = 7;
        assert_eq!(
            c.spend(Period::Day, 20_000, 1_000, 400),
            Some((20_000, 400))
        );
        assert_eq!(c.spend(Period::Total, 0, 1_000, 9), Some((0, 9)));
        let bytes = c.encode();
        assert_eq!(bytes.len(), ENCODED);
        assert_eq!(Counters::decode(Some(&bytes)), c);
        assert_eq!(Counters::decode(None), Counters::default());
        assert_eq!(Counters::decode(Some(&bytes[1..])), Counters::default());
        let mut other = bytes.clone();
        other[0] = 9;
        assert_eq!(Counters::decode(Some(&other)), Counters::default());
    }

    #[test]
    fn a_budget_refuses_past_its_cap_and_changes_nothing() {
        let mut c = Counters::default();
        assert_eq!(c.spend(Period::Day, 5, 1_000, 600), Some((5, 600)));
        let before = c;
        assert_eq!(c.spend(Period::Day, 5, 1_000, 401), None);
        assert_eq!(c, before);
        assert_eq!(c.spend(Period::Day, 5, 1_000, 400), Some((5, 1_000)));
        assert_eq!(c.spent(Period::Day, 5), 1_000);
        // Each period is its own.
        assert_eq!(c.spent(Period::Month, 5), 0);
        assert_eq!(c.spend(Period::Month, 3, 2_000, 1_500), Some((3, 1_500)));
        // A huge amount never wraps.
        let cap = i64::MAX - 1;
        assert_eq!(c.spend(Period::Week, 1, cap, cap), Some((1, cap)));
        assert_eq!(c.spend(Period::Week, 1, cap, i64::MAX), None);
    }

    #[test]
    fn a_new_period_starts_from_nothing_and_an_old_one_counts_in_the_held_one() {
        let mut c = Counters::default();
        c.spend(Period::Day, 10, 1_000, 900);
        assert_eq!(
            c.spent(Period::Day, 11),
            0,
            "tomorrow has not been spent in"
        );
        assert_eq!(c.spend(Period::Day, 11, 1_000, 300), Some((11, 300)));
        // A worker whose clock is still on day 10 counts in day 11.
        assert_eq!(c.spend(Period::Day, 10, 1_000, 300), Some((11, 600)));
        assert_eq!(c.spent(Period::Day, 10), 600);
        // A reservation of day 10 is over; of day 11 it is corrected.
        assert_eq!(c.settle(Period::Day, 10, -500), 600);
        assert_eq!(c.settle(Period::Day, 11, -500), 100);
        assert_eq!(c.settle(Period::Day, 11, -500), 0, "never below nothing");
        // Usage after the fact goes past the cap, and starts a new period.
        assert_eq!(c.charge(Period::Day, 11, 5_000), 5_000);
        assert_eq!(c.charge(Period::Day, 12, 70), 70);
        assert_eq!(c.spent(Period::Day, 12), 70);
        assert_eq!(c.charge(Period::Day, 12, i64::MAX), i64::MAX, "saturates");
    }
}
