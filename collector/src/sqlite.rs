//! SQLite, the embedded default: the schema's migrations (the one list of
//! versions, which PostgreSQL translates), opening, the write of a group of
//! batches with their rollups in one transaction, pruning, counting.

use crate::proto::RequestRecord;
use crate::rollup::{self, Known, Pending, ROLLUP_TABLES};
use rusqlite::{params, Connection, OptionalExtension};
use std::path::Path;

/// Schema migrations, applied in order; `PRAGMA user_version` says how many ran.
pub(crate) const MIGRATIONS: &[&str] = &[
    "CREATE TABLE requests (
        request_id TEXT PRIMARY KEY,
        time_ms INTEGER NOT NULL,
        client TEXT NOT NULL,
        requested_model TEXT NOT NULL,
        model TEXT NOT NULL,
        provider TEXT NOT NULL,
        experiment TEXT NOT NULL,
        arm TEXT NOT NULL,
        cache TEXT NOT NULL,
        attempts TEXT NOT NULL,
        attempt_count INTEGER NOT NULL,
        status INTEGER NOT NULL,
        error TEXT NOT NULL,
        latency_ms INTEGER NOT NULL,
        ttfb_ms INTEGER NOT NULL,
        stream INTEGER NOT NULL,
        prompt_tokens INTEGER NOT NULL,
        completion_tokens INTEGER NOT NULL,
        cached_tokens INTEGER NOT NULL,
        reasoning_tokens INTEGER NOT NULL,
        cost_micros INTEGER NOT NULL,
        prompt TEXT,
        completion TEXT
    );
    CREATE INDEX requests_time ON requests(time_ms);",
    rollup::SCHEMA,
    "ALTER TABLE requests ADD COLUMN limited_by TEXT NOT NULL DEFAULT '';",
    rollup::FAILURES_SCHEMA,
    "ALTER TABLE requests ADD COLUMN guardrails TEXT NOT NULL DEFAULT '';",
    "ALTER TABLE requests ADD COLUMN team TEXT NOT NULL DEFAULT '';
     ALTER TABLE requests ADD COLUMN usage_estimated INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE requests ADD COLUMN price_source TEXT NOT NULL DEFAULT '';
     ALTER TABLE requests ADD COLUMN budget_routed INTEGER NOT NULL DEFAULT 0;",
    "ALTER TABLE requests ADD COLUMN ttft_ms INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE requests ADD COLUMN trace_id BLOB NOT NULL DEFAULT x'';
     ALTER TABLE requests ADD COLUMN api TEXT NOT NULL DEFAULT '';",
    // MCP requests (#47): the JSON-RPC method and error, the sizes.
    "ALTER TABLE requests ADD COLUMN mcp_method TEXT NOT NULL DEFAULT '';
     ALTER TABLE requests ADD COLUMN rpc_error INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE requests ADD COLUMN request_bytes INTEGER NOT NULL DEFAULT 0;
     ALTER TABLE requests ADD COLUMN response_bytes INTEGER NOT NULL DEFAULT 0;",
];

/// Which migration makes the failed-attempt rollups (and fills them from
/// the records already stored).
const FAILURES_MIGRATION: usize = 3;

/// Which migration builds the rollups of records stored before them.
const ROLLUPS_MIGRATION: usize = 1;

pub fn open(path: &Path) -> rusqlite::Result<Connection> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(conn)
}

pub fn migrate(conn: &mut Connection) -> rusqlite::Result<usize> {
    let current: usize =
        conn.query_row("PRAGMA user_version", [], |r| r.get::<_, i64>(0))? as usize;
    for (i, m) in MIGRATIONS.iter().enumerate().skip(current) {
        let tx = conn.transaction()?;
        tx.execute_batch(m)?;
        if i == ROLLUPS_MIGRATION {
            rollup::backfill(&tx)?;
        }
        if i == FAILURES_MIGRATION {
            tx.execute_batch(rollup::FAILURES_BACKFILL)?;
        }
        tx.pragma_update(None, "user_version", (i + 1) as i64)?;
        tx.commit()?;
    }
    Ok(MIGRATIONS.len())
}

/// What makes two records with one request id the same request: start
/// time, latency, client, requested model, status and tokens. FNV-1a 64 over
/// those fields, fixed across versions (a re-send after an upgrade still
/// matches).
pub fn fingerprint(r: &RequestRecord) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        // A separator, so ("ab","c") and ("a","bc") differ.
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    eat(&r.time_ms.to_le_bytes());
    eat(&r.latency_ms.to_le_bytes());
    eat(r.client.as_bytes());
    eat(r.requested_model.as_bytes());
    eat(&r.status.to_le_bytes());
    eat(&r.prompt_tokens.to_le_bytes());
    eat(&r.completion_tokens.to_le_bytes());
    h
}

pub fn write(
    conn: &mut Connection,
    batches: &[&[RequestRecord]],
    known: &mut Known,
) -> rusqlite::Result<Vec<(u32, u32)>> {
    let tx = conn.transaction()?;
    let mut counts = Vec::with_capacity(batches.len());
    let mut rollups = Pending::default();
    {
        let mut stmt = tx.prepare_cached(
            "INSERT OR IGNORE INTO requests (request_id, time_ms, client, requested_model, model, provider,
                experiment, arm, cache, attempts, attempt_count, status, error, latency_ms, ttfb_ms, stream,
                prompt_tokens, completion_tokens, cached_tokens, reasoning_tokens, cost_micros, prompt, completion, limited_by, guardrails,
                team, usage_estimated, price_source, budget_routed, ttft_ms, trace_id, api,
                mcp_method, rpc_error, request_bytes, response_bytes)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25,
                ?26, ?27, ?28, ?29, ?30, ?31, ?32, ?33, ?34, ?35, ?36)",
        )?;
        let mut same = tx.prepare_cached(
            "SELECT time_ms = ?2 AND latency_ms = ?3 AND client = ?4 AND requested_model = ?5
                AND status = ?6 AND prompt_tokens = ?7 AND completion_tokens = ?8
             FROM requests WHERE request_id = ?1",
        )?;
        for batch in batches {
            let (mut stored, mut dup) = (0u32, 0u32);
            for r in batch.iter() {
                let attempts: Vec<serde_json::Value> = r
                    .attempts
                    .iter()
                    .map(|a| serde_json::json!({"provider": a.provider, "status": a.status, "cause": a.cause}))
                    .collect();
                let attempts = serde_json::Value::Array(attempts).to_string();
                let mut insert = |id: &str| {
                    stmt.execute(params![
                        id,
                        r.time_ms as i64,
                        r.client,
                        r.requested_model,
                        r.model,
                        r.provider,
                        r.experiment,
                        r.arm,
                        r.cache,
                        attempts,
                        r.attempts.len() as i64,
                        r.status,
                        r.error,
                        r.latency_ms as i64,
                        r.ttfb_ms as i64,
                        r.stream,
                        r.prompt_tokens as i64,
                        r.completion_tokens as i64,
                        r.cached_tokens as i64,
                        r.reasoning_tokens as i64,
                        r.cost_micros,
                        (!r.prompt.is_empty()).then_some(&r.prompt),
                        (!r.completion.is_empty()).then_some(&r.completion),
                        r.limited_by,
                        r.guardrails,
                        r.team,
                        r.usage_estimated,
                        r.price_source,
                        r.budget_routed,
                        r.ttft_ms as i64,
                        r.trace_id,
                        r.api,
                        r.mcp_method,
                        r.rpc_error,
                        r.request_bytes as i64,
                        r.response_bytes as i64,
                    ])
                };
                // A request id already stored is a re-sent record (the same
                // request: skipped) or another request that reused the id (a
                // client that sends a fixed x-request-id): that one is kept
                // under `<id>~<fingerprint>`, where a re-send of it lands
                // again. At most three statements per record, however often
                // an id is reused.
                let new = if insert(&r.request_id)? == 1 {
                    true
                } else if same.query_row(
                    params![
                        r.request_id,
                        r.time_ms as i64,
                        r.latency_ms as i64,
                        r.client,
                        r.requested_model,
                        r.status,
                        r.prompt_tokens as i64,
                        r.completion_tokens as i64
                    ],
                    |row| row.get::<_, bool>(0),
                )? {
                    false
                } else {
                    insert(&format!("{}~{:016x}", r.request_id, fingerprint(r)))? == 1
                };
                if new {
                    rollups.add(r);
                    stored += 1;
                } else {
                    dup += 1;
                }
            }
            counts.push((stored, dup));
        }
    }
    // In the records' transaction: the rollups never disagree with what was
    // acknowledged.
    rollups.write(&tx, known)?;
    tx.commit()?;
    Ok(counts)
}

/// One small prune step: deletes at most `step` rows of each kind (records
/// older than `cutoff` or past `max_records`, rollups older than `cutoff`).
/// Returns whether more is left.
pub fn prune_step(
    conn: &Connection,
    cutoff: Option<i64>,
    max_records: Option<i64>,
    step: i64,
) -> bool {
    let run = |sql: &str, p: [i64; 2]| match conn.execute(sql, p) {
        Ok(n) => n as i64,
        Err(e) => {
            eprintln!("portcullis-collector: retention prune failed: {e}");
            0
        }
    };
    let mut more = false;
    if let Some(cutoff) = cutoff {
        let records = "DELETE FROM requests WHERE rowid IN
                         (SELECT rowid FROM requests WHERE time_ms < ?1 LIMIT ?2)";
        more |= run(records, [cutoff, step]) == step;
        for table in ROLLUP_TABLES {
            // WITHOUT ROWID tables: deleted by their key's first column.
            let sql = format!(
                "DELETE FROM {table} WHERE start_ms IN
                   (SELECT DISTINCT start_ms FROM {table} WHERE start_ms < ?1 LIMIT ?2)"
            );
            more |= run(&sql, [cutoff, step / 100]) == step / 100;
        }
    }
    if let Some(max) = max_records {
        let over = count(conn).unwrap_or(0).saturating_sub(max);
        if over > 0 {
            let oldest = "DELETE FROM requests WHERE rowid IN
                            (SELECT rowid FROM requests ORDER BY time_ms LIMIT ?1 OFFSET ?2)";
            run(oldest, [over.min(step), 0]);
            more |= over > step;
        }
    }
    more
}

/// How many records there are (tests, health).
pub fn count(conn: &Connection) -> rusqlite::Result<i64> {
    conn.query_row("SELECT COUNT(*) FROM requests", [], |r| r.get(0))
}

pub fn exists(conn: &Connection, request_id: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT 1 FROM requests WHERE request_id = ?1",
        [request_id],
        |_| Ok(()),
    )
    .optional()
    .map(|o| o.is_some())
}
