//! The dynamic-module ABI as Envoy 1.40 exports it (`v0.2.0`): our own
//! declarations of the types, hooks' argument types and the callbacks we
//! call, written from the ABI's published signatures (Envoy's
//! `source/extensions/dynamic_modules/abi.h`). Only what the gateway uses.

#![allow(non_camel_case_types)]

use crate::host::Headers;
use std::ffi::c_void;

/// The ABI version this module is built for (`envoy_dynamic_module_on_program_init`).
pub const ABI_VERSION: &[u8] = b"v0.2.0\0";

/// Bytes Envoy owns, valid until the hook returns.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

/// Bytes the module owns, valid for the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }

    /// The null buffer (a header's value: remove it).
    pub fn null() -> ModuleBuffer {
        ModuleBuffer {
            ptr: std::ptr::null(),
            length: 0,
        }
    }
}

/// A header the module owns (local replies, callouts).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl ModuleHeader {
    pub fn of(key: &[u8], value: &[u8]) -> ModuleHeader {
        ModuleHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

/// A header Envoy owns (header maps, callout answers).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

pub type FilterEnvoy = *mut c_void;
pub type FilterModule = *const c_void;
pub type ConfigEnvoy = *mut c_void;
pub type ConfigModule = *const c_void;
pub type Scheduler = *mut c_void;

// envoy_dynamic_module_type_http_header_type
pub const REQUEST_HEADER: i32 = 0;
pub const RESPONSE_HEADER: i32 = 2;

// envoy_dynamic_module_type_http_body_type
pub const RECEIVED_REQUEST_BODY: i32 = 0;
pub const BUFFERED_REQUEST_BODY: i32 = 1;
pub const RECEIVED_RESPONSE_BODY: i32 = 2;
pub const BUFFERED_RESPONSE_BODY: i32 = 3;

// Hook statuses: headers (Continue, StopIteration, ...), bodies (Continue,
// StopIterationAndBuffer, ...).
pub const CONTINUE: i32 = 0;
pub const STOP_ITERATION: i32 = 1;
pub const STOP_ITERATION_AND_BUFFER: i32 = 1;

// envoy_dynamic_module_type_http_callout_init_result
pub const CALLOUT_SUCCESS: i32 = 0;
pub const CALLOUT_MISSING_HEADERS: i32 = 1;
pub const CALLOUT_CLUSTER_NOT_FOUND: i32 = 2;

// envoy_dynamic_module_type_http_callout_result
pub const CALLOUT_RESULT_SUCCESS: i32 = 0;

// envoy_dynamic_module_type_attribute_id
pub const ATTRIBUTE_RESPONSE_CODE_DETAILS: i32 = 16;

extern "C" {
    pub fn envoy_dynamic_module_callback_log(level: i32, message: ModuleBuffer);
    pub fn envoy_dynamic_module_callback_log_enabled(level: i32) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_headers_size(f: FilterEnvoy, kind: i32) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_headers(
        f: FilterEnvoy,
        kind: i32,
        out: *mut EnvoyHeader,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_set_header(
        f: FilterEnvoy,
        kind: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_add_header(
        f: FilterEnvoy,
        kind: i32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_send_response(
        f: FilterEnvoy,
        status: u32,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    pub fn envoy_dynamic_module_callback_http_get_body_size(f: FilterEnvoy, kind: i32) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(
        f: FilterEnvoy,
        kind: i32,
    ) -> usize;
    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        f: FilterEnvoy,
        kind: i32,
        out: *mut EnvoyBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_append_body(
        f: FilterEnvoy,
        kind: i32,
        data: ModuleBuffer,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_drain_body(
        f: FilterEnvoy,
        kind: i32,
        n: usize,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_received_buffered_request_body(
        f: FilterEnvoy,
    ) -> bool;
    pub fn envoy_dynamic_module_callback_http_received_buffered_response_body(
        f: FilterEnvoy,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_continue_decoding(f: FilterEnvoy);
    pub fn envoy_dynamic_module_callback_http_clear_route_cache(f: FilterEnvoy);

    pub fn envoy_dynamic_module_callback_http_filter_http_callout(
        f: FilterEnvoy,
        callout_id: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> i32;

    pub fn envoy_dynamic_module_callback_http_filter_config_http_callout(
        c: ConfigEnvoy,
        callout_id: *mut u64,
        cluster: ModuleBuffer,
        headers: *mut ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        timeout_ms: u64,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_new(
        c: ConfigEnvoy,
    ) -> Scheduler;
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
        s: Scheduler,
        event: u64,
    );
    pub fn envoy_dynamic_module_callback_http_filter_config_scheduler_delete(s: Scheduler);

    pub fn envoy_dynamic_module_callback_http_filter_config_define_counter(
        c: ConfigEnvoy,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_size: usize,
        id: *mut usize,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_counter(
        c: ConfigEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> i32;

    pub fn envoy_dynamic_module_callback_http_filter_config_define_gauge(
        c: ConfigEnvoy,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_size: usize,
        id: *mut usize,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_define_histogram(
        c: ConfigEnvoy,
        name: ModuleBuffer,
        label_names: *mut ModuleBuffer,
        label_names_size: usize,
        id: *mut usize,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_increment_gauge(
        c: ConfigEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_decrement_gauge(
        c: ConfigEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_set_gauge(
        c: ConfigEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_config_record_histogram_value(
        c: ConfigEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> i32;

    pub fn envoy_dynamic_module_callback_http_filter_set_gauge(
        f: FilterEnvoy,
        id: usize,
        label_values: *mut ModuleBuffer,
        label_values_size: usize,
        value: u64,
    ) -> i32;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(f: FilterEnvoy) -> Scheduler;
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(s: Scheduler, event: u64);
    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(s: Scheduler);

    pub fn envoy_dynamic_module_callback_http_filter_get_attribute_string(
        f: FilterEnvoy,
        id: i32,
        out: *mut EnvoyBuffer,
    ) -> bool;
}

/// Bytes Envoy lent for the duration of a hook, copied.
///
/// # Safety
/// `ptr` is null or points at `len` readable bytes.
pub unsafe fn copy(ptr: *const u8, len: usize) -> Vec<u8> {
    if ptr.is_null() || len == 0 {
        return Vec::new();
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(ptr, len) }.to_vec()
}

/// Headers Envoy lent, copied into one map (room reserved once); a name
/// that is not text is left out.
///
/// # Safety
/// `headers` is null or points at `n` headers whose buffers are readable.
pub unsafe fn copy_headers(headers: *const EnvoyHeader, n: usize) -> Headers {
    if headers.is_null() || n == 0 {
        return Headers::default();
    }
    // SAFETY: the caller's guarantee.
    let all = unsafe { std::slice::from_raw_parts(headers, n) };
    let (names, values) = all.iter().fold((0usize, 0usize), |(k, v), h| {
        (
            k.saturating_add(h.key_length),
            v.saturating_add(h.value_length),
        )
    });
    // The names are checked once, all together (one by one cost more than
    // the copy): all ASCII, each is text; a map with any other byte in a
    // name (never from Envoy's codecs) is taken apart name by name, so a
    // name that is not text alone is left out even when its neighbours'
    // bytes would complete it.
    let mut name_bytes = Vec::with_capacity(names);
    let mut value_bytes = Vec::with_capacity(values);
    let mut places = Vec::with_capacity(n);
    for h in all {
        // SAFETY: Envoy's buffers, valid during the hook.
        let (key, value) = unsafe {
            (
                lent(h.key_ptr, h.key_length),
                lent(h.value_ptr, h.value_length),
            )
        };
        let (k, v) = (name_bytes.len(), value_bytes.len());
        name_bytes.extend_from_slice(key);
        value_bytes.extend_from_slice(value);
        places.push((k..name_bytes.len(), v..value_bytes.len()));
    }
    let names = if name_bytes.is_ascii() {
        String::from_utf8(name_bytes).map_err(std::string::FromUtf8Error::into_bytes)
    } else {
        Err(name_bytes)
    };
    match names {
        Ok(names) => Headers::over(value_bytes, names, places),
        Err(names) => {
            let mut out = Headers::with_capacity(n, names.len(), value_bytes.len());
            for (k, v) in places {
                let key = names.get(k).and_then(|k| std::str::from_utf8(k).ok());
                if let (Some(key), Some(value)) = (key, value_bytes.get(v)) {
                    out.push(key, value);
                }
            }
            out
        }
    }
}

/// A buffer Envoy lent, as a slice (empty for null).
///
/// # Safety
/// `ptr` is null or points at `len` readable bytes that outlive the slice.
unsafe fn lent<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if ptr.is_null() || len == 0 {
        return &[];
    }
    // SAFETY: the caller's guarantee.
    unsafe { std::slice::from_raw_parts(ptr, len) }
}

/// Body chunks Envoy lent, concatenated.
///
/// # Safety
/// `chunks` is null or points at `n` readable buffers.
pub unsafe fn copy_chunks(chunks: *const EnvoyBuffer, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    // SAFETY: the caller's guarantee.
    unsafe { append_chunks(chunks, n, &mut out, usize::MAX) };
    out
}

/// Body chunks Envoy lent, appended to `out` until it holds `limit` bytes:
/// one copy of each byte into room reserved once (a copy per chunk and a
/// growing vector cost a 1 MB body about 3 MB of copying).
///
/// # Safety
/// `chunks` is null or points at `n` readable buffers.
pub unsafe fn append_chunks(chunks: *const EnvoyBuffer, n: usize, out: &mut Vec<u8>, limit: usize) {
    if chunks.is_null() || n == 0 {
        return;
    }
    // SAFETY: the caller's guarantee.
    let all = unsafe { std::slice::from_raw_parts(chunks, n) };
    let total = all.iter().fold(0usize, |a, c| a.saturating_add(c.length));
    out.reserve(total.min(limit.saturating_sub(out.len())));
    for c in all {
        let room = limit.saturating_sub(out.len());
        if room == 0 {
            break;
        }
        if c.ptr.is_null() || c.length == 0 {
            continue;
        }
        // SAFETY: Envoy's buffers, valid during the hook.
        let bytes = unsafe { std::slice::from_raw_parts(c.ptr, c.length) };
        out.extend_from_slice(bytes.get(..room.min(bytes.len())).unwrap_or_default());
    }
}
