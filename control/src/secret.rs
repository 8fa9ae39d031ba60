//! Client keys and admin tokens: random (from the kernel), shown once,
//! kept only as their SHA-256.

use sha2::{Digest, Sha256};
use std::io::Read;

const ALPHABET: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// `prefix` and 43 base-62 characters (256 bits of the kernel's randomness).
pub fn new_secret(prefix: &str) -> std::io::Result<String> {
    let mut bytes = [0u8; 43];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    let mut out = String::with_capacity(prefix.len() + bytes.len());
    out.push_str(prefix);
    for b in bytes {
        // 248 = 4 * 62: reject the top values so each character is uniform.
        let mut v = b;
        let mut extra = [0u8; 1];
        while v >= 248 {
            std::fs::File::open("/dev/urandom")?.read_exact(&mut extra)?;
            v = extra[0];
        }
        out.push(char::from(
            ALPHABET.get(usize::from(v % 62)).copied().unwrap_or(b'0'),
        ));
    }
    Ok(out)
}

/// The SHA-256 of a secret, lowercase hex (what the plugin config's
/// `key_sha256` holds).
pub fn sha256_hex(secret: &str) -> String {
    Sha256::digest(secret.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_distinct_and_hash_as_sha256sum_does() {
        let a = new_secret("sk-pc-").unwrap();
        let b = new_secret("sk-pc-").unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 6 + 43);
        assert!(a[6..].bytes().all(|c| c.is_ascii_alphanumeric()));
        // printf %s sk-portcullis-demo | sha256sum
        assert_eq!(
            sha256_hex("sk-portcullis-demo"),
            "1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8"
        );
    }
}
