//! State the workers share, as process memory: the same key/value store
//! with compare-and-swap that Envoy's shared data gives the Wasm build, so
//! every read-modify-write (`portcullis_core::shared::store::update`) behaves the
//! same on both builds.

use hashbrown::HashMap;
use portcullis_core::shared::store::{Store, StoreError};
use std::sync::{Mutex, OnceLock};

/// A value and its CAS token (rises on every write of the key).
type Entry = (Vec<u8>, u32);

/// Keys hash to one of this many locks, so workers touching different keys
/// rarely wait for each other. Each shard's map hashes with `hashbrown`'s
/// seeded foldhash (a limited request makes about twenty reads and writes
/// here: SipHash was a tenth of their cost).
const SHARDS: usize = 16;

struct Shared {
    shards: Vec<Mutex<HashMap<String, Entry>>>,
}

fn shared() -> &'static Shared {
    static SHARED: OnceLock<Shared> = OnceLock::new();
    SHARED.get_or_init(|| Shared {
        shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
    })
}

fn shard(key: &str) -> Option<&'static Mutex<HashMap<String, Entry>>> {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(key.as_bytes());
    let i = usize::try_from(h.finish() % SHARDS as u64).unwrap_or(0);
    shared().shards.get(i)
}

/// The process's store (every worker's host reaches the same one).
#[derive(Default, Clone, Copy)]
pub struct ProcessStore;

impl Store for ProcessStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        let map = shard(key)
            .ok_or(StoreError::Host(10))?
            .lock()
            .map_err(|_| StoreError::Host(10))?;
        Ok(match map.get(key) {
            Some((v, cas)) => (Some(v.clone()), Some(*cas)),
            None => (None, None),
        })
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        let mut map = shard(key)
            .ok_or(StoreError::Host(10))?
            .lock()
            .map_err(|_| StoreError::Host(10))?;
        let entry = map.get_mut(key);
        let current = entry.as_ref().map(|(_, c)| *c);
        // As Envoy's shared data: a token of 0 (or none) writes
        // unconditionally; any other must match the key's current token.
        if let Some(want) = cas.filter(|c| *c != 0) {
            if current != Some(want) {
                return Err(StoreError::CasMismatch);
            }
        }
        let next = current.unwrap_or(0).wrapping_add(1).max(1);
        // A key written before keeps its name and its value's room.
        match entry {
            Some((v, c)) => {
                v.clear();
                v.extend_from_slice(value);
                *c = next;
            }
            None => {
                map.insert(key.to_string(), (value.to_vec(), next));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use portcullis_core::shared::store::update;

    #[test]
    fn cas_semantics_match_shared_data() {
        let s = ProcessStore;
        let key = "native.store.test.cas";
        assert_eq!(s.get(key), Ok((None, None)));
        s.set(key, b"a", None).unwrap();
        let (v, cas) = s.get(key).unwrap();
        assert_eq!(v.as_deref(), Some(&b"a"[..]));
        let cas = cas.unwrap();
        s.set(key, b"b", Some(cas)).unwrap();
        // The token moved on: the old one loses.
        assert_eq!(s.set(key, b"c", Some(cas)), Err(StoreError::CasMismatch));
        assert_eq!(s.get(key).unwrap().0.as_deref(), Some(&b"b"[..]));
        // A shorter value over a longer one (the key's room is kept).
        s.set(key, b"a longer value", None).unwrap();
        s.set(key, b"x", None).unwrap();
        let (v, after) = s.get(key).unwrap();
        assert_eq!(v.as_deref(), Some(&b"x"[..]));
        assert!(after > Some(cas), "every write moves the token on");
    }

    #[test]
    fn concurrent_updates_lose_nothing() {
        let key = "native.store.test.sum";
        let threads: Vec<_> = (0..4)
            .map(|_| {
                std::thread::spawn(move || {
                    for _ in 0..500 {
                        let mut done = false;
                        while !done {
                            done = update(&ProcessStore, key, |cur| {
                                let n = cur
                                    .and_then(|c| portcullis_core::wire::le::u64_at(c, 0))
                                    .unwrap_or(0);
                                (Some((n + 1).to_le_bytes().to_vec()), ())
                            })
                            .is_ok();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let (v, _) = ProcessStore.get(key).unwrap();
        let n = portcullis_core::wire::le::u64_at(&v.unwrap(), 0).unwrap();
        assert_eq!(n, 2000);
    }
}
