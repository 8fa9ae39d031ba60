//! Prompt cache: the key (BLAKE3 over a canonical form of the request, read
//! in place) and a bounded set-associative table in the shared store.
//!
//! Layout in the store: per set, one small index value (`ways` entries of key
//! hash, expiry, store time, length); per slot, one value holding the key hash
//! and the stored completion. Keys are fixed (`sets * (ways + 1)`) and each
//! slot holds at most `max_entry_bytes`, so memory cannot grow past the
//! configured size whatever the traffic.
//!
//! May use: `api`, `error`, `request`, `shared`, `wire`.

use crate::error::GatewayError;
use crate::request::ChatRequest;
use crate::shared::store::{Store, StoreError, MAX_CAS_TRIES};
use crate::wire::le;
use serde_json::Value;
use std::io::Write as _;

/// Changes whenever the canonical form changes, so old entries stop matching.
const KEY_VERSION: &[u8] = b"portcullis-cache-v2";

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
    /// Each worker's first level of hot answers ([`local`]): its budget in
    /// bytes (0: off) and how long it trusts a copy without reading the
    /// shared table again.
    pub worker_bytes: usize,
    pub worker_ttl_ms: u64,
    /// The fleet's tier ([`fleet`]), when the config has one.
    pub shared: Option<SharedTier>,
    /// The semantic tier ([`semantic`]), when the config has one.
    pub semantic: Option<SemanticTier>,
}

/// `cache.semantic`: near-duplicate prompts answered from the fleet's
/// tier by their embeddings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SemanticTier {
    /// The model (of this config, serving embeddings) that embeds prompts.
    pub embedding_model: String,
    /// The least cosine similarity served, in millionths.
    pub threshold_ppm: u32,
    /// The models (as requested) whose requests may be served.
    pub models: Vec<String>,
    /// Conversations are eligible too.
    pub multi_turn: bool,
    /// The Envoy cluster of the gateway's own listener: the embedding is
    /// asked of the gateway itself, under the client's key.
    pub cluster: String,
    /// How long the embedding may take before the request goes on (a miss).
    pub timeout_ms: u64,
    /// Whose stored prompts a request is compared with.
    pub scope: SemanticScope,
}

/// `cache.semantic.scope`: whose near-duplicates answer a request (#61).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SemanticScope {
    /// Its own key's only (the default).
    #[default]
    Client,
    /// Its team's keys' (a key without a team: its own).
    Team,
    /// Every key's, as the exact tiers' `cache.scope` says.
    Shared,
}

impl SemanticScope {
    /// The space's owner for a request of key `client` in `team`
    /// (`per_client`: the exact tiers are kept per key): `None` shares
    /// across keys. Keys and teams never share a name space.
    pub fn owner(self, client: &str, team: Option<&str>, per_client: bool) -> Option<String> {
        match (self, team) {
            (SemanticScope::Team, Some(t)) => Some(format!("team:{t}")),
            (SemanticScope::Client | SemanticScope::Team, _) => Some(format!("key:{client}")),
            (SemanticScope::Shared, _) => per_client.then(|| format!("key:{client}")),
        }
    }
}

/// `cache.shared`: where the fleet's entries are asked for and sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SharedTier {
    /// The Envoy cluster of the cache service (gRPC).
    pub cluster: String,
    /// A lookup slower than this is a miss.
    pub timeout_ms: u64,
    /// Bytes of fresh answers a worker queues for its next store call.
    pub queue_bytes: usize,
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
    /// Answered by this Envoy's cache, which is the only tier.
    Hit,
    /// Answered by this Envoy's cache where the fleet has a tier too.
    HitLocal,
    /// Answered by the fleet's tier (`cache.shared`).
    HitShared,
    /// Answered with a near-duplicate prompt's answer (`cache.semantic`).
    HitSemantic,
    Miss,
    /// `no-cache`: not served from the cache, but the answer is stored.
    Refresh,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheStatus::Off => "off",
            CacheStatus::Hit => "hit",
            CacheStatus::HitLocal => "hit-local",
            CacheStatus::HitShared => "hit-shared",
            CacheStatus::HitSemantic => "hit-semantic",
            CacheStatus::Miss => "miss",
            CacheStatus::Refresh => "refresh",
        }
    }

    /// Answered from a cache, whichever tier.
    pub fn is_hit(self) -> bool {
        matches!(
            self,
            CacheStatus::Hit
                | CacheStatus::HitLocal
                | CacheStatus::HitShared
                | CacheStatus::HitSemantic
        )
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
/// was read strictly, and returns a `Result`: a key is never built from a
/// partial or empty document.
pub fn key(
    provider: &str,
    model_id: &str,
    request: &ChatRequest,
    normalize: bool,
    client: Option<&str>,
) -> Result<Hash, GatewayError> {
    let mut h = blake3::Hasher::new();
    h.update(KEY_VERSION);
    h.update(&[0]);
    h.update(provider.as_bytes());
    h.update(&[0]);
    h.update(model_id.as_bytes());
    h.update(&[0]);
    h.update(client.unwrap_or("").as_bytes());
    h.update(&[0]);
    // The canonical document is hashed as it is serialized: `{k:v,...}` in
    // key order, without the ignored fields. Without normalization (the
    // default) it is read in place ([`canon`]: the texts are not copied);
    // normalization rewrites the messages' text, from the document tree.
    let mut w = HashWriter(&mut h);
    if normalize {
        let doc = request.document()?;
        write_fields(
            &mut w,
            doc.iter().map(|(k, v)| (k.as_str(), v)),
            |w, k, v| {
                if k == "messages" {
                    let mut m = v.clone();
                    normalize_messages(&mut m);
                    let _ = serde_json::to_writer(w, &m);
                } else {
                    let _ = serde_json::to_writer(w, v);
                }
            },
        );
    } else {
        let doc: canon::Canon<'_> = serde_json::from_slice(request.body())
            .map_err(|e| GatewayError::internal(format!("cache key: {e}")))?;
        let canon::Canon::Object(fields) = doc else {
            return Err(GatewayError::internal("cache key: not an object"));
        };
        write_fields(
            &mut w,
            fields.iter().map(|(k, v)| (k.as_ref(), v)),
            |w, _, v| {
                let _ = v.write(w);
            },
        );
    }
    Ok(*h.finalize().as_bytes())
}

/// `{k:v,...}` of the fields that change the answer, in the order given
/// (sorted), each value written by `value`.
fn write_fields<'v, V: 'v>(
    w: &mut HashWriter<'_>,
    fields: impl Iterator<Item = (&'v str, V)>,
    mut value: impl FnMut(&mut HashWriter<'_>, &str, V),
) {
    let _ = w.write(b"{");
    for (i, (k, v)) in fields
        .filter(|(k, _)| !IGNORED_FIELDS.contains(k))
        .enumerate()
    {
        if i > 0 {
            let _ = w.write(b",");
        }
        let _ = serde_json::to_writer(&mut *w, k);
        let _ = w.write(b":");
        value(w, k, v);
    }
    let _ = w.write(b"}");
}

struct HashWriter<'a>(&'a mut blake3::Hasher);

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
    (le::u64_at(hash, 0).unwrap_or(0) % u64::from(sets.max(1))) as u32
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
            w.expires_ms = le::u64_at(c, 32).unwrap_or(0);
            w.stored_ms = le::u64_at(c, 40).unwrap_or(0);
            w.len = le::u32_at(c, 48).unwrap_or(0);
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

use crate::shared::keys::{cache_index as index_key, cache_slot as slot_key};

/// At configure time: give every set an index (empty where missing), so
/// every store is guarded by a CAS token, the first one in a set included.
/// Indexes already there (a reload, another worker) are kept.
pub fn prepare<S: Store + ?Sized>(store: &S, cfg: &CacheConfig) -> Result<(), StoreError> {
    let empty = encode_index(&vec![Way::default(); cfg.ways as usize]);
    for set in 0..cfg.sets {
        let key = index_key(set);
        if store.get(&key)?.0.is_none() {
            store.set(&key, &empty, None)?;
        }
    }
    Ok(())
}

/// A set's index as a lookup read it, with its CAS token: a store after a
/// miss starts from it instead of reading the index again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Seen {
    bytes: Option<Vec<u8>>,
    cas: Option<u32>,
}

/// The stored completion for `hash`, if present and fresh. Two reads: the
/// set's index, then the slot (whose own hash is checked, since a racing
/// writer may have reused it).
pub fn lookup<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    now_ms: u64,
) -> Result<Option<Vec<u8>>, StoreError> {
    lookup_seen(store, cfg, hash, now_ms).map(|(found, _)| found.map(|f| f.answer))
}

/// A stored answer as a lookup found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    pub answer: Vec<u8>,
    pub expires_ms: u64,
}

/// [`lookup`], also handing back the entry's expiry and the index it read
/// (for [`insert_seen`]).
pub fn lookup_seen<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    now_ms: u64,
) -> Result<(Option<Found>, Seen), StoreError> {
    let set = set_of(hash, cfg.sets);
    let (idx, cas) = store.get(&index_key(set))?;
    let index = decode_index(idx.as_deref(), cfg.ways);
    let seen = |bytes| Seen { bytes, cas };
    let Some((way, expires_ms)) = index
        .iter()
        .enumerate()
        .find(|(_, w)| &w.hash == hash && w.expires_ms > now_ms && !w.is_empty())
        .map(|(i, w)| (i, w.expires_ms))
    else {
        return Ok((None, seen(idx)));
    };
    let (slot, _) = store.get(&slot_key(set, way))?;
    let found = slot.and_then(|s| {
        (s.get(..32) == Some(hash.as_slice())).then(|| Found {
            answer: s.get(32..).unwrap_or_default().to_vec(),
            expires_ms,
        })
    });
    Ok((found, seen(idx)))
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

/// Store a completion: the set's index is claimed by CAS, then the slot is
/// written. A reader between the two finds the slot's own hash differs
/// from the index's and reads a miss, never another answer; a writer that
/// loses the CAS writes nothing and reads the index again.
pub fn insert<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    body: &[u8],
    now_ms: u64,
) -> Result<StoreOutcome, StoreError> {
    insert_seen(store, cfg, hash, body, now_ms, None)
}

/// [`insert`], starting from the index a lookup read (`seen`): when nothing
/// changed the set since, the store costs no read.
pub fn insert_seen<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    body: &[u8],
    now_ms: u64,
    seen: Option<Seen>,
) -> Result<StoreOutcome, StoreError> {
    insert_until(
        store,
        cfg,
        hash,
        body,
        now_ms,
        seen,
        now_ms.saturating_add(cfg.ttl_ms),
    )
}

/// [`insert_seen`] of an entry that expires at `expires_ms` (one the
/// fleet's tier answered keeps its own expiry).
pub fn insert_until<S: Store + ?Sized>(
    store: &S,
    cfg: &CacheConfig,
    hash: &Hash,
    body: &[u8],
    now_ms: u64,
    seen: Option<Seen>,
    expires_ms: u64,
) -> Result<StoreOutcome, StoreError> {
    if body.len() > cfg.max_entry_bytes || body.is_empty() {
        return Ok(StoreOutcome::TooLarge);
    }
    let set = set_of(hash, cfg.sets);
    let ikey = index_key(set);
    let mut seen = seen;
    for _ in 0..MAX_CAS_TRIES {
        // A set that had no index yet has no CAS token to guard a write
        // from a stale read: read it again.
        let (idx, cas) = match seen.take().filter(|s| s.cas.is_some()) {
            Some(s) => (s.bytes, s.cas),
            None => store.get(&ikey)?,
        };
        let mut index = decode_index(idx.as_deref(), cfg.ways);
        let (way, evicted) = choose_way(&index, hash, now_ms);
        let old_len = index.get(way).map(|w| i64::from(w.len)).unwrap_or(0);
        if let Some(w) = index.get_mut(way) {
            *w = Way {
                hash: *hash,
                expires_ms,
                stored_ms: now_ms,
                len: body.len() as u32,
            };
        }
        match store.set(&ikey, &encode_index(&index), cas) {
            Ok(()) => {
                let mut slot = Vec::with_capacity(SLOT_HEADER + body.len());
                slot.extend_from_slice(hash);
                slot.extend_from_slice(body);
                store.set(&slot_key(set, way), &slot, None)?;
                return Ok(StoreOutcome::Stored(Stored {
                    evicted,
                    bytes_delta: body.len() as i64 - old_len,
                }));
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

mod canon;
pub mod fleet;
pub mod local;
pub mod semantic;

#[cfg(test)]
mod tests;
