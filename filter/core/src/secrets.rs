//! The provider credentials the gateway injects never go back to the
//! client: a provider that echoes its key (an error body quoting it, a
//! debug header) has it replaced by `[REDACTED]` before the answer leaves.

/// What a secret is replaced with.
pub const REDACTED: &[u8] = b"[REDACTED]";

/// Shorter values are not scrubbed: a short "key" would match ordinary
/// text and corrupt answers (real provider keys are far longer).
pub const MIN_SECRET_LEN: usize = 8;

/// `bytes` with every occurrence of `secret` replaced, or `None` when it
/// has none (or the secret is too short to scrub).
pub fn scrub(bytes: &[u8], secret: &str) -> Option<Vec<u8>> {
    let s = secret.as_bytes();
    if s.len() < MIN_SECRET_LEN || bytes.len() < s.len() {
        return None;
    }
    let first = find(bytes, s)?;
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    let mut at = Some(first);
    while let Some(i) = at {
        out.extend_from_slice(rest.get(..i).unwrap_or_default());
        out.extend_from_slice(REDACTED);
        rest = rest.get(i.saturating_add(s.len())..).unwrap_or_default();
        at = find(rest, s);
    }
    out.extend_from_slice(rest);
    Some(out)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn every_occurrence_is_replaced_and_short_values_are_left_alone() {
        let key = "sk-provider-123";
        assert_eq!(
            scrub(b"invalid key sk-provider-123 (sk-provider-123)", key).unwrap(),
            b"invalid key [REDACTED] ([REDACTED])"
        );
        assert_eq!(scrub(b"nothing here", key), None);
        assert_eq!(scrub(b"sk-provider-12", key), None);
        assert_eq!(scrub(b"abc abc", "abc"), None, "too short to scrub");
        assert_eq!(scrub(key.as_bytes(), key).unwrap(), REDACTED);
    }
}
