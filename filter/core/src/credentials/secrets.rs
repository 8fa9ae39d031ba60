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
    if secret.len() < MIN_SECRET_LEN {
        return None;
    }
    replace(bytes, secret.as_bytes(), REDACTED)
}

/// `bytes` with every `s` replaced by `with` (`None`: none occurs).
fn replace(bytes: &[u8], s: &[u8], with: &[u8]) -> Option<Vec<u8>> {
    if s.is_empty() || bytes.len() < s.len() {
        return None;
    }
    let first = find(bytes, s)?;
    let mut out = Vec::with_capacity(bytes.len());
    let mut rest = bytes;
    let mut at = Some(first);
    while let Some(i) = at {
        out.extend_from_slice(rest.get(..i).unwrap_or_default());
        out.extend_from_slice(with);
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

/// A body's chunks scrubbed as they pass. Each chunk goes on at once but
/// for a tail that could start a key (a proper prefix of one), which waits
/// for the next chunk: a key split across chunks is still found whole, and
/// a chunk with no key in it and no such tail passes untouched (no copy).
#[derive(Debug, Default)]
pub struct Scrubber {
    held: Vec<u8>,
    same_length: bool,
}

/// What replaces a key of `len` bytes when the body's length must not
/// change (an answer framed by `Content-Length`): `[REDACTED***]` padded to
/// the key's length, or `*`s for a key shorter than the marker.
pub fn mask(len: usize) -> Vec<u8> {
    if len < REDACTED.len() {
        return vec![b'*'; len];
    }
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(
        REDACTED
            .get(..REDACTED.len().saturating_sub(1))
            .unwrap_or_default(),
    );
    out.resize(len.saturating_sub(1), b'*');
    out.push(b']');
    out
}

/// How many bytes at the end of `hay` are a proper prefix of one of
/// `secrets` (the most of any): what must wait for the next chunk.
fn partial_tail(hay: &[u8], secrets: &[&str]) -> usize {
    let mut most = 0usize;
    for s in secrets {
        let s = s.as_bytes();
        let Some(&first) = s.first() else {
            continue;
        };
        let longest = s.len().saturating_sub(1).min(hay.len());
        for k in (most.saturating_add(1)..=longest).rev() {
            let at = hay.len().saturating_sub(k);
            if hay.get(at) == Some(&first) && hay.get(at..) == s.get(..k) {
                most = k;
                break;
            }
        }
    }
    most
}

impl Scrubber {
    /// A scrubber that replaces each key by as many bytes ([`mask`]): the
    /// body keeps its length.
    pub fn same_length() -> Scrubber {
        Scrubber {
            held: Vec::new(),
            same_length: true,
        }
    }

    /// What to send for this chunk (`end`: the body's last), `None` when it
    /// is the chunk as it came: the bytes held from before and this
    /// chunk's, scrubbed, less a tail that may start a key.
    pub fn chunk(&mut self, bytes: &[u8], secrets: &[&str], end: bool) -> Option<Vec<u8>> {
        // Every answer's chunks come here: no allocation unless a key is
        // too short to scrub (then it is left out).
        let long: Vec<&str>;
        let secrets: &[&str] = if secrets.iter().all(|s| s.len() >= MIN_SECRET_LEN) {
            secrets
        } else {
            long = secrets
                .iter()
                .copied()
                .filter(|s| s.len() >= MIN_SECRET_LEN)
                .collect();
            &long
        };
        if self.held.is_empty() {
            let tail = if end { 0 } else { partial_tail(bytes, secrets) };
            let found = secrets.iter().any(|s| find(bytes, s.as_bytes()).is_some());
            if tail == 0 && !found {
                return None;
            }
        }
        let mut all = std::mem::take(&mut self.held);
        all.extend_from_slice(bytes);
        for s in secrets {
            let clean = if self.same_length {
                replace(&all, s.as_bytes(), &mask(s.len()))
            } else {
                replace(&all, s.as_bytes(), REDACTED)
            };
            if let Some(clean) = clean {
                all = clean;
            }
        }
        if !end {
            let tail = partial_tail(&all, secrets);
            self.held = all.split_off(all.len().saturating_sub(tail));
        }
        Some(all)
    }

    /// Whether bytes wait for the next chunk.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }
}

/// Where `needle` first occurs: a scan for its first byte (`memchr`),
/// compared whole only there (every answer's headers and bodies are
/// scanned: this keeps it cheap).
fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    let (&first, rest) = needle.split_first()?;
    let last_start = hay.len().checked_sub(needle.len())?;
    let mut from = 0;
    while from <= last_start {
        let at = from.checked_add(memchr::memchr(first, hay.get(from..=last_start)?)?)?;
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
    /// whole, nothing else changes, the lines before a chunk's last break
    /// leave with that chunk, and the same-length scrubber keeps the length.
    #[test]
    fn a_stream_is_scrubbed_however_its_chunks_split_a_key() {
        let keys = ["sk-server-token-1", "Bearer-other-99"];
        let stream = "event: message\ndata: {\"token\":\"sk-server-token-1\"}\n\nx Bearer-other-99 y sk-server-token-1";
        let want = "event: message\ndata: {\"token\":\"[REDACTED]\"}\n\nx [REDACTED] y [REDACTED]";
        let same = "event: message\ndata: {\"token\":\"[REDACTED*******]\"}\n\nx [REDACTED*****] y [REDACTED*******]";
        assert_eq!(same.len(), stream.len());
        let b = stream.as_bytes();
        for (make, want) in [
            (Scrubber::default as fn() -> Scrubber, want),
            (Scrubber::same_length, same),
        ] {
            for i in 0..=b.len() {
                for j in i..=b.len() {
                    let mut s = make();
                    let pass = |s: &mut Scrubber, c: &[u8], end| {
                        s.chunk(c, &keys, end).unwrap_or(c.to_vec())
                    };
                    let out = pass(&mut s, &b[..i], false);
                    let second = pass(&mut s, &b[i..j], false);
                    // Up to the chunk's last line break, nothing waits.
                    let through = [out.as_slice(), second.as_slice()].concat();
                    assert!(want.as_bytes().starts_with(&through), "{i} {j}");
                    if let Some(k) = b[..j].iter().rposition(|c| *c == b'\n') {
                        // The scrubbed stream through as many line breaks.
                        let n = stream[..=k].matches('\n').count();
                        let end = want.match_indices('\n').nth(n - 1).unwrap().0;
                        assert!(through.starts_with(&want.as_bytes()[..=end]), "{i} {j}");
                    }
                    let mut all = [out, second].concat();
                    all.extend(pass(&mut s, &b[j..], true));
                    assert_eq!(String::from_utf8(all).unwrap(), want, "split at {i}, {j}");
                    assert!(!s.holding());
                }
            }
        }
        // A chunk with no key and no tail that starts one passes untouched.
        let mut s = Scrubber::default();
        assert_eq!(s.chunk(b"data: nothing here\n", &keys, false), None);
        assert_eq!(
            s.chunk(b"ends with sk-ser", &keys, false),
            Some(b"ends with ".to_vec())
        );
        assert_eq!(s.chunk(b"ious", &keys, true), Some(b"sk-serious".to_vec()));
        // Without a key long enough to scrub, the bytes pass as they came.
        assert_eq!(Scrubber::default().chunk(b"abc", &["short"], false), None);
        assert_eq!(
            scrub_all(b"a sk-server-token-1 b Bearer-other-99", &keys).unwrap(),
            b"a [REDACTED] b [REDACTED]"
        );
        assert_eq!(scrub_all(b"clean", &keys), None);
        assert_eq!(mask(8), b"********");
        assert_eq!(mask(12), b"[REDACTED**]");
        assert_eq!(mask(10), b"[REDACTED]");
    }
}
