//! The fleet's shared tier of the prompt cache (`portcullis.cache.v1.Cache`,
//! proto/cache.proto): entries in Redis under the gateway's 32-byte key.
//!
//! An entry as Redis holds it: a version byte, the codec (raw or LZ4,
//! chosen when compression saves a tenth), the expiry (ms since the epoch,
//! little-endian), eight bytes of a BLAKE3 over the key, the expiry and
//! the answer, then the payload. A read that does not decode, decompress
//! and check whole is a miss (counted as damaged), never an answer: an
//! entry written by something else, truncated or moved to another key
//! cannot be served. Redis drops an entry at its expiry (`SET ... PX`);
//! its memory is bounded by Redis' own `maxmemory` (the shipped one runs
//! `allkeys-lru` on a Redis of its own, so counters are never evicted).

use crate::cache_proto::cache_server::Cache;
use crate::cache_proto::{
    GetRequest, GetResponse, NearestRequest, NearestResponse, PutRequest, PutResponse,
    PutVectorsRequest,
};
use crate::redis_conn::Redis;
use crate::semantic::Semantic;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tonic::{Request, Response, Status};

const VERSION: u8 = 1;
const RAW: u8 = 0;
const LZ4: u8 = 1;
/// Version, codec, expiry, checksum.
const HEADER: usize = 1 + 1 + 8 + 8;
/// Answers shorter than this are kept as they are.
const COMPRESS_FROM: usize = 512;
/// The gateway's key: a BLAKE3 hash.
pub const KEY_LEN: usize = 32;

/// What the service did, since it started (read by tests and the bench).
#[derive(Default)]
pub struct Counts {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    /// Entries that did not read back whole (served as misses).
    pub damaged: AtomicU64,
    pub stored: AtomicU64,
    pub refused: AtomicU64,
    pub unauthenticated: AtomicU64,
}

pub struct SharedCache {
    redis: Redis,
    prefix: String,
    max_entry_bytes: usize,
    token: Option<String>,
    pub counts: Counts,
    /// The semantic tier's index ([`crate::semantic`]).
    pub semantic: Semantic,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn checksum(key: &[u8], expires_ms: u64, answer: &[u8]) -> [u8; 8] {
    let mut h = blake3::Hasher::new();
    h.update(key);
    h.update(&expires_ms.to_le_bytes());
    h.update(answer);
    let mut out = [0u8; 8];
    out.copy_from_slice(h.finalize().as_bytes().get(..8).unwrap_or(&[0; 8]));
    out
}

/// An entry's bytes for Redis.
pub fn encode(key: &[u8], answer: &[u8], expires_ms: u64) -> Vec<u8> {
    let compressed = (answer.len() >= COMPRESS_FROM)
        .then(|| lz4_flex::block::compress(answer))
        .filter(|c| c.len().saturating_add(4) < answer.len().saturating_sub(answer.len() / 10));
    let mut out =
        Vec::with_capacity(HEADER + compressed.as_ref().map_or(answer.len(), |c| c.len() + 4));
    out.push(VERSION);
    out.push(if compressed.is_some() { LZ4 } else { RAW });
    out.extend_from_slice(&expires_ms.to_le_bytes());
    out.extend_from_slice(&checksum(key, expires_ms, answer));
    match compressed {
        Some(c) => {
            // The answer's length first: the reader bounds it before
            // decompressing.
            out.extend_from_slice(
                &u32::try_from(answer.len())
                    .unwrap_or(u32::MAX)
                    .to_le_bytes(),
            );
            out.extend_from_slice(&c);
        }
        None => out.extend_from_slice(answer),
    }
    out
}

/// An entry read back: its answer and expiry, or `None` when it does not
/// decode whole under this key (or would be larger than `max_len`).
pub fn decode(key: &[u8], bytes: &[u8], max_len: usize) -> Option<(Vec<u8>, u64)> {
    let (head, payload) = (bytes.get(..HEADER)?, bytes.get(HEADER..)?);
    let [version, codec, rest @ ..] = head else {
        return None;
    };
    if *version != VERSION {
        return None;
    }
    let expires_ms = u64::from_le_bytes(rest.get(..8)?.try_into().ok()?);
    let sum = rest.get(8..16)?;
    let answer = match *codec {
        RAW => payload.to_vec(),
        LZ4 => {
            let len = u32::from_le_bytes(payload.get(..4)?.try_into().ok()?) as usize;
            if len > max_len {
                return None;
            }
            let out = lz4_flex::block::decompress(payload.get(4..)?, len).ok()?;
            (out.len() == len).then_some(out)?
        }
        _ => return None,
    };
    (answer.len() <= max_len && sum == checksum(key, expires_ms, &answer))
        .then_some((answer, expires_ms))
}

impl SharedCache {
    pub fn new(
        redis_url: &str,
        prefix: &str,
        timeout: Duration,
        max_entry_bytes: usize,
    ) -> redis::RedisResult<Self> {
        Ok(Self {
            redis: Redis::new(redis_url, timeout)?,
            prefix: prefix.to_string(),
            max_entry_bytes,
            token: None,
            counts: Counts::default(),
            semantic: Semantic::new(10_000, 256 << 20),
        })
    }

    /// Only calls carrying this token are served.
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token = token.filter(|t| !t.is_empty());
        self
    }

    /// The semantic index's bounds: entries and bytes.
    pub fn with_semantic(mut self, max_entries: usize, max_bytes: usize) -> Self {
        self.semantic = Semantic::new(max_entries, max_bytes);
        self
    }

    /// The stored answer nearest to a prompt's embedding, in its space.
    pub fn nearest(&self, req: &NearestRequest) -> Result<NearestResponse, Status> {
        if req.space.len() != KEY_LEN {
            return Err(Status::invalid_argument(format!(
                "a space is {KEY_LEN} bytes"
            )));
        }
        let threshold = req.threshold_ppm.min(1_000_000) as f32 / 1e6;
        match self
            .semantic
            .nearest(&req.space, &req.vector, threshold, now_ms())
        {
            Some(f) => {
                self.counts.hits.fetch_add(1, Ordering::Relaxed);
                Ok(NearestResponse {
                    found: true,
                    space: req.space.clone(),
                    answer: f.answer,
                    similarity_ppm: (f.similarity.clamp(0.0, 1.0) * 1e6).round() as u32,
                    stored_ms: f.stored_ms,
                    expires_ms: f.expires_ms,
                })
            }
            None => {
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                Ok(NearestResponse::default())
            }
        }
    }

    /// Answers with their prompts' embeddings.
    pub fn put_vectors(&self, req: &PutVectorsRequest) -> PutResponse {
        let now = now_ms();
        let (mut stored, mut refused) = (0u32, 0u32);
        for e in &req.entries {
            let ok = e.space.len() == KEY_LEN
                && e.answer.len() <= self.max_entry_bytes
                && e.vector.len() <= 8192
                && self
                    .semantic
                    .put(&e.space, &e.vector, &e.answer, now, e.expires_ms);
            if ok {
                stored = stored.saturating_add(1);
            } else {
                refused = refused.saturating_add(1);
            }
        }
        self.counts
            .stored
            .fetch_add(u64::from(stored), Ordering::Relaxed);
        self.counts
            .refused
            .fetch_add(u64::from(refused), Ordering::Relaxed);
        PutResponse { stored, refused }
    }

    fn redis_key(&self, key: &[u8]) -> String {
        let mut k = String::with_capacity(self.prefix.len() + 2 * key.len());
        k.push_str(&self.prefix);
        for b in key {
            k.push_str(&format!("{b:02x}"));
        }
        k
    }

    fn authorize<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if portcullis_service::call_authorized(self.token.as_deref(), request) {
            return Ok(());
        }
        self.counts.unauthenticated.fetch_add(1, Ordering::Relaxed);
        Err(Status::unauthenticated(
            "this cache serves only callers with its token",
        ))
    }

    /// One entry by key.
    pub async fn get(&self, key: &[u8]) -> Result<GetResponse, Status> {
        if key.len() != KEY_LEN {
            return Err(Status::invalid_argument(format!(
                "a key is {KEY_LEN} bytes (got {})",
                key.len()
            )));
        }
        let mut conn = self.redis.connection().await?;
        let k = self.redis_key(key);
        let raw: Option<Vec<u8>> = self
            .redis
            .run(redis::cmd("GET").arg(&k).query_async(&mut conn))
            .await?;
        let miss = GetResponse::default();
        let Some(raw) = raw else {
            self.counts.misses.fetch_add(1, Ordering::Relaxed);
            return Ok(miss);
        };
        match decode(key, &raw, self.max_entry_bytes) {
            Some((answer, expires_ms)) if expires_ms > now_ms() => {
                self.counts.hits.fetch_add(1, Ordering::Relaxed);
                Ok(GetResponse {
                    found: true,
                    key: key.to_vec(),
                    answer,
                    expires_ms,
                })
            }
            Some(_) => {
                self.counts.misses.fetch_add(1, Ordering::Relaxed);
                Ok(miss)
            }
            None => {
                self.counts.damaged.fetch_add(1, Ordering::Relaxed);
                Ok(miss)
            }
        }
    }

    /// Entries to keep, in one round trip; the refused are counted.
    pub async fn put(&self, req: &PutRequest) -> Result<PutResponse, Status> {
        let now = now_ms();
        let mut pipe = redis::pipe();
        let (mut stored, mut refused) = (0u32, 0u32);
        for e in &req.entries {
            let ttl = e.expires_ms.saturating_sub(now);
            if e.key.len() != KEY_LEN
                || e.answer.is_empty()
                || e.answer.len() > self.max_entry_bytes
                || ttl == 0
            {
                refused = refused.saturating_add(1);
                continue;
            }
            let value = encode(&e.key, &e.answer, e.expires_ms);
            pipe.cmd("SET")
                .arg(self.redis_key(&e.key))
                .arg(value)
                .arg("PX")
                .arg(ttl)
                .ignore();
            stored = stored.saturating_add(1);
        }
        self.counts
            .refused
            .fetch_add(u64::from(refused), Ordering::Relaxed);
        if stored > 0 {
            let mut conn = self.redis.connection().await?;
            self.redis.run(pipe.query_async::<()>(&mut conn)).await?;
            self.counts
                .stored
                .fetch_add(u64::from(stored), Ordering::Relaxed);
        }
        Ok(PutResponse { stored, refused })
    }
}

#[tonic::async_trait]
impl Cache for SharedCache {
    async fn get(&self, request: Request<GetRequest>) -> Result<Response<GetResponse>, Status> {
        self.authorize(&request)?;
        SharedCache::get(self, &request.get_ref().key)
            .await
            .map(Response::new)
    }

    async fn put(&self, request: Request<PutRequest>) -> Result<Response<PutResponse>, Status> {
        self.authorize(&request)?;
        SharedCache::put(self, request.get_ref())
            .await
            .map(Response::new)
    }

    async fn nearest(
        &self,
        request: Request<NearestRequest>,
    ) -> Result<Response<NearestResponse>, Status> {
        self.authorize(&request)?;
        SharedCache::nearest(self, request.get_ref()).map(Response::new)
    }

    async fn put_vectors(
        &self,
        request: Request<PutVectorsRequest>,
    ) -> Result<Response<PutResponse>, Status> {
        self.authorize(&request)?;
        Ok(Response::new(SharedCache::put_vectors(
            self,
            request.get_ref(),
        )))
    }
}
