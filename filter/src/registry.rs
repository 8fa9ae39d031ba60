//! The VM's metrics: ids by name (defined on first use; ids are per VM), and
//! counter increments summed in the VM until the root context's tick hands
//! them to Envoy.

use crate::abi;
use fnv::FnvHashMap as HashMap;
use proxy_wasm::types::MetricType;
use std::cell::RefCell;

thread_local! {
    static METRICS: RefCell<HashMap<String, u32>> = RefCell::new(HashMap::default());
    /// Counter increments not yet handed to Envoy (see [`flush_counters`]).
    static PENDING: RefCell<HashMap<String, i64>> = RefCell::new(HashMap::default());
    /// Changes to gauges the workers share, not yet handed to Envoy.
    static PENDING_GAUGES: RefCell<HashMap<String, i64>> = RefCell::new(HashMap::default());
}

/// Metric id by name, defined on first use (ids are per VM).
pub fn metric(kind: MetricType, name: &str) -> Option<u32> {
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

fn add(pending: &RefCell<HashMap<String, i64>>, name: &str, by: i64) {
    if let Ok(mut p) = pending.try_borrow_mut() {
        match p.get_mut(name) {
            Some(n) => *n = n.saturating_add(by),
            None => {
                p.insert(name.to_string(), by);
            }
        }
    }
}

/// Add to a gauge the workers share (each adds its own change): summed in
/// the VM and handed to Envoy at the tick, like counters.
pub fn add_to_gauge(name: &str, by: i64) {
    if by != 0 {
        PENDING_GAUGES.with(|p| add(p, name, by));
    }
}

/// Add to a counter: summed in the VM and handed to Envoy by
/// [`flush_counters`] at the root context's tick, so counters cost no host
/// call per request.
pub fn count(name: &str, by: i64) {
    if by != 0 {
        PENDING.with(|p| add(p, name, by));
    }
}

/// Hand the summed counter increments to Envoy (at each tick).
pub fn flush_counters() {
    flush(&PENDING, MetricType::Counter);
    flush(&PENDING_GAUGES, MetricType::Gauge);
}

fn flush(pending: &'static std::thread::LocalKey<RefCell<HashMap<String, i64>>>, kind: MetricType) {
    pending.with(|p| {
        let Ok(mut p) = p.try_borrow_mut() else {
            return;
        };
        // Names stay (zeroed) so the next request finds its entry without
        // allocating the name again.
        for (name, by) in p.iter_mut() {
            if *by == 0 {
                continue;
            }
            if let Some(id) = metric(kind, name) {
                let _ = abi::increment_metric(id, *by);
            }
            *by = 0;
        }
    });
}
