//! The host as Envoy provides it to a Wasm VM: [`Host`] over the proxy-wasm
//! ABI (`abi`), shared data as the core's [`Store`], metrics defined by name
//! in the VM.

use crate::bindings::abi;
use crate::host::registry;
use crate::host::worker::Worker;
use crate::host::{Headers, Host, LogLevel, Part, Status};
use crate::telemetry::shipper;
use portcullis_core::shared::store::{Store, StoreError};
use portcullis_core::telemetry::record::Record;
use proxy_wasm::hostcalls;
use proxy_wasm::types::{BufferType, MapType, MetricType};
use std::rc::Rc;
use std::time::Duration;

/// The SDK's statuses as ours (the SDK's own calls: callouts, the
/// effective context).
pub fn status(s: proxy_wasm::types::Status) -> Status {
    use proxy_wasm::types::Status as S;
    match s {
        S::NotFound => Status::NotFound,
        S::BadArgument => Status::BadArgument,
        S::SerializationFailure => Status::SerializationFailure,
        S::ParseFailure => Status::ParseFailure,
        S::Empty => Status::Empty,
        S::CasMismatch => Status::CasMismatch,
        _ => Status::InternalFailure,
    }
}

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

/// Hand the worker's summed counters and shared-gauge changes to Envoy.
pub fn flush_metrics(w: &Worker) {
    registry::flush(w, |kind, name, by| {
        let kind = match kind {
            registry::Kind::Counter => MetricType::Counter,
            registry::Kind::Gauge => MetricType::Gauge,
        };
        if let Some(id) = metric(w, kind, name) {
            let _ = abi::increment_metric(id, by);
        }
    });
}

/// Envoy, for the context that is running (the ABI knows which), with the
/// worker's state the root context owns.
#[derive(Default, Clone)]
pub struct AbiHost {
    worker: Rc<Worker>,
}

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
    fn worker(&self) -> &Worker {
        &self.worker
    }

    fn now_ms(&self) -> u64 {
        let now = abi::now_ms().unwrap_or(0);
        match self.worker.clock_offset_ms.get() {
            0 => now,
            off => u64::try_from(i64::try_from(now).unwrap_or(i64::MAX).saturating_add(off))
                .unwrap_or(0),
        }
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
        .map_err(status)
    }

    fn dispatch_grpc(
        &self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status> {
        hostcalls::dispatch_grpc_call(
            cluster,
            service,
            method,
            metadata.to_vec(),
            Some(message),
            Duration::from_millis(timeout_ms),
        )
        .map_err(status)
    }

    fn grpc_answer(&self, size: usize) -> Result<Vec<u8>, Status> {
        abi::get_buffer(BufferType::GrpcReceiveBuffer, 0, size).map(Option::unwrap_or_default)
    }

    fn resume_request(&self) -> Result<(), Status> {
        abi::resume_request()
    }

    fn wake(&self, context_id: u32, authorization: Option<&str>) -> Result<(), Status> {
        // The calls that follow act on that request, until the callback
        // this runs in returns.
        hostcalls::set_effective_context(context_id).map_err(status)?;
        if let Some(a) = authorization {
            hostcalls::set_map_value(MapType::HttpRequestHeaders, "authorization", Some(a))
                .map_err(status)?;
        }
        abi::resume_request()
    }

    fn gauge(&self, name: &str, value: u64) {
        if let Some(id) = metric(&self.worker, MetricType::Gauge, name) {
            let _ = abi::record_metric(id, value);
        }
    }

    fn add_to_gauge(&self, name: &str, by: i64) {
        registry::add_to_gauge(&self.worker, name, by);
    }

    fn histogram(&self, name: &str, value: u64) {
        if let Some(id) = metric(&self.worker, MetricType::Histogram, name) {
            let _ = abi::record_metric(id, value);
        }
    }

    fn emit_record(&self, record: &Record) {
        shipper::push(&self.worker, record);
    }
}
