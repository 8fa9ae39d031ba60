//! Envoy's side of the dynamic-module ABI, faked for the FFI layer's unit
//! tests: the callbacks the module calls, over one thread-local stream
//! (header maps, body buffers, the local reply, callouts). Integration
//! tests run the real Envoy; these drive every hook with hostile arguments
//! and check none unwinds.

#![allow(clippy::missing_safety_doc, clippy::indexing_slicing)]

use super::ffi::*;
use std::cell::RefCell;

#[derive(Default)]
pub struct FakeStream {
    pub request_headers: Vec<(String, String)>,
    pub response_headers: Vec<(String, String)>,
    pub buffered: [Vec<u8>; 4],
    pub received: [Vec<u8>; 4],
    pub sent: Option<(u32, String)>,
    pub callouts: Vec<String>,
    pub continued: u32,
    pub logs: Vec<String>,
    /// Keeps what `get_headers` lent alive until the next call.
    lent: Vec<Vec<u8>>,
}

thread_local! {
    pub static FAKE: RefCell<FakeStream> = RefCell::new(FakeStream::default());
}

fn text(b: ModuleBuffer) -> String {
    // SAFETY: the module passes live buffers (or null).
    String::from_utf8_lossy(&unsafe { copy(b.ptr, b.length) }).into_owned()
}

fn map(s: &mut FakeStream, kind: i32) -> &mut Vec<(String, String)> {
    if kind == REQUEST_HEADER {
        &mut s.request_headers
    } else {
        &mut s.response_headers
    }
}

fn body_index(kind: i32) -> Option<(usize, bool)> {
    match kind {
        RECEIVED_REQUEST_BODY => Some((0, false)),
        BUFFERED_REQUEST_BODY => Some((0, true)),
        RECEIVED_RESPONSE_BODY => Some((2, false)),
        BUFFERED_RESPONSE_BODY => Some((2, true)),
        _ => None,
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_log(_level: i32, message: ModuleBuffer) {
    let m = text(message);
    FAKE.with(|f| f.borrow_mut().logs.push(m));
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_log_enabled(_level: i32) -> bool {
    true
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_get_headers_size(
    _f: FilterEnvoy,
    kind: i32,
) -> usize {
    FAKE.with(|f| map(&mut f.borrow_mut(), kind).len())
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_headers(
    _f: FilterEnvoy,
    kind: i32,
    out: *mut EnvoyHeader,
) -> bool {
    FAKE.with(|f| {
        let mut f = f.borrow_mut();
        let pairs = map(&mut f, kind).clone();
        f.lent.clear();
        for (i, (k, v)) in pairs.iter().enumerate() {
            f.lent.push(k.as_bytes().to_vec());
            f.lent.push(v.as_bytes().to_vec());
            let (kp, vp) = (&f.lent[2 * i], &f.lent[2 * i + 1]);
            // SAFETY: the module sized `out` by `get_headers_size`.
            unsafe {
                *out.add(i) = EnvoyHeader {
                    key_ptr: kp.as_ptr(),
                    key_length: kp.len(),
                    value_ptr: vp.as_ptr(),
                    value_length: vp.len(),
                };
            }
        }
        true
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_set_header(
    _f: FilterEnvoy,
    kind: i32,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    let (k, v) = (text(key), (!value.ptr.is_null()).then(|| text(value)));
    FAKE.with(|f| {
        let mut f = f.borrow_mut();
        let m = map(&mut f, kind);
        m.retain(|(name, _)| *name != k);
        if let Some(v) = v {
            m.push((k, v));
        }
    });
    true
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_add_header(
    _f: FilterEnvoy,
    kind: i32,
    key: ModuleBuffer,
    value: ModuleBuffer,
) -> bool {
    let (k, v) = (text(key), text(value));
    FAKE.with(|f| map(&mut f.borrow_mut(), kind).push((k, v)));
    true
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_send_response(
    _f: FilterEnvoy,
    status: u32,
    _headers: *mut ModuleHeader,
    _n: usize,
    body: ModuleBuffer,
    _details: ModuleBuffer,
) {
    let b = text(body);
    FAKE.with(|f| f.borrow_mut().sent = Some((status, b)));
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks_size(
    _f: FilterEnvoy,
    kind: i32,
) -> usize {
    FAKE.with(|f| {
        let f = f.borrow();
        match body_index(kind) {
            Some((i, true)) => usize::from(!f.buffered[i].is_empty()),
            Some((i, false)) => usize::from(!f.received[i].is_empty()),
            None => 0,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_get_body_chunks(
    _f: FilterEnvoy,
    kind: i32,
    out: *mut EnvoyBuffer,
) -> bool {
    FAKE.with(|f| {
        let f = f.borrow();
        let b = match body_index(kind) {
            Some((i, true)) => &f.buffered[i],
            Some((i, false)) => &f.received[i],
            None => return false,
        };
        if !b.is_empty() {
            // SAFETY: sized by `get_body_chunks_size` (one chunk); the
            // buffer outlives the module's copy, made before it returns.
            unsafe {
                *out = EnvoyBuffer {
                    ptr: b.as_ptr(),
                    length: b.len(),
                };
            }
        }
        true
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_append_body(
    _f: FilterEnvoy,
    kind: i32,
    data: ModuleBuffer,
) -> bool {
    // SAFETY: the module's live buffer.
    let d = unsafe { copy(data.ptr, data.length) };
    FAKE.with(|f| {
        let mut f = f.borrow_mut();
        match body_index(kind) {
            Some((i, true)) => f.buffered[i].extend(d),
            Some((i, false)) => f.received[i].extend(d),
            None => return false,
        }
        true
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_drain_body(
    _f: FilterEnvoy,
    kind: i32,
    n: usize,
) -> bool {
    FAKE.with(|f| {
        let mut f = f.borrow_mut();
        let b = match body_index(kind) {
            Some((i, true)) => &mut f.buffered[i],
            Some((i, false)) => &mut f.received[i],
            None => return false,
        };
        let n = n.min(b.len());
        b.drain(..n);
        true
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_received_buffered_request_body(
    _f: FilterEnvoy,
) -> bool {
    false
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_received_buffered_response_body(
    _f: FilterEnvoy,
) -> bool {
    false
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_continue_decoding(_f: FilterEnvoy) {
    FAKE.with(|f| f.borrow_mut().continued += 1);
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_clear_route_cache(_f: FilterEnvoy) {}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_http_callout(
    _f: FilterEnvoy,
    id: *mut u64,
    cluster: ModuleBuffer,
    _headers: *mut ModuleHeader,
    _n: usize,
    _body: ModuleBuffer,
    _timeout: u64,
) -> i32 {
    let c = text(cluster);
    FAKE.with(|f| {
        let mut f = f.borrow_mut();
        f.callouts.push(c);
        // SAFETY: the module's out-parameter.
        unsafe { *id = f.callouts.len() as u64 };
    });
    CALLOUT_SUCCESS
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_config_http_callout(
    _c: ConfigEnvoy,
    _id: *mut u64,
    _cluster: ModuleBuffer,
    _headers: *mut ModuleHeader,
    _n: usize,
    _body: ModuleBuffer,
    _timeout: u64,
) -> i32 {
    CALLOUT_CLUSTER_NOT_FOUND
}

static SCHEDULER: u8 = 0;

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
    _c: ConfigEnvoy,
) -> Scheduler {
    std::ptr::addr_of!(SCHEDULER) as Scheduler
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
    _s: Scheduler,
    _event: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(_s: Scheduler) {
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
    _f: FilterEnvoy,
    _id: i32,
    _out: *mut EnvoyBuffer,
) -> bool {
    false
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_counter(
    _c: ConfigEnvoy,
    _name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _id: *mut usize,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
    _c: ConfigEnvoy,
    _name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _id: *mut usize,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
    _c: ConfigEnvoy,
    _name: ModuleBuffer,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _id: *mut usize,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
    _c: ConfigEnvoy,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _value: u64,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
    _c: ConfigEnvoy,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _value: u64,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
    _c: ConfigEnvoy,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _value: u64,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
    _c: ConfigEnvoy,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _value: u64,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
    _c: ConfigEnvoy,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _value: u64,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_set_gauge(
    _f: FilterEnvoy,
    _id: usize,
    _labels: *mut ModuleBuffer,
    _n: usize,
    _value: u64,
) -> i32 {
    0
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_new(
    _f: FilterEnvoy,
) -> Scheduler {
    std::ptr::addr_of!(SCHEDULER) as Scheduler
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_commit(
    _s: Scheduler,
    _e: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_filter_scheduler_delete(_s: Scheduler) {}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_callback_http_get_body_size(
    _f: FilterEnvoy,
    kind: i32,
) -> usize {
    FAKE.with(|f| {
        let f = f.borrow();
        match body_index(kind) {
            Some((i, true)) => f.buffered[i].len(),
            Some((i, false)) => f.received[i].len(),
            None => 0,
        }
    })
}
