//! What one worker's filter keeps between requests, in one place. The root
//! context owns it; each request's host borrows it ([`Host::worker`]), so
//! every step reaches the same state through the host it already has; the
//! fake host of the lifecycle tests builds a fresh one per test.
//!
//! Shared data (Envoy's, across workers) is not here: this is what a
//! worker's VM alone remembers.
//!
//! [`Host::worker`]: crate::host::Host::worker

use fnv::FnvHashMap;
use portcullis_core::cache::local::Local;
use portcullis_core::routing::KeyHashes;
use portcullis_core::telemetry::record::LogBuffer;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// An entry for the fleet's cache tier: its store call's method and the
/// entry as that call carries it.
pub type SharedPut = (&'static str, Vec<u8>);

#[derive(Default)]
pub struct Worker {
    /// Metric ids by name, defined on first use (ids are per VM).
    pub metric_ids: RefCell<FnvHashMap<String, u32>>,
    /// Counter increments not yet handed to Envoy (the tick flushes them).
    pub pending_counters: RefCell<FnvHashMap<String, i64>>,
    /// Changes to gauges the workers share, not yet handed to Envoy.
    pub pending_gauges: RefCell<FnvHashMap<String, i64>>,
    /// Where per-request metric names are built: one buffer, reused.
    pub metric_name: RefCell<String>,
    /// Request records waiting for the collector (`log.buffer_*`).
    pub log: RefCell<Option<LogBuffer>>,
    /// Settlements for the rate limit service, sent at the tick (bounded).
    pub settlements: RefCell<Vec<Vec<u8>>>,
    /// Fresh answers for the fleet's cache tier (the store call's method
    /// and an encoded entry; their bytes), sent at the tick (bounded by
    /// `cache.shared.queue_bytes`).
    pub shared_puts: RefCell<(Vec<SharedPut>, usize)>,
    /// Requests in flight per provider: (count, last published).
    pub busy: RefCell<HashMap<String, (i64, i64)>>,
    /// This VM's id in the registry of busy counts (0: none yet).
    pub vm_id: Cell<u64>,
    /// When this VM last said it is live.
    pub registered: Cell<u64>,
    /// The live VMs as last read, and when.
    pub vms: RefCell<(Vec<u64>, u64)>,
    /// The strategies' reads of shared data, by key, with when read.
    pub reads: RefCell<HashMap<String, (i64, u64)>>,
    /// Provider name -> when this VM last read its breaker closed and clean.
    pub breakers_clean: RefCell<FnvHashMap<String, u64>>,
    /// This worker's copies of hot answers (`cache.worker_bytes`).
    pub cache: RefCell<Local>,
    /// `testing.clock_offset_ms` of the config applied (0 unless the VM's
    /// environment allows test hooks).
    pub clock_offset_ms: Cell<i64>,
    /// Hashes of keys that authenticated.
    pub key_hashes: RefCell<KeyHashes>,
    /// Requests of this worker paused for a provider's access token, by
    /// provider name: (context id, since when).
    pub token_waiters: RefCell<HashMap<String, Vec<(u32, u64)>>>,
    /// The rate limit service failed a call and has not answered since:
    /// global limits go by this replica's shares (`local_share`).
    pub global_away: Cell<bool>,
}

/// Most rate-limit settlements a worker keeps for its root's next tick.
const MAX_SETTLEMENTS: usize = 10_000;

impl Worker {
    /// Queue a rate-limit settlement for the root context's next tick;
    /// `false` when the queue is full (it is dropped).
    pub fn queue_settlement(&self, message: Vec<u8>) -> bool {
        let Ok(mut q) = self.settlements.try_borrow_mut() else {
            return false;
        };
        if q.len() >= MAX_SETTLEMENTS {
            return false;
        }
        q.push(message);
        true
    }

    /// Queue an entry for the fleet's cache tier; `false` when it would
    /// take the queue past `max_bytes` (it is not shared).
    pub fn queue_shared_put(&self, method: &'static str, entry: Vec<u8>, max_bytes: usize) -> bool {
        let Ok(mut q) = self.shared_puts.try_borrow_mut() else {
            return false;
        };
        let bytes = q.1.saturating_add(entry.len());
        if bytes > max_bytes {
            return false;
        }
        q.0.push((method, entry));
        q.1 = bytes;
        true
    }

    /// The entries queued for the fleet's tier since the last tick.
    pub fn take_shared_puts(&self) -> Vec<SharedPut> {
        self.shared_puts
            .try_borrow_mut()
            .map(|mut q| std::mem::take(&mut *q).0)
            .unwrap_or_default()
    }

    /// The settlements queued since the last tick.
    pub fn take_settlements(&self) -> Vec<Vec<u8>> {
        self.settlements
            .try_borrow_mut()
            .map(|mut q| std::mem::take(&mut *q))
            .unwrap_or_default()
    }
}
