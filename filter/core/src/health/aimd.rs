//! Adaptive concurrency per provider (AIMD): the limit starts at a
//! configured value, halves on a 429, a 5xx or a timeout (and the provider
//! pauses for its `Retry-After`), and grows by one after N successes in a
//! row. The state lives in shared data; these are its pure transitions.

#![deny(clippy::arithmetic_side_effects)]

use crate::wire::le;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AimdConfig {
    pub initial: u32,
    pub min: u32,
    pub max: u32,
    /// Successes in a row that add one to the limit.
    pub increase_after: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aimd {
    pub limit: u32,
    pub in_flight: u32,
    pub successes: u32,
    /// No request until then (the provider's Retry-After).
    pub paused_until_ms: u64,
}

impl Aimd {
    pub fn decode(b: Option<&[u8]>, cfg: &AimdConfig) -> Aimd {
        let read = |b: &[u8]| {
            Some(Aimd {
                limit: le::u32_at(b, 0)?,
                in_flight: le::u32_at(b, 4)?,
                successes: le::u32_at(b, 8)?,
                paused_until_ms: le::u64_at(b, 12)?,
            })
        };
        b.and_then(read).unwrap_or(Aimd {
            limit: cfg.initial,
            in_flight: 0,
            successes: 0,
            paused_until_ms: 0,
        })
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(20);
        out.extend_from_slice(&self.limit.to_le_bytes());
        out.extend_from_slice(&self.in_flight.to_le_bytes());
        out.extend_from_slice(&self.successes.to_le_bytes());
        out.extend_from_slice(&self.paused_until_ms.to_le_bytes());
        out
    }

    /// Take a slot: `Err(ms)` when the provider is paused or full (ms until
    /// it may have room: the pause, else a short wait).
    pub fn admit(self, now_ms: u64) -> (Aimd, Result<(), u64>) {
        if now_ms < self.paused_until_ms {
            return (self, Err(self.paused_until_ms.saturating_sub(now_ms)));
        }
        if self.in_flight >= self.limit {
            return (self, Err(1000));
        }
        let next = Aimd {
            in_flight: self.in_flight.saturating_add(1),
            ..self
        };
        (next, Ok(()))
    }

    /// A slot given back.
    pub fn release(self) -> Aimd {
        Aimd {
            in_flight: self.in_flight.saturating_sub(1),
            ..self
        }
    }

    /// An attempt's result: success grows the limit after N in a row; an
    /// overload halves it and pauses for the provider's Retry-After.
    pub fn on_result(
        self,
        cfg: &AimdConfig,
        ok: bool,
        retry_after_ms: Option<u64>,
        now_ms: u64,
    ) -> Aimd {
        if ok {
            let successes = self.successes.saturating_add(1);
            if successes >= cfg.increase_after.max(1) {
                return Aimd {
                    limit: self.limit.saturating_add(1).min(cfg.max),
                    successes: 0,
                    ..self
                };
            }
            return Aimd { successes, ..self };
        }
        Aimd {
            limit: (self.limit / 2).max(cfg.min),
            successes: 0,
            paused_until_ms: retry_after_ms
                .map_or(self.paused_until_ms, |ms| now_ms.saturating_add(ms)),
            ..self
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const CFG: AimdConfig = AimdConfig {
        initial: 4,
        min: 1,
        max: 6,
        increase_after: 2,
    };

    #[test]
    fn halves_pauses_and_grows_back() {
        let s = Aimd::decode(None, &CFG);
        assert_eq!((s.limit, s.in_flight), (4, 0));
        let (s, ok) = s.admit(0);
        assert!(ok.is_ok() && s.in_flight == 1);
        let s = s.release().on_result(&CFG, false, Some(2000), 1000);
        assert_eq!((s.limit, s.paused_until_ms), (2, 3000));
        assert_eq!(s.admit(2999).1, Err(1));
        let (s, ok) = s.admit(3000);
        assert!(ok.is_ok());
        let (s, ok) = s.admit(3000);
        assert!(ok.is_ok());
        assert_eq!(s.admit(3000).1, Err(1000), "full at the halved limit");
        let s = s.release().on_result(&CFG, true, None, 3100);
        assert_eq!(s.limit, 2);
        let s = s.release().on_result(&CFG, true, None, 3100);
        assert_eq!((s.limit, s.successes, s.in_flight), (3, 0, 0));
        let mut s = s;
        for _ in 0..20 {
            s = s.on_result(&CFG, true, None, 0);
        }
        assert_eq!(s.limit, 6, "capped at max");
        for _ in 0..10 {
            s = s.on_result(&CFG, false, None, 0);
        }
        assert_eq!(s.limit, 1, "floored at min");
        assert_eq!(Aimd::decode(Some(&s.encode()), &CFG), s);
        assert_eq!(Aimd::decode(Some(b"short"), &CFG).limit, 4);
    }
}
