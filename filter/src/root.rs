//! A worker's root: applies a plugin config (parse, compile, then swap),
//! runs the tick (request log, settlements, the fleet cache's entries,
//! busy counts, token waiters),
//! and makes one request context per HTTP stream. The same for both hosts:
//! `wasm` drives it from proxy-wasm's root context, `native` from the
//! dynamic module's hooks.
//!
//! May use: `cache`, `health`, `host`, `limits`, `loaded`, `request`, `telemetry`, `upstream`.

use crate::health::breakers;
use crate::host::metrics;
use crate::host::{Host, LogLevel};
use crate::limits::admission;
use crate::loaded::Loaded;
use crate::request::RequestContext;
use crate::telemetry::shipper::{self, Shipper};
use portcullis_core::cache::fleet;
use portcullis_core::limits::rls;
use portcullis_core::shared::keys;
use portcullis_core::shared::store::update;
use portcullis_core::{compile::compile, config::Gateway};
use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::rc::Rc;

#[derive(Default)]
pub struct Root<H: Host> {
    loaded: Option<Rc<Loaded>>,
    rng: Cell<u64>,
    shipper: Shipper,
    /// Settlement calls in flight to the rate limit service.
    settling: HashSet<u32>,
    /// Store calls in flight to the fleet's cache tier, with their entries.
    sharing: HashMap<u32, u64>,
    /// The linear memory this VM last reported (see `report_memory`).
    reported_memory: u64,
    /// Envoy, with this worker's state (every request's host shares it).
    pub host: H,
    /// Envoy's id of this root context: the calls after a wake of a paused
    /// request (which switches the calls' context) are switched back to it.
    #[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
    pub context_id: u32,
    /// How often the tick should run for the config applied.
    pub tick_ms: u64,
}

/// This VM's linear memory in bytes (64 KiB pages).
fn vm_memory_bytes() -> u64 {
    #[cfg(target_arch = "wasm32")]
    {
        (core::arch::wasm32::memory_size(0) as u64).saturating_mul(65_536)
    }
    #[cfg(not(target_arch = "wasm32"))]
    {
        0
    }
}

/// A config generation shared by the workers: it rises once per distinct
/// config, however many workers apply it.
fn bump_generation(host: &impl Host, config: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(config);
    let hash = h.finish();
    let read = |c: &[u8], at| portcullis_core::wire::le::u64_at(c, at).unwrap_or(0);
    update(host, keys::CONFIG_GENERATION, |cur| {
        let (old_hash, gen) = cur
            .filter(|c| c.len() == 16)
            .map_or((0, 0), |c| (read(c, 0), read(c, 8)));
        if old_hash == hash {
            return (None, gen);
        }
        let next = gen.saturating_add(1);
        let mut v = hash.to_le_bytes().to_vec();
        v.extend_from_slice(&next.to_le_bytes());
        (Some(v), next)
    })
    .unwrap_or(0)
}

impl<H: Host + Clone> Root<H> {
    pub fn next_roll(&self) -> u64 {
        // xorshift64*: cheap, good enough to spread `auto` picks by weight.
        let mut x = self.rng.get();
        if x == 0 {
            x = (self.host.now_ms() << 20) ^ 0x9E37_79B9_7F4A_7C15;
        }
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng.set(x);
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Add this VM's growth of linear memory to the shared gauge.
    fn report_memory(&mut self) {
        let now = vm_memory_bytes();
        if now != self.reported_memory {
            let delta = i64::try_from(now)
                .unwrap_or(i64::MAX)
                .saturating_sub(i64::try_from(self.reported_memory).unwrap_or(i64::MAX));
            self.host.add_to_gauge(metrics::VM_MEMORY_BYTES, delta);
            self.reported_memory = now;
        }
    }

    /// Usage above global reservations, queued by requests since the last
    /// tick, to the rate limit service (its answers only count failures).
    fn send_settlements(&mut self) {
        let queued = self.host.worker().take_settlements();
        if queued.is_empty() {
            return;
        }
        let service = self
            .loaded
            .as_ref()
            .and_then(|l| l.gw.global_limits.clone());
        let Some(service) = service else {
            self.host.count(
                metrics::GLOBAL_SETTLE_DROPPED,
                i64::try_from(queued.len()).unwrap_or(i64::MAX),
            );
            return;
        };
        let owned = crate::loaded::limiter_metadata(self.loaded.as_deref());
        let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        for message in queued {
            match self.host.dispatch_grpc(
                &service.cluster,
                rls::SERVICE,
                rls::METHOD,
                &metadata,
                &message,
                service.timeout_ms.saturating_mul(10).max(1000),
            ) {
                Ok(token) => {
                    self.settling.insert(token);
                }
                Err(_) => self.host.count(metrics::GLOBAL_SETTLE_DROPPED, 1),
            }
        }
    }

    /// Fresh answers queued by requests since the last tick, to the fleet's
    /// cache tier (its answers only count failures).
    fn send_shared_puts(&mut self) {
        let queued = self.host.worker().take_shared_puts();
        if queued.is_empty() {
            return;
        }
        let entries = u64::try_from(queued.len()).unwrap_or(u64::MAX);
        let tier = self
            .loaded
            .as_ref()
            .and_then(|l| l.gw.cache.as_ref())
            .and_then(|c| c.shared.clone());
        let Some(tier) = tier else {
            self.host.count(
                metrics::CACHE_SHARED_DROPPED,
                i64::try_from(entries).unwrap_or(i64::MAX),
            );
            return;
        };
        let owned = crate::loaded::limiter_metadata(self.loaded.as_deref());
        let metadata: Vec<(&str, &[u8])> = owned.iter().map(|(k, v)| (*k, v.as_slice())).collect();
        for (method, batch, n) in fleet::put_batches(queued) {
            let n_metric = i64::try_from(n).unwrap_or(i64::MAX);
            match self.host.dispatch_grpc(
                &tier.cluster,
                fleet::SERVICE,
                method,
                &metadata,
                &batch,
                tier.timeout_ms.saturating_mul(10).max(1000),
            ) {
                Ok(token) => {
                    self.sharing.insert(token, n);
                    self.host.count(metrics::CACHE_SHARED_STORES, n_metric);
                }
                Err(_) => self.host.count(metrics::CACHE_SHARED_DROPPED, n_metric),
            }
        }
    }

    /// Everything a compiled config changes on this VM.
    fn apply(&mut self, gw: Gateway, bytes: &[u8]) {
        let host = self.host.clone();
        breakers::prepare(&host, &gw);
        crate::health::load::prepare(&host, &gw);
        crate::health::concurrency::prepare(&host, &gw);
        crate::request::mcp::prepare(&host, &gw);
        host.worker().clock_offset_ms.set(gw.clock_offset_ms);
        admission::prepare(&host, &gw);
        shipper::configure(host.worker(), gw.log.as_ref());
        crate::cache::configure(&host, gw.cache.as_ref());
        self.tick_ms = gw.log.as_ref().map_or(1000, |l| l.flush_interval_ms);
        host.gauge(metrics::CONFIG_GENERATION, bump_generation(&host, bytes));
        stamp_clients(&host, &gw);
        // After the stamps: a session that sees the count move reads them.
        crate::loaded::CONFIGS_APPLIED.fetch_add(1, std::sync::atomic::Ordering::Release);
        host.log(
            LogLevel::Info,
            &format!(
                "config applied: {} providers, {} models, {} clients",
                gw.providers.len(),
                gw.models.len(),
                gw.clients.len()
            ),
        );
        self.loaded = Some(Rc::new(Loaded::new(gw, &host)));
    }

    /// A gRPC answer to one of the root's calls (settlements, shared cache
    /// entries, log batches).
    pub fn on_grpc_answer(&mut self, token_id: u32, status_code: u32) {
        if let Some(n) = self.sharing.remove(&token_id) {
            if status_code != 0 {
                self.host.count(
                    metrics::CACHE_SHARED_DROPPED,
                    i64::try_from(n).unwrap_or(i64::MAX),
                );
            }
            return;
        }
        if self.settling.remove(&token_id) {
            if status_code != 0 {
                self.host.count(metrics::GLOBAL_SETTLE_DROPPED, 1);
            }
            return;
        }
        self.shipper.on_response(&self.host, token_id, status_code);
    }

    /// Apply a plugin config (`size`: its size as announced, checked before
    /// the bytes are read). Only a config that compiled replaces the one
    /// serving (requests in flight keep their own snapshot); `false`: the
    /// config is refused, and why is logged.
    pub fn configure(
        &mut self,
        size: usize,
        read: impl FnOnce() -> Result<Vec<u8>, String>,
    ) -> bool {
        let env = std::env::var("PORTCULLIS_MAX_CONFIG_BYTES").ok();
        let limit = portcullis_core::config::max_config_bytes(env.as_deref());
        if let Some(msg) = portcullis_core::config::too_large(size, limit) {
            // Refused before it is copied.
            self.host.log(LogLevel::Error, &msg);
            return false;
        }
        let bytes = match read() {
            Ok(b) => b,
            Err(why) => {
                self.host.log(
                    LogLevel::Error,
                    &format!("cannot read plugin config: {why}"),
                );
                return false;
            }
        };
        match accept(&bytes) {
            Ok(gw) => {
                self.apply(gw, &bytes);
                true
            }
            Err(msg) => {
                self.host.log(LogLevel::Error, &msg);
                false
            }
        }
    }

    /// A request context for a new HTTP stream, on the config serving now,
    /// with its host (the Wasm build's is the root's own: the ABI knows
    /// which context runs).
    pub fn new_request(&self, host: H, context_id: u32) -> RequestContext<H> {
        let mut c = RequestContext::new(host, self.loaded.clone(), self.next_roll());
        c.id = context_id;
        c
    }

    /// The periodic work; `true` when paused requests were woken (the
    /// Wasm host then switches its calls' context back to the root).
    pub fn tick(&mut self) -> bool {
        self.send_settlements();
        self.send_shared_puts();
        self.report_memory();
        let cfg = self.loaded.as_ref().and_then(|l| l.gw.log.clone());
        self.shipper.tick(&self.host, cfg.as_ref());
        // Last: a wake switches the calls' context to the woken request, and
        // a callout made after it would answer there.
        self.tick_local()
    }

    /// The periodic work that stays on this worker (no call leaves it but
    /// the wakes of paused requests): busy counts, token
    /// waiters. `true` when paused requests were woken.
    pub fn tick_local(&mut self) -> bool {
        let now = self.host.now_ms();
        if let Some(l) = self.loaded.as_ref() {
            crate::health::load::publish_busy(&self.host, &l.gw, now, self.next_roll());
        }
        self.loaded
            .as_ref()
            .is_some_and(|l| crate::upstream::access_tokens::wake_ready(&self.host, l, now))
    }
}

/// A plugin config's bytes, compiled, or every problem in one message.
pub fn accept(bytes: &[u8]) -> Result<Gateway, String> {
    match compile(bytes) {
        Ok(gw) if gw.clock_offset_ms != 0 && !testing_allowed() => Err("plugin config rejected: testing.clock_offset_ms moves the gateway's clock (budget periods); it is accepted only when the VM's environment has PORTCULLIS_TESTING=1, never in production".to_string()),
        other => other,
    }
}

/// Test hooks in the plugin config (`testing`) apply only where the VM's
/// environment says so.
fn testing_allowed() -> bool {
    std::env::var("PORTCULLIS_TESTING").is_ok_and(|v| v == "1")
}

/// Each client key's stamp in shared data (`Gateway::client_stamp`), and an
/// empty one for each key stamped before (by any config of this Envoy, the
/// list under `keys::CLIENT_STAMPS`) that this config has not: an open
/// Realtime session of a revoked or changed key sees it at its next event
/// and ends (#61). Unchanged stamps are not written again.
fn stamp_clients<H: Host>(host: &H, gw: &Gateway) {
    let mut now: Vec<[u8; 32]> = gw.clients.keys().copied().collect();
    now.sort_unstable();
    for hash in &now {
        let Some(c) = gw.clients.get(hash) else {
            continue;
        };
        let key = keys::client_stamp_key(hash);
        let stamp = gw.client_stamp(c);
        if host.get(&key).ok().and_then(|(v, _)| v).as_deref() != Some(stamp.as_slice()) {
            let _ = host.set(&key, &stamp, None);
        }
    }
    let before = host
        .get(keys::CLIENT_STAMPS)
        .ok()
        .and_then(|(v, _)| v)
        .unwrap_or_default();
    for old in before.chunks_exact(32) {
        if now.binary_search_by(|h| h.as_slice().cmp(old)).is_err() {
            if let Ok(hash) = <[u8; 32]>::try_from(old) {
                let _ = host.set(&keys::client_stamp_key(&hash), &[], None);
            }
        }
    }
    let list: Vec<u8> = now.iter().flatten().copied().collect();
    if list != before {
        let _ = host.set(keys::CLIENT_STAMPS, &list, None);
    }
}
