//! Circuit breaker per provider: a pure state machine over a fixed 41-byte
//! encoding, driven through the shared store so every worker sees one state.
//! Time is a parameter (milliseconds); nothing here reads a clock.
// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BreakerConfig {
    /// Open after this many failures in a row.
    pub consecutive_failures: u32,
    /// Or open when failures/requests reaches this ratio in a window...
    pub failure_ratio: Option<f64>,
    /// ...of at least this many requests.
    pub min_requests: u32,
    pub window_ms: u64,
    /// How long an open breaker refuses before letting probes through.
    pub cooldown_ms: u64,
    /// Requests let through while half-open, across all workers.
    pub half_open_probes: u32,
    /// A probe that has not reported after this long is presumed lost
    /// (client gone, VM restarted) and its slot is given to a new probe. Set
    /// from the provider's timeout: a live probe cannot take longer.
    pub probe_timeout_ms: u64,
}

impl Default for BreakerConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            failure_ratio: None,
            min_requests: 20,
            window_ms: 10_000,
            cooldown_ms: 10_000,
            half_open_probes: 1,
            probe_timeout_ms: 60_000,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum State {
    #[default]
    Closed,
    Open,
    HalfOpen,
}

impl State {
    /// The gauge value: 0 closed, 1 open, 2 half-open.
    pub fn gauge(self) -> u64 {
        match self {
            State::Closed => 0,
            State::Open => 1,
            State::HalfOpen => 2,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            State::Closed => "closed",
            State::Open => "open",
            State::HalfOpen => "half_open",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Breaker {
    pub state: State,
    pub consecutive_failures: u32,
    pub window_start_ms: u64,
    pub window_total: u32,
    pub window_failures: u32,
    /// When it opened (Open) or went half-open (HalfOpen).
    pub since_ms: u64,
    pub probes_in_flight: u32,
}

pub const ENCODED_LEN: usize = 41;

impl Breaker {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(ENCODED_LEN);
        out.push(self.state.gauge() as u8);
        out.extend_from_slice(&self.consecutive_failures.to_le_bytes());
        out.extend_from_slice(&self.window_start_ms.to_le_bytes());
        out.extend_from_slice(&self.window_total.to_le_bytes());
        out.extend_from_slice(&self.window_failures.to_le_bytes());
        out.extend_from_slice(&self.since_ms.to_le_bytes());
        out.extend_from_slice(&self.probes_in_flight.to_le_bytes());
        out.extend_from_slice(&[0u8; 8]);
        out
    }

    /// Unknown or damaged bytes read as a fresh closed breaker.
    pub fn decode(bytes: Option<&[u8]>) -> Breaker {
        let Some(b) = bytes.filter(|b| b.len() == ENCODED_LEN) else {
            return Breaker::default();
        };
        let u32_at = |i: usize| crate::wire::le::u32_at(b, i).unwrap_or(0);
        let u64_at = |i: usize| crate::wire::le::u64_at(b, i).unwrap_or(0);
        let state = match b.first() {
            Some(1) => State::Open,
            Some(2) => State::HalfOpen,
            _ => State::Closed,
        };
        Breaker {
            state,
            consecutive_failures: u32_at(1),
            window_start_ms: u64_at(5),
            window_total: u32_at(13),
            window_failures: u32_at(17),
            since_ms: u64_at(21),
            probes_in_flight: u32_at(29),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admission {
    /// Closed: go ahead.
    Allowed,
    /// Half-open: this request is one of the probes.
    Probe,
    /// Open (or half-open with every probe out): skip this provider.
    Refused { retry_after_ms: u64 },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    pub from: State,
    pub to: State,
}

/// May a request go to this provider now? Returns the new state to write
/// (if any) with the decision, for [`crate::shared::store::update`].
pub fn admit(
    b: &Breaker,
    cfg: &BreakerConfig,
    now_ms: u64,
) -> (Option<Breaker>, Admission, Option<Transition>) {
    admit_at(b, cfg, || now_ms)
}

/// [`admit`] with a clock read only when the state needs it (never when
/// closed: the hot path makes no host call for time).
pub fn admit_at(
    b: &Breaker,
    cfg: &BreakerConfig,
    now: impl FnOnce() -> u64,
) -> (Option<Breaker>, Admission, Option<Transition>) {
    match b.state {
        State::Closed => (None, Admission::Allowed, None),
        State::Open => admit_open(b, cfg, now()),
        State::HalfOpen => {
            let (next, adm) = admit_half_open(b, cfg, now());
            (next, adm, None)
        }
    }
}

/// Open: refused until the cooldown is over, then the first probe.
fn admit_open(
    b: &Breaker,
    cfg: &BreakerConfig,
    now_ms: u64,
) -> (Option<Breaker>, Admission, Option<Transition>) {
    let reopen = b.since_ms.saturating_add(cfg.cooldown_ms);
    if now_ms < reopen {
        let retry_after_ms = reopen.saturating_sub(now_ms);
        return (None, Admission::Refused { retry_after_ms }, None);
    }
    let next = Breaker {
        state: State::HalfOpen,
        since_ms: now_ms,
        probes_in_flight: 1,
        ..Breaker::default()
    };
    let t = Transition {
        from: State::Open,
        to: State::HalfOpen,
    };
    (Some(next), Admission::Probe, Some(t))
}

/// Half-open: up to `half_open_probes` probes at once.
fn admit_half_open(b: &Breaker, cfg: &BreakerConfig, now_ms: u64) -> (Option<Breaker>, Admission) {
    let probes_due = b.since_ms.saturating_add(cfg.probe_timeout_ms);
    if b.probes_in_flight < cfg.half_open_probes {
        let next = Breaker {
            probes_in_flight: b.probes_in_flight.saturating_add(1),
            ..*b
        };
        (Some(next), Admission::Probe)
    } else if now_ms >= probes_due {
        // Probes that never reported must not wedge the breaker.
        let next = Breaker {
            since_ms: now_ms,
            probes_in_flight: 1,
            ..*b
        };
        (Some(next), Admission::Probe)
    } else {
        // The probes report within their timeout; a new round can start a
        // cooldown after a failed one at the earliest.
        let retry_after_ms = cfg.cooldown_ms.min(probes_due.saturating_sub(now_ms));
        (None, Admission::Refused { retry_after_ms })
    }
}

/// Record the outcome of a request that `admit` let through.
pub fn on_result(
    b: &Breaker,
    cfg: &BreakerConfig,
    now_ms: u64,
    success: bool,
    probe: bool,
) -> (Option<Breaker>, Option<Transition>) {
    on_result_at(b, cfg, || now_ms, success, probe)
}

/// [`on_result`] with a clock read only when a counter changes.
pub fn on_result_at(
    b: &Breaker,
    cfg: &BreakerConfig,
    now: impl FnOnce() -> u64,
    success: bool,
    probe: bool,
) -> (Option<Breaker>, Option<Transition>) {
    match b.state {
        // The common case writes nothing: a success that changes no counter.
        State::Closed if success && b.consecutive_failures == 0 && cfg.failure_ratio.is_none() => {
            (None, None)
        }
        State::Closed => closed_result(b, cfg, now(), success),
        State::HalfOpen if probe => {
            let now_ms = now();
            let next = if success {
                Breaker {
                    window_start_ms: now_ms,
                    ..Breaker::default()
                }
            } else {
                opened(now_ms)
            };
            let t = Transition {
                from: State::HalfOpen,
                to: next.state,
            };
            (Some(next), Some(t))
        }
        // Late results of requests admitted before the breaker opened say
        // nothing about the provider now.
        State::HalfOpen | State::Open => (None, None),
    }
}

fn opened(now_ms: u64) -> Breaker {
    Breaker {
        state: State::Open,
        since_ms: now_ms,
        ..Breaker::default()
    }
}

/// Closed: count the result (in a row, and in the ratio window); open on
/// too many failures.
fn closed_result(
    b: &Breaker,
    cfg: &BreakerConfig,
    now_ms: u64,
    success: bool,
) -> (Option<Breaker>, Option<Transition>) {
    let mut n = *b;
    if now_ms.saturating_sub(n.window_start_ms) >= cfg.window_ms {
        n.window_start_ms = now_ms;
        n.window_total = 0;
        n.window_failures = 0;
    }
    n.window_total = n.window_total.saturating_add(1);
    if success {
        n.consecutive_failures = 0;
    } else {
        n.consecutive_failures = n.consecutive_failures.saturating_add(1);
        n.window_failures = n.window_failures.saturating_add(1);
    }
    let by_count = n.consecutive_failures >= cfg.consecutive_failures;
    let by_ratio = cfg.failure_ratio.is_some_and(|r| {
        n.window_total >= cfg.min_requests
            && f64::from(n.window_failures) >= r * f64::from(n.window_total)
    });
    if !success && (by_count || by_ratio) {
        let t = Transition {
            from: State::Closed,
            to: State::Open,
        };
        return (Some(opened(now_ms)), Some(t));
    }
    (Some(n), None)
}

/// A probe ended without a result (client went away): give its slot back.
pub fn release_probe(b: &Breaker) -> Option<Breaker> {
    (b.state == State::HalfOpen && b.probes_in_flight > 0).then(|| Breaker {
        probes_in_flight: b.probes_in_flight.saturating_sub(1),
        ..*b
    })
}

#[cfg(test)]
mod tests;
