//! The shared state the routing strategies read, kept apart from the
//! request step that reads it (so a flight's bookkeeping can update it
//! without depending on the request context): each provider's moving-average
//! latency (after each success), and requests in flight per provider (each
//! VM counts its own exactly and publishes them at its tick; a registry of
//! live VMs says whose to add).

use crate::host::Host;
use portcullis_core::config::Gateway;
use portcullis_core::health::strategy;
use portcullis_core::limits::ratelimit::decode_i64;
use portcullis_core::shared::keys;
use portcullis_core::shared::store::update;

// This VM's counts and reads live in the worker's state
// (`crate::host::worker::Worker`: `busy`, `vm_id`, `registered`, `vms`, `reads`).
// The strategies' reads of shared data are served from `reads` for
// `READ_TTL_MS` (each read is a host call; a few milliseconds of staleness
// does not change an order much).

const READ_TTL_MS: u64 = 100;
/// Entries kept at most (keys of providers and models; a reload can leave
/// old ones behind).
const READS_MAX: usize = 4096;

pub(crate) fn cached(host: &impl Host, key: &str, now_ms: u64) -> Option<i64> {
    let hit = host.worker().reads.try_borrow().ok().and_then(|r| {
        r.get(key)
            .filter(|(_, at)| now_ms.saturating_sub(*at) < READ_TTL_MS)
            .map(|(v, _)| *v)
    });
    if hit.is_some() {
        return hit;
    }
    let v = match host.get(key) {
        Ok((Some(v), _)) => Some(decode_i64(Some(&v))),
        _ => None,
    }?;
    remember(host, key, v, now_ms);
    Some(v)
}

fn remember(host: &impl Host, key: &str, v: i64, now_ms: u64) {
    if let Ok(mut r) = host.worker().reads.try_borrow_mut() {
        if r.len() >= READS_MAX {
            r.clear();
        }
        r.insert(key.to_string(), (v, now_ms));
    }
}

/// Requests in flight at a provider: this VM's own count, exact, plus
/// what the other VMs last published (at their ticks).
pub fn busy(host: &impl Host, name: &str, now_ms: u64) -> u64 {
    let w = host.worker();
    let own = w
        .busy
        .try_borrow()
        .ok()
        .and_then(|m| m.get(name).map(|c| c.0))
        .unwrap_or(0);
    let me = w.vm_id.get();
    refresh_vms(host, now_ms);
    let vms = w.vms.try_borrow().map(|v| v.0.clone()).unwrap_or_default();
    let others: i64 = vms
        .iter()
        .filter(|&&vm| vm != me)
        .filter_map(|&vm| cached(host, &keys::busy(name, vm), now_ms))
        .fold(0i64, i64::saturating_add);
    u64::try_from(own.saturating_add(others)).unwrap_or(0)
}

/// A success's latency into the provider's moving average for the model.
/// The average moves from this VM's copy of it and is written without a
/// compare-and-swap: two workers writing at once lose one sample, which an
/// average can spare (a counter could not).
pub fn note_latency(
    host: &impl Host,
    gw: &Gateway,
    provider: usize,
    model_id: &str,
    sample_ms: u64,
    now_ms: u64,
) {
    let Some(p) = gw.providers.get(provider) else {
        return;
    };
    let initial = gw
        .policy
        .fastest
        .initial_ms
        .get(provider)
        .copied()
        .unwrap_or(1000);
    let key = keys::latency(&p.name, model_id);
    let old = cached(host, &key, now_ms)
        .and_then(|v| u64::try_from(v).ok())
        .unwrap_or(initial);
    let next = strategy::ewma(old, sample_ms, gw.policy.fastest.alpha);
    if next == old {
        return;
    }
    let next = i64::try_from(next).unwrap_or(i64::MAX);
    if host.set(&key, &next.to_le_bytes(), None).is_ok() {
        remember(host, &key, next, now_ms);
    }
}

/// At configure time: create the keys the strategies update (so updates
/// always have a CAS token); existing values (a reload) are kept.
pub fn prepare(host: &impl Host, gw: &Gateway) {
    let create = |key: String, value: i64| {
        if matches!(host.get(&key), Ok((None, _))) {
            let _ = host.set(&key, &value.to_le_bytes(), None);
        }
    };
    for (i, p) in gw.providers.iter().enumerate() {
        if gw.policy.uses_latency {
            let initial = gw.policy.fastest.initial_ms.get(i).copied().unwrap_or(1000);
            for m in &gw.models {
                for s in m.serving.iter().filter(|s| s.provider == i) {
                    create(
                        keys::latency(&p.name, &s.provider_model_id),
                        i64::try_from(initial).unwrap_or(i64::MAX),
                    );
                }
            }
        }
    }
}

/// One more (or one fewer) request in flight at a provider: this VM's
/// count only (no host call); the tick publishes it.
pub fn add_busy(host: &impl Host, provider: &str, by: i64) {
    let Ok(mut m) = host.worker().busy.try_borrow_mut() else {
        return;
    };
    match m.get_mut(provider) {
        Some(c) => c.0 = c.0.saturating_add(by).max(0),
        None => {
            m.insert(provider.to_string(), (by.max(0), 0));
        }
    }
}

/// A VM is live while it said so within this long.
const VM_LIVE_MS: u64 = 60_000;
/// How often a VM says it is live.
const VM_REFRESH_MS: u64 = 10_000;

/// The registry of VMs: (id, last said live at) pairs.
fn decode_vms(b: Option<&[u8]>) -> Vec<(u64, u64)> {
    b.unwrap_or_default()
        .chunks_exact(16)
        .filter_map(|c| {
            Some((
                portcullis_core::wire::le::u64_at(c, 0)?,
                portcullis_core::wire::le::u64_at(c, 8)?,
            ))
        })
        .collect()
}

/// The VMs that publish counts and are live, read again when the copy is
/// older than the counts' (the worker's `vms`).
fn refresh_vms(host: &impl Host, now_ms: u64) {
    let w = host.worker();
    if w.vms
        .try_borrow()
        .is_ok_and(|v| now_ms.saturating_sub(v.1) < READ_TTL_MS)
    {
        return;
    }
    let list: Vec<u64> = match host.get(keys::BUSY_VMS) {
        Ok((v, _)) => decode_vms(v.as_deref())
            .into_iter()
            .filter(|&(_, seen)| now_ms.saturating_sub(seen) < VM_LIVE_MS)
            .map(|(id, _)| id)
            .collect(),
        Err(_) => Vec::new(),
    };
    if let Ok(mut v) = w.vms.try_borrow_mut() {
        *v = (list, now_ms);
    }
}

/// At the root's tick (and configure): publish this VM's counts that
/// changed, and say it is live now and then. `roll`: a random number,
/// this VM's id the first time.
pub fn publish_busy(host: &impl Host, gw: &Gateway, now_ms: u64, roll: u64) {
    if !gw.policy.uses_busy {
        return;
    }
    let w = host.worker();
    if w.vm_id.get() == 0 {
        w.vm_id.set(roll.max(1));
    }
    let me = w.vm_id.get();
    if now_ms.saturating_sub(w.registered.get()) >= VM_REFRESH_MS {
        let ok = update(host, keys::BUSY_VMS, |cur| {
            let mut vms: Vec<(u64, u64)> = decode_vms(cur)
                .into_iter()
                .filter(|&(id, seen)| id != me && now_ms.saturating_sub(seen) < VM_LIVE_MS)
                .collect();
            vms.push((me, now_ms));
            let mut out = Vec::with_capacity(vms.len().saturating_mul(16));
            for (id, seen) in vms {
                out.extend_from_slice(&id.to_le_bytes());
                out.extend_from_slice(&seen.to_le_bytes());
            }
            (Some(out), ())
        });
        if ok.is_ok() {
            w.registered.set(now_ms);
        }
    }
    if let Ok(mut m) = w.busy.try_borrow_mut() {
        for (provider, (now, published)) in m.iter_mut() {
            if now != published
                && host
                    .set(&keys::busy(provider, me), &now.to_le_bytes(), None)
                    .is_ok()
            {
                *published = *now;
            }
        }
    }
}
