//! The fleet's tier of the prompt cache on the wire: the calls to the cache
//! service (`portcullis.cache.v1.Cache`, proto/cache.proto, served by
//! `portcullis-limiter` over Redis), written and read by hand as the
//! rate-limit protocol is ([`crate::wire::pb`]). A reply that does not read
//! whole, answers for another key, has expired or is larger than an entry
//! may be is a miss: the service is trusted to keep entries, never to
//! decide what a client is answered.

use super::{Found, Hash};
use crate::wire::pb::{self, Reader, Value};

pub const SERVICE: &str = "portcullis.cache.v1.Cache";
pub const GET: &str = "Get";
pub const PUT: &str = "Put";

/// A store call carries entries up to about this many bytes; a worker's
/// queue is sent in as many calls as it takes.
pub const PUT_BATCH_BYTES: usize = 1 << 20;

/// `GetRequest { key }`.
pub fn encode_get(key: &Hash) -> Vec<u8> {
    let mut out = Vec::with_capacity(34);
    pb::bytes(&mut out, 1, key);
    out
}

/// One `Entry` as it goes in a `PutRequest` (field 1, embedded): queued by
/// a request, sent at the tick.
pub fn encode_entry(key: &Hash, answer: &[u8], expires_ms: u64) -> Vec<u8> {
    let mut entry = Vec::with_capacity(answer.len().saturating_add(48));
    pb::bytes(&mut entry, 1, key);
    pb::bytes(&mut entry, 2, answer);
    pb::uint(&mut entry, 3, expires_ms);
    let mut out = Vec::with_capacity(entry.len().saturating_add(6));
    pb::message(&mut out, 1, &entry);
    out
}

/// Queued entries (each with its store method: [`PUT`], or the semantic
/// tier's `PutVectors`) as calls of about [`PUT_BATCH_BYTES`] each: the
/// method, the message, how many entries it holds.
pub fn put_batches(entries: Vec<(&'static str, Vec<u8>)>) -> Vec<(&'static str, Vec<u8>, u64)> {
    let mut out: Vec<(&'static str, Vec<u8>, u64)> = Vec::new();
    for (method, e) in entries {
        let open = out
            .iter_mut()
            .rev()
            .find(|(m, b, _)| *m == method && b.len().saturating_add(e.len()) <= PUT_BATCH_BYTES);
        match open {
            Some((_, b, n)) => {
                b.extend_from_slice(&e);
                *n = n.saturating_add(1);
            }
            None => out.push((method, e, 1)),
        }
    }
    out
}

/// A `GetResponse` read for `key`: the entry when it was found, is this
/// key's, has not expired at `now_ms` and is at most `max_len` bytes.
pub fn decode_get(bytes: &[u8], key: &Hash, now_ms: u64, max_len: usize) -> Option<Found> {
    let mut r = Reader::new(bytes);
    let (mut found, mut answered_key, mut answer, mut expires_ms) = (false, None, None, 0);
    while let Some((n, v)) = r.field().ok()? {
        match (n, v) {
            (1, Value::Varint(f)) => found = f != 0,
            (2, Value::Bytes(k)) => answered_key = Some(k),
            (3, Value::Bytes(a)) => answer = Some(a),
            (4, Value::Varint(e)) => expires_ms = e,
            // A known field in another wire type: not this protocol.
            (1..=4, _) => return None,
            _ => {}
        }
    }
    let answer = answer.filter(|a| !a.is_empty() && a.len() <= max_len)?;
    (found && answered_key == Some(key.as_slice()) && expires_ms > now_ms).then(|| Found {
        answer: answer.to_vec(),
        expires_ms,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn answer(found: bool, key: &[u8], body: &[u8], expires: u64) -> Vec<u8> {
        let mut m = Vec::new();
        pb::uint(&mut m, 1, u64::from(found));
        pb::bytes(&mut m, 2, key);
        pb::bytes(&mut m, 3, body);
        pb::uint(&mut m, 4, expires);
        m
    }

    #[test]
    fn an_answer_is_served_only_whole_for_its_own_key_and_unexpired() {
        let (k, other) = ([7u8; 32], [8u8; 32]);
        let ok = answer(true, &k, b"{\"id\":1}", 2_000);
        assert_eq!(
            decode_get(&ok, &k, 1_000, 100),
            Some(Found {
                answer: b"{\"id\":1}".to_vec(),
                expires_ms: 2_000
            })
        );
        // Another key's entry, expired, not found, too large, empty.
        assert_eq!(decode_get(&ok, &other, 1_000, 100), None);
        assert_eq!(decode_get(&ok, &k, 2_000, 100), None);
        assert_eq!(
            decode_get(&answer(false, &k, b"x", 2_000), &k, 1_000, 100),
            None
        );
        assert_eq!(decode_get(&ok, &k, 1_000, 4), None);
        assert_eq!(
            decode_get(&answer(true, &k, b"", 2_000), &k, 1_000, 100),
            None
        );
        // Every truncation of a good answer is a miss or the whole answer
        // (a cut at a field's end drops later fields: key or expiry gone).
        for cut in 0..ok.len() {
            assert_eq!(decode_get(&ok[..cut], &k, 1_000, 100), None, "cut at {cut}");
        }
        // Wrong wire types for known fields.
        let mut bad = Vec::new();
        pb::bytes(&mut bad, 1, b"yes");
        bad.extend_from_slice(&ok);
        assert_eq!(decode_get(&bad, &k, 1_000, 100), None);
    }

    #[test]
    fn entries_are_batched_under_the_bound_and_read_back() {
        let k = [1u8; 32];
        let big = vec![b'a'; PUT_BATCH_BYTES / 3];
        let mut entries: Vec<(&'static str, Vec<u8>)> =
            (0..7).map(|_| (PUT, encode_entry(&k, &big, 5))).collect();
        entries.insert(3, ("PutVectors", b"other".to_vec()));
        let batches = put_batches(entries);
        assert_eq!(
            batches.len(),
            5,
            "two entries per call, the last alone, and the other method's"
        );
        assert_eq!(
            batches
                .iter()
                .filter(|(m, _, _)| *m == PUT)
                .map(|(_, _, n)| n)
                .sum::<u64>(),
            7
        );
        for (method, b, count) in &batches {
            if *method != PUT {
                assert_eq!((b.as_slice(), *count), (b"other".as_slice(), 1));
                continue;
            }
            let mut r = Reader::new(b);
            let mut n = 0;
            while let Some((f, Value::Bytes(e))) = r.field().unwrap() {
                assert_eq!(f, 1);
                let mut er = Reader::new(e);
                assert_eq!(er.field().unwrap(), Some((1, Value::Bytes(&k[..]))));
                assert_eq!(er.field().unwrap(), Some((2, Value::Bytes(&big[..]))));
                assert_eq!(er.field().unwrap(), Some((3, Value::Varint(5))));
                n += 1;
            }
            assert!(n >= 1 && b.len() <= PUT_BATCH_BYTES);
            assert_eq!(n, *count);
        }
        assert_eq!(encode_get(&k).len(), 34);
    }
}
