//! Counter increments and shared-gauge changes summed in the worker's state
//! until the root context's tick hands them to Envoy (each host defines
//! the metrics its own way).

use crate::host::worker::Worker;
use fnv::FnvHashMap as HashMap;
use std::cell::RefCell;

/// Which kind of metric a pending change is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Counter,
    /// A gauge the workers share: each hands over its own change.
    Gauge,
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
/// [`flush`] at the root context's tick, so counters cost no host
/// call per request.
pub fn count(w: &Worker, name: &str, by: i64) {
    if by != 0 {
        add(&w.pending_counters, name, by);
    }
}

/// Hand the summed changes to `hand` (at each tick): its host adds them to
/// Envoy's metrics.
pub fn flush(w: &Worker, mut hand: impl FnMut(Kind, &str, i64)) {
    drain(&w.pending_counters, |n, by| hand(Kind::Counter, n, by));
    drain(&w.pending_gauges, |n, by| hand(Kind::Gauge, n, by));
}

fn drain(pending: &RefCell<HashMap<String, i64>>, mut hand: impl FnMut(&str, i64)) {
    let Ok(mut p) = pending.try_borrow_mut() else {
        return;
    };
    // Names stay (zeroed) so the next request finds its entry without
    // allocating the name again.
    for (name, by) in p.iter_mut() {
        if *by == 0 {
            continue;
        }
        hand(name, *by);
        *by = 0;
    }
}
