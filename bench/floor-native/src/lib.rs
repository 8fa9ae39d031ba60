//! The native floors (see bench/floor): `route` reads the whole request
//! body once at its end, sets the cluster, `:authority`, timeout and
//! credential headers and goes on, then adds two response headers;
//! `answer` reads the body and answers locally. A benchmark fixture with
//! the fewest ABI declarations it needs; it trusts its host.
#![allow(clippy::missing_safety_doc)]

use std::ffi::c_void;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Buf {
    pub ptr: *const u8,
    pub len: usize,
}

#[repr(C)]
struct Header {
    k: *const u8,
    kl: usize,
    v: *const u8,
    vl: usize,
}

fn buf(b: &[u8]) -> Buf {
    Buf {
        ptr: b.as_ptr(),
        len: b.len(),
    }
}

extern "C" {
    fn envoy_dynamic_module_callback_http_set_header(
        f: *mut c_void,
        t: i32,
        k: Buf,
        v: Buf,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_add_header(
        f: *mut c_void,
        t: i32,
        k: Buf,
        v: Buf,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_header(
        f: *mut c_void,
        t: i32,
        k: Buf,
        out: *mut Buf,
        index: usize,
        count: *mut usize,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_get_body_chunks_size(f: *mut c_void, t: i32) -> usize;
    fn envoy_dynamic_module_callback_http_get_body_chunks(
        f: *mut c_void,
        t: i32,
        out: *mut Buf,
    ) -> bool;
    fn envoy_dynamic_module_callback_http_send_response(
        f: *mut c_void,
        status: u32,
        h: *mut Header,
        n: usize,
        body: Buf,
        details: Buf,
    );
    fn envoy_dynamic_module_callback_http_clear_route_cache(f: *mut c_void);
}

const ANSWER: &[u8] = br#"{"id":"chatcmpl-floor","object":"chat.completion","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"message":{"role":"assistant","content":"Hello benchmark, hello there!"},"finish_reason":"stop"}],"usage":{"prompt_tokens":20,"completion_tokens":6,"total_tokens":26}}"#;

static ROUTE: u8 = 1;
static ANSWER_MODE: u8 = 2;
/// Route at the headers, then read every body chunk both ways (a
/// Realtime session's floor).
static STREAM_MODE: u8 = 3;

/// The chunk a body hook received (`kind`: the received request or
/// response body).
unsafe fn chunk(f: *mut c_void, kind: i32) -> Vec<u8> {
    let n = envoy_dynamic_module_callback_http_get_body_chunks_size(f, kind);
    let mut chunks = vec![
        Buf {
            ptr: std::ptr::null(),
            len: 0
        };
        n
    ];
    let mut out = Vec::new();
    if n > 0 && envoy_dynamic_module_callback_http_get_body_chunks(f, kind, chunks.as_mut_ptr()) {
        for c in chunks {
            out.extend_from_slice(std::slice::from_raw_parts(c.ptr, c.len));
        }
    }
    out
}

unsafe fn route(f: *mut c_void) {
    for (k, v) in [
        (&b"x-portcullis-cluster"[..], &b"primary"[..]),
        (b":authority", b"primary.mock"),
        (b"x-envoy-upstream-rq-timeout-ms", b"30000"),
        (b"authorization", b"Bearer sk-bench"),
    ] {
        envoy_dynamic_module_callback_http_set_header(f, 0, buf(k), buf(v));
    }
    envoy_dynamic_module_callback_http_clear_route_cache(f);
}

unsafe fn body(f: *mut c_void) -> Vec<u8> {
    let mut out = Vec::new();
    for kind in [1, 0] {
        let n = envoy_dynamic_module_callback_http_get_body_chunks_size(f, kind);
        let mut chunks = vec![
            Buf {
                ptr: std::ptr::null(),
                len: 0
            };
            n
        ];
        if n > 0 && envoy_dynamic_module_callback_http_get_body_chunks(f, kind, chunks.as_mut_ptr())
        {
            for c in chunks {
                out.extend_from_slice(std::slice::from_raw_parts(c.ptr, c.len));
            }
        }
    }
    out
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    b"v0.2.0\0".as_ptr()
}

#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _c: *mut c_void,
    _n: Buf,
    cfg: Buf,
) -> *const c_void {
    let cfg = std::slice::from_raw_parts(cfg.ptr, cfg.len);
    if cfg.starts_with(b"answer") {
        &ANSWER_MODE as *const u8 as _
    } else if cfg.starts_with(b"stream") {
        &STREAM_MODE as *const u8 as _
    } else {
        &ROUTE as *const u8 as _
    }
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(_c: *const c_void) {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_new(
    c: *const c_void,
    _f: *mut c_void,
) -> *const c_void {
    c
}
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    f: *mut c_void,
    m: *const c_void,
    _e: bool,
) -> i32 {
    if *(m as *const u8) == STREAM_MODE {
        route(f);
        return 0;
    }
    1
}
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    f: *mut c_void,
    m: *const c_void,
    eos: bool,
) -> i32 {
    if *(m as *const u8) == STREAM_MODE {
        let _ = chunk(f, 0);
        return 0;
    }
    if !eos {
        return 1;
    }
    let b = body(f);
    if *(m as *const u8) == ANSWER_MODE {
        let len = b.len().to_string();
        let mut hs = [
            Header {
                k: b"content-type".as_ptr(),
                kl: 12,
                v: b"application/json".as_ptr(),
                vl: 16,
            },
            Header {
                k: b"x-floor-read".as_ptr(),
                kl: 12,
                v: len.as_ptr(),
                vl: len.len(),
            },
        ];
        envoy_dynamic_module_callback_http_send_response(
            f,
            200,
            hs.as_mut_ptr(),
            2,
            buf(ANSWER),
            buf(b"floor"),
        );
        return 1;
    }
    route(f);
    0
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _f: *mut c_void,
    _m: *const c_void,
) -> i32 {
    0
}
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    f: *mut c_void,
    _m: *const c_void,
    _e: bool,
) -> i32 {
    let mut status = Buf {
        ptr: std::ptr::null(),
        len: 0,
    };
    if envoy_dynamic_module_callback_http_get_header(
        f,
        2,
        buf(b":status"),
        &mut status,
        0,
        std::ptr::null_mut(),
    ) && !status.ptr.is_null()
    {
        envoy_dynamic_module_callback_http_add_header(f, 2, buf(b"x-floor-status"), status);
    }
    envoy_dynamic_module_callback_http_add_header(f, 2, buf(b"x-floor"), buf(b"route"));
    0
}
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    f: *mut c_void,
    m: *const c_void,
    _e: bool,
) -> i32 {
    if *(m as *const u8) == STREAM_MODE {
        let _ = chunk(f, 2);
    }
    0
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _f: *mut c_void,
    _m: *const c_void,
) -> i32 {
    0
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    _f: *mut c_void,
    _m: *const c_void,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_destroy(_m: *const c_void) {}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
    _r: i32,
    _h: *mut c_void,
    _nh: usize,
    _b: *mut c_void,
    _nb: usize,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
    _h: *mut c_void,
    _n: usize,
    _e: bool,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
    _d: *const c_void,
    _n: usize,
    _e: bool,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
    _h: *mut c_void,
    _n: usize,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
    _r: i32,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _f: *mut c_void,
    _m: *const c_void,
    _id: u64,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _f: *mut c_void,
    _m: *const c_void,
) {
}
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _f: *mut c_void,
    _m: *const c_void,
) {
}
