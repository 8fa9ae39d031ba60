//! The database behind the collector: SQLite (the embedded default, a file)
//! or PostgreSQL (`--db postgres://...`, for fleets: several collectors,
//! one per node, writing into one database). The same schema, rollups and
//! API on both; the writer and the queries ask this type, which speaks
//! each one's SQL.

use crate::pg;
use crate::rollup::{Counts, Dims};
use rusqlite::params;
use std::fmt;

pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

#[derive(Debug)]
pub struct DbError(pub String);

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError(format!("sqlite: {e}"))
    }
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> Self {
        DbError(format!("postgres: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, DbError>;

/// Whether `--db` names a PostgreSQL database.
pub fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// Open `--db`: a PostgreSQL URL, or a SQLite file path.
pub fn connect(spec: &str) -> Result<Db> {
    if is_postgres(spec) {
        Ok(Db::Postgres(Box::new(pg::connect(spec)?)))
    } else {
        Ok(Db::Sqlite(crate::store::open(spec.as_ref())?))
    }
}

/// Bring the schema up to date (safe with several collectors starting at
/// once on PostgreSQL: they take turns).
pub fn migrate(db: &mut Db) -> Result<usize> {
    match db {
        Db::Sqlite(c) => Ok(crate::store::migrate(c)?),
        Db::Postgres(c) => pg::migrate(c),
    }
}

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

/// One request as the recent-requests API shows it.
pub struct Recent {
    pub request_id: String,
    pub time_ms: i64,
    pub client: String,
    pub requested_model: String,
    pub model: String,
    pub provider: String,
    pub experiment: String,
    pub arm: String,
    pub cache: String,
    pub attempts: String,
    pub status: i64,
    pub error: String,
    pub latency_ms: i64,
    pub ttfb_ms: i64,
    pub stream: bool,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_tokens: i64,
    pub reasoning_tokens: i64,
    pub cost_micros: i64,
    pub limited_by: String,
    pub guardrails: String,
}

impl Recent {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "request_id": self.request_id,
            "time_ms": self.time_ms,
            "client": self.client,
            "requested_model": self.requested_model,
            "model": self.model,
            "provider": self.provider,
            "experiment": self.experiment,
            "arm": self.arm,
            "cache": self.cache,
            "attempts": serde_json::from_str::<serde_json::Value>(&self.attempts).unwrap_or_default(),
            "status": self.status,
            "error": self.error,
            "latency_ms": self.latency_ms,
            "ttfb_ms": self.ttfb_ms,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost_usd": self.cost_micros as f64 / 1e6,
            "limited_by": self.limited_by,
            "guardrails": serde_json::from_str::<serde_json::Value>(&self.guardrails).unwrap_or_default(),
        })
    }
}

/// The columns of [`Recent`], in its order (both databases).
pub const RECENT_COLUMNS: &str = "request_id, time_ms, client, requested_model, model, provider, experiment, arm, cache, attempts,
     status, error, latency_ms, ttfb_ms, stream, prompt_tokens, completion_tokens, cached_tokens,
     reasoning_tokens, cost_micros, limited_by, guardrails";

impl Db {
    /// Rollup rows of `table` with `lo <= start_ms < hi`.
    pub fn rollup_rows(
        &mut self,
        table: Table,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<(i64, Dims, Counts)>> {
        match self {
            Db::Postgres(c) => pg::rollup_rows(c, table, lo, hi),
            Db::Sqlite(conn) => {
                let sql = format!(
                    "SELECT start_ms, provider, model, client, experiment, arm, cells FROM {}
                     WHERE start_ms >= ?1 AND start_ms < ?2 ORDER BY start_ms",
                    table.name()
                );
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows = stmt.query_map(params![lo, hi], |r| {
                    let dims = Dims {
                        provider: r.get(1)?,
                        model: r.get(2)?,
                        client: r.get(3)?,
                        experiment: r.get(4)?,
                        arm: r.get(5)?,
                    };
                    let cells: Vec<u8> = r.get(6)?;
                    Ok((r.get(0)?, dims, Counts::decode(&cells).unwrap_or_default()))
                })?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            }
        }
    }

    /// Failed attempts (provider, cause, count) of `table`'s grain with
    /// `lo <= start_ms < hi`, summed over the buckets.
    pub fn failure_rows(
        &mut self,
        table: Table,
        lo: i64,
        hi: i64,
    ) -> Result<Vec<(String, String, i64)>> {
        let sql = format!(
            "SELECT provider, cause, SUM(count) FROM {} WHERE start_ms >= $1 AND start_ms < $2
             GROUP BY provider, cause",
            table.failures()
        );
        match self {
            Db::Postgres(c) => {
                // SUM over BIGINT is NUMERIC in PostgreSQL: read it back as BIGINT.
                let sql = sql.replace("SUM(count)", "SUM(count)::BIGINT");
                pg::failure_rows(c, &sql, lo, hi)
            }
            Db::Sqlite(conn) => {
                let mut stmt = conn.prepare_cached(&sql)?;
                let rows =
                    stmt.query_map(params![lo, hi], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            }
        }
    }

    /// The latency at 0-based `rank` of the records since `since_ms`.
    pub fn latency_at(&mut self, since_ms: i64, rank: i64) -> Result<i64> {
        let sql = "SELECT latency_ms FROM requests WHERE time_ms >= $1 ORDER BY latency_ms LIMIT 1 OFFSET $2";
        match self {
            Db::Postgres(c) => Ok(c.query_one(sql, &[&since_ms, &rank])?.try_get(0)?),
            Db::Sqlite(conn) => Ok(conn.query_row(sql, params![since_ms, rank], |r| r.get(0))?),
        }
    }

    /// The newest `limit` records.
    pub fn recent(&mut self, limit: i64) -> Result<Vec<Recent>> {
        let sql = format!(
            "SELECT {RECENT_COLUMNS} FROM requests ORDER BY time_ms DESC, request_id LIMIT $1"
        );
        match self {
            Db::Postgres(c) => pg::recent(c, &sql, limit),
            Db::Sqlite(conn) => {
                let mut stmt = conn.prepare(&sql)?;
                let rows = stmt.query_map([limit], |r| {
                    Ok(Recent {
                        request_id: r.get(0)?,
                        time_ms: r.get(1)?,
                        client: r.get(2)?,
                        requested_model: r.get(3)?,
                        model: r.get(4)?,
                        provider: r.get(5)?,
                        experiment: r.get(6)?,
                        arm: r.get(7)?,
                        cache: r.get(8)?,
                        attempts: r.get(9)?,
                        status: r.get(10)?,
                        error: r.get(11)?,
                        latency_ms: r.get(12)?,
                        ttfb_ms: r.get(13)?,
                        stream: r.get(14)?,
                        prompt_tokens: r.get(15)?,
                        completion_tokens: r.get(16)?,
                        cached_tokens: r.get(17)?,
                        reasoning_tokens: r.get(18)?,
                        cost_micros: r.get(19)?,
                        limited_by: r.get(20)?,
                        guardrails: r.get(21)?,
                    })
                })?;
                Ok(rows.collect::<rusqlite::Result<_>>()?)
            }
        }
    }

    /// A trivial query (health).
    pub fn ping(&mut self) -> Result<()> {
        match self {
            Db::Postgres(c) => c.simple_query("SELECT 1").map(|_| ()).map_err(Into::into),
            Db::Sqlite(conn) => Ok(conn.query_row("SELECT 1", [], |_| Ok(()))?),
        }
    }

    /// How many records there are.
    pub fn count(&mut self) -> Result<i64> {
        match self {
            Db::Postgres(c) => Ok(c
                .query_one("SELECT COUNT(*) FROM requests", &[])?
                .try_get(0)?),
            Db::Sqlite(conn) => Ok(crate::store::count(conn)?),
        }
    }
}
