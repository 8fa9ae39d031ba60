//! Header names the gateway reads or writes: defined once.

/// Prefix of every gateway header; client-sent ones are dropped.
pub const PREFIX: &str = "x-portcullis-";
/// Route to the provider's Envoy cluster (`cluster_header` in the route).
pub const CLUSTER: &str = "x-portcullis-cluster";
pub const MODEL: &str = "x-portcullis-model";
pub const PROVIDER: &str = "x-portcullis-provider";

pub fn is_gateway_header(name: &str) -> bool {
    name.len() >= PREFIX.len()
        && name
            .get(..PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
}
pub const ATTEMPTS: &str = "x-portcullis-attempts";
/// Request header: a client allowed to (`allow_overrides`) pins the
/// provider for one request.
pub const PIN_PROVIDER: &str = "x-portcullis-pin-provider";
/// Request fields the answering provider could not honour, dropped
/// because its config says so (`drop_unsupported`).
pub const DROPPED: &str = "x-portcullis-dropped";
pub const CACHE: &str = "x-portcullis-cache";
/// A semantic hit (`hit-semantic`): how similar the stored prompt was
/// (cosine, 0 to 1), and the stored answer's age in seconds.
pub const CACHE_SIMILARITY: &str = "x-portcullis-cache-similarity";
pub const CACHE_AGE: &str = "x-portcullis-cache-age";
pub const EXPERIMENT: &str = "x-portcullis-experiment";
/// The model a client asked for, when a low budget sent the request to a
/// cheaper one (`on_budget_low`; `x-portcullis-model` names that one).
pub const BUDGET_ROUTED: &str = "x-portcullis-budget-routed";

/// Whether a client's request header goes on to the provider, on the first
/// attempt and on every fallback alike. It does unless it is:
/// - a pseudo-header or `host` (the upstream request sets its own),
/// - the client's credentials: `authorization`, `proxy-authorization`,
///   `cookie` (the provider gets its own key, never the client's),
/// - hop-by-hop (`connection`, `keep-alive`, `proxy-connection`, `te`,
///   `trailer`, `transfer-encoding`, `upgrade`) or `content-length` (the
///   body may be rewritten),
/// - `accept-encoding` (the gateway reads answers: providers answer plain),
/// - the gateway's own `x-portcullis-*` or Envoy's `x-envoy-*`.
///
/// So `user-agent`, `content-type`, `accept`, `openai-organization`,
/// `openai-project`, `x-request-id`, tracing headers (`traceparent`,
/// `tracestate`, `b3`, `x-b3-*`), the SDK's `x-stainless-*` and any other
/// application header pass.
pub fn forwarded_upstream(name: &str) -> bool {
    // Client credentials in every provider's header (the Anthropic SDK
    // sends its key as `x-api-key`, Azure's as `api-key`).
    const NOT_FOR_PROVIDERS: &[&str] = &[
        "proxy-authorization",
        "cookie",
        "accept-encoding",
        "x-api-key",
        "api-key",
        // Set from the provider's config for Anthropic providers.
        "anthropic-version",
    ];
    !(name.starts_with(':')
        || one_of(SET_PER_ATTEMPT, name)
        || one_of(NOT_FOR_PROVIDERS, name)
        || is_gateway_header(name)
        || name
            .get(..8)
            .is_some_and(|p| p.eq_ignore_ascii_case("x-envoy-")))
}

/// Client headers the filter removes before Envoy's router sends the first
/// attempt: those not [`forwarded_upstream`] that nothing else takes care of
/// (each attempt sets the pseudo-headers, `authorization` and, when the body
/// changes, `content-length`; Envoy's codec drops hop-by-hop headers).
pub fn removed_before_routing(name: &str) -> bool {
    !forwarded_upstream(name) && !name.starts_with(':') && !one_of(SET_PER_ATTEMPT, name)
}

/// Headers each attempt sets itself (`host`, `authorization`,
/// `content-length`) or that are hop-by-hop (Envoy's codec owns them).
const SET_PER_ATTEMPT: &[&str] = &[
    "host",
    "authorization",
    "content-length",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

fn one_of(list: &[&str], name: &str) -> bool {
    list.iter().any(|d| d.eq_ignore_ascii_case(name))
}

/// A header map as the proxy-wasm ABI passes it: the number of pairs (u32
/// LE), each pair's key and value length (u32 LE each), then each key and
/// value followed by a NUL.
pub fn encode_pairs<K: AsRef<[u8]>, V: AsRef<[u8]>>(pairs: &[(K, V)]) -> Vec<u8> {
    let size = 4 + pairs
        .iter()
        .map(|(k, v)| 10 + k.as_ref().len() + v.as_ref().len())
        .sum::<usize>();
    let mut out = Vec::with_capacity(size);
    out.extend_from_slice(&(pairs.len() as u32).to_le_bytes());
    for (k, v) in pairs {
        out.extend_from_slice(&(k.as_ref().len() as u32).to_le_bytes());
        out.extend_from_slice(&(v.as_ref().len() as u32).to_le_bytes());
    }
    for (k, v) in pairs {
        out.extend_from_slice(k.as_ref());
        out.push(0);
        out.extend_from_slice(v.as_ref());
        out.push(0);
    }
    out
}

fn u32_at(bytes: &[u8], at: usize) -> Option<usize> {
    crate::wire::le::u32_at(bytes, at).map(|n| n as usize)
}

/// The pairs of an encoded header map, borrowed, as bytes: header values are
/// not always UTF-8 (HTTP allows obs-text), and a value that is not must not
/// break anything. `None` when the encoding is malformed; empty input is an
/// empty map.
pub fn decode_pairs(bytes: &[u8]) -> Option<Vec<(&[u8], &[u8])>> {
    if bytes.is_empty() {
        return Some(Vec::new());
    }
    let n = u32_at(bytes, 0)?;
    // Each pair takes at least 10 bytes: refuse counts the input cannot hold.
    if n > bytes.len() / 10 {
        return None;
    }
    let mut data = n.checked_mul(8)?.checked_add(4)?;
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let lens = 4 + i * 8;
        let (kl, vl) = (u32_at(bytes, lens)?, u32_at(bytes, lens + 4)?);
        let key = bytes.get(data..data.checked_add(kl)?)?;
        data = data.checked_add(kl)?.checked_add(1)?;
        let value = bytes.get(data..data.checked_add(vl)?)?;
        data = data.checked_add(vl)?.checked_add(1)?;
        out.push((key, value));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn pairs_round_trip_including_bytes_that_are_not_utf8() {
        let pairs: Vec<(&[u8], &[u8])> = vec![
            (b":path", b"/v1/chat/completions"),
            (b"x-note", b"caf\xe9"),
            (b"empty", b""),
        ];
        let enc = encode_pairs(&pairs);
        assert_eq!(enc.len(), 4 + 3 * 8 + (5 + 20 + 6 + 4 + 5) + 6);
        assert_eq!(decode_pairs(&enc), Some(pairs));
        assert_eq!(decode_pairs(b""), Some(vec![]));
        assert_eq!(decode_pairs(&encode_pairs::<&str, &str>(&[])), Some(vec![]));
    }

    #[test]
    fn malformed_maps_are_refused_not_read_past_their_end() {
        let enc = encode_pairs(&[("a", "b"), ("key", "value")]);
        for cut in 1..enc.len() - 1 {
            assert_eq!(decode_pairs(&enc[..cut]), None, "cut at {cut}");
        }
        let mut huge = enc.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_pairs(&huge), None);
        let mut long = enc.clone();
        long[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode_pairs(&long), None);
    }

    #[test]
    fn the_same_client_headers_go_to_every_provider() {
        for kept in [
            "user-agent",
            "content-type",
            "accept",
            "openai-organization",
            "OpenAI-Project",
            "x-request-id",
            "traceparent",
            "tracestate",
            "x-b3-traceid",
            "x-stainless-lang",
            "x-app",
        ] {
            assert!(forwarded_upstream(kept), "{kept}");
        }
        for dropped in [
            ":path",
            ":authority",
            "host",
            "Authorization",
            "proxy-authorization",
            "cookie",
            "connection",
            "transfer-encoding",
            "te",
            "upgrade",
            "content-length",
            "accept-encoding",
            "x-portcullis-cluster",
            "X-Envoy-Upstream-Rq-Timeout-Ms",
            "x-envoy-retry-on",
        ] {
            assert!(!forwarded_upstream(dropped), "{dropped}");
        }
    }

    #[test]
    fn before_routing_only_what_nothing_else_replaces_is_removed() {
        for removed in [
            "cookie",
            "proxy-authorization",
            "accept-encoding",
            "x-portcullis-model",
            "x-envoy-retry-on",
        ] {
            assert!(removed_before_routing(removed), "{removed}");
        }
        for kept in [
            ":path",
            "host",
            "authorization",
            "content-length",
            "te",
            "user-agent",
            "x-request-id",
        ] {
            assert!(!removed_before_routing(kept), "{kept}");
        }
    }
}
