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

/// Where `needle` first occurs: a scan for its first byte, compared whole
/// only there (every answer's headers are scanned: this keeps it cheap).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        let at = from.checked_add(
            hay.get(from..=last_start)?
                .iter()
                .position(|&b| b == first)?,
        )?;
        let after = at.checked_add(1)?;
        if hay.get(after..after.checked_add(rest.len())?) == Some(rest) {
            return Some(at);
        }
        from = after;
    }
    None
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
        // A near miss at every first byte, then the key at the very end.
        let hay = "ssk-sk-provider-12 xsk-provider-123";
        assert_eq!(
            scrub(hay.as_bytes(), key).unwrap(),
            b"ssk-sk-provider-12 x[REDACTED]"
        );
        assert_eq!(find(b"aab", b"ab"), Some(1));
        assert_eq!(find(b"ab", b"abc"), None);
    }
}
