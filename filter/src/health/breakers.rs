//! Each provider's circuit breaker in shared data: one CAS update per
//! decision, the state transition reported as a gauge, a counter and a log
//! line. A store problem fails open: it never takes a provider out.

use crate::host::metrics;
use crate::host::Host;
use crate::host::LogLevel;
use portcullis_core::config::{Gateway, Provider};
use portcullis_core::health::breaker::{self, Admission, Breaker, Transition};
use portcullis_core::shared::keys;
use portcullis_core::shared::store::update;

/// How long a VM trusts its own read of a closed breaker with nothing
/// counted: its requests meanwhile skip the shared-data read (a copy and
/// Envoy's lock shared by every worker). A failure this VM records forgets
/// the read at once; a breaker another worker opens is seen here at most
/// this late, so a few more requests may try the provider and fall back.
/// Half-open and open breakers are always read.
pub const CLEAN_TTL_MS: u64 = 100;

/// Whether this VM read the provider's breaker closed and clean within
/// [`CLEAN_TTL_MS`] (the worker's `breakers_clean`).
fn read_clean_since(host: &impl Host, provider: &str, now: u64) -> bool {
    host.worker().breakers_clean.try_borrow().is_ok_and(|c| {
        c.get(provider)
            .is_some_and(|&at| now >= at && now - at < CLEAN_TTL_MS)
    })
}

fn remember_clean(host: &impl Host, provider: &str, now: Option<u64>) {
    if let Ok(mut c) = host.worker().breakers_clean.try_borrow_mut() {
        match (now, c.get_mut(provider)) {
            (Some(now), Some(at)) => *at = now,
            (Some(now), None) => {
                c.insert(provider.to_string(), now);
            }
            (None, _) => {
                c.remove(provider);
            }
        }
    }
}

/// At configure time: create missing breaker keys (so request-time updates
/// always have a CAS token) and publish each state; existing state (a
/// reload) is kept.
pub fn prepare(host: &impl Host, gw: &Gateway) {
    for p in &gw.providers {
        let key = keys::breaker(&p.name);
        match host.get(&key) {
            Ok((Some(v), _)) => host.gauge(
                &metrics::breaker_state(&p.name),
                Breaker::decode(Some(&v)).state.gauge(),
            ),
            Ok((None, _)) => {
                let _ = host.set(&key, &Breaker::default().encode(), None);
                host.gauge(&metrics::breaker_state(&p.name), 0);
            }
            Err(e) => host.log(
                LogLevel::Warn,
                &format!("breaker state of `{}` unreadable: {e:?}", p.name),
            ),
        }
    }
}

fn note(host: &impl Host, provider: &str, t: Option<Transition>) {
    let Some(t) = t else { return };
    host.gauge(&metrics::breaker_state(provider), t.to.gauge());
    host.count(&metrics::breaker_transition(provider, t.to), 1);
    host.log(
        LogLevel::Info,
        &format!(
            "breaker of `{provider}`: {} -> {}",
            t.from.name(),
            t.to.name()
        ),
    );
}

/// Ask the provider's breaker for admission at `now`. Also says whether the
/// breaker was clean (closed, no failures counted, no ratio window): then a
/// success has nothing to record. A clean read is trusted for
/// [`CLEAN_TTL_MS`].
pub fn admit(host: &impl Host, p: &Provider, now: u64) -> (Admission, bool) {
    if read_clean_since(host, &p.name, now) {
        return (Admission::Allowed, true);
    }
    let r = update(host, &keys::breaker(&p.name), |cur| {
        let b = Breaker::decode(cur);
        let clean = b.state == breaker::State::Closed
            && b.consecutive_failures == 0
            && p.breaker.failure_ratio.is_none();
        let (next, adm, t) = breaker::admit_at(&b, &p.breaker, || now);
        (next.map(|n| n.encode()), (adm, t, clean))
    });
    match r {
        Ok((adm, t, clean)) => {
            note(host, &p.name, t);
            let trusted = clean && adm == Admission::Allowed;
            remember_clean(host, &p.name, trusted.then_some(now));
            (adm, clean)
        }
        Err(e) => {
            host.log(
                LogLevel::Warn,
                &format!(
                    "breaker of `{}` unavailable ({e:?}); letting the request through",
                    p.name
                ),
            );
            (Admission::Allowed, false)
        }
    }
}

/// A success on a breaker this VM read clean: read it again (one
/// shared-data get), since another worker may have counted failures since
/// (#46: failures *in a row* across workers). Still clean: nothing to
/// write; otherwise the success is recorded (the count starts over).
pub fn on_clean_success(host: &impl Host, p: &Provider) {
    let key = keys::breaker(&p.name);
    let clean = host.get(&key).is_ok_and(|(v, _)| {
        let b = Breaker::decode(v.as_deref());
        b.state == breaker::State::Closed && b.consecutive_failures == 0
    });
    if !clean {
        on_result(host, p, true, false);
    }
}

/// Record an attempt's result (`probe`: it was a half-open probe).
pub fn on_result(host: &impl Host, p: &Provider, success: bool, probe: bool) {
    // What this VM trusted no longer holds (or is worth reading again).
    remember_clean(host, &p.name, None);
    let now = || host.now_ms();
    let r = update(host, &keys::breaker(&p.name), |cur| {
        let (next, t) =
            breaker::on_result_at(&Breaker::decode(cur), &p.breaker, now, success, probe);
        (next.map(|n| n.encode()), t)
    });
    match r {
        Ok(t) => note(host, &p.name, t),
        Err(e) => host.log(
            LogLevel::Warn,
            &format!("breaker of `{}` not updated: {e:?}", p.name),
        ),
    }
}

/// A probe that will never report (its call was not sent, or the client
/// went away) gives its slot back.
pub fn release_probe(host: &impl Host, p: &Provider) {
    let _ = update(host, &keys::breaker(&p.name), |cur| {
        (
            breaker::release_probe(&Breaker::decode(cur)).map(|n| n.encode()),
            (),
        )
    });
}
