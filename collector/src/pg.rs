//! PostgreSQL: the same schema, rollups and guarantees as SQLite, for
//! several collectors writing into one database.
//!
//! A batch is one transaction, acknowledged after its commit. Records go in
//! with one multi-row `INSERT ... ON CONFLICT DO NOTHING RETURNING`, so a
//! re-send (to this collector or another one) stores nothing twice; only
//! the records it stored add to the rollups. Rollup rows are merged under
//! row locks (`SELECT ... FOR UPDATE`), taken in one order by every writer,
//! so concurrent collectors never lose an update nor deadlock; no writer
//! keeps rows in memory (another may have changed them).

use crate::proto::RequestRecord;
use crate::rollup::{failure_upsert, Counts, Dims, Pending};
use crate::rollup::{Table, ROLLUP_TABLES};
use crate::types::{DbError, Recent, Result};
use postgres::types::ToSql;
use postgres::{Client, NoTls, Transaction};
use std::collections::HashSet;

/// SQLite's schema (`sqlite::MIGRATIONS`, the one list of versions) in
/// PostgreSQL's types; `portcullis_schema` says how many ran.
fn dialect(sqlite: &str) -> String {
    sqlite
        .replace("INTEGER", "BIGINT")
        .replace("BLOB", "BYTEA")
        .replace("DEFAULT x''", "DEFAULT ''::bytea")
        .replace(") WITHOUT ROWID", ")")
}

/// Any number fixed for this schema: collectors starting at once migrate in
/// turn under this advisory lock.
const MIGRATION_LOCK: i64 = 0x706f_7274_6375;

pub fn connect(url: &str) -> Result<Client> {
    Ok(Client::connect(url, NoTls)?)
}

pub fn migrate(c: &mut Client) -> Result<usize> {
    let mut tx = c.transaction()?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])?;
    tx.batch_execute("CREATE TABLE IF NOT EXISTS portcullis_schema (version BIGINT NOT NULL)")?;
    let current: Option<i64> = tx
        .query_opt("SELECT version FROM portcullis_schema", &[])?
        .map(|r| r.try_get(0))
        .transpose()?;
    if current.is_none() {
        tx.execute("INSERT INTO portcullis_schema (version) VALUES (0)", &[])?;
    }
    let current = usize::try_from(current.unwrap_or(0)).unwrap_or(0);
    let migrations = crate::sqlite::MIGRATIONS;
    for (i, m) in migrations.iter().enumerate().skip(current) {
        tx.batch_execute(&dialect(m))?;
        let v = i64::try_from(i + 1).unwrap_or(i64::MAX);
        tx.execute("UPDATE portcullis_schema SET version = $1", &[&v])?;
    }
    tx.commit()?;
    Ok(migrations.len())
}

fn i(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The columns a record is stored in, in order.
const COLUMNS: &str = "request_id, time_ms, client, requested_model, model, provider, experiment, arm, cache,
    attempts, attempt_count, status, error, latency_ms, ttfb_ms, stream, prompt_tokens, completion_tokens,
    cached_tokens, reasoning_tokens, cost_micros, prompt, completion, limited_by, guardrails,
    team, usage_estimated, price_source, budget_routed, ttft_ms, trace_id, api,
    mcp_method, rpc_error, request_bytes, response_bytes";
const NCOLS: usize = 36;

/// A record's values, owned, in [`COLUMNS`] order.
fn values(id: String, r: &RequestRecord) -> Vec<Box<dyn ToSql + Sync>> {
    let attempts: Vec<serde_json::Value> = r
        .attempts
        .iter()
        .map(|a| serde_json::json!({"provider": a.provider, "status": a.status, "cause": a.cause}))
        .collect();
    vec![
        Box::new(id),
        Box::new(i(r.time_ms)),
        Box::new(r.client.clone()),
        Box::new(r.requested_model.clone()),
        Box::new(r.model.clone()),
        Box::new(r.provider.clone()),
        Box::new(r.experiment.clone()),
        Box::new(r.arm.clone()),
        Box::new(r.cache.clone()),
        Box::new(serde_json::Value::Array(attempts).to_string()),
        Box::new(i(r.attempts.len() as u64)),
        Box::new(i64::from(r.status)),
        Box::new(r.error.clone()),
        Box::new(i(r.latency_ms)),
        Box::new(i(r.ttfb_ms)),
        Box::new(i64::from(r.stream)),
        Box::new(i(r.prompt_tokens)),
        Box::new(i(r.completion_tokens)),
        Box::new(i(r.cached_tokens)),
        Box::new(i(r.reasoning_tokens)),
        Box::new(r.cost_micros),
        Box::new((!r.prompt.is_empty()).then(|| r.prompt.clone())),
        Box::new((!r.completion.is_empty()).then(|| r.completion.clone())),
        Box::new(r.limited_by.clone()),
        Box::new(r.guardrails.clone()),
        Box::new(r.team.clone()),
        Box::new(i64::from(r.usage_estimated)),
        Box::new(r.price_source.clone()),
        Box::new(i64::from(r.budget_routed)),
        Box::new(i(r.ttft_ms)),
        Box::new(r.trace_id.clone()),
        Box::new(r.api.clone()),
        Box::new(r.mcp_method.clone()),
        Box::new(r.rpc_error),
        Box::new(i(r.request_bytes)),
        Box::new(i(r.response_bytes)),
    ]
}

/// Insert `rows` (id, record) in one statement; the ids that went in.
fn insert(tx: &mut Transaction<'_>, rows: &[(String, &RequestRecord)]) -> Result<HashSet<String>> {
    let mut out = HashSet::new();
    // PostgreSQL allows 65,535 parameters per statement.
    for chunk in rows.chunks(1000) {
        let mut sql = format!("INSERT INTO requests ({COLUMNS}) VALUES ");
        let mut params: Vec<Box<dyn ToSql + Sync>> = Vec::with_capacity(chunk.len() * NCOLS);
        for (n, (id, r)) in chunk.iter().enumerate() {
            if n > 0 {
                sql.push(',');
            }
            sql.push('(');
            for c in 0..NCOLS {
                if c > 0 {
                    sql.push(',');
                }
                sql.push_str(&format!("${}", n * NCOLS + c + 1));
            }
            sql.push(')');
            params.extend(values(id.clone(), r));
        }
        sql.push_str(" ON CONFLICT (request_id) DO NOTHING RETURNING request_id");
        let refs: Vec<&(dyn ToSql + Sync)> = params.iter().map(|p| p.as_ref()).collect();
        for row in tx.query(sql.as_str(), &refs)? {
            out.insert(row.try_get::<_, String>(0)?);
        }
    }
    Ok(out)
}

/// Whether the stored record under `r.request_id` is this same request.
fn same(tx: &mut Transaction<'_>, r: &RequestRecord) -> Result<bool> {
    let row = tx.query_opt(
        "SELECT time_ms = $2 AND latency_ms = $3 AND client = $4 AND requested_model = $5
            AND status = $6 AND prompt_tokens = $7 AND completion_tokens = $8
         FROM requests WHERE request_id = $1",
        &[
            &r.request_id,
            &i(r.time_ms),
            &i(r.latency_ms),
            &r.client,
            &r.requested_model,
            &i64::from(r.status),
            &i(r.prompt_tokens),
            &i(r.completion_tokens),
        ],
    )?;
    Ok(row
        .map(|r| r.try_get::<_, bool>(0))
        .transpose()?
        .unwrap_or(false))
}

/// Store the batches of one group in one transaction; (stored, duplicates)
/// per batch, as SQLite's writer answers.
pub fn write(c: &mut Client, batches: &[&[RequestRecord]]) -> Result<Vec<(u32, u32)>> {
    let mut tx = c.transaction()?;
    // First occurrences go in together; a request id repeated within the
    // group is decided after them, one by one.
    let mut seen = HashSet::new();
    let mut bulk = Vec::new();
    for r in batches.iter().flat_map(|b| b.iter()) {
        if seen.insert(r.request_id.clone()) {
            bulk.push((r.request_id.clone(), r));
        }
    }
    bulk.sort_by(|a, b| a.0.cmp(&b.0));
    let mut inserted = insert(&mut tx, &bulk)?;
    let mut rollups = Pending::default();
    let mut counts = Vec::with_capacity(batches.len());
    for b in batches {
        let (mut stored, mut dup) = (0u32, 0u32);
        for r in b.iter() {
            // Taken once: a later record with this id is not new by it.
            let new = if inserted.remove(&r.request_id) {
                true
            } else if same(&mut tx, r)? {
                false
            } else {
                let id = format!("{}~{:016x}", r.request_id, crate::sqlite::fingerprint(r));
                insert(&mut tx, &[(id, r)])?.len() == 1
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
    for ((table, start, provider, cause), n) in rollups.take_failures() {
        tx.execute(
            failure_upsert(table).as_str(),
            &[&start, &provider, &cause, &n],
        )?;
    }
    merge_rollups(&mut tx, rollups)?;
    tx.commit()?;
    Ok(counts)
}

/// Merge a group's rollups into the stored rows: per table, three
/// statements however many rows — create the missing rows empty, lock and
/// read them all (in key order, as every writer does), write them merged.
fn merge_rollups(tx: &mut Transaction<'_>, rollups: Pending) -> Result<()> {
    let mut rows = rollups.into_rows();
    rows.sort_by(|a, b| key_of(a).cmp(&key_of(b)));
    for table in [Table::Minute, Table::Hour] {
        let mine: Vec<&Row> = rows.iter().filter(|r| r.0 == table).collect();
        // 7 parameters a row; PostgreSQL allows 65,535 a statement.
        for chunk in mine.chunks(1000) {
            merge_chunk(tx, table, chunk)?;
        }
    }
    Ok(())
}

type Row = (Table, i64, Dims, Counts);

fn key_of(r: &Row) -> (Table, i64, &str, &str, &str, &str, &str) {
    let d = &r.2;
    (
        r.0,
        r.1,
        &d.provider,
        &d.model,
        &d.client,
        &d.experiment,
        &d.arm,
    )
}

/// `($1::BIGINT, $2::TEXT, ...)` tuples for `rows` rows of `types`.
fn tuples(rows: usize, types: &[&str]) -> String {
    let mut out = String::new();
    for r in 0..rows {
        if r > 0 {
            out.push(',');
        }
        out.push('(');
        for (c, t) in types.iter().enumerate() {
            if c > 0 {
                out.push(',');
            }
            out.push_str(&format!("${}::{t}", r * types.len() + c + 1));
        }
        out.push(')');
    }
    out
}

const KEY_TYPES: [&str; 6] = ["BIGINT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT"];
const ROW_TYPES: [&str; 7] = ["BIGINT", "TEXT", "TEXT", "TEXT", "TEXT", "TEXT", "BYTEA"];
const KEY_COLUMNS: &str = "start_ms, provider, model, client, experiment, arm";

/// The parameters of `rows`: each row's key, then (with `cells`) the
/// cells to write for it.
fn row_params<'a>(
    rows: &'a [&'a Row],
    cells: Option<&'a [Vec<u8>]>,
) -> Vec<&'a (dyn ToSql + Sync)> {
    let mut p: Vec<&(dyn ToSql + Sync)> = Vec::with_capacity(rows.len() * 7);
    for (n, r) in rows.iter().enumerate() {
        let d = &r.2;
        p.extend([
            &r.1 as &(dyn ToSql + Sync),
            &d.provider,
            &d.model,
            &d.client,
            &d.experiment,
            &d.arm,
        ]);
        if let Some(c) = cells.and_then(|c| c.get(n)) {
            p.push(c);
        }
    }
    p
}

fn merge_chunk(tx: &mut Transaction<'_>, table: Table, rows: &[&Row]) -> Result<()> {
    let t = table.name();
    let empty = vec![Counts::default().encode(); rows.len()];
    tx.execute(
        format!(
            "INSERT INTO {t} ({KEY_COLUMNS}, cells) VALUES {} ON CONFLICT DO NOTHING",
            tuples(rows.len(), &ROW_TYPES)
        )
        .as_str(),
        &row_params(rows, Some(&empty)),
    )?;
    let stored = tx.query(
        format!(
            "SELECT {KEY_COLUMNS}, cells FROM {t} WHERE ({KEY_COLUMNS}) IN ({})
             ORDER BY {KEY_COLUMNS} FOR UPDATE",
            tuples(rows.len(), &KEY_TYPES)
        )
        .as_str(),
        &row_params(rows, None),
    )?;
    let mut current = std::collections::HashMap::with_capacity(stored.len());
    for s in &stored {
        let key = (
            s.try_get::<_, i64>(0)?,
            s.try_get::<_, String>(1)?,
            s.try_get::<_, String>(2)?,
            s.try_get::<_, String>(3)?,
            s.try_get::<_, String>(4)?,
            s.try_get::<_, String>(5)?,
        );
        let cells: Vec<u8> = s.try_get(6)?;
        let counts = Counts::decode(&cells)
            .ok_or_else(|| DbError(format!("{t}: a row that does not decode")))?;
        current.insert(key, counts);
    }
    let mut merged: Vec<Vec<u8>> = Vec::with_capacity(rows.len());
    for r in rows {
        let d = &r.2;
        let key = (
            r.1,
            d.provider.clone(),
            d.model.clone(),
            d.client.clone(),
            d.experiment.clone(),
            d.arm.clone(),
        );
        let mut c = current
            .remove(&key)
            .ok_or_else(|| DbError(format!("{t}: a row that was just made is missing")))?;
        c.merge(&r.3);
        merged.push(c.encode());
    }
    tx.execute(
        format!(
            "UPDATE {t} SET cells = v.cells FROM (VALUES {}) AS v({KEY_COLUMNS}, cells)
             WHERE {t}.start_ms = v.start_ms AND {t}.provider = v.provider AND {t}.model = v.model
               AND {t}.client = v.client AND {t}.experiment = v.experiment AND {t}.arm = v.arm",
            tuples(rows.len(), &ROW_TYPES)
        )
        .as_str(),
        &row_params(rows, Some(&merged)),
    )?;
    Ok(())
}

/// One prune step (see the SQLite writer's): rows past the age limit, and
/// the oldest records past the count limit, at most `step` of each.
pub fn prune_step(
    c: &mut Client,
    cutoff: Option<i64>,
    max_records: Option<i64>,
    step: i64,
) -> Result<bool> {
    let mut more = false;
    if let Some(cutoff) = cutoff {
        let n = c.execute(
            "DELETE FROM requests WHERE ctid IN (SELECT ctid FROM requests WHERE time_ms < $1 LIMIT $2)",
            &[&cutoff, &step],
        )?;
        more |= i(n) == step;
        for t in ROLLUP_TABLES {
            let sql = format!(
                "DELETE FROM {t} WHERE ctid IN (SELECT ctid FROM {t} WHERE start_ms < $1 LIMIT $2)"
            );
            more |= i(c.execute(sql.as_str(), &[&cutoff, &step])?) == step;
        }
    }
    if let Some(max) = max_records {
        let total: i64 = c
            .query_one("SELECT COUNT(*) FROM requests", &[])?
            .try_get(0)?;
        let over = total.saturating_sub(max);
        if over > 0 {
            c.execute(
                "DELETE FROM requests WHERE ctid IN (SELECT ctid FROM requests ORDER BY time_ms LIMIT $1)",
                &[&over.min(step)],
            )?;
            more |= over > step;
        }
    }
    Ok(more)
}

pub fn rollup_rows(
    c: &mut Client,
    table: Table,
    lo: i64,
    hi: i64,
) -> Result<Vec<(i64, Dims, Counts)>> {
    let sql = format!(
        "SELECT start_ms, provider, model, client, experiment, arm, cells FROM {}
         WHERE start_ms >= $1 AND start_ms < $2 ORDER BY start_ms",
        table.name()
    );
    let mut out = Vec::new();
    for r in c.query(sql.as_str(), &[&lo, &hi])? {
        let cells: Vec<u8> = r.try_get(6)?;
        out.push((
            r.try_get(0)?,
            Dims {
                provider: r.try_get(1)?,
                model: r.try_get(2)?,
                client: r.try_get(3)?,
                experiment: r.try_get(4)?,
                arm: r.try_get(5)?,
            },
            Counts::decode(&cells).unwrap_or_default(),
        ));
    }
    Ok(out)
}

pub fn failure_rows(
    c: &mut Client,
    sql: &str,
    lo: i64,
    hi: i64,
) -> Result<Vec<(String, String, i64)>> {
    let mut out = Vec::new();
    for r in c.query(sql, &[&lo, &hi])? {
        out.push((r.try_get(0)?, r.try_get(1)?, r.try_get(2)?));
    }
    Ok(out)
}

pub fn recent(c: &mut Client, sql: &str, limit: i64) -> Result<Vec<Recent>> {
    let mut out = Vec::new();
    for r in c.query(sql, &[&limit])? {
        out.push(Recent {
            request_id: r.try_get(0)?,
            time_ms: r.try_get(1)?,
            client: r.try_get(2)?,
            requested_model: r.try_get(3)?,
            model: r.try_get(4)?,
            provider: r.try_get(5)?,
            experiment: r.try_get(6)?,
            arm: r.try_get(7)?,
            cache: r.try_get(8)?,
            attempts: r.try_get(9)?,
            status: r.try_get(10)?,
            error: r.try_get(11)?,
            latency_ms: r.try_get(12)?,
            ttfb_ms: r.try_get(13)?,
            stream: r.try_get::<_, i64>(14)? != 0,
            prompt_tokens: r.try_get(15)?,
            completion_tokens: r.try_get(16)?,
            cached_tokens: r.try_get(17)?,
            reasoning_tokens: r.try_get(18)?,
            cost_micros: r.try_get(19)?,
            limited_by: r.try_get(20)?,
            guardrails: r.try_get(21)?,
            team: r.try_get(22)?,
            usage_estimated: r.try_get::<_, i64>(23)? != 0,
            price_source: r.try_get(24)?,
            budget_routed: r.try_get::<_, i64>(25)? != 0,
            ttft_ms: r.try_get(26)?,
            trace_id: r.try_get(27)?,
            api: r.try_get(28)?,
            mcp_method: r.try_get(29)?,
            rpc_error: r.try_get(30)?,
            request_bytes: r.try_get(31)?,
            response_bytes: r.try_get(32)?,
        });
    }
    Ok(out)
}
