//! A worker's own first level in front of the shared table: hot answers by
//! a cheap fingerprint of what decides the key (the route, the scope and
//! the request body exactly as it arrived), so a repeated request is
//! answered without building the canonical key or copying from shared
//! data. The shared table stays the one source of truth: an entry here is
//! only ever a copy of one stored there under the canonical key, held for
//! at most `ttl_ms` (and never past the stored entry's expiry), in at most
//! `max_bytes`, oldest first out.
//!
//! The fingerprint's hash only finds the entry; the entry keeps the
//! whole fingerprint and a lookup compares it byte for byte, so two
//! requests that differ in a byte can never share an answer.

use super::Hash;
use std::collections::VecDeque;

/// What an entry costs beyond its bytes (map and queue slots, headers).
const OVERHEAD: usize = 96;

struct Entry {
    fingerprint: Vec<u8>,
    key: Hash,
    answer: Vec<u8>,
    until_ms: u64,
    /// Which insertion this is (the queue may hold older ones for the hash).
    seq: u64,
}

impl Entry {
    fn size(&self) -> usize {
        self.fingerprint
            .len()
            .saturating_add(self.answer.len())
            .saturating_add(OVERHEAD)
    }
}

/// The fingerprint's parts: the route and scope as the canonical key has
/// them, then the body. Parts are separated so no two splits read alike.
pub type Parts<'a> = [&'a [u8]];

/// Eight bytes a step (#29: FNV's byte a step cost ~8 instructions a byte
/// in V8, most of a 100 KB repeat's cost). Hand-written, on the hot path:
/// the hash only finds the entry, whose fingerprint is then compared byte
/// for byte, so it needs to spread keys, not to resist attack.
fn hash(parts: &Parts<'_>) -> u64 {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let mix = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let mut h = 0u64;
    for p in parts {
        h = mix(h, p.len() as u64);
        let mut words = p.chunks_exact(8);
        for w in &mut words {
            h = mix(h, u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        }
        let mut tail = [0u8; 8];
        for (t, b) in tail.iter_mut().zip(words.remainder()) {
            *t = *b;
        }
        h = mix(h, u64::from_le_bytes(tail));
    }
    h
}

fn same(stored: &[u8], parts: &Parts<'_>) -> bool {
    let mut rest = stored;
    for p in parts {
        let Some((len, tail)) = rest.split_first_chunk::<8>() else {
            return false;
        };
        if u64::from_le_bytes(*len) != p.len() as u64
            || !tail.get(..p.len()).is_some_and(|t| same_bytes(t, p))
        {
            return false;
        }
        rest = tail.get(p.len()..).unwrap_or_default();
    }
    rest.is_empty()
}

/// Equal slices, compared eight bytes a step (the Wasm build's `memcmp`
/// goes a byte a step).
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let word = |w: &[u8]| u64::from_le_bytes(w.try_into().unwrap_or([0; 8]));
    let (wa, wb) = (a.chunks_exact(8), b.chunks_exact(8));
    a.len() == b.len()
        && wa.remainder() == wb.remainder()
        && wa.zip(wb).all(|(x, y)| word(x) == word(y))
}

fn joined(parts: &Parts<'_>) -> Vec<u8> {
    let n = parts.iter().map(|p| p.len().saturating_add(8)).sum();
    let mut out = Vec::with_capacity(n);
    for p in parts {
        out.extend_from_slice(&(p.len() as u64).to_le_bytes());
        out.extend_from_slice(p);
    }
    out
}

#[derive(Default)]
pub struct Local {
    map: hashbrown::HashMap<u64, Entry, fnv::FnvBuildHasher>,
    /// Insertion order, for eviction: (hash, seq).
    order: VecDeque<(u64, u64)>,
    bytes: usize,
    max_bytes: usize,
    ttl_ms: u64,
    next_seq: u64,
}

impl Local {
    pub fn new(max_bytes: usize, ttl_ms: u64) -> Self {
        Self {
            max_bytes,
            ttl_ms,
            ..Self::default()
        }
    }

    /// Bytes held (fingerprints, answers and a fixed overhead per entry).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The canonical key and answer for exactly these parts, if held and
    /// fresh at `now_ms`.
    pub fn get(&mut self, parts: &Parts<'_>, now_ms: u64) -> Option<(Hash, &[u8])> {
        // A request too large to be held is not hashed (#29: a 1 MB
        // prompt would be read for nothing).
        if !self.could_hold(parts, 0) {
            return None;
        }
        let h = hash(parts);
        let fresh = match self.map.get(&h) {
            Some(e) if same(&e.fingerprint, parts) => now_ms < e.until_ms,
            _ => return None,
        };
        if !fresh {
            self.remove(h);
            return None;
        }
        self.map.get(&h).map(|e| (e.key, e.answer.as_slice()))
    }

    /// Hold a copy of an answer stored (or found) in the shared table under
    /// `key`, until `expires_ms` at the latest. Answers larger than a
    /// quarter of the budget are not held.
    pub fn put(
        &mut self,
        parts: &Parts<'_>,
        key: Hash,
        answer: &[u8],
        expires_ms: u64,
        now_ms: u64,
    ) {
        if self.max_bytes == 0 || self.ttl_ms == 0 || !self.could_hold(parts, answer.len()) {
            return;
        }
        let h = hash(parts);
        self.remove(h);
        let seq = self.next_seq;
        self.next_seq = self.next_seq.wrapping_add(1);
        let e = Entry {
            fingerprint: joined(parts),
            key,
            answer: answer.to_vec(),
            until_ms: expires_ms.min(now_ms.saturating_add(self.ttl_ms)),
            seq,
        };
        let size = e.size();
        if size > self.max_bytes / 4 || e.until_ms <= now_ms {
            return;
        }
        while self.bytes.saturating_add(size) > self.max_bytes {
            let Some((old, old_seq)) = self.order.pop_front() else {
                break;
            };
            if self.map.get(&old).is_some_and(|o| o.seq == old_seq) {
                self.remove(old);
            }
        }
        self.bytes = self.bytes.saturating_add(size);
        self.order.push_back((h, seq));
        self.map.insert(h, e);
        // Entries replaced or removed leave their queue slots behind; keep
        // the queue from growing past the entries it orders.
        if self.order.len() > self.map.len().saturating_mul(2).saturating_add(16) {
            let map = &self.map;
            self.order
                .retain(|(h, s)| map.get(h).is_some_and(|e| e.seq == *s));
        }
    }

    /// Whether an entry for these parts and an answer of this size is
    /// within a quarter of the budget, the most one entry may take.
    fn could_hold(&self, parts: &Parts<'_>, answer_len: usize) -> bool {
        let size = parts
            .iter()
            .map(|p| p.len().saturating_add(8))
            .fold(answer_len.saturating_add(OVERHEAD), usize::saturating_add);
        size <= self.max_bytes / 4
    }

    /// Forget what is held for these parts (a refresh stored a new answer).
    pub fn forget(&mut self, parts: &Parts<'_>) {
        if self.could_hold(parts, 0) {
            self.remove(hash(parts));
        }
    }

    fn remove(&mut self, h: u64) {
        if let Some(e) = self.map.remove(&h) {
            self.bytes = self.bytes.saturating_sub(e.size());
        }
    }

    /// Drop everything (a new config may key answers differently).
    pub fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
        self.bytes = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn key(n: u8) -> Hash {
        [n; 32]
    }

    #[test]
    fn a_held_answer_is_found_only_for_exactly_the_same_parts() {
        let mut l = Local::new(10_000, 1_000);
        let parts: [&[u8]; 3] = [b"primary", b"gpt-4o-mini", b"{\"a\":1}"];
        l.put(&parts, key(1), b"answer", u64::MAX, 0);
        assert_eq!(l.get(&parts, 1), Some((key(1), &b"answer"[..])));
        // The same bytes split otherwise, another route, another body.
        let moved: [&[u8]; 3] = [b"primar", b"ygpt-4o-mini", b"{\"a\":1}"];
        let other: [&[u8]; 3] = [b"backup", b"gpt-4o-mini", b"{\"a\":1}"];
        let body: [&[u8]; 3] = [b"primary", b"gpt-4o-mini", b"{\"a\":2}"];
        for p in [moved, other, body] {
            assert_eq!(l.get(&p, 1), None);
        }
    }

    /// The word-wise hash and compare (#29) tell apart bodies that differ
    /// in any one byte, inside a word or in the tail, and in length.
    #[test]
    fn a_body_differing_in_any_byte_is_another_entry() {
        let body: Vec<u8> = (0..45u8).collect();
        let mut l = Local::new(100_000, 1_000);
        l.put(&[b"route", &body], key(1), b"answer", 10_000, 0);
        assert!(l.get(&[b"route", &body], 1).is_some());
        for i in 0..body.len() {
            let mut other = body.clone();
            if let Some(b) = other.get_mut(i) {
                *b ^= 1;
            }
            assert!(l.get(&[b"route", &other], 1).is_none(), "byte {i}");
            assert!(!same_bytes(&body, &other), "byte {i}");
        }
        let shorter = body.get(..44).unwrap_or_default();
        assert!(l.get(&[b"route", shorter], 1).is_none());
        assert!(!same_bytes(&body, shorter));
        assert!(same_bytes(&body, &body.clone()));
    }

    #[test]
    fn an_entry_lives_its_ttl_and_never_past_the_stored_expiry() {
        let mut l = Local::new(10_000, 1_000);
        let a: [&[u8]; 1] = [b"a"];
        let b: [&[u8]; 1] = [b"b"];
        l.put(&a, key(1), b"x", u64::MAX, 100);
        l.put(&b, key(2), b"y", 500, 100);
        assert!(l.get(&a, 1_099).is_some());
        assert!(l.get(&a, 1_100).is_none(), "held ttl_ms");
        assert!(l.get(&b, 499).is_some());
        assert!(
            l.get(&b, 500).is_none(),
            "not past the shared entry's expiry"
        );
        assert!(l.is_empty() && l.bytes() == 0);
    }

    #[test]
    fn the_budget_holds_oldest_out_first_and_large_answers_stay_out() {
        let mut l = Local::new(4 * (OVERHEAD + 8 + 1 + 100), 1_000);
        let names: Vec<[u8; 1]> = (0..10u8).map(|i| [i]).collect();
        for (i, n) in names.iter().enumerate() {
            l.put(&[n.as_slice()], key(i as u8), &[0; 100], u64::MAX, 0);
            assert!(l.bytes() <= 4 * (OVERHEAD + 8 + 1 + 100));
        }
        assert_eq!(l.len(), 4);
        assert!(l.get(&[names[5].as_slice()], 1).is_none());
        assert!(l.get(&[names[9].as_slice()], 1).is_some());
        let big = vec![0u8; 400];
        l.put(&[b"big".as_slice()], key(0), &big, u64::MAX, 0);
        assert!(l.get(&[b"big".as_slice()], 1).is_none());
        // Replacing one entry over and over keeps the queue bounded.
        for i in 0..1_000u32 {
            l.put(&[b"same".as_slice()], key(1), &i.to_le_bytes(), u64::MAX, 0);
        }
        assert!(l.order.len() <= l.len() * 2 + 16);
        assert_eq!(
            l.get(&[b"same".as_slice()], 1).map(|(_, a)| a.to_vec()),
            Some(999u32.to_le_bytes().to_vec())
        );
    }

    #[test]
    fn off_when_it_has_no_room_or_no_time() {
        for mut l in [Local::new(0, 1_000), Local::new(10_000, 0)] {
            l.put(&[b"a".as_slice()], key(1), b"x", u64::MAX, 0);
            assert!(l.get(&[b"a".as_slice()], 1).is_none());
        }
    }
}
