//! State shared by Envoy's workers: one small key/value interface with
//! compare-and-swap, and the bounded CAS loop every read-modify-write uses.
//! The host implements it with shared data; tests use [`MemStore`].

/// Why a store call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreError {
    /// Someone else wrote the key since our read.
    CasMismatch,
    /// The host refused for another reason (its status, for the log).
    Host(u32),
    /// The CAS loop lost every race it was allowed.
    Contended,
}

pub trait Store {
    /// The value and its CAS token; `(None, None)` when the key is unset.
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError>;
    /// Write if the key is still at `cas` (`None`: unconditionally).
    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError>;
}

/// How many times a read-modify-write retries after losing a race.
pub const MAX_CAS_TRIES: usize = 16;

/// Read, decide, write with the read's CAS token; on a lost race re-read and
/// decide again. `decide` gets the current bytes and returns the new bytes
/// (`None`: nothing to write) and the decision, so the write carries the
/// decision and nothing is checked in one step and counted in another.
pub fn update<S: Store + ?Sized, T>(
    store: &S,
    key: &str,
    mut decide: impl FnMut(Option<&[u8]>) -> (Option<Vec<u8>>, T),
) -> Result<T, StoreError> {
    for _ in 0..MAX_CAS_TRIES {
        let (current, cas) = store.get(key)?;
        let (next, decision) = decide(current.as_deref());
        let Some(next) = next else {
            return Ok(decision);
        };
        // A missing key has no token; Envoy treats cas 0 as "no check", so a
        // first write cannot lose a race it never saw. Keys are created at
        // configure time to keep that window at start-up only.
        match store.set(key, &next, cas) {
            Ok(()) => return Ok(decision),
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Contended)
}

/// In-memory store for tests, able to inject CAS conflicts: before each of
/// the next `n` writes, another "worker" applies `interfere` to the value.
#[derive(Default)]
pub struct MemStore {
    map: std::cell::RefCell<hashbrown::HashMap<String, (Vec<u8>, u32)>>,
    conflicts: std::cell::Cell<u32>,
    #[allow(clippy::type_complexity)]
    interfere: std::cell::RefCell<Option<Box<dyn Fn(&[u8]) -> Vec<u8>>>>,
}

impl MemStore {
    pub fn inject_conflicts(&self, n: u32, interfere: impl Fn(&[u8]) -> Vec<u8> + 'static) {
        self.conflicts.set(n);
        *self.interfere.borrow_mut() = Some(Box::new(interfere));
    }
}

impl Store for MemStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        Ok(match self.map.borrow().get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut map = self.map.borrow_mut();
        if self.conflicts.get() > 0 {
            self.conflicts.set(self.conflicts.get() - 1);
            if let (Some(f), Some(entry)) = (self.interfere.borrow().as_ref(), map.get_mut(key)) {
                entry.0 = f(&entry.0);
                entry.1 += 1;
            }
        }
        let entry = map
            .entry(key.to_string())
            .or_insert_with(|| (Vec::new(), 0));
        if let Some(c) = cas {
            if c != entry.1 {
                return Err(StoreError::CasMismatch);
            }
        }
        entry.0 = value.to_vec();
        entry.1 += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn incr(cur: Option<&[u8]>) -> (Option<Vec<u8>>, u8) {
        let n = cur.and_then(|c| c.first().copied()).unwrap_or(0) + 1;
        (Some(vec![n]), n)
    }

    #[test]
    fn update_retries_after_a_lost_race_and_keeps_both_writes() {
        let s = MemStore::default();
        assert_eq!(update(&s, "k", incr).unwrap(), 1);
        s.inject_conflicts(3, |v| vec![v[0] + 10]);
        // Three other writers each add 10 between our read and our write.
        assert_eq!(update(&s, "k", incr).unwrap(), 32);
        assert_eq!(s.get("k").unwrap().0.unwrap(), vec![32]);
    }

    #[test]
    fn update_gives_up_after_the_bound() {
        let s = MemStore::default();
        update(&s, "k", incr).unwrap();
        s.inject_conflicts(MAX_CAS_TRIES as u32, |v| v.to_vec());
        assert_eq!(update(&s, "k", incr), Err(StoreError::Contended));
    }

    #[test]
    fn decide_without_write_touches_nothing() {
        let s = MemStore::default();
        assert_eq!(update(&s, "k", |_| (None, 7)).unwrap(), 7);
        assert_eq!(s.get("k").unwrap(), (None, None));
    }
}
