//! Each provider's adaptive concurrency in shared data (the transitions are
//! [`portcullis_core::health::aimd`]): a slot taken per attempt and given back when
//! it ends, the limit moved by each result, published as a gauge. A store
//! problem fails open: it never takes a provider out.

use crate::host::metrics;
use crate::host::Host;
use portcullis_core::config::{Gateway, Provider};
use portcullis_core::health::aimd::Aimd;
use portcullis_core::shared::keys;
use portcullis_core::shared::store::update;

/// At configure time: create missing state (so updates always have a CAS
/// token) and publish each limit; existing state (a reload) is kept.
pub fn prepare(host: &impl Host, gw: &Gateway) {
    for p in &gw.providers {
        let Some(cfg) = p.concurrency.as_ref() else {
            continue;
        };
        let key = keys::aimd(&p.name);
        let state = match host.get(&key) {
            Ok((Some(v), _)) => Aimd::decode(Some(&v), cfg),
            _ => {
                let s = Aimd::decode(None, cfg);
                let _ = host.set(&key, &s.encode(), None);
                s
            }
        };
        host.gauge(&metrics::concurrency_limit(&p.name), u64::from(state.limit));
    }
}

/// Take a slot at the provider: `Err(ms)` when it is paused or full.
pub fn admit(host: &impl Host, p: &Provider, now_ms: u64) -> Result<(), u64> {
    let Some(cfg) = p.concurrency.as_ref() else {
        return Ok(());
    };
    update(host, &keys::aimd(&p.name), |cur| {
        let (next, verdict) = Aimd::decode(cur, cfg).admit(now_ms);
        (verdict.is_ok().then(|| next.encode()), verdict)
    })
    .unwrap_or(Ok(()))
}

pub fn release(host: &impl Host, p: &Provider) {
    let Some(cfg) = p.concurrency.as_ref() else {
        return;
    };
    let _ = update(host, &keys::aimd(&p.name), |cur| {
        (Some(Aimd::decode(cur, cfg).release().encode()), ())
    });
}

/// An attempt's result moves the limit.
pub fn on_result(
    host: &impl Host,
    p: &Provider,
    ok: bool,
    retry_after_ms: Option<u64>,
    now_ms: u64,
) {
    let Some(cfg) = p.concurrency.as_ref() else {
        return;
    };
    let moved = update(host, &keys::aimd(&p.name), |cur| {
        let before = Aimd::decode(cur, cfg);
        let after = before.on_result(cfg, ok, retry_after_ms, now_ms);
        let moved = (after.limit != before.limit).then_some(after.limit);
        ((after != before).then(|| after.encode()), moved)
    });
    if let Ok(Some(limit)) = moved {
        host.gauge(&metrics::concurrency_limit(&p.name), u64::from(limit));
    }
}
