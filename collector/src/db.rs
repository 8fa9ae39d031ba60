//! The database behind the collector: SQLite (the embedded default, a file)
//! or PostgreSQL (`--db postgres://...`, for fleets: several collectors,
//! one per node, writing into one database). The same schema, rollups and
//! API on both; the writer and the queries ask this type, which speaks
//! each one's SQL.

use crate::pg;
use crate::proto::RequestRecord;
use crate::rollup::{Counts, Dims, Known};
pub use crate::rollup::{Table, ROLLUP_TABLES};
use crate::sqlite;
pub use crate::types::{DbError, Recent, Result, RECENT_COLUMNS};
use rusqlite::params;

pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

/// Whether `--db` names a PostgreSQL database.
pub fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

/// Open `--db`: a PostgreSQL URL, or a SQLite file path.
pub fn connect(spec: &str) -> Result<Db> {
    if is_postgres(spec) {
        Ok(Db::Postgres(Box::new(pg::connect(spec)?)))
    } else {
        Ok(Db::Sqlite(sqlite::open(spec.as_ref())?))
    }
}

/// Bring the schema up to date (safe with several collectors starting at
/// once on PostgreSQL: they take turns).
pub fn migrate(db: &mut Db) -> Result<usize> {
    match db {
        Db::Sqlite(c) => Ok(sqlite::migrate(c)?),
        Db::Postgres(c) => pg::migrate(c),
    }
}

impl Db {
    /// Store batches in one transaction (with their rollups): per batch,
    /// (stored, duplicates). `known`: the SQLite writer's cache of rollup
    /// rows (PostgreSQL keeps none: another collector may write too).
    pub fn write(
        &mut self,
        batches: &[&[RequestRecord]],
        known: &mut Known,
    ) -> Result<Vec<(u32, u32)>> {
        match self {
            Db::Sqlite(conn) => Ok(sqlite::write(conn, batches, known)?),
            Db::Postgres(c) => pg::write(c, batches),
        }
    }

    /// One prune step: at most `step` records (and rollup rows) older than
    /// `cutoff` or past `max_records`; whether more is left.
    pub fn prune_step(&mut self, cutoff: Option<i64>, max_records: Option<i64>, step: i64) -> bool {
        match self {
            Db::Sqlite(conn) => sqlite::prune_step(conn, cutoff, max_records, step),
            Db::Postgres(c) => pg::prune_step(c, cutoff, max_records, step).unwrap_or_else(|e| {
                eprintln!("portcullis-collector: retention prune failed: {e}");
                false
            }),
        }
    }

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
                        team: r.get(22)?,
                        usage_estimated: r.get(23)?,
                        price_source: r.get(24)?,
                        budget_routed: r.get(25)?,
                        ttft_ms: r.get(26)?,
                        trace_id: r.get(27)?,
                        api: r.get(28)?,
                        mcp_method: r.get(29)?,
                        rpc_error: r.get(30)?,
                        request_bytes: r.get(31)?,
                        response_bytes: r.get(32)?,
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
            Db::Sqlite(conn) => Ok(sqlite::count(conn)?),
        }
    }
}
