//! [`Host`] over the dynamic-module ABI: one per HTTP stream, holding
//! Envoy's pointer to that stream's filter, with the worker's state
//! (`Worker`, per thread) and the process's store.

use super::calls::{grpc_message, grpc_request, log};
use super::ffi::{self, EnvoyBuffer, EnvoyHeader, FilterEnvoy, ModuleBuffer, ModuleHeader};
use super::store::ProcessStore;
use crate::host::registry;
use crate::host::worker::Worker;
use crate::host::{Headers, Host, LogLevel, Part, Status};
use crate::telemetry::shipper;
use portcullis_core::shared::store::{Store, StoreError};
use portcullis_core::telemetry::record::Record;
use std::cell::{Cell, RefCell};
use std::rc::Rc;

/// What one stream's host keeps between hooks.
pub struct Stream {
    /// Envoy's filter for this stream (null for a worker's root: it has no
    /// stream, and calls that need one fail with `Unimplemented`).
    pub envoy: Cell<FilterEnvoy>,
    /// The last callout answer, as the hook delivered it.
    pub call_headers: RefCell<Headers>,
    pub call_body: RefCell<Vec<u8>>,
    /// Callouts that carry gRPC (their answers are unframed).
    pub grpc_calls: RefCell<Vec<u64>>,
    /// The body hook running now, if any: only then is the received chunk
    /// readable (and the whole body the buffered part and it).
    pub in_body: Cell<Option<Part>>,
    /// The metrics of the config this stream's filter was made from.
    pub metrics: Option<std::sync::Arc<super::metrics::Table>>,
    /// This stream's scheduler while it waits for another's access token
    /// (the main thread's tick wakes it; 0: none).
    pub scheduler: Cell<usize>,
    /// Request headers were written since the route was last chosen: it is
    /// chosen again (once) before the request goes on.
    pub route_dirty: Cell<bool>,
}

impl Default for Stream {
    fn default() -> Self {
        Stream {
            envoy: Cell::new(std::ptr::null_mut()),
            call_headers: RefCell::new(Headers::default()),
            call_body: RefCell::new(Vec::new()),
            grpc_calls: RefCell::new(Vec::new()),
            in_body: Cell::new(None),
            metrics: None,
            scheduler: Cell::new(0),
            route_dirty: Cell::new(false),
        }
    }
}

#[derive(Default, Clone)]
pub struct NativeHost {
    pub worker: Rc<Worker>,
    pub stream: Rc<Stream>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn kinds(part: Part) -> Option<(i32, i32)> {
    match part {
        Part::Request => Some((ffi::BUFFERED_REQUEST_BODY, ffi::RECEIVED_REQUEST_BODY)),
        Part::Response => Some((ffi::BUFFERED_RESPONSE_BODY, ffi::RECEIVED_RESPONSE_BODY)),
        Part::CallResponse => None,
    }
}

/// A body's chunks of one kind appended to `out`, up to `limit` bytes.
fn append_chunks(f: FilterEnvoy, kind: i32, out: &mut Vec<u8>, limit: usize) {
    // SAFETY: `f` is the live filter of the hook running; the vector has
    // room for the number of chunks Envoy said it has.
    unsafe {
        let n = ffi::envoy_dynamic_module_callback_http_get_body_chunks_size(f, kind);
        if n == 0 {
            return;
        }
        let mut bufs = vec![
            EnvoyBuffer {
                ptr: std::ptr::null(),
                length: 0
            };
            n
        ];
        if !ffi::envoy_dynamic_module_callback_http_get_body_chunks(f, kind, bufs.as_mut_ptr()) {
            return;
        }
        ffi::append_chunks(bufs.as_ptr(), n, out, limit);
    }
}

impl Stream {
    /// The route was chosen on the headers as they came; the filter's
    /// (`x-portcullis-cluster`, the path) choose it again, once, before the
    /// request goes on (the Wasm host clears it at every header written).
    pub fn settle_route(&self) {
        let f = self.envoy.get();
        if self.route_dirty.replace(false) && !f.is_null() {
            // SAFETY: live filter.
            unsafe { ffi::envoy_dynamic_module_callback_http_clear_route_cache(f) };
        }
    }
}

impl NativeHost {
    /// Which of a body's parts hold it now: inside its body hook the
    /// buffered part and the chunk received (or the chunk alone when it is
    /// the buffered body handed on), outside it the buffered part.
    fn body_kinds(
        &self,
        f: FilterEnvoy,
        buffered: i32,
        received: i32,
        part: Part,
    ) -> impl Iterator<Item = i32> {
        let kinds = self.body_kind_pair(f, buffered, received, part);
        kinds.into_iter().flatten()
    }

    fn body_kind_pair(
        &self,
        f: FilterEnvoy,
        buffered: i32,
        received: i32,
        part: Part,
    ) -> [Option<i32>; 2] {
        if self.stream.in_body.get() != Some(part) {
            return [Some(buffered), None];
        }
        // SAFETY: live filter, inside its body hook.
        let received_is_buffered = unsafe {
            match part {
                Part::Request => {
                    ffi::envoy_dynamic_module_callback_http_received_buffered_request_body(f)
                }
                _ => ffi::envoy_dynamic_module_callback_http_received_buffered_response_body(f),
            }
        };
        if received_is_buffered {
            [Some(received), None]
        } else {
            [Some(buffered), Some(received)]
        }
    }

    /// A body's size without copying it (a body hook's `body_size`).
    pub fn body_size(&self, part: Part) -> usize {
        let (Some((buffered, received)), Ok(f)) = (kinds(part), self.filter()) else {
            return 0;
        };
        self.body_kinds(f, buffered, received, part)
            // SAFETY: live filter of the hook running.
            .map(|k| unsafe { ffi::envoy_dynamic_module_callback_http_get_body_size(f, k) })
            .fold(0usize, usize::saturating_add)
    }

    fn filter(&self) -> Result<FilterEnvoy, Status> {
        let f = self.stream.envoy.get();
        if f.is_null() {
            Err(Status::Unimplemented)
        } else {
            Ok(f)
        }
    }

    fn callout(
        &self,
        cluster: &str,
        headers: &[(&str, &[u8])],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u64, Status> {
        let f = self.filter()?;
        let mut hs: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader::of(k.as_bytes(), v))
            .collect();
        let mut id = 0u64;
        // SAFETY: live filter; every buffer outlives the call.
        let r = unsafe {
            ffi::envoy_dynamic_module_callback_http_filter_http_callout(
                f,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                hs.as_mut_ptr(),
                hs.len(),
                ModuleBuffer::of(body),
                timeout_ms,
            )
        };
        match r {
            ffi::CALLOUT_SUCCESS => Ok(id),
            ffi::CALLOUT_MISSING_HEADERS => Err(Status::BadArgument),
            ffi::CALLOUT_CLUSTER_NOT_FOUND => Err(Status::BadArgument),
            _ => Err(Status::InternalFailure),
        }
    }
}

impl Store for NativeHost {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        ProcessStore.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        ProcessStore.set(key, value, cas)
    }
}

impl Host for NativeHost {
    fn worker(&self) -> &Worker {
        &self.worker
    }

    fn now_ms(&self) -> u64 {
        let now = now_ms();
        match self.worker.clock_offset_ms.get() {
            0 => now,
            off => u64::try_from(i64::try_from(now).unwrap_or(i64::MAX).saturating_add(off))
                .unwrap_or(0),
        }
    }

    fn log(&self, level: LogLevel, message: &str) {
        log(level, message);
    }

    fn headers(&self, part: Part) -> Result<Headers, Status> {
        let kind = match part {
            Part::Request => ffi::REQUEST_HEADER,
            Part::Response => ffi::RESPONSE_HEADER,
            Part::CallResponse => return Ok(self.stream.call_headers.borrow().clone()),
        };
        let f = self.filter()?;
        // SAFETY: live filter; the vector has room for every header Envoy
        // counted, and the buffers are copied before the hook returns.
        unsafe {
            let n = ffi::envoy_dynamic_module_callback_http_get_headers_size(f, kind);
            let mut hs = vec![
                EnvoyHeader {
                    key_ptr: std::ptr::null(),
                    key_length: 0,
                    value_ptr: std::ptr::null(),
                    value_length: 0,
                };
                n
            ];
            if n > 0
                && !ffi::envoy_dynamic_module_callback_http_get_headers(f, kind, hs.as_mut_ptr())
            {
                return Err(Status::NotFound);
            }
            Ok(ffi::copy_headers(hs.as_ptr(), n))
        }
    }

    fn set_header(&self, part: Part, name: &str, value: Option<&str>) -> Result<(), Status> {
        let kind = match part {
            Part::Request => ffi::REQUEST_HEADER,
            Part::Response => ffi::RESPONSE_HEADER,
            Part::CallResponse => return Err(Status::BadArgument),
        };
        let f = self.filter()?;
        let value = value.map_or(ModuleBuffer::null(), |v| ModuleBuffer::of(v.as_bytes()));
        // SAFETY: live filter; buffers outlive the call.
        let ok = unsafe {
            ffi::envoy_dynamic_module_callback_http_set_header(
                f,
                kind,
                ModuleBuffer::of(name.as_bytes()),
                value,
            )
        };
        if part == Part::Request {
            self.stream.route_dirty.set(true);
        }
        ok.then_some(()).ok_or(Status::NotFound)
    }

    fn add_header(&self, part: Part, name: &str, value: &str) -> Result<(), Status> {
        let kind = match part {
            Part::Request => ffi::REQUEST_HEADER,
            Part::Response => ffi::RESPONSE_HEADER,
            Part::CallResponse => return Err(Status::BadArgument),
        };
        let f = self.filter()?;
        // SAFETY: live filter; buffers outlive the call.
        let ok = unsafe {
            ffi::envoy_dynamic_module_callback_http_add_header(
                f,
                kind,
                ModuleBuffer::of(name.as_bytes()),
                ModuleBuffer::of(value.as_bytes()),
            )
        };
        if part == Part::Request {
            self.stream.route_dirty.set(true);
        }
        ok.then_some(()).ok_or(Status::NotFound)
    }

    fn body(&self, part: Part, size: usize) -> Result<Vec<u8>, Status> {
        let Some((buffered, received)) = kinds(part) else {
            let b = self.stream.call_body.borrow();
            return Ok(b.get(..size.min(b.len())).unwrap_or_default().to_vec());
        };
        let f = self.filter()?;
        let mut out = Vec::new();
        for kind in self.body_kinds(f, buffered, received, part) {
            append_chunks(f, kind, &mut out, size);
        }
        Ok(out)
    }

    fn set_body(&self, part: Part, _size: usize, bytes: &[u8]) -> Result<(), Status> {
        let Some((buffered, received)) = kinds(part) else {
            return Err(Status::BadArgument);
        };
        let f = self.filter()?;
        // The whole body is replaced (every caller passes its whole size):
        // inside the body hook it is the buffered part and the chunk
        // received, which Envoy joins when the hook lets it go on.
        let inside = self.stream.in_body.get() == Some(part);
        // SAFETY: live filter; the bytes outlive the call.
        let ok = unsafe {
            ffi::envoy_dynamic_module_callback_http_drain_body(f, buffered, usize::MAX);
            if inside {
                ffi::envoy_dynamic_module_callback_http_drain_body(f, received, usize::MAX);
            }
            ffi::envoy_dynamic_module_callback_http_append_body(
                f,
                if inside { received } else { buffered },
                ModuleBuffer::of(bytes),
            )
        };
        ok.then_some(()).ok_or(Status::NotFound)
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        let id = match path {
            ["response", "code_details"] => ffi::ATTRIBUTE_RESPONSE_CODE_DETAILS,
            _ => return None,
        };
        let f = self.filter().ok()?;
        let mut out = EnvoyBuffer {
            ptr: std::ptr::null(),
            length: 0,
        };
        // SAFETY: live filter; the result is copied before the hook returns.
        unsafe {
            ffi::envoy_dynamic_module_callback_http_filter_get_attribute_string(f, id, &mut out)
                .then(|| ffi::copy(out.ptr, out.length))
        }
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), Status> {
        let f = self.filter()?;
        let mut hs: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader::of(k.as_bytes(), v))
            .collect();
        // SAFETY: live filter; every buffer outlives the call.
        unsafe {
            ffi::envoy_dynamic_module_callback_http_send_response(
                f,
                u32::from(status),
                hs.as_mut_ptr(),
                hs.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(b"portcullis"),
            );
        }
        Ok(())
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status> {
        let hs: Vec<(&str, &[u8])> = headers.iter().map(|(k, v)| (*k, v.as_bytes())).collect();
        let id = self.callout(cluster, &hs, body, timeout_ms)?;
        u32::try_from(id).map_err(|_| Status::InternalFailure)
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
        let (headers, body) =
            grpc_request(cluster, service, method, metadata, message).ok_or(Status::BadArgument)?;
        let hs: Vec<(&str, &[u8])> = headers.iter().collect();
        let id = self.callout(cluster, &hs, &body, timeout_ms)?;
        if let Ok(mut g) = self.stream.grpc_calls.try_borrow_mut() {
            g.push(id);
        }
        u32::try_from(id).map_err(|_| Status::InternalFailure)
    }

    fn grpc_answer(&self, size: usize) -> Result<Vec<u8>, Status> {
        let b = self.stream.call_body.borrow();
        let m = grpc_message(&b).ok_or(Status::NotFound)?;
        Ok(m.get(..size.min(m.len())).unwrap_or_default().to_vec())
    }

    fn resume_request(&self) -> Result<(), Status> {
        let f = self.filter()?;
        self.stream.settle_route();
        // SAFETY: live filter.
        unsafe { ffi::envoy_dynamic_module_callback_http_filter_continue_decoding(f) };
        Ok(())
    }

    fn wake(&self, context_id: u32, authorization: Option<&str>) -> Result<(), Status> {
        let other = super::live_filter(context_id).ok_or(Status::NotFound)?;
        let host = NativeHost {
            worker: self.worker.clone(),
            stream: other,
        };
        if let Some(a) = authorization {
            host.set_header(Part::Request, "authorization", Some(a))?;
        }
        host.resume_request()
    }

    fn gauge(&self, name: &str, value: u64) {
        // A worker's root (no stream) sets gauges only as it applies a
        // config, to what the main thread's root set then from the same
        // shared state: left out, so a late copy cannot undo a request's.
        if let (Ok(f), Some(t)) = (self.filter(), self.stream.metrics.as_ref()) {
            t.set_now(f, name, value);
        }
    }

    fn add_to_gauge(&self, name: &str, by: i64) {
        registry::add_to_gauge(&self.worker, name, by);
    }

    fn histogram(&self, name: &str, value: u64) {
        super::main_thread::record(name, value);
    }

    fn emit_record(&self, record: &Record) {
        shipper::push(&self.worker, record);
    }
}
