//! Prompt cache: the key (SHA-256 over a canonical form of the request) and a
//! bounded set-associative table in the shared store.
//!
//! Layout in the store: per set, one small index value (`ways` entries of key
//! hash, expiry, store time, length); per slot, one value holding the key hash
//! and the stored completion. Keys are fixed (`sets * (ways + 1)`) and each
//! slot holds at most `max_entry_bytes`, so memory cannot grow past the
//! configured size whatever the traffic.

use crate::request::ChatRequest;
use crate::store::{Store, StoreError, MAX_CAS_TRIES};
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::Write as _;

/// Changes whenever the canonical form changes, so old entries stop matching.
const KEY_VERSION: &[u8] = b"portcullis-cache-v1";

/// Request fields that do not change the answer.
const IGNORED_FIELDS: &[&str] = &["model", "stream", "stream_options", "user"];

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheConfig {
    pub sets: u32,
    pub ways: u32,
    pub ttl_ms: u64,
    pub max_entry_bytes: usize,
    pub normalize: bool,
    pub per_client: bool,
}

impl CacheConfig {
    /// Sets and ways from a total size: `max_bytes / max_entry_bytes` slots.
    pub fn sized(max_bytes: usize, max_entry_bytes: usize, ways: u32) -> (u32, u32) {
        let slots = (max_bytes / max_entry_bytes.max(1)).max(1);
        let ways = ways.clamp(1, slots as u32);
        let sets = (slots / ways as usize).max(1) as u32;
        (sets, ways)
    }

    /// Most bytes the table can hold (slot payloads and indexes).
    pub fn capacity_bytes(&self) -> usize {
        let slots = self.sets as usize * self.ways as usize;
        slots * (self.max_entry_bytes + SLOT_HEADER)
            + self.sets as usize * self.ways as usize * WAY_LEN
    }
}

pub type Hash = [u8; 32];

/// What the cache did for a request (`x-portcullis-cache`, the record).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CacheStatus {
    /// No cache, or the client bypassed it (`no-store`).
    #[default]
    Off,
    Hit,
    Miss,
    /// `no-cache`: not served from the cache, but the answer is stored.
    Refresh,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Off => "off",
            CacheStatus::Hit => "hit",
            CacheStatus::Miss => "miss",
            CacheStatus::Refresh => "refresh",
        }
    }
}

/// Case-fold and collapse whitespace in message text.
fn normalize_text(s: &str) -> String {
    s.split_whitespace()
        .map(str::to_lowercase)
        .collect::<Vec<_>>()
        .join(" ")
}

fn normalize_messages(messages: &mut Value) {
    let Some(arr) = messages.as_array_mut() else {
        return;
    };
    for m in arr {
        match m.get_mut("content") {
            Some(Value::String(s)) => *s = normalize_text(s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(Value::String(t)) = p.get_mut("text") {
                        *t = normalize_text(t);
                    }
                }
            }
            _ => {}
        }
    }
}

/// The cache key of a request for a provider and its model id. Object keys
/// are sorted (serde_json's map is ordered), so field order never matters.
/// It takes a parsed `ChatRequest`, which only exists once its whole body
/// was read: a key is never built from a partial or empty document.
pub fn key(
    provider: &str,
    model_id: &str,
    request: &ChatRequest,
    normalize: bool,
    client: Option<&str>,
) -> Hash {
    let doc = request.document();
    let mut h = Sha256::new();
    h.update(KEY_VERSION);
    h.update([0]);
    h.update(provider.as_bytes());
    h.update([0]);
    h.update(model_id.as_bytes());
    h.update([0]);
    h.update(client.unwrap_or("").as_bytes());
    h.update([0]);
    // The canonical document is hashed as it is serialized: `{k:v,...}` in
    // key order, without the ignored fields, and without copying the tree.
    let mut w = HashWriter(&mut h);
    let _ = w.write(b"{");
    let mut first = true;
    for (k, v) in doc
        .iter()
        .filter(|(k, _)| !IGNORED_FIELDS.contains(&k.as_str()))
    {
        if !first {
            let _ = w.write(b",");
        }
        first = false;
        let _ = serde_json::to_writer(&mut w, k);
        let _ = w.write(b":");
        if normalize && k == "messages" {
            let mut m = v.clone();
            normalize_messages(&mut m);
            let _ = serde_json::to_writer(&mut w, &m);
        } else {
            let _ = serde_json::to_writer(&mut w, v);
        }
    }
    let _ = w.write(b"}");
    h.finalize().into()
}

struct HashWriter<'a>(&'a mut Sha256);

impl std::io::Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

pub fn set_of(hash: &Hash, sets: u32) -> u32 {
    let mut b = [0u8; 8];
    b.copy_from_slice(hash.get(..8).unwrap_or(&[0; 8]));
    (u64::from_le_bytes(b) % u64::from(sets.max(1))) as u32
}

const WAY_LEN: usize = 32 + 8 + 8 + 4;
const SLOT_HEADER: usize = 32;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Way {
    pub hash: Hash,
    pub expires_ms: u64,
    pub stored_ms: u64,
    pub len: u32,
}

impl Way {
    fn is_empty(&self) -> bool {
        self.len == 0 && self.expires_ms == 0
    }
}

pub fn encode_index(ways: &[Way]) -> Vec<u8> {
    let mut out = Vec::with_capacity(ways.len() * WAY_LEN);
    for w in ways {
        out.extend_from_slice(&w.hash);
        out.extend_from_slice(&w.expires_ms.to_le_bytes());
        out.extend_from_slice(&w.stored_ms.to_le_bytes());
        out.extend_from_slice(&w.len.to_le_bytes());
    }
    out
}

/// An index of `ways` entries; damaged or resized indexes read as empty.
pub fn decode_index(bytes: Option<&[u8]>, ways: u32) -> Vec<Way> {
    let n = ways as usize;
    let Some(b) = bytes.filter(|b| b.len() == n * WAY_LEN) else {
        return vec![Way::default(); n];
    };
    b.chunks_exact(WAY_LEN)
        .map(|c| {
            let mut w = Way::default();
            w.hash.copy_from_slice(c.get(..32).unwrap_or(&[0; 32]));
            let u64_at = |i: usize| {
                c.get(i..i + 8)
                    .and_then(|s| s.try_into().ok())
                    .map(u64::from_le_bytes)
                    .unwrap_or(0)
            };
            w.expires_ms = u64_at(32);
            w.stored_ms = u64_at(40);
            w.len = c
                .get(48..52)
                .and_then(|s| s.try_into().ok())
                .map(u32::from_le_bytes)
                .unwrap_or(0);
            w
        })
        .collect()
}

/// Where a new entry goes: its own way if present, else an empty one, else an
/// expired one, else the oldest. Returns (way, evicted a live entry).
pub fn choose_way(index: &[Way], hash: &Hash, now_ms: u64) -> (usize, bool) {
    if let Some(i) = index.iter().position(|w| &w.hash == hash && !w.is_empty()) {
        return (i, false);
    }
    if let Some(i) = index.iter().position(Way::is_empty) {
        return (i, false);
    }
    if let Some(i) = index.iter().position(|w| w.expires_ms <= now_ms) {
        return (i, false);
    }
    let oldest = index
        .iter()
        .enumerate()
        .min_by_key(|(_, w)| w.stored_ms)
        .map(|(i, _)| i)
        .unwrap_or(0);
    (oldest, true)
}

use crate::keys::{cache_index as index_key, cache_slot as slot_key};

/// The stored completion for `hash`, if present and fresh. Two reads: the
/// set's index, then the slot (whose own hash is checked, since a racing
/// writer may have reused it).
pub fn lookup<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    now_ms: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    let set = set_of(hash, cfg.sets);
    let (idx, _) = store.get(&index_key(set))?;
    let index = decode_index(idx.as_deref(), cfg.ways);
    let Some(way) = index
        .iter()
        .position(|w| &w.hash == hash && w.expires_ms > now_ms && !w.is_empty())
    else {
        return Ok(None);
    };
    let (slot, _) = store.get(&slot_key(set, way))?;
    Ok(slot.and_then(|s| {
        (s.get(..32) == Some(hash.as_slice())).then(|| s.get(32..).unwrap_or_default().to_vec())
    }))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stored {
    pub evicted: bool,
    /// Change in bytes held (new length minus the replaced entry's).
    pub bytes_delta: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOutcome {
    Stored(Stored),
    TooLarge,
}

/// Store a completion. The slot is written first, then the index by CAS: a
/// reader never sees an index entry whose slot holds another hash's data as
/// a hit, because the slot carries its hash.
pub fn insert<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    body: &[u8],
    now_ms: u64,
) -> Result<StoreOutcome, StoreError> {
    if body.len() > cfg.max_entry_bytes || body.is_empty() {
        return Ok(StoreOutcome::TooLarge);
    }
    let set = set_of(hash, cfg.sets);
    let ikey = index_key(set);
    let mut slot = Vec::with_capacity(SLOT_HEADER + body.len());
    slot.extend_from_slice(hash);
    slot.extend_from_slice(body);
    for _ in 0..MAX_CAS_TRIES {
        let (idx, cas) = store.get(&ikey)?;
        let mut index = decode_index(idx.as_deref(), cfg.ways);
        let (way, evicted) = choose_way(&index, hash, now_ms);
        let old_len = index.get(way).map(|w| i64::from(w.len)).unwrap_or(0);
        store.set(&slot_key(set, way), &slot, None)?;
        if let Some(w) = index.get_mut(way) {
            *w = Way {
                hash: *hash,
                expires_ms: now_ms.saturating_add(cfg.ttl_ms),
                stored_ms: now_ms,
                len: body.len() as u32,
            };
        }
        match store.set(&ikey, &encode_index(&index), cas) {
            Ok(()) => {
                return Ok(StoreOutcome::Stored(Stored {
                    evicted,
                    bytes_delta: body.len() as i64 - old_len,
                }))
            }
            Err(StoreError::CasMismatch) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(StoreError::Contended)
}

/// What `cache-control` asks of the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Directive {
    /// Read, and store on a miss.
    Normal,
    /// `no-cache`: do not answer from the cache, but store the fresh answer.
    Refresh,
    /// `no-store`: neither read nor write.
    Bypass,
}

pub fn directive(cache_control: Option<&str>) -> Directive {
    let Some(cc) = cache_control else {
        return Directive::Normal;
    };
    let has = |d: &str| cc.split(',').any(|p| p.trim().eq_ignore_ascii_case(d));
    if has("no-store") {
        Directive::Bypass
    } else if has("no-cache") {
        Directive::Refresh
    } else {
        Directive::Normal
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::MemStore;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// A parsed request (a `model` is added when the text has none: the
    /// key ignores it).
    fn doc(s: &str) -> ChatRequest {
        let body = if s.contains(r#""model""#) {
            s.to_string()
        } else {
            s.replacen('{', r#"{"model":"x","#, 1)
        };
        ChatRequest::parse(body.as_bytes()).unwrap()
    }

    const CFG: CacheConfig = CacheConfig {
        sets: 4,
        ways: 2,
        ttl_ms: 1_000,
        max_entry_bytes: 100,
        normalize: false,
        per_client: false,
    };

    #[test]
    fn key_is_the_hash_of_the_canonical_document() {
        let d = doc(
            r#"{"temperature":0.5,"model":"x","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        );
        let mut h = Sha256::new();
        h.update(b"portcullis-cache-v1\0p\0m\0\0");
        h.update(br#"{"messages":[{"content":"hi","role":"user"}],"temperature":0.5}"#);
        let want: Hash = h.finalize().into();
        assert_eq!(key("p", "m", &d, false, None), want);
    }

    #[test]
    fn key_ignores_field_order_and_non_answer_fields() {
        let a = doc(
            r#"{"model":"x","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stream":true,"user":"u1"}"#,
        );
        let b = doc(
            r#"{"temperature":0.5,"messages":[{"content":"hi","role":"user"}],"model":"y","stream_options":{"include_usage":true}}"#,
        );
        assert_eq!(
            key("p", "m", &a, false, None),
            key("p", "m", &b, false, None)
        );
    }

    #[test]
    fn key_changes_with_every_answer_field_provider_model_and_scope() {
        let base = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
        let k = key("p", "m", &doc(base), false, None);
        assert_ne!(k, key("q", "m", &doc(base), false, None));
        assert_ne!(k, key("p", "n", &doc(base), false, None));
        assert_ne!(k, key("p", "m", &doc(base), false, Some("client-a")));
        for extra in [
            r#""temperature":1"#,
            r#""top_p":0.9"#,
            r#""max_tokens":5"#,
            r#""seed":1"#,
            r#""stop":["x"]"#,
            r#""tools":[]"#,
            r#""tool_choice":"none""#,
            r#""response_format":{"type":"json_object"}"#,
        ] {
            let d = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{extra}}}"#);
            assert_ne!(k, key("p", "m", &doc(&d), false, None), "{extra}");
        }
    }

    #[test]
    fn normalization_folds_case_and_whitespace_only_when_on() {
        let a = doc(r#"{"messages":[{"role":"user","content":"Hello   World\n"}]}"#);
        let b = doc(r#"{"messages":[{"role":"user","content":"hello world"}]}"#);
        assert_ne!(
            key("p", "m", &a, false, None),
            key("p", "m", &b, false, None)
        );
        assert_eq!(key("p", "m", &a, true, None), key("p", "m", &b, true, None));
        let parts = doc(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"HELLO  world"}]}]}"#,
        );
        let parts2 = doc(
            r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello world"}]}]}"#,
        );
        assert_eq!(
            key("p", "m", &parts, true, None),
            key("p", "m", &parts2, true, None)
        );
    }

    #[test]
    fn sizing() {
        assert_eq!(CacheConfig::sized(1 << 20, 1 << 14, 4), (16, 4));
        assert_eq!(CacheConfig::sized(100, 1000, 4), (1, 1));
        assert_eq!(CacheConfig::sized(3000, 1000, 4), (1, 3));
    }

    fn h(n: u8, set: u32) -> Hash {
        // A hash landing in `set` of CFG.sets.
        let mut x = [n; 32];
        x[..8].copy_from_slice(&u64::from(set).to_le_bytes());
        x
    }

    #[test]
    fn miss_store_hit_then_expiry() {
        let s = MemStore::default();
        let k = h(1, 0);
        assert_eq!(lookup(&s, &CFG, &k, 0).unwrap(), None);
        assert!(matches!(
            insert(&s, &CFG, &k, b"answer", 0).unwrap(),
            StoreOutcome::Stored(_)
        ));
        assert_eq!(
            lookup(&s, &CFG, &k, 999).unwrap().as_deref(),
            Some(&b"answer"[..])
        );
        assert_eq!(lookup(&s, &CFG, &k, 1_000).unwrap(), None, "expired at ttl");
    }

    #[test]
    fn full_set_evicts_its_oldest_slot_and_other_sets_are_untouched() {
        let s = MemStore::default();
        let other = h(9, 1);
        insert(&s, &CFG, &other, b"other", 0).unwrap();
        let (a, b, c) = (h(1, 0), h(2, 0), h(3, 0));
        insert(&s, &CFG, &a, b"a", 10).unwrap();
        insert(&s, &CFG, &b, b"bb", 20).unwrap();
        let out = insert(&s, &CFG, &c, b"ccc", 30).unwrap();
        assert_eq!(
            out,
            StoreOutcome::Stored(Stored {
                evicted: true,
                bytes_delta: 2
            }),
            "replaced `a` (1 byte)"
        );
        assert_eq!(lookup(&s, &CFG, &a, 31).unwrap(), None);
        assert_eq!(lookup(&s, &CFG, &b, 31).unwrap().unwrap(), b"bb");
        assert_eq!(lookup(&s, &CFG, &c, 31).unwrap().unwrap(), b"ccc");
        assert_eq!(lookup(&s, &CFG, &other, 31).unwrap().unwrap(), b"other");
    }

    #[test]
    fn expired_slots_are_reused_before_live_ones_and_refresh_replaces_in_place() {
        let s = MemStore::default();
        let (a, b, c) = (h(1, 0), h(2, 0), h(3, 0));
        insert(&s, &CFG, &a, b"a", 0).unwrap();
        insert(&s, &CFG, &b, b"b", 500).unwrap();
        // At 1200 `a` has expired (ttl 1000) though `b` is live.
        let out = insert(&s, &CFG, &c, b"c", 1_200).unwrap();
        assert_eq!(
            out,
            StoreOutcome::Stored(Stored {
                evicted: false,
                bytes_delta: 0
            })
        );
        assert_eq!(lookup(&s, &CFG, &b, 1_201).unwrap().unwrap(), b"b");
        let out = insert(&s, &CFG, &b, b"b2", 1_300).unwrap();
        assert_eq!(
            out,
            StoreOutcome::Stored(Stored {
                evicted: false,
                bytes_delta: 1
            })
        );
        assert_eq!(lookup(&s, &CFG, &b, 1_301).unwrap().unwrap(), b"b2");
    }

    #[test]
    fn filling_far_past_capacity_keeps_the_table_bounded() {
        let s = MemStore::default();
        let mut held: i64 = 0;
        for i in 0..(CFG.sets * CFG.ways * 10) {
            let mut k = [0u8; 32];
            k[..4].copy_from_slice(&i.to_le_bytes());
            let k: Hash = Sha256::digest(k).into();
            if let StoreOutcome::Stored(st) =
                insert(&s, &CFG, &k, &[7u8; 90], u64::from(i)).unwrap()
            {
                held += st.bytes_delta;
            }
        }
        assert!(held <= (CFG.sets * CFG.ways) as i64 * 90, "{held}");
        assert!(held as usize <= CFG.capacity_bytes());
        assert_eq!(
            insert(&s, &CFG, &h(1, 0), &[0u8; 101], 0).unwrap(),
            StoreOutcome::TooLarge
        );
    }

    #[test]
    fn slot_reused_by_a_racing_writer_reads_as_a_miss() {
        let s = MemStore::default();
        let (a, b) = (h(1, 0), h(2, 0));
        insert(&s, &CFG, &a, b"a", 0).unwrap();
        // Another worker wrote b's data into a's slot but lost the index race.
        let mut slot = b.to_vec();
        slot.extend_from_slice(b"b");
        s.set(&slot_key(0, 0), &slot, None).unwrap();
        assert_eq!(lookup(&s, &CFG, &a, 1).unwrap(), None);
    }

    #[test]
    fn cache_control_directives() {
        assert_eq!(directive(None), Directive::Normal);
        assert_eq!(directive(Some("no-cache")), Directive::Refresh);
        assert_eq!(directive(Some("max-age=0, No-Store")), Directive::Bypass);
        assert_eq!(directive(Some("max-age=10")), Directive::Normal);
    }
}
