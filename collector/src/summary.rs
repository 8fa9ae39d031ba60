//! The query API's figures, computed in SQL over the stored records.

use rusqlite::{params, Connection};
use serde::Serialize;

#[derive(Debug, Serialize, PartialEq)]
pub struct Group {
    pub key: String,
    pub requests: i64,
    pub success_rate: f64,
    pub avg_latency_ms: f64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Summary {
    pub since_ms: i64,
    pub total: i64,
    pub success_rate: f64,
    pub cache_hit_rate: f64,
    pub fallbacks: i64,
    pub avg_latency_ms: f64,
    pub p50_latency_ms: i64,
    pub p95_latency_ms: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
    pub by_provider: Vec<Group>,
    pub by_model: Vec<Group>,
    pub by_experiment: Vec<Group>,
}

fn ratio(a: i64, b: i64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Latency at quantile `q` by nearest rank.
fn quantile(conn: &Connection, since: i64, n: i64, q: f64) -> rusqlite::Result<i64> {
    if n == 0 {
        return Ok(0);
    }
    let rank = ((q * n as f64).ceil() as i64).clamp(1, n) - 1;
    conn.query_row(
        "SELECT latency_ms FROM requests WHERE time_ms >= ?1 ORDER BY latency_ms LIMIT 1 OFFSET ?2",
        params![since, rank],
        |r| r.get(0),
    )
}

fn groups(conn: &Connection, since: i64, key: &str) -> rusqlite::Result<Vec<Group>> {
    // `key` is one of our own column expressions, never user input.
    let sql = format!(
        "SELECT {key} AS k, COUNT(*), SUM(status BETWEEN 200 AND 299), AVG(latency_ms),
                SUM(prompt_tokens), SUM(completion_tokens), SUM(cost_micros)
         FROM requests WHERE time_ms >= ?1 AND {key} != '' GROUP BY k ORDER BY COUNT(*) DESC, k"
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map([since], |r| {
        let n: i64 = r.get(1)?;
        Ok(Group {
            key: r.get(0)?,
            requests: n,
            success_rate: ratio(r.get::<_, Option<i64>>(2)?.unwrap_or(0), n),
            avg_latency_ms: r.get::<_, Option<f64>>(3)?.unwrap_or(0.0),
            prompt_tokens: r.get::<_, Option<i64>>(4)?.unwrap_or(0),
            completion_tokens: r.get::<_, Option<i64>>(5)?.unwrap_or(0),
            cost_usd: r.get::<_, Option<i64>>(6)?.unwrap_or(0) as f64 / 1e6,
        })
    })?;
    rows.collect()
}

pub fn summary(conn: &Connection, since_ms: i64) -> rusqlite::Result<Summary> {
    let (total, ok, hits, fallbacks, avg, pt, ct, cost): (i64, i64, i64, i64, f64, i64, i64, i64) = conn.query_row(
        "SELECT COUNT(*), COALESCE(SUM(status BETWEEN 200 AND 299), 0), COALESCE(SUM(cache = 'hit'), 0),
                COALESCE(SUM(attempt_count > 1), 0), COALESCE(AVG(latency_ms), 0),
                COALESCE(SUM(prompt_tokens), 0), COALESCE(SUM(completion_tokens), 0), COALESCE(SUM(cost_micros), 0)
         FROM requests WHERE time_ms >= ?1",
        [since_ms],
        |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?, r.get(7)?)),
    )?;
    Ok(Summary {
        since_ms,
        total,
        success_rate: ratio(ok, total),
        cache_hit_rate: ratio(hits, total),
        fallbacks,
        avg_latency_ms: avg,
        p50_latency_ms: quantile(conn, since_ms, total, 0.5)?,
        p95_latency_ms: quantile(conn, since_ms, total, 0.95)?,
        prompt_tokens: pt,
        completion_tokens: ct,
        cost_usd: cost as f64 / 1e6,
        by_provider: groups(conn, since_ms, "provider")?,
        by_model: groups(conn, since_ms, "model")?,
        by_experiment: groups(
            conn,
            since_ms,
            "CASE WHEN experiment = '' THEN '' ELSE experiment || '/' || arm END",
        )?,
    })
}

pub fn recent(conn: &Connection, limit: i64) -> rusqlite::Result<Vec<serde_json::Value>> {
    let mut stmt = conn.prepare(
        "SELECT request_id, time_ms, client, requested_model, model, provider, experiment, arm, cache, attempts,
                status, error, latency_ms, ttfb_ms, stream, prompt_tokens, completion_tokens, cached_tokens,
                reasoning_tokens, cost_micros
         FROM requests ORDER BY time_ms DESC, request_id LIMIT ?1",
    )?;
    let rows = stmt.query_map([limit], |r| {
        let attempts: String = r.get(9)?;
        Ok(serde_json::json!({
            "request_id": r.get::<_, String>(0)?,
            "time_ms": r.get::<_, i64>(1)?,
            "client": r.get::<_, String>(2)?,
            "requested_model": r.get::<_, String>(3)?,
            "model": r.get::<_, String>(4)?,
            "provider": r.get::<_, String>(5)?,
            "experiment": r.get::<_, String>(6)?,
            "arm": r.get::<_, String>(7)?,
            "cache": r.get::<_, String>(8)?,
            "attempts": serde_json::from_str::<serde_json::Value>(&attempts).unwrap_or_default(),
            "status": r.get::<_, i64>(10)?,
            "error": r.get::<_, String>(11)?,
            "latency_ms": r.get::<_, i64>(12)?,
            "ttfb_ms": r.get::<_, i64>(13)?,
            "stream": r.get::<_, bool>(14)?,
            "prompt_tokens": r.get::<_, i64>(15)?,
            "completion_tokens": r.get::<_, i64>(16)?,
            "cached_tokens": r.get::<_, i64>(17)?,
            "reasoning_tokens": r.get::<_, i64>(18)?,
            "cost_usd": r.get::<_, i64>(19)? as f64 / 1e6,
        }))
    })?;
    rows.collect()
}
