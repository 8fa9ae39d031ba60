//! The credentials the gateway injects never go back to the client: a
//! provider or an MCP server that echoes its key (an error body quoting
//! it, a debug header, a streamed event) has it replaced by `[REDACTED]`
//! before the answer leaves. [`Scrubber`] does it for a body that arrives
//! in chunks, wherever the chunks split a key.

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

/// `bytes` with every one of `secrets` scrubbed (`None`: none occurs).
pub fn scrub_all(bytes: &[u8], secrets: &[&str]) -> Option<Vec<u8>> {
    let mut out: Option<Vec<u8>> = None;
    for secret in secrets {
        let now = out.as_deref().unwrap_or(bytes);
        if let Some(clean) = scrub(now, secret) {
            out = Some(clean);
        }
    }
    out
}

/// A body's chunks scrubbed as they pass. Each chunk goes on at once up to
/// its last line break (a key holds none, so none spans one) and at least
/// up to the last `longest key - 1` bytes; only those few bytes wait for
/// the next chunk, so an SSE event is never held back and a key split
/// across chunks is still found whole.
#[derive(Debug, Default)]
pub struct Scrubber {
    held: Vec<u8>,
}

impl Scrubber {
    /// What to send for this chunk (`end`: the body's last): the bytes
    /// held from before and this chunk's, scrubbed, less the tail that may
    /// start a key.
    pub fn chunk(&mut self, bytes: &[u8], secrets: &[&str], end: bool) -> Vec<u8> {
        let longest = secrets
            .iter()
            .map(|s| s.len())
            .filter(|l| *l >= MIN_SECRET_LEN)
            .max();
        let mut all = std::mem::take(&mut self.held);
        all.extend_from_slice(bytes);
        let Some(longest) = longest else {
            return all;
        };
        if let Some(clean) = scrub_all(&all, secrets) {
            all = clean;
        }
        if end {
            return all;
        }
        let after_line = memchr::memrchr(b'\n', &all).map_or(0, |i| i.saturating_add(1));
        let cut = after_line.max(all.len().saturating_sub(longest.saturating_sub(1)));
        self.held = all.split_off(cut.min(all.len()));
        all
    }

    /// Whether bytes wait for the next chunk.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }
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

    /// Every split of a stream into two or three chunks: the key is found
    /// whole, nothing else changes, and the lines before a chunk's last
    /// break leave with that chunk.
    #[test]
    fn a_stream_is_scrubbed_however_its_chunks_split_a_key() {
        let keys = ["sk-server-token-1", "Bearer-other-99"];
        let stream = "event: message\ndata: {\"token\":\"sk-server-token-1\"}\n\nx Bearer-other-99 y sk-server-token-1";
        let want = "event: message\ndata: {\"token\":\"[REDACTED]\"}\n\nx [REDACTED] y [REDACTED]";
        let b = stream.as_bytes();
        for i in 0..=b.len() {
            for j in i..=b.len() {
                let mut s = Scrubber::default();
                let mut out = s.chunk(&b[..i], &keys, false);
                let second = s.chunk(&b[i..j], &keys, false);
                // Up to the chunk's last line break, nothing waits.
                if let Some(k) = b[..j].iter().rposition(|c| *c == b'\n') {
                    let lines = &b[..=k];
                    let lines = scrub_all(lines, &keys).unwrap_or(lines.to_vec());
                    let through = [out.as_slice(), second.as_slice()].concat();
                    assert!(through.starts_with(&lines), "{i} {j}");
                }
                out.extend(second);
                out.extend(s.chunk(&b[j..], &keys, true));
                assert_eq!(String::from_utf8(out).unwrap(), want, "split at {i}, {j}");
                assert!(!s.holding());
            }
        }
        // Without a key long enough to scrub, the bytes pass as they came.
        let mut s = Scrubber::default();
        assert_eq!(s.chunk(b"abc", &["short"], false), b"abc");
        assert_eq!(
            scrub_all(b"a sk-server-token-1 b Bearer-other-99", &keys).unwrap(),
            b"a [REDACTED] b [REDACTED]"
        );
        assert_eq!(scrub_all(b"clean", &keys), None);
    }
}
