//! The native build's periodic work that leaves the process: the request
//! log to the collector and usage settlements to the rate limit service.
//! It runs on Envoy's main thread, woken every tick by a timer thread this
//! module owns, through the filter config's own callouts: a stream's
//! callouts end with the stream, and an idle worker has none.
//!
//! Workers hand their records and settlements over at the end of each
//! stream ([`hand_off`]); the main thread's [`Root`] ships them with the
//! same shipper and the same batching as the Wasm build.

use super::calls;
use super::ffi::{self, ConfigEnvoy, ModuleBuffer, ModuleHeader};
use super::metrics::{Change, Table};
use super::store::ProcessStore;
use crate::host::metrics::Kind;
use crate::host::registry;
use crate::host::worker::Worker;
use crate::host::{Headers, Host, LogLevel, Part, Status};
use crate::root::Root;
use crate::telemetry::shipper;
use portcullis_core::shared::store::{Store, StoreError};
use portcullis_core::telemetry::record::Record;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

/// What workers handed over since the main thread's last tick.
#[derive(Default)]
struct Handoff {
    records: Vec<Vec<u8>>,
    settlements: Vec<Vec<u8>>,
    /// Entries for the fleet's cache tier (bounded by the bytes each
    /// worker queued, `cache.shared.queue_bytes`, and by count here).
    shared_puts: Vec<crate::host::worker::SharedPut>,
    /// Summed counter increments and shared-gauge changes, by name.
    counters: HashMap<String, i64>,
    gauges: HashMap<String, i64>,
    /// Histogram values.
    recorded: Vec<(String, u64)>,
}

/// Records waiting for the main thread at most (beyond, dropped): the
/// main thread's own buffer (`log.buffer_*`) bounds them again.
const MAX_HANDOFF: usize = 100_000;

static HANDOFF: OnceLock<Mutex<Handoff>> = OnceLock::new();

fn handoff() -> &'static Mutex<Handoff> {
    HANDOFF.get_or_init(Mutex::default)
}

/// A worker's records, settlements and metric changes, handed to the main
/// thread (at each stream's end).
pub fn hand_off(w: &Worker) {
    let records = shipper::take_all(w);
    let settlements = w.take_settlements();
    let shared_puts = w.take_shared_puts();
    let Ok(mut h) = handoff().lock() else {
        return;
    };
    let h = &mut *h;
    let room = MAX_HANDOFF.saturating_sub(h.records.len());
    h.records.extend(records.into_iter().take(room));
    let room = MAX_HANDOFF.saturating_sub(h.settlements.len());
    h.settlements.extend(settlements.into_iter().take(room));
    let room = MAX_HANDOFF.saturating_sub(h.shared_puts.len());
    h.shared_puts.extend(shared_puts.into_iter().take(room));
    registry::flush(w, |kind, name, by| {
        let sums = match kind {
            registry::Kind::Counter => &mut h.counters,
            registry::Kind::Gauge => &mut h.gauges,
        };
        match sums.get_mut(name) {
            Some(n) => *n = n.saturating_add(by),
            None => {
                sums.insert(name.to_string(), by);
            }
        }
    });
}

/// A histogram value.
pub fn record(name: &str, value: u64) {
    if let Ok(mut h) = handoff().lock() {
        if h.recorded.len() < MAX_HANDOFF {
            h.recorded.push((name.to_string(), value));
        }
    }
}

/// The host the main thread's root runs on: the config's callouts, the
/// process's store; no stream.
#[derive(Clone)]
pub struct MainHost {
    worker: Rc<Worker>,
    config: Rc<Cell<ConfigEnvoy>>,
    /// The config's metrics (gauges the root sets are set at once).
    metrics: Rc<RefCell<Option<Arc<Table>>>>,
}

impl Default for MainHost {
    fn default() -> Self {
        MainHost {
            worker: Rc::default(),
            config: Rc::new(Cell::new(std::ptr::null_mut())),
            metrics: Rc::default(),
        }
    }
}

impl Store for MainHost {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        ProcessStore.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        ProcessStore.set(key, value, cas)
    }
}

impl Host for MainHost {
    fn worker(&self) -> &Worker {
        &self.worker
    }

    fn now_ms(&self) -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }

    fn log(&self, level: LogLevel, message: &str) {
        calls::log(level, message);
    }

    fn headers(&self, _part: Part) -> Result<Headers, Status> {
        Err(Status::Unimplemented)
    }

    fn set_header(&self, _part: Part, _name: &str, _value: Option<&str>) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    fn add_header(&self, _part: Part, _name: &str, _value: &str) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    fn body(&self, _part: Part, _size: usize) -> Result<Vec<u8>, Status> {
        Err(Status::Unimplemented)
    }

    fn set_body(&self, _part: Part, _size: usize, _bytes: &[u8]) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    fn property(&self, _path: &[&str]) -> Option<Vec<u8>> {
        None
    }

    fn send_response(
        &self,
        _status: u16,
        _headers: &[(&str, &[u8])],
        _body: &[u8],
    ) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    fn dispatch(
        &self,
        _cluster: &str,
        _headers: &[(&str, &str)],
        _body: &[u8],
        _timeout_ms: u64,
    ) -> Result<u32, Status> {
        Err(Status::Unimplemented)
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
        let config = self.config.get();
        if config.is_null() {
            return Err(Status::Unimplemented);
        }
        let (headers, body) = calls::grpc_request(cluster, service, method, metadata, message)
            .ok_or(Status::BadArgument)?;
        let mut hs: Vec<ModuleHeader> = headers
            .iter()
            .map(|(k, v)| ModuleHeader::of(k.as_bytes(), v))
            .collect();
        let mut id = 0u64;
        // SAFETY: the live config, on the main thread; buffers outlive the call.
        let r = unsafe {
            ffi::envoy_dynamic_module_callback_http_filter_config_http_callout(
                config,
                &mut id,
                ModuleBuffer::of(cluster.as_bytes()),
                hs.as_mut_ptr(),
                hs.len(),
                ModuleBuffer::of(&body),
                timeout_ms,
            )
        };
        if r != ffi::CALLOUT_SUCCESS {
            return Err(Status::BadArgument);
        }
        u32::try_from(id).map_err(|_| Status::InternalFailure)
    }

    fn grpc_answer(&self, _size: usize) -> Result<Vec<u8>, Status> {
        Err(Status::Unimplemented)
    }

    fn resume_request(&self) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    fn wake(&self, _context_id: u32, _authorization: Option<&str>) -> Result<(), Status> {
        Err(Status::Unimplemented)
    }

    /// The main thread's own settles: a full queue drops them uncounted
    /// (its root reports no per-request metrics).
    fn send_later(&self, message: Vec<u8>) {
        let _ = self.worker.queue_settlement(message);
    }

    fn gauge(&self, name: &str, value: u64) {
        if let Some(t) = self.metrics.borrow().as_ref() {
            t.apply(self.config.get(), Kind::Gauge, name, Change::Set(value));
        }
    }

    fn add_to_gauge(&self, name: &str, by: i64) {
        registry::add_to_gauge(&self.worker, name, by);
    }

    fn histogram(&self, name: &str, value: u64) {
        record(name, value);
    }

    fn emit_record(&self, record: &Record) {
        shipper::push(&self.worker, record);
    }
}

/// A config's main-thread root and the timer that wakes it, and the
/// metrics it declared (its workers set gauges through them).
pub struct Ticker {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    scheduler: usize,
    pub metrics: Arc<Table>,
}

/// A config's state on the main thread.
struct Main {
    root: Root<MainHost>,
    metrics: Arc<Table>,
}

thread_local! {
    /// The main thread's state, by config generation.
    static MAIN: RefCell<HashMap<u64, Main>> = RefCell::new(HashMap::new());
}

/// At a config's creation (main thread): its root, configured, and a timer
/// that wakes it every `log.flush_interval_ms`.
pub fn start(config: ConfigEnvoy, generation: u64, bytes: &[u8]) -> Option<Ticker> {
    // Declared first: Envoy takes no new metric once the config is made.
    let metrics = Arc::new(super::metrics::declare(config));
    let mut root = Root::<MainHost>::default();
    root.host.config.set(config);
    *root.host.metrics.borrow_mut() = Some(metrics.clone());
    let owned = bytes.to_vec();
    if !root.configure(owned.len(), || Ok(owned)) {
        return None;
    }
    let period = Duration::from_millis(root.tick_ms.max(50));
    MAIN.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            m.insert(
                generation,
                Main {
                    root,
                    metrics: metrics.clone(),
                },
            );
        }
    })
    .ok()?;
    // SAFETY: the live config, on the main thread.
    let scheduler =
        unsafe { ffi::envoy_dynamic_module_callback_http_filter_config_scheduler_new(config) }
            as usize;
    if scheduler == 0 {
        return None;
    }
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let thread = std::thread::Builder::new()
        .name("portcullis-tick".to_string())
        .spawn(move || {
            while !flag.load(Ordering::Acquire) {
                std::thread::park_timeout(period);
                if flag.load(Ordering::Acquire) {
                    break;
                }
                // SAFETY: the scheduler lives until `stop` joins this thread;
                // Envoy's scheduler may be committed from any thread.
                unsafe {
                    ffi::envoy_dynamic_module_callback_http_filter_config_scheduler_commit(
                        scheduler as ffi::Scheduler,
                        generation,
                    );
                }
            }
        })
        .ok();
    Some(Ticker {
        stop,
        thread,
        scheduler,
        metrics,
    })
}

/// At a config's destruction (main thread): the timer stopped, the root gone.
pub fn stop(ticker: &mut Ticker, generation: u64) {
    ticker.stop.store(true, Ordering::Release);
    if let Some(t) = ticker.thread.take() {
        t.thread().unpark();
        let _ = t.join();
    }
    if ticker.scheduler != 0 {
        // SAFETY: the scheduler `start` made; its timer thread has ended.
        unsafe {
            ffi::envoy_dynamic_module_callback_http_filter_config_scheduler_delete(
                ticker.scheduler as ffi::Scheduler,
            );
        }
        ticker.scheduler = 0;
    }
    let _ = MAIN.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            m.remove(&generation);
        }
    });
}

/// The main thread's tick: take what the workers handed over, then the
/// root's periodic work (settlements, the request log).
pub fn tick(generation: u64) {
    super::wake_waiting_streams();
    let handed = handoff()
        .lock()
        .map(|mut h| std::mem::take(&mut *h))
        .unwrap_or_default();
    let _ = MAIN.try_with(|m| {
        let Ok(mut m) = m.try_borrow_mut() else {
            return;
        };
        let Some(main) = m.get_mut(&generation) else {
            // An older config's timer: what it took goes back for the new one.
            if let Ok(mut h) = handoff().lock() {
                h.records.extend(handed.records);
                h.settlements.extend(handed.settlements);
                h.shared_puts.extend(handed.shared_puts);
                for (k, v) in handed.counters {
                    *h.counters.entry(k).or_default() += v;
                }
                for (k, v) in handed.gauges {
                    *h.gauges.entry(k).or_default() += v;
                }
                h.recorded.extend(handed.recorded);
            }
            return;
        };
        let w = main.root.host.worker.clone();
        for r in handed.records {
            shipper::push_encoded(&w, r);
        }
        for s in handed.settlements {
            let _ = w.queue_settlement(s);
        }
        for (method, e) in handed.shared_puts {
            let _ = w.queue_shared_put(method, e, usize::MAX);
        }
        main.root.tick();
        let config = main.root.host.config.get();
        let t = &main.metrics;
        registry::flush(&w, |kind, name, by| {
            let kind = match kind {
                registry::Kind::Counter => Kind::Counter,
                registry::Kind::Gauge => Kind::Gauge,
            };
            t.apply_sum(config, kind, name, by);
        });
        for (name, by) in handed.counters {
            t.apply_sum(config, Kind::Counter, &name, by);
        }
        for (name, by) in handed.gauges {
            t.apply_sum(config, Kind::Gauge, &name, by);
        }
        for (name, v) in handed.recorded {
            t.apply(config, Kind::Histogram, &name, Change::Record(v));
        }
    });
}

/// A gRPC answer to one of the main thread's calls.
pub fn answered(generation: u64, callout_id: u64, headers: &Headers, body: &[u8]) {
    let status = calls::grpc_status(headers, body);
    let token = u32::try_from(callout_id).unwrap_or(u32::MAX);
    let _ = MAIN.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            if let Some(main) = m.get_mut(&generation) {
                main.root.on_grpc_answer(token, status);
            }
        }
    });
}
