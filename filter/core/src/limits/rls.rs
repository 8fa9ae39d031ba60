//! Envoy's rate limit service protocol (`envoy.service.ratelimit.v3`), the
//! part the gateway speaks: `ShouldRateLimit` requests with descriptors that
//! carry their own limit (the plugin config stays the one control plane; the
//! service holds no limits of its own) and `hits_addend` for weighted
//! reservations, and the answer read defensively: anything the gateway does
//! not understand is an error (the configured failure mode decides), never
//! an admission by accident.
// Untrusted numbers (config, the service's answer) meet here.
#![deny(clippy::arithmetic_side_effects)]

use crate::limits::period::Period;
use crate::shared::keys::Owner;
use crate::wire::pb::{self, Reader, Value, WireError};

pub const SERVICE: &str = "envoy.service.ratelimit.v3.RateLimitService";
pub const METHOD: &str = "ShouldRateLimit";
/// The domain of every request (the service may serve other domains too).
pub const DOMAIN: &str = "portcullis";
/// Budgets are counted in units of 100 micro-USD ($0.0001): the protocol's
/// counts are 32-bit, so a daily cap up to $429,496 fits.
pub const BUDGET_UNIT_MICROS: u64 = 100;

/// `RateLimitUnit`: the period of a descriptor's limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    Second = 1,
    Minute = 2,
    Hour = 3,
    Day = 4,
    Month = 5,
    Year = 6,
    Week = 7,
}

/// One descriptor: its entries and the limit it carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub entries: Vec<(&'static str, String)>,
    pub requests_per_unit: u32,
    pub unit: Unit,
}

/// A global limit of a key or a team, as a descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    RequestsPerMinute,
    TokensPerMinute,
    /// A budget of one period: which, and its index ([`Period::index`]).
    Budget(Period, u64),
}

impl Limit {
    pub fn name(self) -> &'static str {
        match self {
            Limit::RequestsPerMinute => "requests_per_minute",
            Limit::TokensPerMinute => "tokens_per_minute",
            Limit::Budget(Period::Day, _) => "budget_usd_per_day",
            Limit::Budget(Period::Week, _) => "budget_usd_per_week",
            Limit::Budget(Period::Month, _) => "budget_usd_per_month",
            Limit::Budget(Period::Total, _) => "budget_usd_total",
        }
    }

    /// The descriptor `[client|team=<name>, limit=<which>]`, and for a
    /// budget the period it counts (`day=2026-12-02`, `week=2026-11-30`,
    /// `month=2026-12`): a fixed window the service never refills. A
    /// `total` budget's window is the service's longest (a year, from its
    /// first spend).
    pub fn descriptor(self, owner: Owner<'_>, limit: u32) -> Descriptor {
        let mut entries = vec![
            (owner.kind(), owner.name().to_string()),
            ("limit", self.name().into()),
        ];
        let unit = match self {
            Limit::Budget(p, index) => {
                let unit = match p {
                    Period::Day => Unit::Day,
                    Period::Week => Unit::Week,
                    Period::Month => Unit::Month,
                    Period::Total => Unit::Year,
                };
                if p != Period::Total {
                    entries.push((p.name(), p.label(index)));
                }
                unit
            }
            _ => Unit::Minute,
        };
        Descriptor {
            entries,
            requests_per_unit: limit,
            unit,
        }
    }
}

/// Micro-USD as budget units, rounded up (a reservation never undercounts).
pub fn budget_units(micros: i64) -> u64 {
    u64::try_from(micros.max(0))
        .unwrap_or(0)
        .div_ceil(BUDGET_UNIT_MICROS)
}

/// `YYYY-MM-DD` of a day number (days since 1970-01-01, UTC).
pub fn iso_date(day: u64) -> String {
    Period::Day.label(day)
}

/// A `RateLimitRequest`: every descriptor counts `hits` (at least 1).
pub fn encode_request<'a>(
    descriptors: impl IntoIterator<Item = &'a Descriptor>,
    hits: u32,
) -> Vec<u8> {
    let mut out = request_with(descriptors.into_iter().map(|d| (d, None)));
    pb::uint(&mut out, 3, u64::from(hits.max(1)));
    out
}

/// A `RateLimitRequest` whose descriptors each count their own hits: the
/// descriptor's `hits_addend` (field 3 of Envoy's `RateLimitDescriptor`, a
/// `UInt64Value` that overrides the request's), so the limits of several
/// kinds (requests, tokens, budget units) go in one call and the service
/// admits all of them or none (#34).
pub fn encode_weighted<'a>(
    descriptors: impl IntoIterator<Item = (&'a Descriptor, u32)>,
) -> Vec<u8> {
    request_with(descriptors.into_iter().map(|(d, hits)| (d, Some(hits))))
}

fn request_with<'a>(descriptors: impl Iterator<Item = (&'a Descriptor, Option<u32>)>) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    pb::bytes(&mut out, 1, DOMAIN.as_bytes());
    for (d, hits) in descriptors {
        let mut dm = Vec::with_capacity(48);
        for (k, v) in &d.entries {
            let mut e = Vec::with_capacity(k.len().saturating_add(v.len()).saturating_add(4));
            pb::bytes(&mut e, 1, k.as_bytes());
            pb::bytes(&mut e, 2, v.as_bytes());
            pb::message(&mut dm, 1, &e);
        }
        let mut lim = Vec::with_capacity(8);
        pb::uint(&mut lim, 1, u64::from(d.requests_per_unit));
        pb::uint(&mut lim, 2, d.unit as u64);
        pb::message(&mut dm, 2, &lim);
        if let Some(hits) = hits {
            let mut w = Vec::with_capacity(6);
            pb::uint(&mut w, 1, u64::from(hits));
            pb::message(&mut dm, 3, &w);
        }
        pb::message(&mut out, 2, &dm);
    }
    out
}

/// `RateLimitResponse.Code`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
    /// UNKNOWN, or a value this version does not know.
    Unknown(u64),
}

impl Code {
    fn of(v: u64) -> Code {
        match v {
            1 => Code::Ok,
            2 => Code::OverLimit,
            other => Code::Unknown(other),
        }
    }
}

/// One descriptor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// The limit the service applied (`requests_per_unit`), when it said.
    pub limit: Option<u32>,
    pub remaining: u32,
    /// Until the limit resets (or, refused, until this request would pass).
    pub reset_ms: u64,
}

/// The service's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Response {
    pub overall: Code,
    pub statuses: Vec<Status>,
}

/// Why an answer could not be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerError {
    Wire(WireError),
    /// A field with the wrong wire type, or a number out of its range.
    Malformed(&'static str),
}

impl From<WireError> for AnswerError {
    fn from(e: WireError) -> Self {
        AnswerError::Wire(e)
    }
}

fn varint(v: Value<'_>, what: &'static str) -> Result<u64, AnswerError> {
    match v {
        Value::Varint(n) => Ok(n),
        _ => Err(AnswerError::Malformed(what)),
    }
}

fn message<'a>(v: Value<'a>, what: &'static str) -> Result<&'a [u8], AnswerError> {
    match v {
        Value::Bytes(b) => Ok(b),
        _ => Err(AnswerError::Malformed(what)),
    }
}

fn u32_of(n: u64, what: &'static str) -> Result<u32, AnswerError> {
    u32::try_from(n).map_err(|_| AnswerError::Malformed(what))
}

/// `google.protobuf.Duration` in milliseconds (negative reads as 0).
fn duration_ms(b: &[u8]) -> Result<u64, AnswerError> {
    let (mut secs, mut nanos) = (0u64, 0u64);
    let mut r = Reader::new(b);
    while let Some((n, v)) = r.field()? {
        match n {
            1 => secs = varint(v, "duration seconds")?,
            2 => nanos = varint(v, "duration nanos")?,
            _ => {}
        }
    }
    // int64 fields: a negative value arrives as a huge varint.
    if i64::try_from(secs).is_err() || i64::try_from(nanos).is_err() {
        return Ok(0);
    }
    Ok(secs
        .saturating_mul(1000)
        .saturating_add(nanos.min(999_999_999) / 1_000_000))
}

fn status(b: &[u8]) -> Result<Status, AnswerError> {
    let mut s = Status {
        code: Code::Unknown(0),
        limit: None,
        remaining: 0,
        reset_ms: 0,
    };
    let mut r = Reader::new(b);
    while let Some((n, v)) = r.field()? {
        match n {
            1 => s.code = Code::of(varint(v, "status code")?),
            2 => {
                let mut lr = Reader::new(message(v, "current limit")?);
                let mut per_unit = 0;
                while let Some((ln, lv)) = lr.field()? {
                    if ln == 1 {
                        per_unit = u32_of(varint(lv, "requests per unit")?, "requests per unit")?;
                    }
                }
                s.limit = Some(per_unit);
            }
            3 => s.remaining = u32_of(varint(v, "limit remaining")?, "limit remaining")?,
            4 => s.reset_ms = duration_ms(message(v, "duration until reset")?)?,
            _ => {}
        }
    }
    Ok(s)
}

pub fn decode_response(bytes: &[u8]) -> Result<Response, AnswerError> {
    let mut out = Response {
        overall: Code::Unknown(0),
        statuses: Vec::new(),
    };
    let mut r = Reader::new(bytes);
    while let Some((n, v)) = r.field()? {
        match n {
            1 => out.overall = Code::of(varint(v, "overall code")?),
            2 => out.statuses.push(status(message(v, "descriptor status")?)?),
            _ => {}
        }
    }
    Ok(out)
}

/// What the gateway makes of an answer to a request of `descriptors`
/// descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Admitted; the tightest descriptor (least remaining) and its status,
    /// when the service gave statuses.
    Ok(Option<(usize, Status)>),
    /// Refused; the descriptor that refused and its status, when given.
    OverLimit(Option<(usize, Status)>),
    /// Not an answer the gateway can act on (the failure mode decides).
    Unusable(&'static str),
}

/// The answer to one call that carried several groups of descriptors (in
/// order, `groups[g]` of them in group `g`): a verdict per group. The call
/// is admitted or refused whole; a refusal is the group holding the first
/// refusing descriptor (the first group when the service named none), and
/// every other group reads as admitted with its tightest status.
pub fn verdicts(bytes: &[u8], groups: &[usize]) -> Vec<Verdict> {
    let total = groups.iter().fold(0usize, |a, &n| a.saturating_add(n));
    let whole = verdict(bytes, total);
    let statuses = match (&whole, decode_response(bytes)) {
        (Verdict::Unusable(_), _) | (_, Err(_)) => return vec![whole; groups.len()],
        (_, Ok(r)) => r.statuses,
    };
    let refused_at = match whole {
        Verdict::OverLimit(Some((i, _))) => Some(i),
        Verdict::OverLimit(None) => Some(0),
        _ => None,
    };
    let mut out = Vec::with_capacity(groups.len());
    let mut start = 0usize;
    for &n in groups {
        let end = start.saturating_add(n);
        let inside = |i: usize| i >= start && i < end;
        let own = statuses.get(start..end).unwrap_or_default();
        let tightest = own
            .iter()
            .copied()
            .enumerate()
            .min_by_key(|(_, s)| s.remaining);
        out.push(match (refused_at, whole) {
            (Some(i), Verdict::OverLimit(s)) if inside(i) => {
                Verdict::OverLimit(s.map(|(i, st)| (i.saturating_sub(start), st)))
            }
            _ => Verdict::Ok(tightest),
        });
        start = end;
    }
    out
}

pub fn verdict(bytes: &[u8], descriptors: usize) -> Verdict {
    let r = match decode_response(bytes) {
        Ok(r) => r,
        Err(AnswerError::Malformed(what)) => return Verdict::Unusable(what),
        Err(AnswerError::Wire(_)) => return Verdict::Unusable("not a RateLimitResponse"),
    };
    if !r.statuses.is_empty() && r.statuses.len() != descriptors {
        return Verdict::Unusable("one status per descriptor expected");
    }
    let indexed = r.statuses.iter().copied().enumerate();
    match r.overall {
        Code::Ok => Verdict::Ok(indexed.min_by_key(|(_, s)| s.remaining)),
        Code::OverLimit => Verdict::OverLimit(
            indexed
                .clone()
                .find(|(_, s)| s.code == Code::OverLimit)
                .or(r.statuses.first().map(|s| (0, *s))),
        ),
        Code::Unknown(_) => Verdict::Unusable("overall code is not OK or OVER_LIMIT"),
    }
}

#[cfg(test)]
mod tests;
