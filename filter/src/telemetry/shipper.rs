//! The request log on the host: records wait in a bounded per-VM buffer and
//! go to the collector in batches by `dispatch_grpc_call` from the root
//! context's tick. Nothing here can block or fail a request: a full buffer
//! drops (and counts) the record.

use crate::host::metrics;
use crate::host::worker::Worker;
use crate::host::{Host, LogLevel};
use portcullis_core::config::LogConfig;
use portcullis_core::telemetry::record::{encode_batch, LogBuffer, Record};
use std::collections::HashMap;

/// (Re)size the buffer for a new config; records already waiting are kept.
pub fn configure(w: &Worker, cfg: Option<&LogConfig>) {
    if let Ok(mut b) = w.log.try_borrow_mut() {
        match cfg {
            Some(c) => {
                let mut fresh = LogBuffer::new(c.buffer_records, c.buffer_bytes);
                if let Some(old) = b.as_mut() {
                    fresh.dropped = old.dropped;
                    let waiting = old.take(usize::MAX);
                    fresh.requeue(waiting);
                }
                *b = Some(fresh);
            }
            None => *b = None,
        }
    }
}

pub fn push(w: &Worker, record: &Record) {
    if let Ok(mut b) = w.log.try_borrow_mut() {
        if let Some(buf) = b.as_mut() {
            buf.push(record.encode());
        }
    }
}

/// A record already encoded (the native build hands each worker's records
/// to the main thread, which ships them).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub fn push_encoded(w: &Worker, record: Vec<u8>) {
    if let Ok(mut b) = w.log.try_borrow_mut() {
        if let Some(buf) = b.as_mut() {
            buf.push(record);
        }
    }
}

/// Every record waiting, in order (the native build's hand-off).
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub fn take_all(w: &Worker) -> Vec<Vec<u8>> {
    take(w, usize::MAX)
}

fn requeue(w: &Worker, batch: Vec<Vec<u8>>) {
    if let Ok(mut b) = w.log.try_borrow_mut() {
        if let Some(buf) = b.as_mut() {
            buf.requeue(batch);
        }
    }
}

fn take(w: &Worker, n: usize) -> Vec<Vec<u8>> {
    w.log
        .try_borrow_mut()
        .ok()
        .and_then(|mut b| b.as_mut().map(|b| b.take(n)))
        .unwrap_or_default()
}

fn dropped(w: &Worker) -> u64 {
    w.log
        .try_borrow()
        .ok()
        .and_then(|b| b.as_ref().map(|b| b.dropped))
        .unwrap_or(0)
}

/// Batches sent at once at most, per VM: with a batch of 500 every tick, one
/// at a time would cap the log at 500 records per second per worker.
const MAX_IN_FLIGHT: usize = 8;

/// A collector that cannot be reached is logged at most this often (the
/// `portcullis.log.flush_failures` counter counts every failure).
const WARN_EVERY_MS: u64 = 60_000;

/// The batches in flight to the collector, per VM.
#[derive(Default)]
pub struct Shipper {
    in_flight: HashMap<u32, Vec<Vec<u8>>>,
    reported_drops: u64,
    /// When the last "not sent" warning was logged, and failures since.
    warned_ms: Option<u64>,
    unwarned: u64,
    /// `authorization` for the collector (`Bearer <token>`), from the VM
    /// environment's `PORTCULLIS_INGEST_TOKEN`, read once; never from the
    /// plugin config.
    credential: Option<Option<Vec<u8>>>,
}

impl Shipper {
    /// At a tick: send what waits, up to [`MAX_IN_FLIGHT`] batches at once.
    pub fn tick(&mut self, host: &impl Host, cfg: Option<&LogConfig>) {
        let w = host.worker();
        let dropped = dropped(w);
        if dropped > self.reported_drops {
            let new = dropped.saturating_sub(self.reported_drops);
            host.count(metrics::LOG_DROPPED, i64::try_from(new).unwrap_or(i64::MAX));
            self.reported_drops = dropped;
        }
        let Some(cfg) = cfg else { return };
        let credential = self
            .credential
            .get_or_insert_with(|| {
                std::env::var("PORTCULLIS_INGEST_TOKEN")
                    .ok()
                    .filter(|t| !t.trim().is_empty())
                    .map(|t| format!("Bearer {}", t.trim()).into_bytes())
            })
            .clone();
        while self.in_flight.len() < MAX_IN_FLIGHT {
            let batch = take(w, cfg.batch_size);
            if batch.is_empty() {
                return;
            }
            let metadata: Vec<(&str, &[u8])> = credential
                .as_deref()
                .map(|c| vec![("authorization", c)])
                .unwrap_or_default();
            match host.dispatch_grpc(
                &cfg.cluster,
                "portcullis.v1.Collector",
                "Ingest",
                &metadata,
                &encode_batch(&batch),
                cfg.timeout_ms,
            ) {
                Ok(token) => {
                    self.in_flight.insert(token, batch);
                }
                Err(s) => {
                    self.warn_not_sent(host, &format!("to cluster `{}`: {s:?}", cfg.cluster));
                    host.count(metrics::LOG_FLUSH_FAILURES, 1);
                    requeue(w, batch);
                    return;
                }
            }
        }
    }

    /// Warn that the log is not getting through, at most every
    /// [`WARN_EVERY_MS`], saying how many failures went unreported.
    fn warn_not_sent(&mut self, host: &impl Host, why: &str) {
        let now = host.now_ms();
        if self
            .warned_ms
            .is_some_and(|t| now.saturating_sub(t) < WARN_EVERY_MS)
        {
            self.unwarned = self.unwarned.saturating_add(1);
            return;
        }
        let since = match (self.warned_ms, self.unwarned) {
            (Some(_), n) if n > 0 => format!(" ({n} more failures since the last warning)"),
            _ => String::new(),
        };
        host.log(
            LogLevel::Warn,
            &format!("request log not sent {why}; records wait (up to log.buffer_records per worker) and are re-sent{since}"),
        );
        self.warned_ms = Some(now);
        self.unwarned = 0;
    }

    /// The collector answered (gRPC status 0 = committed).
    pub fn on_response(&mut self, host: &impl Host, token: u32, grpc_status: u32) {
        let Some(batch) = self.in_flight.remove(&token) else {
            return;
        };
        if grpc_status == 0 {
            host.count(
                metrics::LOG_RECORDS_SENT,
                i64::try_from(batch.len()).unwrap_or(i64::MAX),
            );
        } else {
            self.warn_not_sent(
                host,
                &format!("(the collector answered gRPC status {grpc_status})"),
            );
            host.count(metrics::LOG_FLUSH_FAILURES, 1);
            requeue(host.worker(), batch);
        }
    }
}
