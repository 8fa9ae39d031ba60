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
pub const CACHE: &str = "x-portcullis-cache";
pub const EXPERIMENT: &str = "x-portcullis-experiment";

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
    let b: [u8; 4] = bytes.get(at..at.checked_add(4)?)?.try_into().ok()?;
    Some(u32::from_le_bytes(b) as usize)
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
}
