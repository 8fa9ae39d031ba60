//! Envoy shared data behind the core's `Store` trait, and the metrics cache.

use crate::abi;
use portcullis_core::store::{Store, StoreError};
use proxy_wasm::types::{MetricType, Status};
use std::cell::RefCell;
use std::collections::HashMap;

/// Shared data of this VM id: one value per key, with a CAS token.
pub struct HostStore;

impl Store for HostStore {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        abi::get_shared_data(key).map_err(|s| StoreError::Host(s as u32))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        match abi::set_shared_data(key, value, cas) {
            Ok(()) => Ok(()),
            Err(Status::CasMismatch) => Err(StoreError::CasMismatch),
            Err(s) => Err(StoreError::Host(s as u32)),
        }
    }
}

thread_local! {
    static METRICS: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::new());
    /// Counter increments not yet handed to Envoy (see [`flush_counters`]).
    static PENDING: RefCell<HashMap<String, i64>> = RefCell::new(HashMap::new());
}

/// Metric id by name, defined on first use (ids are per VM).
fn metric(kind: MetricType, name: &str) -> Option<u32> {
    METRICS.with(|m| {
        let mut m = m.try_borrow_mut().ok()?;
        if let Some(id) = m.get(name) {
            return Some(*id);
        }
        let id = abi::define_metric(kind, name).ok()?;
        m.insert(name.to_string(), id);
        Some(id)
    })
}

/// Add to a counter. Metric names: `portcullis.<what>`, with label values
/// spelled in (`portcullis.provider.<name>.<what>`); Envoy shows them as
/// `wasmcustom.<name>` and the bootstrap's `stats_tags` turn the parts into
/// labels. Increments are summed in the VM and handed to Envoy by
/// [`flush_counters`] at the root context's tick: no host call per request.
pub fn count(name: &str, by: i64) {
    if by == 0 {
        return;
    }
    PENDING.with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            match p.get_mut(name) {
                Some(n) => *n += by,
                None => {
                    p.insert(name.to_string(), by);
                }
            }
        }
    });
}

/// Hand the summed counter increments to Envoy (at each tick).
pub fn flush_counters() {
    let pending: Vec<(String, i64)> = PENDING.with(|p| {
        p.try_borrow_mut()
            .map(|mut p| p.drain().collect())
            .unwrap_or_default()
    });
    for (name, by) in pending {
        if let Some(id) = metric(MetricType::Counter, &name) {
            let _ = abi::increment_metric(id, by);
        }
    }
}

pub fn gauge(name: &str, value: u64) {
    if let Some(id) = metric(MetricType::Gauge, name) {
        let _ = abi::record_metric(id, value);
    }
}

/// Add to a gauge (each worker adds its own changes to the shared value).
pub fn count_gauge(name: &str, by: i64) {
    if let Some(id) = metric(MetricType::Gauge, name) {
        let _ = abi::increment_metric(id, by);
    }
}

pub fn histogram(name: &str, value: u64) {
    if let Some(id) = metric(MetricType::Histogram, name) {
        let _ = abi::record_metric(id, value);
    }
}

pub fn provider_metric(provider: &str, what: &str) -> String {
    format!("portcullis.provider.{provider}.{what}")
}
