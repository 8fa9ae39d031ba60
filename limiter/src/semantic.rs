//! The semantic tier's index (`Nearest`, `PutVectors`): prompts'
//! embeddings with their answers, in this process's memory, compared by
//! cosine similarity within a space (the gateway's hash of everything two
//! prompts must share exactly: route, scope, settings, numbers).
//!
//! Why here and in memory: the Redis this project installs (Debian's) has
//! no vector search, and the index is small enough to scan: each lookup
//! compares the request's vector with the entries of its own space only,
//! a dot product per entry (1,536 dimensions: 0.8 µs each up to 1,000
//! entries, 1.6 µs at 10,000, where a lookup takes 16 ms under the index's
//! lock; `make bench-fleet-cache`). Memory is
//! bounded by `--semantic-max-entries` and `--semantic-max-bytes`; when
//! either is reached the entry stored longest ago goes first (expired ones
//! are dropped as they are met). The index is per limiter process: a fleet
//! with several limiters has an index in each (a miss in one is only a
//! miss), and a restart starts it empty.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// One stored answer and its prompt's embedding (normalized).
struct Entry {
    id: u64,
    vector: Vec<f32>,
    answer: Vec<u8>,
    stored_ms: u64,
    expires_ms: u64,
}

impl Entry {
    fn bytes(&self) -> usize {
        self.vector
            .len()
            .saturating_mul(4)
            .saturating_add(self.answer.len())
            .saturating_add(64)
    }
}

#[derive(Default)]
struct Index {
    spaces: HashMap<Vec<u8>, Vec<Entry>>,
    /// Entry id -> its space, oldest first (the eviction order).
    order: BTreeMap<u64, Vec<u8>>,
    next_id: u64,
    bytes: usize,
}

/// What a lookup found.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    pub answer: Vec<u8>,
    pub similarity: f32,
    pub stored_ms: u64,
    pub expires_ms: u64,
}

pub struct Semantic {
    index: Mutex<Index>,
    max_entries: usize,
    max_bytes: usize,
}

/// A vector scaled to length 1, or `None` (empty, zero, not finite).
fn normalized(v: &[f32]) -> Option<Vec<f32>> {
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    (!v.is_empty() && norm.is_normal() && v.iter().all(|x| x.is_finite()))
        .then(|| v.iter().map(|x| (f64::from(*x) / norm) as f32).collect())
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

impl Index {
    fn remove(&mut self, id: u64) {
        let Some(space) = self.order.remove(&id) else {
            return;
        };
        if let Some(list) = self.spaces.get_mut(&space) {
            if let Some(i) = list.iter().position(|e| e.id == id) {
                let e = list.swap_remove(i);
                self.bytes = self.bytes.saturating_sub(e.bytes());
            }
            if list.is_empty() {
                self.spaces.remove(&space);
            }
        }
    }
}

impl Semantic {
    pub fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            index: Mutex::new(Index::default()),
            max_entries,
            max_bytes,
        }
    }

    /// Entries held, and their bytes.
    pub fn size(&self) -> (usize, usize) {
        self.index
            .lock()
            .map(|i| (i.order.len(), i.bytes))
            .unwrap_or((0, 0))
    }

    /// The entry of `space` nearest to `vector`, when at least `threshold`
    /// similar and unexpired at `now_ms`.
    pub fn nearest(
        &self,
        space: &[u8],
        vector: &[f32],
        threshold: f32,
        now_ms: u64,
    ) -> Option<Found> {
        let v = normalized(vector)?;
        let mut index = self.index.lock().ok()?;
        let list = index.spaces.get(space)?;
        let mut expired = Vec::new();
        let mut best: Option<(f32, &Entry)> = None;
        for e in list {
            if e.expires_ms <= now_ms {
                expired.push(e.id);
                continue;
            }
            if e.vector.len() != v.len() {
                continue;
            }
            let s = dot(&v, &e.vector);
            if s >= threshold && best.is_none_or(|(b, _)| s > b) {
                best = Some((s, e));
            }
        }
        let found = best.map(|(s, e)| Found {
            answer: e.answer.clone(),
            similarity: s.min(1.0),
            stored_ms: e.stored_ms,
            expires_ms: e.expires_ms,
        });
        for id in expired {
            index.remove(id);
        }
        found
    }

    /// Keep an answer under its prompt's embedding; one nearly the same
    /// (similarity at least 0.999) in the space is replaced. `false`: not
    /// kept (a bad vector, expired, or larger than the whole index).
    pub fn put(
        &self,
        space: &[u8],
        vector: &[f32],
        answer: &[u8],
        now_ms: u64,
        expires_ms: u64,
    ) -> bool {
        let Some(v) = normalized(vector) else {
            return false;
        };
        if expires_ms <= now_ms || answer.is_empty() {
            return false;
        }
        let Ok(mut index) = self.index.lock() else {
            return false;
        };
        let same: Option<u64> = index
            .spaces
            .get(space)
            .and_then(|l| {
                l.iter()
                    .find(|e| e.vector.len() == v.len() && dot(&v, &e.vector) >= 0.999)
            })
            .map(|e| e.id);
        if let Some(id) = same {
            index.remove(id);
        }
        let id = index.next_id;
        index.next_id = id.saturating_add(1);
        let e = Entry {
            id,
            vector: v,
            answer: answer.to_vec(),
            stored_ms: now_ms,
            expires_ms,
        };
        let size = e.bytes();
        if size > self.max_bytes {
            return false;
        }
        while index.order.len() >= self.max_entries
            || index.bytes.saturating_add(size) > self.max_bytes
        {
            let Some(oldest) = index.order.keys().next().copied() else {
                break;
            };
            index.remove(oldest);
        }
        index.bytes = index.bytes.saturating_add(size);
        index.order.insert(id, space.to_vec());
        index.spaces.entry(space.to_vec()).or_default().push(e);
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn the_nearest_entry_of_the_space_above_the_threshold_is_found() {
        let s = Semantic::new(100, 1 << 20);
        assert!(s.put(b"a", &[1.0, 0.0], b"east", 0, 100));
        assert!(s.put(b"a", &[0.0, 1.0], b"north", 0, 100));
        assert!(s.put(b"b", &[1.0, 0.1], b"other space", 0, 100));
        let f = s.nearest(b"a", &[0.9, 0.1], 0.9, 1).unwrap();
        assert_eq!(f.answer, b"east");
        assert!(f.similarity > 0.99);
        assert_eq!(s.nearest(b"a", &[1.0, 1.0], 0.9, 1), None, "0.707 is below");
        assert_eq!(s.nearest(b"c", &[1.0, 0.0], 0.0, 1), None);
        assert_eq!(s.nearest(b"a", &[1.0, 0.0], 0.5, 100), None, "expired");
        assert_eq!(s.size().0, 1, "expired entries went as they were met");
        // Another dimension count never compares.
        assert_eq!(s.nearest(b"b", &[1.0, 0.0, 0.0], 0.0, 1), None);
        assert!(!s.put(b"a", &[0.0, 0.0], b"x", 0, 100));
        assert!(!s.put(b"a", &[f32::NAN, 1.0], b"x", 0, 100));
    }

    #[test]
    fn memory_is_bounded_and_the_oldest_goes_first() {
        let s = Semantic::new(3, 1 << 20);
        for i in 0..5u8 {
            let angle = f32::from(i) * 0.3;
            assert!(s.put(b"a", &[angle.cos(), angle.sin()], &[i], 0, 100));
        }
        assert_eq!(s.size().0, 3);
        let first = s.nearest(b"a", &[1.0, 0.0], 0.99, 1);
        assert_eq!(first, None, "the oldest two were evicted");
        let last = s
            .nearest(b"a", &[1.2f32.cos(), 1.2f32.sin()], 0.99, 1)
            .unwrap();
        assert_eq!(last.answer, vec![4]);
        // A byte bound too.
        let small = Semantic::new(1000, 300);
        for i in 0..10u8 {
            small.put(b"a", &[1.0, f32::from(i)], &[0; 100], 0, 100);
        }
        assert!(small.size().1 <= 300, "{:?}", small.size());
        // Nearly the same prompt replaces its entry.
        let r = Semantic::new(10, 1 << 20);
        r.put(b"a", &[1.0, 0.0], b"old", 0, 100);
        r.put(b"a", &[1.0, 0.0001], b"new", 0, 100);
        assert_eq!(r.size().0, 1);
        assert_eq!(r.nearest(b"a", &[1.0, 0.0], 0.9, 1).unwrap().answer, b"new");
    }
}
