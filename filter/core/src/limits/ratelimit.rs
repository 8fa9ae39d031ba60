//! Admission arithmetic for a key or a team: token buckets (requests and
//! tokens per minute), a concurrency counter, and USD budgets (their
//! periods: [`crate::limits::period`]). Pure arithmetic over small fixed encodings;
//! every check is the decision of one CAS write, so two workers can never
//! both take the last unit. Time is a parameter.
// Untrusted numbers (client bodies, provider usage, config) meet here:
// every sum and product saturates or is checked, never wraps.
#![deny(clippy::arithmetic_side_effects)]

/// Units are thousandths, so refill rates below one per millisecond stay exact.
const MILLI: i64 = 1000;

/// A count of whole units in thousandths, saturating: a client's `max_tokens`
/// of 2^63 or 2^64-1 is a huge request, never a negative or tiny one.
fn milli(units: u64) -> i64 {
    i64::try_from(units)
        .unwrap_or(i64::MAX)
        .saturating_mul(MILLI)
}

/// A whole-unit count as a signed delta, saturating.
pub fn signed(units: u64) -> i64 {
    i64::try_from(units).unwrap_or(i64::MAX)
}

/// A token bucket: `capacity` per minute, refilled continuously. The level
/// may go negative when a settlement takes more than was reserved (debt).
///
/// When the capacity changes (a key's or team's limit is raised or
/// lowered by a new config), what was used stays used: a raised limit adds
/// the difference to the level (a client that had used 2 of 2 has 98 of a
/// new 100 at once), a lowered one caps the level at the new capacity (no
/// burst past it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Bucket {
    /// Level in thousandths of a unit.
    pub level_milli: i64,
    pub updated_ms: u64,
    /// Set once the bucket has been used (a fresh bucket starts full).
    pub initialized: bool,
    /// The capacity (thousandths) the level was last refilled against; 0:
    /// not known (a value written before it was kept).
    pub cap_milli: i64,
}

/// An encoded bucket: level, time, initialized, capacity.
const ENCODED: usize = 25;
/// The encoding before the capacity was kept (read, never written).
const ENCODED_V1: usize = 17;

impl Bucket {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(ENCODED);
        self.encode_into(&mut v);
        v
    }

    /// The encoding appended to `out` (a level's counters hold two).
    pub fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.level_milli.to_le_bytes());
        out.extend_from_slice(&self.updated_ms.to_le_bytes());
        out.push(u8::from(self.initialized));
        out.extend_from_slice(&self.cap_milli.to_le_bytes());
    }

    pub fn decode(b: Option<&[u8]>) -> Bucket {
        let Some(b) = b.filter(|b| b.len() == ENCODED || b.len() == ENCODED_V1) else {
            return Bucket::default();
        };
        Bucket {
            level_milli: crate::wire::le::i64_at(b, 0).unwrap_or(0),
            updated_ms: crate::wire::le::u64_at(b, 8).unwrap_or(0),
            initialized: b.get(16) == Some(&1),
            cap_milli: crate::wire::le::i64_at(b, 17).unwrap_or(0),
        }
    }

    /// The level at `now`, refilled at `per_minute` and capped there (a
    /// capacity raised since the last refill adds the difference first).
    pub fn refilled(&self, per_minute: u64, now_ms: u64) -> Bucket {
        let cap = milli(per_minute);
        if !self.initialized {
            return Bucket {
                level_milli: cap,
                updated_ms: now_ms,
                initialized: true,
                cap_milli: cap,
            };
        }
        // The time since the last refill counts at the rate the level was
        // kept at (a new rate applies from now); a raise then adds its
        // difference, and the new capacity caps the level.
        let (old_cap, old_rate) = if self.cap_milli > 0 {
            (self.cap_milli, self.cap_milli / MILLI)
        } else {
            (cap, per_minute as i64)
        };
        let elapsed = now_ms.saturating_sub(self.updated_ms) as i64;
        // per_minute units per 60_000 ms, in thousandths: per_minute * elapsed / 60.
        let add = old_rate.saturating_mul(elapsed) / 60;
        let mut level = self.level_milli.saturating_add(add).min(old_cap);
        if cap > old_cap {
            level = level.saturating_add(cap.saturating_sub(old_cap));
        }
        Bucket {
            level_milli: level.min(cap),
            updated_ms: now_ms,
            initialized: true,
            cap_milli: cap,
        }
    }
}

/// What a bucket said about a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Take {
    pub admitted: bool,
    /// Whole units left after this request (for `x-ratelimit-remaining-*`).
    pub remaining: u64,
    /// Milliseconds until `amount` would be available (when refused) or
    /// until the bucket is full again (when admitted), for `retry-after` and
    /// `x-ratelimit-reset-*`.
    pub wait_ms: u64,
}

fn ms_to_refill(deficit_milli: i64, per_minute: u64) -> u64 {
    if deficit_milli <= 0 || per_minute == 0 {
        return 0;
    }
    // deficit (thousandths) / (per_minute/60 per ms in thousandths) = deficit * 60 / per_minute.
    ((deficit_milli as u64).saturating_mul(60)).div_ceil(per_minute)
}

/// Take `amount` units if the bucket holds them. Returns the state to write
/// (always: the refill is part of it) and the decision.
pub fn take(b: &Bucket, per_minute: u64, amount: u64, now_ms: u64) -> (Bucket, Take) {
    let cur = b.refilled(per_minute, now_ms);
    let want = milli(amount);
    let cap = milli(per_minute);
    if cur.level_milli >= want {
        let next = Bucket {
            level_milli: cur.level_milli.saturating_sub(want),
            ..cur
        };
        let remaining = (next.level_milli.max(0) / MILLI) as u64;
        (
            next,
            Take {
                admitted: true,
                remaining,
                wait_ms: ms_to_refill(cap.saturating_sub(next.level_milli), per_minute),
            },
        )
    } else {
        let remaining = (cur.level_milli.max(0) / MILLI) as u64;
        (
            cur,
            Take {
                admitted: false,
                remaining,
                wait_ms: ms_to_refill(want.saturating_sub(cur.level_milli), per_minute).max(1),
            },
        )
    }
}

/// The bucket as it stands, without taking anything (for headers).
pub fn level(b: &Bucket, per_minute: u64, now_ms: u64) -> Take {
    let cur = b.refilled(per_minute, now_ms);
    let cap = milli(per_minute);
    Take {
        admitted: true,
        remaining: (cur.level_milli.max(0) / MILLI) as u64,
        wait_ms: ms_to_refill(cap.saturating_sub(cur.level_milli), per_minute),
    }
}

/// Give back (positive) or take more (negative) after the fact: settling a
/// reservation with real usage. Never above capacity; may go into debt.
pub fn adjust(b: &Bucket, per_minute: u64, delta: i64, now_ms: u64) -> Bucket {
    let cur = b.refilled(per_minute, now_ms);
    let cap = milli(per_minute);
    Bucket {
        level_milli: cur
            .level_milli
            .saturating_add(delta.saturating_mul(MILLI))
            .min(cap),
        ..cur
    }
}

/// Requests in flight: acquire if under `max`.
pub fn acquire(in_flight: Option<&[u8]>, max: u32) -> (Option<Vec<u8>>, bool) {
    let n = decode_u32(in_flight);
    if n < max {
        (Some(n.saturating_add(1).to_le_bytes().to_vec()), true)
    } else {
        (None, false)
    }
}

pub fn release(in_flight: Option<&[u8]>) -> Option<Vec<u8>> {
    let n = decode_u32(in_flight);
    (n > 0).then(|| n.saturating_sub(1).to_le_bytes().to_vec())
}

pub fn decode_u32(b: Option<&[u8]>) -> u32 {
    b.filter(|b| b.len() == 4)
        .and_then(|b| crate::wire::le::u32_at(b, 0))
        .unwrap_or(0)
}

/// Money in millionths of a USD (micro-dollars), so sums stay exact.
pub type Micros = i64;

/// USD per million tokens for one model (micro-dollars per token), and
/// micro-dollars per unit of the APIs priced by images, audio seconds,
/// characters or searches.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Price {
    pub input: f64,
    pub output: f64,
    pub cached_input: f64,
    /// Prompt tokens written to the provider's prompt cache (Anthropic).
    pub cache_write: f64,
    /// Reasoning tokens (counted in the completion; OpenAI's `reasoning_tokens`,
    /// Gemini's `thoughtsTokenCount`).
    pub reasoning: f64,
    /// Audio tokens of the prompt and of the completion (the Realtime API).
    pub input_audio: f64,
    pub output_audio: f64,
    /// Micro-dollars per unit (an image, a second of audio, a character, a
    /// search): the API says which ([`crate::api::Units`]).
    pub unit: f64,
    /// Per-image prices by quality and size (over `unit`).
    pub images: crate::units::ImagePrices,
    /// The request's units known before its answer, reserved with its
    /// tokens (set on a request's own price, [`crate::pricing::price_for`]).
    pub units: u64,
}

impl Price {
    /// Every price times `f` (a batch's discount).
    pub fn scaled(self, f: f64) -> Price {
        Price {
            input: self.input * f,
            output: self.output * f,
            cached_input: self.cached_input * f,
            cache_write: self.cache_write * f,
            reasoning: self.reasoning * f,
            input_audio: self.input_audio * f,
            output_audio: self.output_audio * f,
            unit: self.unit * f,
            ..self
        }
    }

    /// The cost of an answer's usage, each kind of token at its price.
    pub fn usage_cost(&self, u: &crate::usage::Usage) -> Micros {
        let cached = u.cached.min(u.prompt);
        let written = u.cache_write.min(u.prompt.saturating_sub(cached));
        let plain = u.prompt.saturating_sub(cached).saturating_sub(written);
        let reasoning = u.reasoning.min(u.completion);
        let audio_in = u.audio_prompt.min(plain);
        let audio_out = u
            .audio_completion
            .min(u.completion.saturating_sub(reasoning));
        let micros = plain.saturating_sub(audio_in) as f64 * self.input
            + audio_in as f64 * self.input_audio
            + cached as f64 * self.cached_input
            + written as f64 * self.cache_write
            + u.completion
                .saturating_sub(reasoning)
                .saturating_sub(audio_out) as f64
                * self.output
            + audio_out as f64 * self.output_audio
            + reasoning as f64 * self.reasoning
            + u.units as f64 * self.unit;
        micros.ceil() as Micros
    }

    /// The completion tokens `left` micro-USD pays for after a prompt of
    /// `prompt` tokens (`u64::MAX` when output is free).
    pub fn completion_room(&self, left: Micros, prompt: u64) -> u64 {
        // One micro-USD of margin: the reservation's cost is rounded up.
        let after_prompt = left as f64 - prompt as f64 * self.input - 1.0;
        if after_prompt < 0.0 {
            return 0;
        }
        if self.output <= 0.0 {
            return u64::MAX;
        }
        // A float cast saturates; the floor keeps the reservation within.
        (after_prompt / self.output).floor() as u64
    }

    /// Cost in micro-USD: tokens * (USD per 1M tokens) = micro-USD exactly.
    pub fn cost(&self, prompt: u64, completion: u64, cached: u64) -> Micros {
        let cached = cached.min(prompt);
        let micros = prompt.saturating_sub(cached) as f64 * self.input
            + cached as f64 * self.cached_input
            + completion as f64 * self.output
            + self.units as f64 * self.unit;
        micros.ceil() as Micros
    }
}

pub fn decode_i64(b: Option<&[u8]>) -> i64 {
    b.filter(|b| b.len() == 8)
        .and_then(|b| crate::wire::le::i64_at(b, 0))
        .unwrap_or(0)
}

/// Tokens to reserve for a request: a prompt estimate (about 4 bytes a
/// token of the request body) plus the completion cap it asked for.
pub fn reservation(
    body_len: usize,
    max_tokens: Option<u64>,
    default_max_tokens: u64,
) -> (u64, u64) {
    (
        (body_len as u64).div_ceil(4),
        max_tokens.unwrap_or(default_max_tokens),
    )
}

/// OpenAI's reset format: `1s`, `6m0s`, `1h2m3s`, `250ms`.
pub fn reset_text(ms: u64) -> String {
    // Written digit by digit: three of these on every limited answer.
    let mut out = String::with_capacity(16);
    if ms < 1000 {
        crate::wire::text::push_padded(ms, 1, &mut out);
        out.push_str("ms");
        return out;
    }
    let s = ms.div_ceil(1000);
    let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
    if h > 0 {
        crate::wire::text::push_padded(h, 1, &mut out);
        out.push('h');
    }
    if h > 0 || m > 0 {
        crate::wire::text::push_padded(m, 1, &mut out);
        out.push('m');
    }
    crate::wire::text::push_padded(s, 1, &mut out);
    out.push('s');
    out
}

#[cfg(test)]
mod tests;
