//! What a provider's answer means for fallback and for its breaker, and the
//! error a client gets when every candidate failed.

use crate::error::GatewayError;

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    Status(u16),
    ConnectFailure,
    Reset,
    Timeout,
}

impl Cause {
    /// Metric suffix.
    pub fn metric(self) -> &'static str {
        match self {
            Cause::Status(429) => "failure_429",
            Cause::Status(_) => "failure_5xx",
            Cause::ConnectFailure => "failure_connect",
            Cause::Reset => "failure_reset",
            Cause::Timeout => "failure_timeout",
        }
    }

    /// The cause in the request record.
    pub fn class(self) -> &'static str {
        match self {
            Cause::Status(429) => "http_429",
            Cause::Status(_) => "http_5xx",
            Cause::ConnectFailure => "connect",
            Cause::Reset => "reset",
            Cause::Timeout => "timeout",
        }
    }

    pub fn status(self) -> u32 {
        match self {
            Cause::Status(s) => u32::from(s),
            _ => 0,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Cause::Status(s) => format!("HTTP {s}"),
            Cause::ConnectFailure => "connection failed".into(),
            Cause::Reset => "connection reset".into(),
            Cause::Timeout => "timed out".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The provider answered; pass it on; it counts as a success.
    Success,
    /// The client's fault (4xx other than 429): pass through verbatim, never
    /// retried, never counted against the breaker.
    ClientError,
    /// Try the next candidate; counts against the breaker.
    Retryable(Cause),
}

/// Classify an answer that went through Envoy's router. Envoy's own local
/// replies for upstream failures (503/504) say why in `code_details`.
pub fn classify(status: u16, code_details: Option<&str>) -> Outcome {
    match status {
        429 | 500..=599 => Outcome::Retryable(cause_from_details(status, code_details)),
        400..=499 => Outcome::ClientError,
        _ => Outcome::Success,
    }
}

fn cause_from_details(status: u16, details: Option<&str>) -> Cause {
    let d = details.unwrap_or("");
    if d.contains("timeout") {
        Cause::Timeout
    } else if d.contains("connection_failure")
        || d.contains("connection_refused")
        || d.contains("no_healthy_upstream")
    {
        Cause::ConnectFailure
    } else if d.contains("reset")
        || d.contains("connection_termination")
        || d.contains("protocol_error")
    {
        Cause::Reset
    } else {
        Cause::Status(status)
    }
}

/// Classify a `dispatch_http_call` answer: no `:status` means the call
/// failed; it is a timeout when it took (about) the whole timeout.
pub fn classify_call(status: Option<u16>, elapsed_ms: u64, timeout_ms: u64) -> Outcome {
    match status {
        Some(s) => classify(s, None),
        None if elapsed_ms + 50 >= timeout_ms => Outcome::Retryable(Cause::Timeout),
        None => Outcome::Retryable(Cause::ConnectFailure),
    }
}

/// The error when no candidate answered. `attempts`: each provider tried and
/// why it failed; `skipped`: providers passed over because their breaker was
/// open, with milliseconds until each lets a probe through.
pub fn exhausted(
    model: &str,
    attempts: &[(String, Cause)],
    skipped: &[(String, u64)],
) -> GatewayError {
    let mut parts: Vec<String> = attempts
        .iter()
        .map(|(p, c)| format!("{p}: {}", c.describe()))
        .collect();
    parts.extend(
        skipped
            .iter()
            .map(|(p, ms)| format!("{p}: circuit open (retry in {}s)", ms.div_ceil(1000).max(1))),
    );
    let list = parts.join("; ");
    if attempts.is_empty() {
        let soonest = skipped.iter().map(|&(_, ms)| ms).min().unwrap_or(1000);
        GatewayError::new(
            503,
            "server_error",
            "providers_unavailable",
            format!("Every provider of `{model}` is failing and temporarily skipped ({list}). Retry later."),
        )
        .with_retry_after(soonest.div_ceil(1000).max(1))
    } else {
        GatewayError::new(
            502,
            "server_error",
            "upstream_failed",
            format!("Every provider of `{model}` failed ({list})."),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn classification_table() {
        let cases: &[(u16, Option<&str>, Outcome)] = &[
            (200, None, Outcome::Success),
            (201, None, Outcome::Success),
            (400, None, Outcome::ClientError),
            (401, None, Outcome::ClientError),
            (404, None, Outcome::ClientError),
            (429, None, Outcome::Retryable(Cause::Status(429))),
            (500, None, Outcome::Retryable(Cause::Status(500))),
            (503, Some("upstream_reset_before_response_started{connection_failure}"), Outcome::Retryable(Cause::ConnectFailure)),
            (503, Some("upstream_reset_before_response_started{remote_connection_failure,delayed_connect_error:_Connection_refused}"), Outcome::Retryable(Cause::ConnectFailure)),
            (503, Some("upstream_reset_before_response_started{connection_termination}"), Outcome::Retryable(Cause::Reset)),
            (504, Some("response_timeout"), Outcome::Retryable(Cause::Timeout)),
            (503, Some("via_upstream"), Outcome::Retryable(Cause::Status(503))),
        ];
        for (s, d, want) in cases {
            assert_eq!(classify(*s, *d), *want, "{s} {d:?}");
        }
    }

    #[test]
    fn failed_calls_are_timeouts_only_when_they_used_the_timeout() {
        assert_eq!(
            classify_call(None, 1000, 1000),
            Outcome::Retryable(Cause::Timeout)
        );
        assert_eq!(
            classify_call(None, 3, 1000),
            Outcome::Retryable(Cause::ConnectFailure)
        );
        assert_eq!(classify_call(Some(200), 3, 1000), Outcome::Success);
    }

    #[test]
    fn exhausted_lists_every_attempt_and_uses_503_when_all_were_skipped() {
        let e = exhausted(
            "m",
            &[
                ("a".into(), Cause::Status(500)),
                ("b".into(), Cause::Timeout),
            ],
            &[("c".into(), 1500)],
        );
        assert_eq!(e.status, 502);
        assert_eq!(e.message, "Every provider of `m` failed (a: HTTP 500; b: timed out; c: circuit open (retry in 2s)).");
        let e = exhausted("m", &[], &[("a".into(), 4100), ("b".into(), 900)]);
        assert_eq!((e.status, e.retry_after_s), (503, Some(1)));
        assert!(
            e.message.contains("a: circuit open (retry in 5s)"),
            "{}",
            e.message
        );
    }
}
