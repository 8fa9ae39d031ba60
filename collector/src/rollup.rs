//! Rollups kept at write time, so the summary reads a number of rows that
//! depends on the window, not on how many records there are: per minute
//! and per hour, per provider, model, client and experiment arm, the
//! request counts by status class, cache hits, fallbacks, tokens, cost, and
//! a latency histogram with log-spaced buckets (each bucket 20% wider than
//! the one before, so a percentile read from it is within 10% of the exact
//! one). The writer updates them in the transaction that stores the
//! records, counting only records it stored (a re-send adds nothing).

use crate::proto::RequestRecord;
use rusqlite::{params, Connection, OptionalExtension};
use std::collections::HashMap;

/// Every table of rollups (what an age limit prunes beside the records).
pub const ROLLUP_TABLES: [&str; 4] = [
    "rollup_minute",
    "rollup_hour",
    "failures_minute",
    "failures_hour",
];

/// The rollup tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Table {
    Minute,
    Hour,
}

impl Table {
    pub fn name(self) -> &'static str {
        match self {
            Table::Minute => "rollup_minute",
            Table::Hour => "rollup_hour",
        }
    }

    /// The failed attempts at this table's grain.
    pub fn failures(self) -> &'static str {
        match self {
            Table::Minute => "failures_minute",
            Table::Hour => "failures_hour",
        }
    }
}

/// Latency buckets: 0 is under 1 ms; bucket `b` >= 1 holds
/// [1.2^(b-1), 1.2^b) ms; the last one everything from about 50 minutes on.
pub const BUCKETS: usize = 64;
const GROWTH: f64 = 1.2;

pub const MINUTE_MS: i64 = 60_000;
pub const HOUR_MS: i64 = 3_600_000;

pub const SCHEMA: &str = "
    CREATE TABLE rollup_minute (
        start_ms INTEGER NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL,
        client TEXT NOT NULL, experiment TEXT NOT NULL, arm TEXT NOT NULL,
        cells BLOB NOT NULL,
        PRIMARY KEY (start_ms, provider, model, client, experiment, arm)
    ) WITHOUT ROWID;
    CREATE TABLE rollup_hour (
        start_ms INTEGER NOT NULL, provider TEXT NOT NULL, model TEXT NOT NULL,
        client TEXT NOT NULL, experiment TEXT NOT NULL, arm TEXT NOT NULL,
        cells BLOB NOT NULL,
        PRIMARY KEY (start_ms, provider, model, client, experiment, arm)
    ) WITHOUT ROWID;";

/// The bucket of a latency.
pub fn bucket_of(latency_ms: u64) -> usize {
    if latency_ms == 0 {
        return 0;
    }
    let b = ((latency_ms as f64).ln() / GROWTH.ln()).floor() as usize + 1;
    b.min(BUCKETS - 1)
}

/// The value a bucket stands for: the geometric middle of its bounds.
pub fn bucket_value(b: usize) -> f64 {
    if b == 0 {
        return 0.5;
    }
    GROWTH.powf(b as f64 - 0.5)
}

/// What one rollup row counts.
#[derive(Debug, Clone, PartialEq)]
pub struct Counts {
    pub requests: i64,
    pub ok: i64,
    pub client_errors: i64,
    pub server_errors: i64,
    pub cache_hits: i64,
    pub fallbacks: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_micros: i64,
    pub latency_sum_ms: i64,
    pub latency: [u64; BUCKETS],
    /// Streams' time to first token, in the latency's buckets.
    pub ttft: [u64; BUCKETS],
}

impl Default for Counts {
    fn default() -> Self {
        Self {
            requests: 0,
            ok: 0,
            client_errors: 0,
            server_errors: 0,
            cache_hits: 0,
            fallbacks: 0,
            prompt_tokens: 0,
            completion_tokens: 0,
            cost_micros: 0,
            latency_sum_ms: 0,
            latency: [0; BUCKETS],
            ttft: [0; BUCKETS],
        }
    }
}

const FIELDS: usize = 10;
/// A row without streams (and every row written before #31): no TTFT
/// histogram.
const ENCODED_LEN_V1: usize = (FIELDS + BUCKETS) * 8;
/// A row with streams: the TTFT histogram after it, in 32-bit counts (a
/// row stays under SQLite's ~1,000-byte local payload of a WITHOUT ROWID
/// row; past it every update would also write an overflow page).
const ENCODED_LEN: usize = ENCODED_LEN_V1 + BUCKETS * 4;

fn sat(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Counts {
    pub fn add_record(&mut self, r: &RequestRecord) {
        self.requests = self.requests.saturating_add(1);
        match r.status {
            200..=299 => self.ok = self.ok.saturating_add(1),
            400..=499 => self.client_errors = self.client_errors.saturating_add(1),
            500..=599 => self.server_errors = self.server_errors.saturating_add(1),
            _ => {}
        }
        if r.cache.starts_with("hit") {
            self.cache_hits = self.cache_hits.saturating_add(1);
        }
        if r.attempts.len() > 1 {
            self.fallbacks = self.fallbacks.saturating_add(1);
        }
        self.prompt_tokens = self.prompt_tokens.saturating_add(sat(r.prompt_tokens));
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(sat(r.completion_tokens));
        self.cost_micros = self.cost_micros.saturating_add(r.cost_micros);
        self.latency_sum_ms = self.latency_sum_ms.saturating_add(sat(r.latency_ms));
        if let Some(b) = self.latency.get_mut(bucket_of(r.latency_ms)) {
            *b = b.saturating_add(1);
        }
        if r.ttft_ms > 0 {
            if let Some(b) = self.ttft.get_mut(bucket_of(r.ttft_ms)) {
                *b = b.saturating_add(1);
            }
        }
    }

    pub fn merge(&mut self, o: &Counts) {
        self.requests = self.requests.saturating_add(o.requests);
        self.ok = self.ok.saturating_add(o.ok);
        self.client_errors = self.client_errors.saturating_add(o.client_errors);
        self.server_errors = self.server_errors.saturating_add(o.server_errors);
        self.cache_hits = self.cache_hits.saturating_add(o.cache_hits);
        self.fallbacks = self.fallbacks.saturating_add(o.fallbacks);
        self.prompt_tokens = self.prompt_tokens.saturating_add(o.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(o.completion_tokens);
        self.cost_micros = self.cost_micros.saturating_add(o.cost_micros);
        self.latency_sum_ms = self.latency_sum_ms.saturating_add(o.latency_sum_ms);
        for (a, b) in self.latency.iter_mut().zip(o.latency.iter()) {
            *a = a.saturating_add(*b);
        }
        for (a, b) in self.ttft.iter_mut().zip(o.ttft.iter()) {
            *a = a.saturating_add(*b);
        }
    }

    fn fields(&self) -> [i64; FIELDS] {
        [
            self.requests,
            self.ok,
            self.client_errors,
            self.server_errors,
            self.cache_hits,
            self.fallbacks,
            self.prompt_tokens,
            self.completion_tokens,
            self.cost_micros,
            self.latency_sum_ms,
        ]
    }

    pub fn encode(&self) -> Vec<u8> {
        let streams = self.ttft.iter().any(|b| *b > 0);
        let mut out = Vec::with_capacity(if streams { ENCODED_LEN } else { ENCODED_LEN_V1 });
        for f in self.fields() {
            out.extend_from_slice(&f.to_le_bytes());
        }
        for b in &self.latency {
            out.extend_from_slice(&b.to_le_bytes());
        }
        if streams {
            for b in &self.ttft {
                out.extend_from_slice(&u32::try_from(*b).unwrap_or(u32::MAX).to_le_bytes());
            }
        }
        out
    }

    /// A stored row; a damaged one reads as empty (and says so).
    pub fn decode(bytes: &[u8]) -> Option<Counts> {
        if bytes.len() != ENCODED_LEN && bytes.len() != ENCODED_LEN_V1 {
            return None;
        }
        let word = |i: usize| -> [u8; 8] {
            let mut w = [0u8; 8];
            if let Some(s) = bytes.get(i * 8..i * 8 + 8) {
                w.copy_from_slice(s);
            }
            w
        };
        let f = |i: usize| i64::from_le_bytes(word(i));
        let mut c = Counts {
            requests: f(0),
            ok: f(1),
            client_errors: f(2),
            server_errors: f(3),
            cache_hits: f(4),
            fallbacks: f(5),
            prompt_tokens: f(6),
            completion_tokens: f(7),
            cost_micros: f(8),
            latency_sum_ms: f(9),
            ..Counts::default()
        };
        for (i, b) in c.latency.iter_mut().enumerate() {
            *b = u64::from_le_bytes(word(FIELDS + i));
        }
        if let Some(tail) = bytes.get(ENCODED_LEN_V1..) {
            for (b, w) in c.ttft.iter_mut().zip(tail.chunks_exact(4)) {
                let mut x = [0u8; 4];
                x.copy_from_slice(w);
                *b = u64::from(u32::from_le_bytes(x));
            }
        }
        Some(c)
    }

    /// The latency at quantile `q` (0..=1) from the histogram.
    pub fn latency_quantile(&self, q: f64) -> f64 {
        quantile(&self.latency, q)
    }

    /// Streams with a time to first token.
    pub fn streams(&self) -> u64 {
        self.ttft.iter().sum()
    }

    /// Time to first token at quantile `q`, from its histogram (0: none).
    pub fn ttft_quantile(&self, q: f64) -> f64 {
        quantile(&self.ttft, q)
    }
}

/// A histogram's value at quantile `q` (0 when it is empty).
fn quantile(buckets: &[u64; BUCKETS], q: f64) -> f64 {
    let total: u64 = buckets.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0u64;
    for (b, n) in buckets.iter().enumerate() {
        seen = seen.saturating_add(*n);
        if seen >= rank {
            return bucket_value(b);
        }
    }
    bucket_value(BUCKETS - 1)
}

/// The dimensions of one rollup row.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Dims {
    pub provider: String,
    pub model: String,
    pub client: String,
    pub experiment: String,
    pub arm: String,
}

impl Dims {
    pub fn of(r: &RequestRecord) -> Dims {
        Dims {
            provider: r.provider.clone(),
            model: r.model.clone(),
            client: r.client.clone(),
            experiment: r.experiment.clone(),
            arm: r.arm.clone(),
        }
    }
}

type RowKey = (Table, i64, Dims);

/// Counts for one batch, by (table, bucket start, dimensions), before they
/// are merged into the stored rows; and the failed attempts by (table,
/// bucket start, provider, cause).
#[derive(Default)]
pub struct Pending {
    rows: HashMap<RowKey, Counts>,
    failures: HashMap<FailKey, i64>,
}

type FailKey = (Table, i64, String, String);

/// Failed attempts (the providers a request fell back from, and why), per
/// minute and per hour: `count` attempts of `provider` ended with `cause`.
/// Both databases add to a row with one upsert, atomically.
pub const FAILURES_SCHEMA: &str = "
    CREATE TABLE failures_minute (
        start_ms BIGINT NOT NULL, provider TEXT NOT NULL, cause TEXT NOT NULL,
        count BIGINT NOT NULL, PRIMARY KEY (start_ms, provider, cause));
    CREATE TABLE failures_hour (
        start_ms BIGINT NOT NULL, provider TEXT NOT NULL, cause TEXT NOT NULL,
        count BIGINT NOT NULL, PRIMARY KEY (start_ms, provider, cause));";

/// SQLite: the failures of the records already stored (their attempts are
/// JSON text).
pub const FAILURES_BACKFILL: &str = "
    INSERT INTO failures_minute
      SELECT time_ms - time_ms % 60000, json_extract(a.value, '$.provider'), json_extract(a.value, '$.cause'), COUNT(*)
      FROM requests, json_each(requests.attempts) AS a
      WHERE json_extract(a.value, '$.cause') != '' GROUP BY 1, 2, 3;
    INSERT INTO failures_hour
      SELECT time_ms - time_ms % 3600000, json_extract(a.value, '$.provider'), json_extract(a.value, '$.cause'), COUNT(*)
      FROM requests, json_each(requests.attempts) AS a
      WHERE json_extract(a.value, '$.cause') != '' GROUP BY 1, 2, 3;";

/// Add `count` failures to a row (either database).
pub fn failure_upsert(grain: Table) -> String {
    let table = grain.failures();
    format!(
        "INSERT INTO {table} (start_ms, provider, cause, count) VALUES ($1, $2, $3, $4)
         ON CONFLICT (start_ms, provider, cause) DO UPDATE SET count = {table}.count + excluded.count"
    )
}

/// The rows the writer wrote last, as stored: the writer owns the only
/// connection that writes, so a row it knows needs no read before its next
/// update. Bounded; cleared when a transaction fails.
#[derive(Default)]
pub struct Known(HashMap<RowKey, Counts>);

impl Known {
    const MAX_ROWS: usize = 20_000;

    pub fn forget(&mut self) {
        self.0.clear();
    }
}

impl Pending {
    /// The rows to merge: (table, bucket start, dimensions, counts).
    pub fn into_rows(self) -> Vec<(Table, i64, Dims, Counts)> {
        self.rows
            .into_iter()
            .map(|((t, start, dims), c)| (t, start, dims, c))
            .collect()
    }

    pub fn add(&mut self, r: &RequestRecord) {
        let t = i64::try_from(r.time_ms).unwrap_or(i64::MAX);
        let dims = Dims::of(r);
        for (table, step) in [(Table::Minute, MINUTE_MS), (Table::Hour, HOUR_MS)] {
            let start = t - t.rem_euclid(step);
            self.rows
                .entry((table, start, dims.clone()))
                .or_default()
                .add_record(r);
        }
        for a in r.attempts.iter().filter(|a| !a.cause.is_empty()) {
            for (table, step) in [(Table::Minute, MINUTE_MS), (Table::Hour, HOUR_MS)] {
                let start = t - t.rem_euclid(step);
                let n = self
                    .failures
                    .entry((table, start, a.provider.clone(), a.cause.clone()))
                    .or_default();
                *n = n.saturating_add(1);
            }
        }
    }

    /// Merge into the stored rows (in the caller's transaction).
    /// The failures to add, in key order (the order every writer locks in).
    pub fn sorted_failures(f: HashMap<FailKey, i64>) -> Vec<(FailKey, i64)> {
        let mut v: Vec<(FailKey, i64)> = f.into_iter().collect();
        v.sort();
        v
    }

    /// Take the failures out (PostgreSQL writes them itself).
    pub fn take_failures(&mut self) -> Vec<(FailKey, i64)> {
        Self::sorted_failures(std::mem::take(&mut self.failures))
    }

    pub fn write(mut self, conn: &Connection, known: &mut Known) -> rusqlite::Result<()> {
        if known.0.len() > Known::MAX_ROWS {
            known.forget();
        }
        for ((table, start, provider, cause), n) in
            Self::sorted_failures(std::mem::take(&mut self.failures))
        {
            conn.prepare_cached(&failure_upsert(table))?
                .execute(params![start, provider, cause, n])?;
        }
        for (key, counts) in self.rows {
            let mut merged = match known.0.remove(&key) {
                Some(c) => c,
                None => stored(conn, &key)?.unwrap_or_default(),
            };
            merged.merge(&counts);
            let (table, start, d) = &key;
            let table = table.name();
            let upsert = format!(
                "INSERT OR REPLACE INTO {table} (start_ms, provider, model, client, experiment, arm, cells)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)"
            );
            conn.prepare_cached(&upsert)?.execute(params![
                start,
                d.provider,
                d.model,
                d.client,
                d.experiment,
                d.arm,
                merged.encode()
            ])?;
            known.0.insert(key, merged);
        }
        Ok(())
    }
}

/// A row as stored, if there is one.
fn stored(conn: &Connection, (table, start, d): &RowKey) -> rusqlite::Result<Option<Counts>> {
    let table = table.name();
    let select = format!(
        "SELECT cells FROM {table} WHERE start_ms = ?1 AND provider = ?2 AND model = ?3
                 AND client = ?4 AND experiment = ?5 AND arm = ?6"
    );
    let cells: Option<Vec<u8>> = conn
        .prepare_cached(&select)?
        .query_row(
            params![start, d.provider, d.model, d.client, d.experiment, d.arm],
            |r| r.get(0),
        )
        .optional()?;
    Ok(cells.as_deref().and_then(Counts::decode))
}

/// Build the rollups for records stored before they existed (a migration),
/// reading the records in time order, a chunk at a time.
pub fn backfill(conn: &Connection) -> rusqlite::Result<u64> {
    let mut stmt = conn.prepare(
        "SELECT time_ms, client, model, provider, experiment, arm, cache, attempt_count,
                status, latency_ms, prompt_tokens, completion_tokens, cost_micros
         FROM requests",
    )?;
    let mut rows = stmt.query([])?;
    let mut pending = Pending::default();
    let mut n = 0u64;
    while let Some(row) = rows.next()? {
        let attempts: i64 = row.get(7)?;
        let r = RequestRecord {
            time_ms: row.get::<_, i64>(0)?.max(0) as u64,
            client: row.get(1)?,
            model: row.get(2)?,
            provider: row.get(3)?,
            experiment: row.get(4)?,
            arm: row.get(5)?,
            cache: row.get(6)?,
            // Only the count matters to a rollup.
            attempts: vec![Default::default(); usize::try_from(attempts).unwrap_or(0).min(2)],
            status: row.get(8)?,
            latency_ms: row.get::<_, i64>(9)?.max(0) as u64,
            prompt_tokens: row.get::<_, i64>(10)?.max(0) as u64,
            completion_tokens: row.get::<_, i64>(11)?.max(0) as u64,
            cost_micros: row.get(12)?,
            ..Default::default()
        };
        pending.add(&r);
        n += 1;
        if n.is_multiple_of(50_000) {
            std::mem::take(&mut pending).write(conn, &mut Known::default())?;
        }
    }
    pending.write(conn, &mut Known::default())?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_log_spaced_and_quantiles_within_ten_percent() {
        assert_eq!(bucket_of(0), 0);
        assert_eq!(bucket_of(1), 1);
        assert_eq!(bucket_of(u64::MAX), BUCKETS - 1);
        let mut c = Counts::default();
        for ms in 1..=10_000u64 {
            c.add_record(&RequestRecord {
                latency_ms: ms,
                status: 200,
                ..Default::default()
            });
        }
        for (q, exact) in [(0.5, 5_000.0), (0.95, 9_500.0), (0.99, 9_900.0)] {
            let got = c.latency_quantile(q);
            assert!((got / exact - 1.0).abs() <= 0.10, "q{q}: {got} vs {exact}");
        }
        assert_eq!(Counts::decode(&c.encode()), Some(c));
        assert_eq!(Counts::decode(b"short"), None);
    }

    /// A row written before the TTFT histogram reads with an empty one; a
    /// row written now carries it.
    #[test]
    fn rows_without_the_ttft_histogram_still_read() {
        let mut c = Counts::default();
        c.add_record(&RequestRecord {
            latency_ms: 900,
            ttft_ms: 300,
            status: 200,
            ..Default::default()
        });
        assert_eq!(c.streams(), 1);
        assert!((c.ttft_quantile(0.5) / 300.0 - 1.0).abs() <= 0.10);
        let now = c.encode();
        let old = &now[..ENCODED_LEN_V1];
        let read = Counts::decode(old).unwrap();
        assert_eq!((read.requests, read.streams()), (1, 0));
        assert_eq!(read.latency, c.latency);
        assert_eq!(Counts::decode(&now), Some(c));
    }
}
