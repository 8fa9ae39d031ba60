//! The native build: the same gateway as an Envoy dynamic module
//! (`envoy.filters.http.dynamic_modules`, ABI `v0.2.0`, Envoy 1.40). The
//! hooks here drive the same [`Root`] and [`RequestContext`] the Wasm build
//! drives; [`host::NativeHost`] is the host, process memory the store.
//!
//! - Every hook runs inside `catch_unwind`: a panic never crosses into
//!   Envoy. A request whose hook panicked is answered 500 (when it can
//!   still be answered) and the next request is served.
//! - Per-worker state (`Worker`, the config's compiled snapshot) is
//!   thread-local: Envoy runs every hook of a stream on its worker's
//!   thread. State the workers share is [`store::ProcessStore`].
//! - The plugin YAML arrives as the filter config (a `StringValue`); it is
//!   compiled on the main thread when Envoy creates the config (a bad one
//!   is refused, and Envoy keeps the config serving), then by each worker
//!   at its first request on it.

pub mod calls;
#[cfg(test)]
mod fake_envoy;
pub mod ffi;
pub mod host;
pub(crate) mod main_thread;
mod metrics;
pub mod store;
#[cfg(test)]
mod tests;

use crate::host::{Action, Headers, Host, LogLevel, Part};
use crate::request::{Phase, RequestContext};
use crate::root::Root;
use ffi::{ConfigEnvoy, ConfigModule, EnvoyBuffer, EnvoyHeader, FilterEnvoy, FilterModule};
use host::{NativeHost, Stream};
use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A plugin config as Envoy holds it: its bytes (compiled once here, then
/// by each worker) and a number that tells the workers it is new.
pub struct Config {
    bytes: Vec<u8>,
    generation: u64,
    /// The main thread's periodic work for this config (its timer).
    ticker: std::sync::Mutex<Option<main_thread::Ticker>>,
}

static GENERATION: AtomicU64 = AtomicU64::new(1);

/// What a worker's thread keeps.
#[derive(Default)]
struct WorkerState {
    root: Root<NativeHost>,
    /// The config generation the root applied (0: none).
    applied: u64,
    next_id: u32,
    next_tick_ms: u64,
}

thread_local! {
    static WORKER: RefCell<WorkerState> = RefCell::new(WorkerState::default());
    /// The streams alive on this worker, by context id (paused requests
    /// are woken through them, from inside the worker's root).
    static LIVE: RefCell<HashMap<u32, Rc<Stream>>> = RefCell::new(HashMap::new());
}

/// A live stream of this worker.
pub fn live_filter(id: u32) -> Option<Rc<Stream>> {
    LIVE.try_with(|l| l.try_borrow().ok()?.get(&id).cloned())
        .ok()
        .flatten()
}

/// The schedulers of streams waiting for another's access token: the main
/// thread's tick commits an event to each, and the stream's worker then
/// wakes those whose token is kept (`access_tokens::wake_ready`).
static WAITING: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());

/// At the main thread's tick: wake each waiting stream's worker.
pub(crate) fn wake_waiting_streams() {
    if let Ok(w) = WAITING.lock() {
        for s in w.iter() {
            // SAFETY: a scheduler is deleted only after it leaves the list,
            // under this lock.
            unsafe {
                ffi::envoy_dynamic_module_callback_http_filter_scheduler_commit(
                    *s as ffi::Scheduler,
                    0,
                )
            };
        }
    }
}

/// After a hook: a stream now waiting for a token gets a scheduler.
fn watch_if_waiting(filter: &Filter) {
    if filter.stream.scheduler.get() != 0 {
        return;
    }
    let waiting = filter
        .ctx
        .host
        .worker
        .token_waiters
        .try_borrow()
        .is_ok_and(|w| {
            w.values()
                .any(|v| v.iter().any(|(id, _)| *id == filter.ctx.id))
        });
    let envoy = filter.stream.envoy.get();
    if !waiting || envoy.is_null() {
        return;
    }
    // SAFETY: the live filter of the hook that just ran.
    let s = unsafe { ffi::envoy_dynamic_module_callback_http_filter_scheduler_new(envoy) } as usize;
    if s == 0 {
        return;
    }
    if let Ok(mut w) = WAITING.lock() {
        w.push(s);
        filter.stream.scheduler.set(s);
    }
}

/// A stream going away: its scheduler out of the list, then deleted.
fn unwatch(filter: &Filter) {
    let s = filter.stream.scheduler.replace(0);
    if s == 0 {
        return;
    }
    if let Ok(mut w) = WAITING.lock() {
        w.retain(|x| *x != s);
        // SAFETY: the scheduler `watch_if_waiting` made, out of the list.
        unsafe {
            ffi::envoy_dynamic_module_callback_http_filter_scheduler_delete(s as ffi::Scheduler)
        };
    }
}

/// One HTTP stream.
pub struct Filter {
    ctx: RequestContext<NativeHost>,
    stream: Rc<Stream>,
}

/// Test hooks apply only where Envoy's environment says so (read once).
fn testing_allowed() -> bool {
    static ALLOWED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ALLOWED.get_or_init(|| std::env::var("PORTCULLIS_TESTING").is_ok_and(|v| v == "1"))
}

/// Run a hook; a panic is caught, logged, and becomes `fallback`.
fn guarded<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(e) => {
            let why = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let _ = catch_unwind(|| {
                calls::log(
                    LogLevel::Critical,
                    &format!("portcullis: panic in {what} caught: {why}"),
                )
            });
            fallback
        }
    }
}

/// A hook on a stream: the filter, its Envoy pointer set, the action
/// mapped. A panic answers 500 when the stream can still be answered.
fn on_stream(
    envoy: FilterEnvoy,
    module: FilterModule,
    what: &str,
    paused: i32,
    f: impl FnOnce(&mut Filter) -> Action,
) -> i32 {
    if module.is_null() {
        return ffi::CONTINUE;
    }
    // SAFETY: `module` is the Box this module gave Envoy at
    // `on_http_filter_new`, alive until `on_http_filter_destroy`; Envoy
    // runs a stream's hooks one at a time on its worker.
    let filter = unsafe { &mut *(module as *mut Filter) };
    if !envoy.is_null() {
        filter.stream.envoy.set(envoy);
    }
    let ran = catch_unwind(AssertUnwindSafe(|| {
        let a = f(filter);
        filter.stream.settle_route();
        watch_if_waiting(filter);
        a
    }));
    match ran {
        Ok(Action::Continue) => ffi::CONTINUE,
        Ok(Action::Pause) => paused,
        Err(e) => {
            let why = e
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| e.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            guarded(what, ffi::STOP_ITERATION, || {
                calls::log(
                    LogLevel::Critical,
                    &format!("portcullis: panic in {what} caught: {why}"),
                );
                if filter.ctx.phase != Phase::Done {
                    filter.ctx.log.error = "internal_error";
                    let body = filter.ctx.request.api.error_body(
                        &portcullis_core::error::GatewayError::internal(
                            "The gateway failed on this request; it was not sent on.",
                        ),
                    );
                    filter
                        .ctx
                        .send(500, &[("content-type", b"application/json")], &body);
                }
                ffi::STOP_ITERATION
            })
        }
    }
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const u8 {
    ffi::ABI_VERSION.as_ptr()
}

/// # Safety
/// Envoy's buffers are readable for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    config_envoy: ConfigEnvoy,
    _name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> ConfigModule {
    guarded("config_new", std::ptr::null(), || {
        let env = std::env::var("PORTCULLIS_MAX_CONFIG_BYTES").ok();
        let limit = portcullis_core::config::max_config_bytes(env.as_deref());
        if let Some(msg) = portcullis_core::config::too_large(config.length, limit) {
            calls::log(LogLevel::Error, &msg);
            return std::ptr::null();
        }
        // SAFETY: Envoy's buffer, valid during the call.
        let bytes = unsafe { ffi::copy(config.ptr, config.length) };
        match crate::root::accept(&bytes) {
            Ok(gw) => {
                calls::log(
                    LogLevel::Info,
                    &format!(
                        "config accepted: {} providers, {} models, {} clients",
                        gw.providers.len(),
                        gw.models.len(),
                        gw.clients.len()
                    ),
                );
                let generation = GENERATION.fetch_add(1, Ordering::Relaxed);
                let ticker = main_thread::start(config_envoy, generation, &bytes);
                if ticker.is_none() {
                    calls::log(
                        LogLevel::Warn,
                        "no periodic work for this config: the request log and settlements will not be sent",
                    );
                }
                Box::into_raw(Box::new(Config {
                    bytes,
                    generation,
                    ticker: std::sync::Mutex::new(ticker),
                })) as ConfigModule
            }
            Err(msg) => {
                calls::log(LogLevel::Error, &msg);
                std::ptr::null()
            }
        }
    })
}

/// # Safety
/// `config` is null or a pointer `config_new` returned, not yet destroyed.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: ConfigModule) {
    guarded("config_destroy", (), || {
        if !config.is_null() {
            // SAFETY: the Box `config_new` made; Envoy destroys it once,
            // after every filter made from it.
            let config = unsafe { Box::from_raw(config as *mut Config) };
            if let Ok(mut t) = config.ticker.lock() {
                if let Some(t) = t.as_mut() {
                    main_thread::stop(t, config.generation);
                }
            }
            drop(config);
        }
    });
}

/// # Safety
/// `config` is a live pointer `config_new` returned.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: ConfigModule,
    envoy: FilterEnvoy,
) -> FilterModule {
    guarded("filter_new", std::ptr::null(), || {
        if config.is_null() {
            return std::ptr::null();
        }
        // SAFETY: Envoy keeps the config alive while its filters live.
        let config = unsafe { &*(config as *const Config) };
        WORKER
            .try_with(|w| {
                let mut w = w.try_borrow_mut().ok()?;
                let w = &mut *w;
                if w.applied != config.generation {
                    let bytes = config.bytes.clone();
                    w.root.configure(bytes.len(), || Ok(bytes));
                    w.applied = config.generation;
                }
                let now = w.root.host.now_ms();
                if now >= w.next_tick_ms {
                    w.next_tick_ms = now.saturating_add(w.root.tick_ms.max(100));
                    w.root.tick_local();
                }
                let metrics = config
                    .ticker
                    .lock()
                    .ok()
                    .and_then(|t| t.as_ref().map(|t| t.metrics.clone()));
                let stream = Rc::new(Stream {
                    metrics,
                    ..Stream::default()
                });
                stream.envoy.set(envoy);
                let host = NativeHost {
                    worker: w.root.host.worker.clone(),
                    stream: stream.clone(),
                };
                w.next_id = w.next_id.wrapping_add(1).max(1);
                let ctx = w.root.new_request(host, w.next_id);
                let id = w.next_id;
                let _ = LIVE.try_with(|l| {
                    if let Ok(mut l) = l.try_borrow_mut() {
                        l.insert(id, stream.clone());
                    }
                });
                Some(Box::into_raw(Box::new(Filter { ctx, stream })) as FilterModule)
            })
            .ok()
            .flatten()
            .unwrap_or(std::ptr::null())
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    envoy: FilterEnvoy,
    module: FilterModule,
    end_of_stream: bool,
) -> i32 {
    on_stream(envoy, module, "request_headers", ffi::STOP_ITERATION, |f| {
        // Read before the request path removes the gateway's own headers.
        let panic = testing_allowed() && asks_for_panic(f);
        let a = f.ctx.on_request_headers(end_of_stream);
        if panic {
            inject_panic();
        }
        a
    })
}

/// Tests prove a panic is caught at the hook: with `PORTCULLIS_TESTING=1`
/// in Envoy's environment, a request carrying `x-portcullis-test-panic`
/// panics in its headers hook (after its API is known, so the 500 has the
/// client's error shape).
fn asks_for_panic(f: &Filter) -> bool {
    f.ctx.host.headers(Part::Request).is_ok_and(|h| {
        h.iter()
            .any(|(k, _)| k.eq_ignore_ascii_case("x-portcullis-test-panic"))
    })
}

#[allow(clippy::panic)]
fn inject_panic() {
    panic!("injected by x-portcullis-test-panic");
}

/// A body hook: the body's parts readable while `step` runs, its size
/// read without copying it.
fn on_body(
    envoy: FilterEnvoy,
    module: FilterModule,
    what: &str,
    part: Part,
    step: impl FnOnce(&mut RequestContext<NativeHost>, usize) -> Action,
) -> i32 {
    on_stream(envoy, module, what, ffi::STOP_ITERATION_AND_BUFFER, |f| {
        f.stream.in_body.set(Some(part));
        let size = f.ctx.host.body_size(part);
        let a = step(&mut f.ctx, size);
        f.stream.in_body.set(None);
        a
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    envoy: FilterEnvoy,
    module: FilterModule,
    end_of_stream: bool,
) -> i32 {
    on_body(envoy, module, "request_body", Part::Request, |ctx, size| {
        ctx.on_request_body(size, end_of_stream)
    })
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: FilterEnvoy,
    _module: FilterModule,
) -> i32 {
    ffi::CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: FilterEnvoy,
    module: FilterModule,
    end_of_stream: bool,
) -> i32 {
    on_stream(
        envoy,
        module,
        "response_headers",
        ffi::STOP_ITERATION,
        |f| f.ctx.on_response_headers(end_of_stream),
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: FilterEnvoy,
    module: FilterModule,
    end_of_stream: bool,
) -> i32 {
    on_body(
        envoy,
        module,
        "response_body",
        Part::Response,
        |ctx, size| ctx.on_response_body(size, end_of_stream),
    )
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    _envoy: FilterEnvoy,
    _module: FilterModule,
) -> i32 {
    ffi::CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy: FilterEnvoy,
    module: FilterModule,
) {
    on_stream(envoy, module, "stream_complete", ffi::CONTINUE, |f| {
        f.ctx.on_log();
        main_thread::hand_off(f.ctx.host.worker());
        Action::Continue
    });
}

/// # Safety
/// `module` is null or the Box `filter_new` returned, destroyed once.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: FilterModule) {
    guarded("filter_destroy", (), || {
        if module.is_null() {
            return;
        }
        // SAFETY: the Box `filter_new` made; Envoy destroys each once.
        let filter = unsafe { Box::from_raw(module as *mut Filter) };
        let id = filter.ctx.id;
        let _ = LIVE.try_with(|l| {
            if let Ok(mut l) = l.try_borrow_mut() {
                l.remove(&id);
            }
        });
        unwatch(&filter);
        // Calls on a destroyed filter must fail, not reach Envoy.
        filter.stream.envoy.set(std::ptr::null_mut());
        drop(filter);
    });
}

/// # Safety
/// Envoy's headers and chunks are readable for the call (or null).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_http_callout_done(
    envoy: FilterEnvoy,
    module: FilterModule,
    callout_id: u64,
    _result: i32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) {
    on_stream(envoy, module, "http_callout_done", ffi::CONTINUE, |f| {
        // SAFETY: Envoy's answer, valid during the hook (a failed callout
        // has none: empty headers, and the request path treats it as such).
        let (hs, body) = unsafe {
            (
                ffi::copy_headers(headers, headers_size),
                ffi::copy_chunks(chunks, chunks_size),
            )
        };
        let grpc = {
            let mut g = f.stream.grpc_calls.borrow_mut();
            match g.iter().position(|id| *id == callout_id) {
                Some(i) => {
                    g.swap_remove(i);
                    true
                }
                None => false,
            }
        };
        let status = grpc.then(|| calls::grpc_status(&hs, &body));
        let size = if grpc {
            calls::grpc_message(&body).map_or(0, <[u8]>::len)
        } else {
            body.len()
        };
        *f.stream.call_headers.borrow_mut() = hs;
        *f.stream.call_body.borrow_mut() = body;
        let token = u32::try_from(callout_id).unwrap_or(u32::MAX);
        match status {
            Some(s) => f.ctx.on_grpc_answer(token, s, size),
            None => f.ctx.on_call_response(token, size),
        }
        *f.stream.call_headers.borrow_mut() = Headers::default();
        f.stream.call_body.borrow_mut().clear();
        Action::Continue
    });
}

/// The main thread's timer fired for a config.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_config_scheduled(
    _config_envoy: ConfigEnvoy,
    config: ConfigModule,
    _event: u64,
) {
    guarded("config_scheduled", (), || {
        if config.is_null() {
            return;
        }
        // SAFETY: the live config `config_new` made.
        let config = unsafe { &*(config as *const Config) };
        main_thread::tick(config.generation);
    });
}

/// An answer to one of the main thread's calls (the collector, the rate
/// limit service).
///
/// # Safety
/// Envoy's headers and chunks are readable for the call (or null).
#[no_mangle]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_http_callout_done(
    _config_envoy: ConfigEnvoy,
    config: ConfigModule,
    callout_id: u64,
    _result: i32,
    headers: *const EnvoyHeader,
    headers_size: usize,
    chunks: *const EnvoyBuffer,
    chunks_size: usize,
) {
    guarded("config_http_callout_done", (), || {
        if config.is_null() {
            return;
        }
        // SAFETY: the live config `config_new` made.
        let config = unsafe { &*(config as *const Config) };
        // SAFETY: Envoy's answer, valid during the hook.
        let (hs, body) = unsafe {
            (
                ffi::copy_headers(headers, headers_size),
                ffi::copy_chunks(chunks, chunks_size),
            )
        };
        main_thread::answered(config.generation, callout_id, &hs, &body);
    });
}

// The hooks Envoy requires of an HTTP filter module that the gateway does
// not use: streamed callouts, schedulers, watermarks.

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_headers(
    _envoy: FilterEnvoy,
    _module: FilterModule,
    _stream: u64,
    _headers: *const EnvoyHeader,
    _n: usize,
    _end: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_data(
    _envoy: FilterEnvoy,
    _module: FilterModule,
    _stream: u64,
    _data: *const EnvoyBuffer,
    _n: usize,
    _end: bool,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_trailers(
    _envoy: FilterEnvoy,
    _module: FilterModule,
    _stream: u64,
    _trailers: *const EnvoyHeader,
    _n: usize,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_complete(
    _envoy: FilterEnvoy,
    _module: FilterModule,
    _stream: u64,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_http_stream_reset(
    _envoy: FilterEnvoy,
    _module: FilterModule,
    _stream: u64,
    _reason: i32,
) {
}

/// The main thread's tick reached a stream waiting for a token: its
/// worker wakes the waiters whose token is kept.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    _envoy: FilterEnvoy,
    module: FilterModule,
    _event: u64,
) {
    if module.is_null() {
        return;
    }
    guarded("filter_scheduled", (), || {
        let _ = WORKER.try_with(|w| {
            if let Ok(mut w) = w.try_borrow_mut() {
                w.root.tick_local();
            }
        });
    });
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark(
    _envoy: FilterEnvoy,
    _module: FilterModule,
) {
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark(
    _envoy: FilterEnvoy,
    _module: FilterModule,
) {
}
