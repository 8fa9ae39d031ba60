//! Calls into Envoy that need no stream, for every part of the native
//! build (the filter's host, the main thread's, the metrics): the log, and
//! gRPC as HTTP/2 callouts (the ABI has no gRPC call). Kept apart from
//! [`super::host`] so those parts do not import each other.

use super::ffi::{self, ModuleBuffer};
use crate::host::{Headers, LogLevel};

/// Log a line through Envoy's `dynamic_modules` logger.
pub fn log(level: LogLevel, message: &str) {
    let level = level as i32;
    // SAFETY: plain values; the message lives for the call.
    unsafe {
        if ffi::envoy_dynamic_module_callback_log_enabled(level) {
            ffi::envoy_dynamic_module_callback_log(level, ModuleBuffer::of(message.as_bytes()));
        }
    }
}

/// A unary gRPC call as an HTTP/2 request: its headers (`:path` is
/// `/<service>/<method>`, then the call's metadata) and its framed body.
/// Both native hosts send gRPC this way (the ABI has no gRPC call).
pub fn grpc_request(
    cluster: &str,
    service: &str,
    method: &str,
    metadata: &[(&str, &[u8])],
    message: &[u8],
) -> Option<(Headers, Vec<u8>)> {
    let path = format!("/{service}/{method}");
    let fixed: [(&str, &[u8]); 5] = [
        (":method", b"POST"),
        (":path", path.as_bytes()),
        (":authority", cluster.as_bytes()),
        ("content-type", b"application/grpc"),
        ("te", b"trailers"),
    ];
    let headers = fixed
        .iter()
        .chain(metadata.iter())
        .map(|(k, v)| (k.to_string(), v.to_vec()))
        .collect();
    Some((headers, grpc_frame(message)?))
}

/// A unary gRPC message framed for the wire: uncompressed, length-prefixed.
pub fn grpc_frame(message: &[u8]) -> Option<Vec<u8>> {
    let len = u32::try_from(message.len()).ok()?;
    let mut out = Vec::with_capacity(message.len().saturating_add(5));
    out.push(0);
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(message);
    Some(out)
}

/// The gRPC status of a unary answer delivered as a callout's answer:
/// `grpc-status` when the headers carry it (a trailers-only answer),
/// else OK for an HTTP 200 carrying one whole message (the callout's answer
/// has no trailers), else UNAVAILABLE (14).
pub fn grpc_status(headers: &Headers, body: &[u8]) -> u32 {
    let find = |name: &str| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .and_then(|(_, v)| std::str::from_utf8(v).ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
    };
    if let Some(s) = find("grpc-status") {
        return s;
    }
    match (find(":status"), grpc_message(body)) {
        (Some(200), Some(_)) => 0,
        _ => 14,
    }
}

/// The message of a unary gRPC answer (one uncompressed frame).
pub fn grpc_message(body: &[u8]) -> Option<&[u8]> {
    let (&flag, rest) = body.split_first()?;
    if flag != 0 {
        return None;
    }
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?);
    rest.get(4..)?.get(..usize::try_from(len).ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_framing_round_trips() {
        let f = grpc_frame(b"hello").unwrap();
        assert_eq!(f, b"\0\0\0\0\x05hello");
        assert_eq!(grpc_message(&f), Some(&b"hello"[..]));
        // Cut short, compressed, or empty: no message.
        assert_eq!(grpc_message(&f[..7]), None);
        assert_eq!(grpc_message(b"\x01\0\0\0\x01a"), None);
        assert_eq!(grpc_message(b""), None);
    }

    #[test]
    fn grpc_status_from_headers_or_the_answer() {
        let h = |pairs: &[(&str, &str)]| -> Headers {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                .collect()
        };
        let ok = grpc_frame(b"x").unwrap();
        assert_eq!(grpc_status(&h(&[(":status", "200")]), &ok), 0);
        assert_eq!(
            grpc_status(&h(&[(":status", "200"), ("grpc-status", "16")]), b""),
            16
        );
        assert_eq!(grpc_status(&h(&[(":status", "503")]), b""), 14);
        assert_eq!(grpc_status(&h(&[(":status", "200")]), b"\0\0"), 14);
        assert_eq!(grpc_status(&Headers::default(), b""), 14);
    }
}
