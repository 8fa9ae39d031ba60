//! The host calls the filter makes, declared against the proxy-wasm ABI
//! itself so that every status the host returns becomes a `Result`.
//!
//! The SDK's wrappers (`proxy_wasm::hostcalls`) panic on any status they do
//! not expect, and its header-map reader panics on a header value that is not
//! UTF-8 (HTTP allows such bytes; one client request carrying one used to
//! trap the VM and turn every later request on that worker into a 503). A
//! panic here is never an option, so these wrappers map every status and
//! read header maps as bytes.
//!
//! Two calls stay with the SDK: `dispatch_http_call` and `dispatch_grpc_call`
//! register their token with the SDK's dispatcher, which is what routes the
//! answer back to the right context. The statuses Envoy returns for them
//! (`BadArgument`, `ParseFailure`, `InternalFailure`) are all mapped by the SDK.

use crate::host::Headers;
use crate::host::{LogLevel, Status};
use portcullis_core::wire::headers::{decode_pairs, encode_pairs};
use proxy_wasm::types::{BufferType, MapType, MetricType};
use std::ptr::{null, null_mut};

#[link(wasm_import_module = "env")]
extern "C" {
    fn proxy_log(level: u32, data: *const u8, size: usize) -> u32;
    fn proxy_get_current_time_nanoseconds(out: *mut u64) -> u32;
    fn proxy_set_tick_period_milliseconds(period: u32) -> u32;
    fn proxy_continue_stream(stream: u32) -> u32;
    fn proxy_get_buffer_bytes(
        buffer: u32,
        start: usize,
        max: usize,
        out: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_set_buffer_bytes(
        buffer: u32,
        start: usize,
        size: usize,
        data: *const u8,
        data_size: usize,
    ) -> u32;
    fn proxy_get_header_map_pairs(map: u32, out: *mut *mut u8, out_size: *mut usize) -> u32;
    fn proxy_replace_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_remove_header_map_value(map: u32, key: *const u8, key_size: usize) -> u32;
    fn proxy_add_header_map_value(
        map: u32,
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
    ) -> u32;
    fn proxy_get_property(
        path: *const u8,
        path_size: usize,
        out: *mut *mut u8,
        out_size: *mut usize,
    ) -> u32;
    fn proxy_get_shared_data(
        key: *const u8,
        key_size: usize,
        out: *mut *mut u8,
        out_size: *mut usize,
        out_cas: *mut u32,
    ) -> u32;
    fn proxy_set_shared_data(
        key: *const u8,
        key_size: usize,
        value: *const u8,
        value_size: usize,
        cas: u32,
    ) -> u32;
    #[allow(clippy::too_many_arguments)]
    fn proxy_send_local_response(
        status: u32,
        details: *const u8,
        details_size: usize,
        body: *const u8,
        body_size: usize,
        headers: *const u8,
        headers_size: usize,
        grpc_status: i32,
    ) -> u32;
    fn proxy_define_metric(kind: u32, name: *const u8, name_size: usize, out_id: *mut u32) -> u32;
    fn proxy_increment_metric(id: u32, offset: i64) -> u32;
    fn proxy_record_metric(id: u32, value: u64) -> u32;
}

/// A host status code as a `Result`; codes this build does not know are an
/// internal failure, never a panic.
fn status(code: u32) -> Result<(), Status> {
    Err(match code {
        0 => return Ok(()),
        1 => Status::NotFound,
        2 => Status::BadArgument,
        3 => Status::SerializationFailure,
        4 => Status::ParseFailure,
        7 => Status::Empty,
        8 => Status::CasMismatch,
        _ => Status::InternalFailure,
    })
}

/// Take ownership of bytes the host wrote into memory it got from the
/// module's allocator (`proxy_on_memory_allocate`, a `Vec` of exactly `size`).
///
/// # Safety
/// `data` is null, or was allocated by this module's allocator for `size` bytes.
unsafe fn owned(data: *mut u8, size: usize) -> Option<Vec<u8>> {
    (!data.is_null()).then(|| Vec::from_raw_parts(data, size, size))
}

/// Call a host function that hands back bytes; `NotFound` is `None`.
fn returned(call: impl FnOnce(*mut *mut u8, *mut usize) -> u32) -> Result<Option<Vec<u8>>, Status> {
    let mut data: *mut u8 = null_mut();
    let mut size: usize = 0;
    match status(call(&mut data, &mut size)) {
        // SAFETY: on success the host filled `data`/`size` from our allocator.
        Ok(()) => Ok(unsafe { owned(data, size) }),
        Err(Status::NotFound) => {
            // SAFETY: as above; a host may still have allocated.
            drop(unsafe { owned(data, size) });
            Ok(None)
        }
        Err(s) => {
            // SAFETY: as above.
            drop(unsafe { owned(data, size) });
            Err(s)
        }
    }
}

pub fn log(level: LogLevel, message: &str) -> Result<(), Status> {
    // SAFETY: pointer and length of a live &str.
    status(unsafe { proxy_log(level as u32, message.as_ptr(), message.len()) })
}

/// Milliseconds since the Unix epoch, by the host's clock.
pub fn now_ms() -> Result<u64, Status> {
    let mut ns: u64 = 0;
    // SAFETY: writes one u64 we own.
    status(unsafe { proxy_get_current_time_nanoseconds(&mut ns) })?;
    Ok(ns / 1_000_000)
}

pub fn set_tick_period_ms(ms: u32) -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_set_tick_period_milliseconds(ms) })
}

/// Let a paused request go on (`StreamType::HttpRequest` is 0).
pub fn resume_request() -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_continue_stream(0) })
}

pub fn get_buffer(buffer: BufferType, start: usize, max: usize) -> Result<Option<Vec<u8>>, Status> {
    // SAFETY: out-pointers to locals of `returned`.
    returned(|d, s| unsafe { proxy_get_buffer_bytes(buffer as u32, start, max, d, s) })
}

pub fn set_buffer(
    buffer: BufferType,
    start: usize,
    size: usize,
    data: &[u8],
) -> Result<(), Status> {
    // SAFETY: pointer and length of a live slice.
    status(unsafe { proxy_set_buffer_bytes(buffer as u32, start, size, data.as_ptr(), data.len()) })
}

/// A header map as bytes (values need not be UTF-8): the values stay in the
/// buffer the host filled; a name that is not text is left out (Envoy's
/// codecs let none through).
pub fn get_map_bytes(map: MapType) -> Result<Headers, Status> {
    // SAFETY: out-pointers to locals of `returned`.
    let raw = returned(|d, s| unsafe { proxy_get_header_map_pairs(map as u32, d, s) })?
        .unwrap_or_default();
    let base = raw.as_ptr() as usize;
    let mut names = String::new();
    let mut places = Vec::new();
    for (k, v) in decode_pairs(&raw).ok_or(Status::SerializationFailure)? {
        let Ok(k) = std::str::from_utf8(k) else {
            continue;
        };
        // `v` is a slice of `raw`: its place there.
        let start = (v.as_ptr() as usize).saturating_sub(base);
        let n = names.len();
        names.push_str(k);
        places.push((n..names.len(), start..start.saturating_add(v.len())));
    }
    Ok(Headers::over(raw, names, places))
}

/// Replace a header (or remove it, with `None`).
pub fn set_map_value(map: MapType, key: &str, value: Option<&str>) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live &strs.
    status(unsafe {
        match value {
            Some(v) => proxy_replace_header_map_value(
                map as u32,
                key.as_ptr(),
                key.len(),
                v.as_ptr(),
                v.len(),
            ),
            None => proxy_remove_header_map_value(map as u32, key.as_ptr(), key.len()),
        }
    })
}

pub fn add_map_value(map: MapType, key: &str, value: &str) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live &strs.
    status(unsafe {
        proxy_add_header_map_value(
            map as u32,
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
        )
    })
}

pub fn get_property(path: &[&str]) -> Result<Option<Vec<u8>>, Status> {
    let joined = path.join("\0");
    // SAFETY: out-pointers to locals of `returned`; path is a live String.
    returned(|d, s| unsafe { proxy_get_property(joined.as_ptr(), joined.len(), d, s) })
}

/// A shared-data value and its CAS token (`None` when the key is unknown).
pub fn get_shared_data(key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), Status> {
    let mut cas: u32 = 0;
    // SAFETY: out-pointers to locals; key is a live &str.
    let value =
        returned(|d, s| unsafe { proxy_get_shared_data(key.as_ptr(), key.len(), d, s, &mut cas) })?;
    Ok((value, (cas != 0).then_some(cas)))
}

pub fn set_shared_data(key: &str, value: &[u8], cas: Option<u32>) -> Result<(), Status> {
    // SAFETY: pointers and lengths of live data.
    status(unsafe {
        proxy_set_shared_data(
            key.as_ptr(),
            key.len(),
            value.as_ptr(),
            value.len(),
            cas.unwrap_or(0),
        )
    })
}

/// Answer the request from the filter (header values as bytes).
pub fn send_http_response(code: u32, headers: &[(&str, &[u8])], body: &[u8]) -> Result<(), Status> {
    let enc = encode_pairs(headers);
    // SAFETY: pointers and lengths of live data; no details string.
    status(unsafe {
        proxy_send_local_response(
            code,
            null(),
            0,
            body.as_ptr(),
            body.len(),
            enc.as_ptr(),
            enc.len(),
            -1,
        )
    })
}

pub fn define_metric(kind: MetricType, name: &str) -> Result<u32, Status> {
    let mut id: u32 = 0;
    // SAFETY: pointer and length of a live &str; writes one u32 we own.
    status(unsafe { proxy_define_metric(kind as u32, name.as_ptr(), name.len(), &mut id) })?;
    Ok(id)
}

pub fn increment_metric(id: u32, by: i64) -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_increment_metric(id, by) })
}

pub fn record_metric(id: u32, value: u64) -> Result<(), Status> {
    // SAFETY: no pointers.
    status(unsafe { proxy_record_metric(id, value) })
}
