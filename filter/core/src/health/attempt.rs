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
    /// A 4xx the provider explained (its body read): which class.
    Refused(u16, Class),
}

/// The error classes (llmgate's taxonomy): what `routing.fallback_on`
/// lists, the record and the metrics say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    RateLimited,
    Overloaded,
    Transient,
    Timeout,
    Connect,
    Auth,
    ContextLength,
    ContentPolicy,
    Client,
}

impl Class {
    pub const ALL: [Class; 9] = [
        Class::RateLimited,
        Class::Overloaded,
        Class::Transient,
        Class::Timeout,
        Class::Connect,
        Class::Auth,
        Class::ContextLength,
        Class::ContentPolicy,
        Class::Client,
    ];
    /// What falls over to the next candidate unless `fallback_on` says.
    pub const DEFAULT_FALLBACK: [Class; 5] = [
        Class::RateLimited,
        Class::Overloaded,
        Class::Transient,
        Class::Timeout,
        Class::Connect,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Class::RateLimited => "rate_limited",
            Class::Overloaded => "overloaded",
            Class::Transient => "transient",
            Class::Timeout => "timeout",
            Class::Connect => "connect",
            Class::Auth => "auth",
            Class::ContextLength => "context_length",
            Class::ContentPolicy => "content_policy",
            Class::Client => "client",
        }
    }

    pub fn parse(s: &str) -> Option<Class> {
        Class::ALL.into_iter().find(|c| c.name() == s)
    }
}

/// The class of a 4xx answer from its status and body (the provider's
/// error `code`, `type` and message).
pub fn class_of_refusal(status: u16, body: &[u8]) -> Class {
    if status == 401 || status == 403 {
        return Class::Auth;
    }
    if status == 429 {
        return Class::RateLimited;
    }
    let text = String::from_utf8_lossy(body.get(..4096).unwrap_or(body)).to_ascii_lowercase();
    let any = |words: &[&str]| words.iter().any(|w| text.contains(w));
    if any(&[
        "context_length_exceeded",
        "maximum context length",
        "context length",
        "prompt is too long",
        "too many tokens",
    ]) {
        Class::ContextLength
    } else if any(&[
        "content_policy",
        "content_filter",
        "content management policy",
        "safety",
    ]) {
        Class::ContentPolicy
    } else {
        Class::Client
    }
}

impl Cause {
    /// Metric suffix.
    pub fn metric(self) -> &'static str {
        match self {
            Cause::Status(429) => "failure_429",
            Cause::Status(_) => "failure_5xx",
            Cause::Refused(..) => "failure_4xx",
            Cause::ConnectFailure => "failure_connect",
            Cause::Reset => "failure_reset",
            Cause::Timeout => "failure_timeout",
        }
    }

    /// The cause in the request record: its error class.
    pub fn class(self) -> &'static str {
        self.error_class().name()
    }

    pub fn error_class(self) -> Class {
        match self {
            Cause::Status(429) => Class::RateLimited,
            Cause::Status(503 | 529) => Class::Overloaded,
            Cause::Status(504) | Cause::Timeout => Class::Timeout,
            Cause::Status(_) => Class::Transient,
            Cause::ConnectFailure | Cause::Reset => Class::Connect,
            Cause::Refused(_, c) => c,
        }
    }

    pub fn status(self) -> u32 {
        match self {
            Cause::Status(s) | Cause::Refused(s, _) => u32::from(s),
            _ => 0,
        }
    }

    pub fn describe(self) -> String {
        match self {
            Cause::Status(s) => format!("HTTP {s}"),
            Cause::Refused(s, c) => format!("HTTP {s} ({})", c.name()),
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

/// Why a candidate was passed over without an attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// Its circuit breaker is open.
    Open,
    /// Paused for its Retry-After, or at its adaptive concurrency limit.
    Busy,
}

impl Skip {
    pub fn describe(self) -> &'static str {
        match self {
            Skip::Open => "circuit open",
            Skip::Busy => "paused or at its concurrency limit",
        }
    }

    /// The cause in the request record.
    pub fn class(self) -> &'static str {
        match self {
            Skip::Open => "circuit_open",
            Skip::Busy => "busy",
        }
    }
}

/// The error when no candidate answered. `attempts`: each provider tried and
/// why it failed; `skipped`: providers passed over, why, and milliseconds
/// until each may take a request again.
pub fn exhausted(
    model: &str,
    attempts: &[(String, Cause)],
    skipped: &[(String, u64, Skip)],
) -> GatewayError {
    let mut parts: Vec<String> = attempts
        .iter()
        .map(|(p, c)| format!("{p}: {}", c.describe()))
        .collect();
    parts.extend(skipped.iter().map(|(p, ms, why)| {
        format!(
            "{p}: {} (retry in {}s)",
            why.describe(),
            ms.div_ceil(1000).max(1)
        )
    }));
    let list = parts.join("; ");
    if attempts.is_empty() {
        let soonest = skipped.iter().map(|&(_, ms, _)| ms).min().unwrap_or(1000);
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
    fn error_classes_from_status_codes_and_bodies() {
        assert_eq!(Cause::Status(429).class(), "rate_limited");
        assert_eq!(Cause::Status(503).class(), "overloaded");
        assert_eq!(Cause::Status(529).class(), "overloaded");
        assert_eq!(Cause::Status(500).class(), "transient");
        assert_eq!(Cause::Status(504).class(), "timeout");
        assert_eq!(Cause::Reset.class(), "connect");
        let cases: &[(u16, &str, Class)] = &[
            (
                400,
                r#"{"error":{"code":"context_length_exceeded","message":"This model's maximum context length is 8192 tokens"}}"#,
                Class::ContextLength,
            ),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                Class::ContextLength,
            ),
            (
                400,
                r#"{"error":{"code":"content_policy_violation","message":"blocked"}}"#,
                Class::ContentPolicy,
            ),
            (401, "", Class::Auth),
            (403, "", Class::Auth),
            (
                400,
                r#"{"error":{"message":"bad temperature"}}"#,
                Class::Client,
            ),
            (404, "<html>", Class::Client),
        ];
        for (s, body, want) in cases {
            assert_eq!(class_of_refusal(*s, body.as_bytes()), *want, "{s} {body}");
        }
        assert_eq!(
            Cause::Refused(400, Class::ContextLength).describe(),
            "HTTP 400 (context_length)"
        );
        for c in Class::ALL {
            assert_eq!(Class::parse(c.name()), Some(c));
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
            &[("c".into(), 1500, Skip::Open)],
        );
        assert_eq!(e.status, 502);
        assert_eq!(e.message, "Every provider of `m` failed (a: HTTP 500; b: timed out; c: circuit open (retry in 2s)).");
        let e = exhausted(
            "m",
            &[],
            &[
                ("a".into(), 4100, Skip::Open),
                ("b".into(), 900, Skip::Busy),
            ],
        );
        assert_eq!((e.status, e.retry_after_s), (503, Some(1)));
        assert!(
            e.message.contains("a: circuit open (retry in 5s)"),
            "{}",
            e.message
        );
        assert!(
            e.message
                .contains("b: paused or at its concurrency limit (retry in 1s)"),
            "{}",
            e.message
        );
    }
}
