//! The gateway's seal (#61): a keyed MAC over what a caller may hand back
//! later (an MCP session, a file's or a batch's id), so the gateway knows
//! it made that value for that caller and nobody forged or moved it.
//!
//! The key comes from the gateway's own secret, never from a provider's
//! credential: `PORTCULLIS_SEAL_SECRET` in the VM's environment (listed in
//! `host_env_keys`; at least [`MIN_SECRET_BYTES`] bytes), the same on every
//! Envoy of a fleet so any replica opens what another sealed. Rotation
//! without dropping what callers hold: the new secret goes to
//! `PORTCULLIS_SEAL_SECRET`, the old one to
//! `PORTCULLIS_SEAL_SECRET_PREVIOUS`; the gateway seals with the new one
//! and opens with either until the old one is removed.
//!
//! The MAC is BLAKE3 in keyed mode (a PRF by design, one pass, no HMAC
//! construction needed) over length-prefixed parts (two bytes of length:
//! a session's parts fit one 64-byte block), so two different part
//! lists never hash the same bytes; the key is derived from the secret with
//! BLAKE3's `derive_key` and a context of its own.

use crate::wire::text::{hex, unhex};

/// The variable holding the secret.
pub const SECRET_ENV: &str = "PORTCULLIS_SEAL_SECRET";
/// The variable holding the secret being rotated out (opens, never seals).
pub const PREVIOUS_ENV: &str = "PORTCULLIS_SEAL_SECRET_PREVIOUS";
/// The shortest secret taken (a shorter one is refused with a warning).
pub const MIN_SECRET_BYTES: usize = 16;
/// Bytes of MAC kept (128 bits).
pub const MAC_BYTES: usize = 16;

const CONTEXT: &str = "portcullis 2026-12-07 gateway seal v1";

/// The keys a gateway seals with (the first) and opens with (any).
#[derive(Clone)]
pub struct Seal {
    keys: Vec<[u8; 32]>,
}

impl std::fmt::Debug for Seal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Seal({} keys)", self.keys.len())
    }
}

/// Why the environment gave no seal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Missing {
    Unset,
    TooShort(&'static str),
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Missing::Unset => write!(f, "{SECRET_ENV} is not set in the VM"),
            Missing::TooShort(name) => {
                write!(f, "{name} is shorter than {MIN_SECRET_BYTES} bytes")
            }
        }
    }
}

fn derive(secret: &str) -> [u8; 32] {
    blake3::derive_key(CONTEXT, secret.as_bytes())
}

impl Seal {
    /// The seal from the environment (`var` reads one variable): the
    /// current secret, and the previous one while it is rotated out. A
    /// previous secret too short is left out (the current one still seals).
    pub fn from_env(var: impl Fn(&str) -> Option<String>) -> Result<Seal, Missing> {
        let current = var(SECRET_ENV)
            .filter(|s| !s.is_empty())
            .ok_or(Missing::Unset)?;
        if current.len() < MIN_SECRET_BYTES {
            return Err(Missing::TooShort(SECRET_ENV));
        }
        let mut keys = vec![derive(&current)];
        if let Some(previous) = var(PREVIOUS_ENV).filter(|s| s.len() >= MIN_SECRET_BYTES) {
            keys.push(derive(&previous));
        }
        Ok(Seal { keys })
    }

    /// A seal over one secret (tests, benchmarks).
    pub fn with_secret(secret: &str) -> Seal {
        Seal {
            keys: vec![derive(secret)],
        }
    }

    fn mac_with(key: &[u8; 32], parts: &[&[u8]]) -> [u8; MAC_BYTES] {
        // The message laid out once and hashed in one call (BLAKE3's
        // one-shot keyed hash: a session's fits one block; no streaming
        // state per part), on the stack when it is small.
        let mut stack = [0u8; 192];
        let mut heap = Vec::new();
        let len: usize = parts
            .iter()
            .map(|p| p.len().saturating_add(10))
            .fold(0, usize::saturating_add);
        let buf: &mut [u8] = if len <= stack.len() {
            &mut stack
        } else {
            heap.resize(len, 0);
            &mut heap
        };
        let mut at = 0usize;
        let mut put = |bytes: &[u8]| {
            let end = at.saturating_add(bytes.len());
            if let Some(dst) = buf.get_mut(at..end) {
                dst.copy_from_slice(bytes);
            }
            at = end;
        };
        for part in parts {
            // Two bytes of length (the usual case fits one BLAKE3 block);
            // 0xFFFF then eight for a longer part: no two part lists hash
            // the same bytes.
            match u16::try_from(part.len()) {
                Ok(n) if n < u16::MAX => put(&n.to_le_bytes()),
                _ => {
                    put(&u16::MAX.to_le_bytes());
                    put(&(part.len() as u64).to_le_bytes());
                }
            }
            put(part);
        }
        let hash = blake3::keyed_hash(key, buf.get(..at).unwrap_or_default());
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(hash.as_bytes().get(..MAC_BYTES).unwrap_or(&[0; MAC_BYTES]));
        out
    }

    /// The MAC of `parts` with the current key.
    pub fn mac(&self, parts: &[&[u8]]) -> [u8; MAC_BYTES] {
        self.keys
            .first()
            .map(|k| Self::mac_with(k, parts))
            .unwrap_or_default()
    }

    /// Each key's MAC of `parts` (the current key's first): what a value
    /// sealed before a rotation may carry.
    pub fn macs(&self, parts: &[&[u8]]) -> Vec<[u8; MAC_BYTES]> {
        self.keys.iter().map(|k| Self::mac_with(k, parts)).collect()
    }

    /// Whether `mac` is the MAC of `parts` under any key (compared in
    /// constant time).
    pub fn verify(&self, parts: &[&[u8]], mac: &[u8]) -> bool {
        let mut ok = false;
        for key in &self.keys {
            ok |= constant_eq(&Self::mac_with(key, parts), mac);
        }
        ok
    }

    /// The MAC of `parts` as lower-case hex (ids carry it as text).
    pub fn mac_hex(&self, parts: &[&[u8]]) -> String {
        hex(&self.mac(parts))
    }

    /// Whether `mac_hex` is the hex MAC of `parts` under any key.
    pub fn verify_hex(&self, parts: &[&[u8]], mac_hex: &str) -> bool {
        unhex(mac_hex).is_some_and(|m| self.verify(parts, &m))
    }
}

fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn a_mac_verifies_under_its_key_and_no_other_nor_other_parts() {
        let s = Seal::with_secret("a secret of sixteen+");
        let m = s.mac(&[b"owner", b"id"]);
        assert!(s.verify(&[b"owner", b"id"], &m));
        assert!(!s.verify(&[b"owner", b"id2"], &m));
        // Length prefixes: the same bytes cut elsewhere are other parts.
        assert!(!s.verify(&[b"ownerid"], &m));
        assert!(!s.verify(&[b"owne", b"rid"], &m));
        // A part past 0xFFFE bytes is told apart by its long length.
        let long = vec![7u8; 70_000];
        assert!(s.verify(&[&long, b"x"], &s.mac(&[&long, b"x"])));
        assert!(!s.verify(&[&long[..69_999], b"x"], &s.mac(&[&long, b"x"])));
        assert!(!Seal::with_secret("another secret, 16+").verify(&[b"owner", b"id"], &m));
        let mut flipped = m;
        flipped[0] ^= 1;
        assert!(!s.verify(&[b"owner", b"id"], &flipped));
        assert!(!s.verify(&[b"owner", b"id"], &m[..15]));
        assert!(s.verify_hex(&[b"owner", b"id"], &s.mac_hex(&[b"owner", b"id"])));
        assert!(!s.verify_hex(&[b"owner", b"id"], "zz"));
    }

    /// The MAC is BLAKE3's keyed hash with the derived key, checked against
    /// the crate's own one-shot functions (not this module's code).
    #[test]
    fn the_mac_is_blake3_keyed_with_the_derived_key() {
        let s = Seal::with_secret("0123456789abcdef");
        let key = blake3::derive_key(CONTEXT, b"0123456789abcdef");
        let mut msg = Vec::new();
        for p in [&b"a"[..], b"bc"] {
            msg.extend_from_slice(&(p.len() as u16).to_le_bytes());
            msg.extend_from_slice(p);
        }
        let want = blake3::keyed_hash(&key, &msg);
        assert_eq!(s.mac(&[b"a", b"bc"]), want.as_bytes()[..MAC_BYTES]);
        // And on the heap, past the stack buffer.
        let big = vec![9u8; 300];
        let mut msg = (300u16).to_le_bytes().to_vec();
        msg.extend_from_slice(&big);
        assert_eq!(
            s.mac(&[&big]),
            blake3::keyed_hash(&key, &msg).as_bytes()[..MAC_BYTES]
        );
    }

    #[test]
    fn a_rotated_secret_still_opens_what_it_sealed_and_seals_no_more() {
        let old = Seal::from_env(env(&[(SECRET_ENV, "the old secret, long")])).unwrap();
        let sealed = old.mac(&[b"x"]);
        let rotated = Seal::from_env(env(&[
            (SECRET_ENV, "the new secret, long"),
            (PREVIOUS_ENV, "the old secret, long"),
        ]))
        .unwrap();
        assert!(rotated.verify(&[b"x"], &sealed));
        assert_ne!(rotated.mac(&[b"x"]), sealed, "seals with the new one");
        assert_eq!(rotated.macs(&[b"x"]).len(), 2);
        let done = Seal::from_env(env(&[(SECRET_ENV, "the new secret, long")])).unwrap();
        assert!(!done.verify(&[b"x"], &sealed));
        assert!(done.verify(&[b"x"], &rotated.mac(&[b"x"])));
    }

    #[test]
    fn no_secret_or_a_short_one_is_no_seal() {
        assert_eq!(Seal::from_env(env(&[])).unwrap_err(), Missing::Unset);
        assert_eq!(
            Seal::from_env(env(&[(SECRET_ENV, "")])).unwrap_err(),
            Missing::Unset
        );
        assert_eq!(
            Seal::from_env(env(&[(SECRET_ENV, "short")])).unwrap_err(),
            Missing::TooShort(SECRET_ENV)
        );
        let s = Seal::from_env(env(&[
            (SECRET_ENV, "long enough secret"),
            (PREVIOUS_ENV, "short"),
        ]))
        .unwrap();
        assert_eq!(s.macs(&[]).len(), 1, "a short previous secret is left out");
    }

    #[test]
    fn hex_round_trips() {
        let bytes: Vec<u8> = (0..=255).collect();
        assert_eq!(unhex(&hex(&bytes)).unwrap(), bytes);
        assert_eq!(hex(&[0x0f, 0xa0]), "0fa0");
        assert_eq!(unhex("0FA0"), Some(vec![0x0f, 0xa0]));
        for bad in ["0", "0g", "é0"] {
            assert_eq!(unhex(bad), None, "{bad}");
        }
    }
}
