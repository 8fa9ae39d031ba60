//! W3C Trace Context (`traceparent`): the client's trace continued, or a
//! new one started, and one span id for the gateway's own span and one per
//! provider attempt, each sent upstream as that attempt's parent.
//!
//! No random source is needed: ids come from the request's random roll and
//! a hash of its request id, mixed (splitmix64), so a trace id is unique as
//! long as either is.

use crate::wire::text::push_hex;

/// A trace as the gateway carries it through one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Trace {
    pub trace_id: [u8; 16],
    /// The client's span (none when the gateway started the trace).
    pub parent: Option<[u8; 8]>,
    /// The gateway's span: the parent of every attempt's.
    pub span: [u8; 8],
    /// The trace flags (bit 0: sampled).
    pub flags: u8,
    seed: u64,
}

/// A client's `traceparent`, read: trace id, parent span id, flags.
pub type Parent = ([u8; 16], [u8; 8], u8);

fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A non-zero 8-byte id from a seed (W3C forbids the all-zero id).
fn id8(seed: u64) -> [u8; 8] {
    let v = mix(seed);
    (if v == 0 { 1 } else { v }).to_be_bytes()
}

fn hex_val(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    }
}

/// Lower-case hex into `out`; `None` on any other character.
fn unhex(text: &[u8], out: &mut [u8]) -> Option<()> {
    if text.len() != out.len().checked_mul(2)? {
        return None;
    }
    for (o, pair) in out.iter_mut().zip(text.chunks_exact(2)) {
        let hi = hex_val(*pair.first()?)?;
        let lo = hex_val(*pair.get(1)?)?;
        *o = (hi << 4) | lo;
    }
    Some(())
}

/// Read a `traceparent` value: `00-<32 hex>-<16 hex>-<2 hex>`, lower case,
/// ids not all zero. A later version is read by its first four fields (as
/// the spec asks) when what follows them starts with `-`; version `ff` and
/// anything malformed are `None` (the request then starts a trace of its
/// own, if sampling says so).
pub fn parse_traceparent(value: &[u8]) -> Option<Parent> {
    let value = value.trim_ascii();
    let head = value.get(..55)?;
    let mut version = [0u8; 1];
    unhex(head.get(0..2)?, &mut version)?;
    let rest = value.get(55..)?;
    match version[0] {
        0xff => return None,
        0 if !rest.is_empty() => return None,
        _ if !rest.is_empty() && rest.first() != Some(&b'-') => return None,
        _ => {}
    }
    if head.get(2) != Some(&b'-') || head.get(35) != Some(&b'-') || head.get(52) != Some(&b'-') {
        return None;
    }
    let mut trace = [0u8; 16];
    let mut span = [0u8; 8];
    let mut flags = [0u8; 1];
    unhex(head.get(3..35)?, &mut trace)?;
    unhex(head.get(36..52)?, &mut span)?;
    unhex(head.get(53..55)?, &mut flags)?;
    if trace == [0; 16] || span == [0; 8] {
        return None;
    }
    Some((trace, span, flags[0]))
}

/// FNV-1a of some bytes (the request id's part of a new trace id).
fn fnv(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01B3)
    })
}

impl Trace {
    /// The client's trace, continued: the gateway's span is its child.
    pub fn continued(parent: Parent, roll: u64) -> Trace {
        let (trace_id, span, flags) = parent;
        let seed = roll ^ fnv(&trace_id) ^ u64::from_be_bytes(span);
        Trace {
            trace_id,
            parent: Some(span),
            span: id8(seed),
            flags,
            seed,
        }
    }

    /// A new trace (sampled), its id from the request's roll and id.
    pub fn started(roll: u64, request_id: &str, now_ms: u64) -> Trace {
        let hi = id8(roll);
        let lo = id8(fnv(request_id.as_bytes()) ^ now_ms.rotate_left(32));
        let mut trace_id = [0u8; 16];
        for (d, s) in trace_id.iter_mut().zip(hi.iter().chain(lo.iter())) {
            *d = *s;
        }
        let seed = roll ^ u64::from_be_bytes(lo);
        Trace {
            trace_id,
            parent: None,
            span: id8(seed),
            flags: 1,
            seed,
        }
    }

    /// The span id of attempt `n` (1 for the first): the parent the
    /// provider sees.
    pub fn attempt_span(&self, n: u32) -> [u8; 8] {
        id8(self.seed ^ u64::from(n).wrapping_mul(0xD6E8_FEB8_6659_FD93))
    }

    /// The `traceparent` an attempt sends.
    pub fn traceparent(&self, n: u32) -> String {
        let mut s = String::with_capacity(55);
        s.push_str("00-");
        push_hex(&self.trace_id, &mut s);
        s.push('-');
        push_hex(&self.attempt_span(n), &mut s);
        s.push('-');
        push_hex(&[self.flags], &mut s);
        s
    }
}

/// Whether a request without a trace starts one: `rate` of them, by the
/// request's roll (the high bits: `auto` reads the low ones).
pub fn sampled(rate: f64, roll: u64) -> bool {
    if rate >= 1.0 {
        return true;
    }
    if rate.is_nan() || rate <= 0.0 {
        return false;
    }
    let draw = (roll >> 11) as f64 / (1u64 << 53) as f64;
    draw < rate
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::text::hex;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn reads_the_specs_example_and_refuses_what_it_forbids() {
        let (t, s, f) = parse_traceparent(GOOD.as_bytes()).unwrap();
        assert_eq!(hex(&t), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(hex(&s), "00f067aa0ba902b7");
        assert_eq!(f, 1);
        assert!(parse_traceparent(format!(" {GOOD} ").as_bytes()).is_some());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad.as_bytes()), None, "{bad:?}");
        }
        // A later version: its first four fields, whatever follows a dash.
        let v1 = "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00-future";
        assert_eq!(parse_traceparent(v1.as_bytes()).map(|p| p.2), Some(0));
        assert_eq!(
            parse_traceparent(
                "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00x".as_bytes()
            ),
            None
        );
    }

    #[test]
    fn a_continued_trace_keeps_the_clients_ids_and_gives_each_attempt_its_own_span() {
        let parent = parse_traceparent(GOOD.as_bytes()).unwrap();
        let t = Trace::continued(parent, 42);
        assert_eq!(t.trace_id, parent.0);
        assert_eq!(t.parent, Some(parent.1));
        let spans = [
            t.span,
            t.attempt_span(1),
            t.attempt_span(2),
            t.attempt_span(3),
        ];
        for (i, a) in spans.iter().enumerate() {
            assert_ne!(*a, [0; 8]);
            assert_ne!(*a, parent.1);
            for b in spans.iter().skip(i + 1) {
                assert_ne!(a, b);
            }
        }
        let tp = t.traceparent(2);
        assert_eq!(tp.len(), 55);
        assert_eq!(
            parse_traceparent(tp.as_bytes()),
            Some((parent.0, t.attempt_span(2), 1))
        );
        // Not sampled by the client: passed on as it is.
        let unsampled = Trace::continued((parent.0, parent.1, 0), 42);
        assert!(unsampled.traceparent(1).ends_with("-00"));
    }

    #[test]
    fn new_traces_differ_by_roll_or_by_request_id() {
        let a = Trace::started(1, "req-a", 1000);
        let b = Trace::started(1, "req-b", 1000);
        let c = Trace::started(2, "req-a", 1000);
        assert_ne!(a.trace_id, b.trace_id);
        assert_ne!(a.trace_id, c.trace_id);
        assert_eq!(a.parent, None);
        assert_eq!(a.flags, 1);
        assert_ne!(a.span, a.attempt_span(1));
    }

    #[test]
    fn sampling_takes_its_share() {
        assert!(sampled(1.0, 0) && !sampled(0.0, u64::MAX) && !sampled(f64::NAN, 1));
        let mut x = 1u64;
        let n = (0..10_000)
            .filter(|_| {
                x = mix(x);
                sampled(0.25, x)
            })
            .count();
        assert!((2_200..2_800).contains(&n), "{n}");
    }
}
