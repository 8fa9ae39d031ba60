//! The host as Envoy provides it: [`Host`] over the proxy-wasm ABI (`abi`),
//! shared data as the core's [`Store`], and the VM's metric registry.

use crate::abi;
use crate::host::{Headers, Host, Part};
use crate::shipper;
use portcullis_core::record::Record;
use portcullis_core::store::{Store, StoreError};
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, LogLevel, MapType, MetricType, Status};
use std::cell::RefCell;
use std::collections::HashMap;
use std::time::Duration;

/// Envoy, for the context that is running (the ABI knows which).
#[derive(Debug, Default, Clone, Copy)]
pub struct AbiHost;

fn map(part: Part) -> MapType {
    match part {
        Part::Request => MapType::HttpRequestHeaders,
        Part::Response => MapType::HttpResponseHeaders,
        Part::CallResponse => MapType::HttpCallResponseHeaders,
    }
}

fn buffer(part: Part) -> BufferType {
    match part {
        Part::Request => BufferType::HttpRequestBody,
        Part::Response => BufferType::HttpResponseBody,
        Part::CallResponse => BufferType::HttpCallResponseBody,
    }
}

impl Store for AbiHost {
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

impl Host for AbiHost {
    fn now_ms(&self) -> u64 {
        abi::now_ms().unwrap_or(0)
    }

    fn log(&self, level: LogLevel, message: &str) {
        let _ = abi::log(level, message);
    }

    fn headers(&self, part: Part) -> Result<Headers, Status> {
        abi::get_map_bytes(map(part))
    }

    fn set_header(&self, part: Part, name: &str, value: Option<&str>) -> Result<(), Status> {
        abi::set_map_value(map(part), name, value)
    }

    fn add_header(&self, part: Part, name: &str, value: &str) -> Result<(), Status> {
        abi::add_map_value(map(part), name, value)
    }

    fn body(&self, part: Part, size: usize) -> Result<Vec<u8>, Status> {
        Ok(abi::get_buffer(buffer(part), 0, size)?.unwrap_or_default())
    }

    fn set_body(&self, part: Part, size: usize, bytes: &[u8]) -> Result<(), Status> {
        abi::set_buffer(buffer(part), 0, size, bytes)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        abi::get_property(path).ok().flatten()
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), Status> {
        abi::send_http_response(u32::from(status), headers, body)
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status> {
        // The SDK's call registers the token with its dispatcher, which routes
        // the answer back to this context; it maps every status it returns.
        hostcalls::dispatch_http_call(
            cluster,
            headers.to_vec(),
            Some(body),
            vec![],
            Duration::from_millis(timeout_ms),
        )
    }

    fn count(&self, name: &str, by: i64) {
        count(name, by);
    }

    fn gauge(&self, name: &str, value: u64) {
        if let Some(id) = metric(MetricType::Gauge, name) {
            let _ = abi::record_metric(id, value);
        }
    }

    fn add_to_gauge(&self, name: &str, by: i64) {
        if let Some(id) = metric(MetricType::Gauge, name) {
            let _ = abi::increment_metric(id, by);
        }
    }

    fn histogram(&self, name: &str, value: u64) {
        if let Some(id) = metric(MetricType::Histogram, name) {
            let _ = abi::record_metric(id, value);
        }
    }

    fn emit_record(&self, record: &Record) {
        shipper::push(record);
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

/// Add to a counter: summed in the VM and handed to Envoy by
/// [`flush_counters`] at the root context's tick, so counters cost no host
/// call per request.
pub fn count(name: &str, by: i64) {
    if by == 0 {
        return;
    }
    PENDING.with(|p| {
        if let Ok(mut p) = p.try_borrow_mut() {
            match p.get_mut(name) {
                Some(n) => *n = n.saturating_add(by),
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
