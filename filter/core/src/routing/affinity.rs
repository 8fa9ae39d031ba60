//! Which provider made which response (the Responses API is stateful: a
//! response lives at the provider that made it). A bounded table in shared
//! data: a response id hashes to one of [`SLOTS`] slots, each holding one
//! (id, owner, provider, expiry); a newer response in the same slot
//! replaces the older one, so the table never grows past its slots, and an
//! entry lives [`TTL_MS`] at most. Reading checks the id, so a replaced or
//! expired entry is simply not known. The owner is the client (its key's
//! name) that made the response: only it reads, lists, deletes or chains
//! to it (#61).

use fnv::FnvHasher;
use std::hash::Hasher;

/// Slots of the table (each a few dozen bytes).
pub const SLOTS: u32 = 4096;
/// How long the gateway remembers a response's provider.
pub const TTL_MS: u64 = 24 * 3600 * 1000;

/// The slot a response id lives in.
pub fn slot(id: &str) -> u32 {
    let mut h = FnvHasher::default();
    h.write(id.as_bytes());
    (h.finish() % u64::from(SLOTS)) as u32
}

/// An entry: expiry (8 bytes LE), id length (2 bytes LE), id, owner
/// length (2 bytes LE), owner, provider.
pub fn encode(id: &str, owner: &str, provider: &str, now_ms: u64) -> Option<Vec<u8>> {
    let len = u16::try_from(id.len()).ok()?;
    let owner_len = u16::try_from(owner.len()).ok()?;
    let mut out = Vec::with_capacity(
        12usize
            .saturating_add(id.len())
            .saturating_add(owner.len())
            .saturating_add(provider.len()),
    );
    out.extend_from_slice(&now_ms.saturating_add(TTL_MS).to_le_bytes());
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(id.as_bytes());
    out.extend_from_slice(&owner_len.to_le_bytes());
    out.extend_from_slice(owner.as_bytes());
    out.extend_from_slice(provider.as_bytes());
    Some(out)
}

fn u16_at(entry: &[u8], at: usize) -> Option<usize> {
    let bytes = entry.get(at..at.checked_add(2)?)?;
    Some(usize::from(u16::from_le_bytes([
        *bytes.first()?,
        *bytes.get(1)?,
    ])))
}

/// The provider of `id` in this entry, if it is that id's, alive and
/// `owner`'s: a response another client made is not known to this one.
pub fn provider_of(entry: &[u8], id: &str, owner: &str, now_ms: u64) -> Option<String> {
    let expires = crate::wire::le::u64_at(entry, 0)?;
    let len = u16_at(entry, 8)?;
    let id_end = 10usize.checked_add(len)?;
    let stored = entry.get(10..id_end)?;
    if stored != id.as_bytes() || now_ms >= expires {
        return None;
    }
    let owner_len = u16_at(entry, id_end)?;
    let owner_start = id_end.checked_add(2)?;
    let owner_end = owner_start.checked_add(owner_len)?;
    if entry.get(owner_start..owner_end)? != owner.as_bytes() {
        return None;
    }
    let provider = entry.get(owner_end..)?;
    String::from_utf8(provider.to_vec())
        .ok()
        .filter(|p| !p.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn an_entry_names_its_provider_for_its_id_and_owner_until_it_expires() {
        let e = encode("resp_1", "alice", "primary", 1_000).unwrap();
        assert_eq!(
            provider_of(&e, "resp_1", "alice", 2_000).as_deref(),
            Some("primary")
        );
        assert_eq!(
            provider_of(&e, "resp_2", "alice", 2_000),
            None,
            "another id in the same slot"
        );
        assert_eq!(
            provider_of(&e, "resp_1", "bob", 2_000),
            None,
            "another client's response"
        );
        assert_eq!(
            provider_of(&e, "resp_1", "alic", 2_000),
            None,
            "an owner's prefix"
        );
        assert_eq!(
            provider_of(&e, "resp_1", "alice", 1_000 + TTL_MS),
            None,
            "expired"
        );
        for cut in 0..e.len().saturating_sub("primary".len()) {
            assert_eq!(provider_of(&e[..cut], "resp_1", "alice", 2_000), None);
        }
        assert!(slot("resp_1") < SLOTS);
        assert_eq!(slot("resp_1"), slot("resp_1"));
    }
}
