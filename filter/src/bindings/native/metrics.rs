//! Metrics on the native build. The dynamic-module ABI declares metrics
//! only while Envoy creates the filter config, each with its label names;
//! the gateway's names carry their label values
//! (`portcullis.provider.<p>.breaker_state`). So every metric family
//! (`metrics::families`) is declared at `config_new` with the labels the
//! bootstrap's `stats_tags` would take out of the Wasm build's names
//! (`portcullis_core::telemetry::metric_tags`), in the namespace `portcullis` (set in
//! the ECDS resource): Prometheus gets the same metrics and labels as from
//! the Wasm build, named `envoy_portcullis_*` (Envoy registers the Wasm
//! build's `wasmcustom` namespace, which it strips, for Wasm only).
//! Counters and shared gauges are summed per worker as on Wasm, handed to
//! the main thread at each stream's end and added at its tick; gauges a
//! request sets are set at once (as on Wasm).

use super::calls;
use super::ffi::{self, ConfigEnvoy, ModuleBuffer};
use crate::host::metrics::{families, Kind};
use crate::host::LogLevel;
use portcullis_core::telemetry::metric_tags::split;
use std::collections::HashMap;

/// A declared metric's id and the label values a name spells.
type Resolved = Option<(usize, Vec<String>)>;

/// The most labels a family has (`metric_tags`); more are not published.
const MAX_LABELS: usize = 8;

/// The config's declared metrics: id and label count by kind and name.
#[derive(Default)]
pub struct Table {
    ids: HashMap<(Kind, String), (usize, usize)>,
    /// Names already taken apart, by name and kind: the metric's id and its
    /// label values (`None`: not a declared metric). The same few names
    /// come back at every request's end, so a name is looked up without
    /// being copied and its labels lent, not cloned.
    resolved: std::sync::Mutex<HashMap<String, [Option<Resolved>; 3]>>,
}

fn slot(kind: Kind) -> usize {
    match kind {
        Kind::Counter => 0,
        Kind::Gauge => 1,
        Kind::Histogram => 2,
    }
}

const SUCCESS: i32 = 0;

/// Declare every family on a config being created (main thread).
pub fn declare(config: ConfigEnvoy) -> Table {
    let mut table = Table::default();
    for (kind, sample) in families() {
        let Some((base, labels)) = split(&sample) else {
            continue;
        };
        if table.ids.contains_key(&(kind, base.clone())) {
            continue;
        }
        let mut names: Vec<ModuleBuffer> = labels
            .iter()
            .map(|(k, _)| ModuleBuffer::of(k.as_bytes()))
            .collect();
        let mut id = 0usize;
        // The namespace (`portcullis`) is Envoy's to add.
        let short = base.strip_prefix("portcullis.").unwrap_or(&base);
        let name = ModuleBuffer::of(short.as_bytes());
        let (ptr, n) = (names.as_mut_ptr(), names.len());
        // SAFETY: the config being created, on the main thread; every
        // buffer outlives the call.
        let r = unsafe {
            match kind {
                Kind::Counter => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_define_counter(
                        config, name, ptr, n, &mut id,
                    )
                }
                Kind::Gauge => ffi::envoy_dynamic_module_callback_http_filter_config_define_gauge(
                    config, name, ptr, n, &mut id,
                ),
                Kind::Histogram => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_define_histogram(
                        config, name, ptr, n, &mut id,
                    )
                }
            }
        };
        if r == SUCCESS {
            table.ids.insert((kind, base), (id, n));
        } else {
            calls::log(
                LogLevel::Warn,
                &format!("metric {base} not declared (result {r}): it will not be published"),
            );
        }
    }
    table
}

/// How a value changes a metric.
#[derive(Debug, Clone, Copy)]
pub enum Change {
    Add(u64),
    Sub(u64),
    Set(u64),
    Record(u64),
}

impl Table {
    /// A metric's id and label values, from its name.
    fn resolve(&self, kind: Kind, name: &str) -> Resolved {
        split(name).and_then(|(base, labels)| {
            let &(id, n) = self.ids.get(&(kind, base))?;
            (labels.len() == n).then(|| (id, labels.iter().map(|(_, v)| v.to_string()).collect()))
        })
    }

    /// Apply a change to the metric `name` (its label values spelled in):
    /// a name seen before is found in one lookup, without being copied.
    pub fn apply(&self, config: ConfigEnvoy, kind: Kind, name: &str, change: Change) {
        let Ok(mut cache) = self.resolved.lock() else {
            return;
        };
        if let Some(Some(seen)) = cache.get(name).and_then(|k| k.get(slot(kind))) {
            if let Some((id, labels)) = seen {
                Self::call(config, kind, *id, labels, change);
            }
            return;
        }
        let r = self.resolve(kind, name);
        if let Some((id, labels)) = &r {
            Self::call(config, kind, *id, labels, change);
        }
        // Bounded: names are per provider, model and client, not per request.
        if cache.len() < 10_000 {
            if let Some(k) = cache
                .entry(name.to_string())
                .or_default()
                .get_mut(slot(kind))
            {
                *k = Some(r);
            }
        }
    }

    /// Envoy's call for a change, the label values lent.
    fn call(config: ConfigEnvoy, kind: Kind, id: usize, labels: &[String], change: Change) {
        let n = labels.len();
        if n > MAX_LABELS {
            return;
        }
        let mut values = [ModuleBuffer::null(); MAX_LABELS];
        for (slot, v) in values.iter_mut().zip(labels) {
            *slot = ModuleBuffer::of(v.as_bytes());
        }
        let ptr = values.as_mut_ptr();
        // SAFETY: the live config, on the main thread; the buffers outlive
        // the call; the label count is the one declared.
        unsafe {
            match change {
                Change::Add(v) if kind == Kind::Counter => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_increment_counter(
                        config, id, ptr, n, v,
                    );
                }
                Change::Add(v) => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_increment_gauge(
                        config, id, ptr, n, v,
                    );
                }
                Change::Sub(v) => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
                        config, id, ptr, n, v,
                    );
                }
                Change::Set(v) => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_set_gauge(
                        config, id, ptr, n, v,
                    );
                }
                Change::Record(v) => {
                    ffi::envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
                        config, id, ptr, n, v,
                    );
                }
            }
        }
    }

    /// Set a gauge from a stream's hook (its filter made from this config).
    pub fn set_now(&self, filter: ffi::FilterEnvoy, name: &str, value: u64) {
        let Some((base, labels)) = split(name) else {
            return;
        };
        let Some(&(id, n)) = self.ids.get(&(Kind::Gauge, base)) else {
            return;
        };
        if labels.len() != n {
            return;
        }
        let mut values: Vec<ModuleBuffer> = labels
            .iter()
            .map(|(_, v)| ModuleBuffer::of(v.as_bytes()))
            .collect();
        // SAFETY: the live filter of the hook running; buffers outlive the
        // call; the label count is the one declared.
        unsafe {
            ffi::envoy_dynamic_module_callback_http_filter_set_gauge(
                filter,
                id,
                values.as_mut_ptr(),
                values.len(),
                value,
            );
        }
    }

    /// A summed change from a worker: a counter's increment or a shared
    /// gauge's change.
    pub fn apply_sum(&self, config: ConfigEnvoy, kind: Kind, name: &str, by: i64) {
        let change = if by >= 0 {
            Change::Add(by.unsigned_abs())
        } else {
            Change::Sub(by.unsigned_abs())
        };
        self.apply(config, kind, name, change);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Label values are lent to Envoy from a fixed array: every family the
    /// gateway declares fits in it (one that did not would never publish).
    #[test]
    fn every_family_has_room_for_its_labels() {
        for (kind, sample) in families() {
            let (_, labels) = split(&sample).unwrap();
            assert!(
                labels.len() <= MAX_LABELS,
                "{kind:?} {sample}: {}",
                labels.len()
            );
        }
    }
}
