//! The VM's metrics: ids by name (defined on first use; ids are per VM), and
//! counter increments summed in the worker's state until the root
//! context's tick hands them to Envoy.

use crate::abi;
use crate::worker::Worker;
use fnv::FnvHashMap as HashMap;
use proxy_wasm::types::MetricType;
use std::cell::RefCell;

/// Metric id by name, defined on first use (ids are per VM).
pub fn metric(w: &Worker, kind: MetricType, name: &str) -> Option<u32> {
    let mut m = w.metric_ids.try_borrow_mut().ok()?;
    if let Some(id) = m.get(name) {
        return Some(*id);
    }
    let id = abi::define_metric(kind, name).ok()?;
    m.insert(name.to_string(), id);
    Some(id)
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
pub fn add_to_gauge(w: &Worker, name: &str, by: i64) {
    if by != 0 {
        add(&w.pending_gauges, name, by);
    }
}

/// Add to a counter: summed in the VM and handed to Envoy by
/// [`flush_counters`] at the root context's tick, so counters cost no host
/// call per request.
pub fn count(w: &Worker, name: &str, by: i64) {
    if by != 0 {
        add(&w.pending_counters, name, by);
    }
}

/// Hand the summed counter increments to Envoy (at each tick).
pub fn flush_counters(w: &Worker) {
    flush(w, &w.pending_counters, MetricType::Counter);
    flush(w, &w.pending_gauges, MetricType::Gauge);
}

fn flush(w: &Worker, pending: &RefCell<HashMap<String, i64>>, kind: MetricType) {
    let Ok(mut p) = pending.try_borrow_mut() else {
        return;
    };
    // Names stay (zeroed) so the next request finds its entry without
    // allocating the name again.
    for (name, by) in p.iter_mut() {
        if *by == 0 {
            continue;
        }
        if let Some(id) = metric(w, kind, name) {
            let _ = abi::increment_metric(id, *by);
        }
        *by = 0;
    }
}
