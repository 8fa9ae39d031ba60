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
        let u32_at = |i: usize| crate::le::u32_at(b, i).unwrap_or(0);
        let u64_at = |i: usize| crate::le::u64_at(b, i).unwrap_or(0);
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
/// (if any) with the decision, for [`crate::store::update`].
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
    if b.state == State::Closed {
        return (None, Admission::Allowed, None);
    }
    let now_ms = now();
    match b.state {
        State::Closed => (None, Admission::Allowed, None),
        State::Open => {
            let reopen = b.since_ms.saturating_add(cfg.cooldown_ms);
            if now_ms >= reopen {
                let next = Breaker {
                    state: State::HalfOpen,
                    since_ms: now_ms,
                    probes_in_flight: 1,
                    ..Breaker::default()
                };
                (
                    Some(next),
                    Admission::Probe,
                    Some(Transition {
                        from: State::Open,
                        to: State::HalfOpen,
                    }),
                )
            } else {
                (
                    None,
                    Admission::Refused {
                        retry_after_ms: reopen.saturating_sub(now_ms),
                    },
                    None,
                )
            }
        }
        State::HalfOpen => {
            if b.probes_in_flight < cfg.half_open_probes {
                (
                    Some(Breaker {
                        probes_in_flight: b.probes_in_flight.saturating_add(1),
                        ..*b
                    }),
                    Admission::Probe,
                    None,
                )
            } else if now_ms >= b.since_ms.saturating_add(cfg.probe_timeout_ms) {
                // Probes that never reported must not wedge the breaker.
                (
                    Some(Breaker {
                        since_ms: now_ms,
                        probes_in_flight: 1,
                        ..*b
                    }),
                    Admission::Probe,
                    None,
                )
            } else {
                // The probes report within their timeout; a new round can start
                // a cooldown after a failed one at the earliest.
                let retry = cfg.cooldown_ms.min(
                    b.since_ms
                        .saturating_add(cfg.probe_timeout_ms)
                        .saturating_sub(now_ms),
                );
                (
                    None,
                    Admission::Refused {
                        retry_after_ms: retry,
                    },
                    None,
                )
            }
        }
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
    if b.state == State::Closed
        && success
        && b.consecutive_failures == 0
        && cfg.failure_ratio.is_none()
    {
        return (None, None);
    }
    let now_ms = now();
    match b.state {
        // The common case writes nothing: a success that changes no counter.
        State::Closed if success && b.consecutive_failures == 0 && cfg.failure_ratio.is_none() => {
            (None, None)
        }
        State::Closed => {
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
                let open = Breaker {
                    state: State::Open,
                    since_ms: now_ms,
                    ..Breaker::default()
                };
                return (
                    Some(open),
                    Some(Transition {
                        from: State::Closed,
                        to: State::Open,
                    }),
                );
            }
            (Some(n), None)
        }
        State::HalfOpen if probe => {
            if success {
                let closed = Breaker {
                    window_start_ms: now_ms,
                    ..Breaker::default()
                };
                (
                    Some(closed),
                    Some(Transition {
                        from: State::HalfOpen,
                        to: State::Closed,
                    }),
                )
            } else {
                let open = Breaker {
                    state: State::Open,
                    since_ms: now_ms,
                    ..Breaker::default()
                };
                (
                    Some(open),
                    Some(Transition {
                        from: State::HalfOpen,
                        to: State::Open,
                    }),
                )
            }
        }
        // Late results of requests admitted before the breaker opened say
        // nothing about the provider now.
        State::HalfOpen | State::Open => (None, None),
    }
}

/// A probe ended without a result (client went away): give its slot back.
pub fn release_probe(b: &Breaker) -> Option<Breaker> {
    (b.state == State::HalfOpen && b.probes_in_flight > 0).then(|| Breaker {
        probes_in_flight: b.probes_in_flight.saturating_sub(1),
        ..*b
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{update, MemStore, Store};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const CFG: BreakerConfig = BreakerConfig {
        consecutive_failures: 3,
        failure_ratio: Some(0.5),
        min_requests: 10,
        window_ms: 1_000,
        cooldown_ms: 5_000,
        half_open_probes: 2,
        probe_timeout_ms: 30_000,
    };

    fn fail(b: &Breaker, now: u64) -> (Breaker, Option<Transition>) {
        let (n, t) = on_result(b, &CFG, now, false, false);
        (n.unwrap_or(*b), t)
    }

    #[test]
    fn encoding_round_trips_and_garbage_reads_as_closed() {
        let b = Breaker {
            state: State::HalfOpen,
            consecutive_failures: 2,
            window_start_ms: 77,
            window_total: 9,
            window_failures: 4,
            since_ms: u64::MAX - 1,
            probes_in_flight: 3,
        };
        assert_eq!(b.encode().len(), ENCODED_LEN);
        assert_eq!(Breaker::decode(Some(&b.encode())), b);
        assert_eq!(Breaker::decode(Some(b"short")), Breaker::default());
        assert_eq!(Breaker::decode(None), Breaker::default());
    }

    #[test]
    fn transitions_table() {
        let open = Breaker {
            state: State::Open,
            since_ms: 100,
            ..Breaker::default()
        };
        let half = |probes| Breaker {
            state: State::HalfOpen,
            since_ms: 200,
            probes_in_flight: probes,
            ..Breaker::default()
        };
        // (state, now, admission expected)
        let cases: &[(Breaker, u64, Admission)] = &[
            (Breaker::default(), 0, Admission::Allowed),
            (
                open,
                100,
                Admission::Refused {
                    retry_after_ms: 5_000,
                },
            ),
            (open, 5_099, Admission::Refused { retry_after_ms: 1 }),
            (open, 5_100, Admission::Probe),
            (half(0), 300, Admission::Probe),
            (half(1), 300, Admission::Probe),
            (
                half(2),
                300,
                Admission::Refused {
                    retry_after_ms: 5_000,
                },
            ),
            (
                half(2),
                29_000,
                Admission::Refused {
                    retry_after_ms: 1_200,
                },
            ),
            (half(2), 30_200, Admission::Probe),
        ];
        for (b, now, want) in cases {
            assert_eq!(admit(b, &CFG, *now).1, *want, "{b:?} at {now}");
        }
        assert_eq!(
            admit(&open, &CFG, 5_100).2,
            Some(Transition {
                from: State::Open,
                to: State::HalfOpen
            })
        );
    }

    #[test]
    fn consecutive_failures_open_and_a_success_resets_the_count() {
        let mut b = Breaker::default();
        (b, _) = fail(&b, 0);
        (b, _) = fail(&b, 1);
        b = on_result(&b, &CFG, 2, true, false).0.unwrap();
        assert_eq!(b.consecutive_failures, 0);
        (b, _) = fail(&b, 3);
        (b, _) = fail(&b, 4);
        let (b, t) = fail(&b, 5);
        assert_eq!(
            (b.state, t),
            (
                State::Open,
                Some(Transition {
                    from: State::Closed,
                    to: State::Open
                })
            )
        );
        assert_eq!(b.since_ms, 5);
    }

    #[test]
    fn failure_ratio_opens_only_past_min_requests_within_the_window() {
        let mut b = Breaker::default();
        // Alternate success/failure: never 3 in a row, ratio 0.5.
        for i in 0..9u64 {
            b = on_result(&b, &CFG, i, i % 2 == 1, false).0.unwrap();
        }
        assert_eq!(b.state, State::Closed, "9 requests < min_requests");
        let (b2, t) = fail(&b, 9);
        assert_eq!(b2.state, State::Open, "{t:?}");
        // The same pattern spread over windows never reaches min_requests.
        let mut b = Breaker::default();
        for i in 0..30u64 {
            b = on_result(&b, &CFG, i * 300, i % 2 == 1, false).0.unwrap();
        }
        assert_eq!(b.state, State::Closed);
    }

    #[test]
    fn probe_success_closes_and_probe_failure_reopens() {
        let half = Breaker {
            state: State::HalfOpen,
            since_ms: 10,
            probes_in_flight: 1,
            ..Breaker::default()
        };
        let (n, t) = on_result(&half, &CFG, 20, true, true);
        assert_eq!(n.unwrap().state, State::Closed);
        assert_eq!(
            t,
            Some(Transition {
                from: State::HalfOpen,
                to: State::Closed
            })
        );
        let (n, _) = on_result(&half, &CFG, 20, false, true);
        assert_eq!(
            n.unwrap(),
            Breaker {
                state: State::Open,
                since_ms: 20,
                ..Breaker::default()
            }
        );
        // Results of non-probe requests while half-open or open are ignored.
        assert_eq!(on_result(&half, &CFG, 20, false, false), (None, None));
        let open = Breaker {
            state: State::Open,
            since_ms: 10,
            ..Breaker::default()
        };
        assert_eq!(on_result(&open, &CFG, 20, true, false), (None, None));
    }

    #[test]
    fn released_probe_frees_its_slot() {
        let half = Breaker {
            state: State::HalfOpen,
            since_ms: 10,
            probes_in_flight: 2,
            ..Breaker::default()
        };
        assert_eq!(release_probe(&half).unwrap().probes_in_flight, 1);
        assert_eq!(release_probe(&Breaker::default()), None);
    }

    fn admit_in(store: &MemStore, now: u64) -> Admission {
        update(store, "b", |cur| {
            let (next, adm, _) = admit(&Breaker::decode(cur), &CFG, now);
            (next.map(|n| n.encode()), adm)
        })
        .unwrap()
    }

    #[test]
    fn probe_limit_holds_when_other_workers_race_for_probes() {
        let store = MemStore::default();
        let open = Breaker {
            state: State::Open,
            since_ms: 0,
            ..Breaker::default()
        };
        store.set("b", &open.encode(), None).unwrap();
        // Another worker takes the first probe between our read and write.
        store.inject_conflicts(1, |_| {
            Breaker {
                state: State::HalfOpen,
                since_ms: 5_000,
                probes_in_flight: 1,
                ..Breaker::default()
            }
            .encode()
        });
        assert_eq!(admit_in(&store, 5_000), Admission::Probe);
        let b = Breaker::decode(store.get("b").unwrap().0.as_deref());
        assert_eq!(
            b.probes_in_flight, 2,
            "our probe is counted on top of theirs"
        );
        assert!(
            matches!(admit_in(&store, 5_001), Admission::Refused { .. }),
            "limit of 2 reached"
        );
    }

    #[test]
    fn failures_recorded_under_contention_are_all_counted() {
        let store = MemStore::default();
        store.inject_conflicts(2, |v| {
            let b = Breaker::decode(Some(v));
            on_result(&b, &CFG, 0, false, false).0.unwrap().encode()
        });
        store.set("b", &Breaker::default().encode(), None).unwrap();
        store.inject_conflicts(2, |v| {
            let b = Breaker::decode(Some(v));
            on_result(&b, &CFG, 0, false, false).0.unwrap().encode()
        });
        let t = update(&store, "b", |cur| {
            let (n, t) = on_result(&Breaker::decode(cur), &CFG, 0, false, false);
            (n.map(|n| n.encode()), t)
        })
        .unwrap();
        // Two interfering failures + ours = 3 in a row: ours is the one that opens it.
        assert_eq!(
            t,
            Some(Transition {
                from: State::Closed,
                to: State::Open
            })
        );
    }
}
