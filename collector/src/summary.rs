//! The query API's figures: totals and groups from the rollups
//! ([`crate::rollup`]), so a summary costs the same at any number of
//! records; recent requests from the records.

use crate::db::{Db, Recent, Result, Table};
use crate::rollup::{Counts, Dims, HOUR_MS, MINUTE_MS};
use serde::Serialize;
use std::collections::HashMap;

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
    pub p99_latency_ms: i64,
    /// `exact` (read from the records, for windows of at most
    /// [`EXACT_QUANTILES_UP_TO`] records) or `histogram` (from the rollups:
    /// within 10% of the exact value).
    pub latency_quantiles: &'static str,
    /// Streams with a time to first token, and its median and 95th
    /// percentile from the rollups' histogram (within 10%; 0: none).
    pub streams: i64,
    pub p50_ttft_ms: i64,
    pub p95_ttft_ms: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
    pub by_provider: Vec<Group>,
    pub by_model: Vec<Group>,
    pub by_experiment: Vec<Group>,
    /// Requests and spend per client.
    pub by_client: Vec<Group>,
    /// Attempts that failed (and were fallen back from, or ended the
    /// request), by provider and cause, most first.
    pub failed_attempts: Vec<Failure>,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Failure {
    pub provider: String,
    pub cause: String,
    pub count: i64,
}

fn ratio(a: i64, b: i64) -> f64 {
    if b == 0 {
        0.0
    } else {
        a as f64 / b as f64
    }
}

/// Windows with at most this many records get exact percentiles, read
/// from the records; larger ones read them from the rollups' histogram.
pub const EXACT_QUANTILES_UP_TO: i64 = 10_000;

/// Latency at quantile `q` by nearest rank, from the records.
fn exact_quantile(db: &mut Db, since: i64, n: i64, q: f64) -> Result<i64> {
    if n == 0 {
        return Ok(0);
    }
    let rank = ((q * n as f64).ceil() as i64).clamp(1, n) - 1;
    db.latency_at(since, rank)
}

fn group(key: String, c: &Counts) -> Group {
    Group {
        key,
        requests: c.requests,
        success_rate: ratio(c.ok, c.requests),
        avg_latency_ms: ratio(c.latency_sum_ms, c.requests),
        prompt_tokens: c.prompt_tokens,
        completion_tokens: c.completion_tokens,
        cost_usd: c.cost_micros as f64 / 1e6,
    }
}

/// Groups by a key, busiest first (empty keys left out).
fn ranked(by: HashMap<String, Counts>) -> Vec<Group> {
    let mut out: Vec<Group> = by
        .into_iter()
        .filter(|(k, _)| !k.is_empty())
        .map(|(k, c)| group(k, &c))
        .collect();
    out.sort_by(|a, b| b.requests.cmp(&a.requests).then_with(|| a.key.cmp(&b.key)));
    out
}

/// The rollup rows of a window: whole hours from the hourly table, the
/// minutes before the first whole hour from the per-minute one.
/// A window's parts: minutes before its first whole hour, then hours.
fn grains(since_ms: i64) -> [(Table, i64, i64); 2] {
    let first_hour = since_ms
        .div_euclid(HOUR_MS)
        .saturating_add(i64::from(since_ms.rem_euclid(HOUR_MS) != 0))
        * HOUR_MS;
    [
        (Table::Minute, since_ms, first_hour),
        (Table::Hour, first_hour, i64::MAX),
    ]
}

/// A window's failed attempts, most first.
fn failures(db: &mut Db, since_ms: i64) -> Result<Vec<Failure>> {
    let mut by: HashMap<(String, String), i64> = HashMap::new();
    for (table, lo, hi) in grains(since_ms) {
        for (provider, cause, n) in db.failure_rows(table, lo, hi)? {
            let e = by.entry((provider, cause)).or_default();
            *e = e.saturating_add(n);
        }
    }
    let mut out: Vec<Failure> = by
        .into_iter()
        .map(|((provider, cause), count)| Failure {
            provider,
            cause,
            count,
        })
        .collect();
    out.sort_by(|a, b| {
        b.count
            .cmp(&a.count)
            .then_with(|| (&a.provider, &a.cause).cmp(&(&b.provider, &b.cause)))
    });
    Ok(out)
}

pub(crate) fn window_rows(db: &mut Db, since_ms: i64) -> Result<Vec<(Dims, Counts)>> {
    let mut out = Vec::new();
    for (table, lo, hi) in grains(since_ms) {
        out.extend(
            db.rollup_rows(table, lo, hi)?
                .into_iter()
                .map(|(_, d, c)| (d, c)),
        );
    }
    Ok(out)
}

/// The summary of the records since `since_ms` (rounded down to the
/// minute, the rollups' grain), read from the rollups: its cost follows the
/// window's length, not the number of records.
pub fn summary(db: &mut Db, since_ms: i64) -> Result<Summary> {
    let since_ms = since_ms.max(0) - since_ms.max(0).rem_euclid(MINUTE_MS);
    // Rows merged by their dimensions first (few), then grouped.
    let mut by_dims: HashMap<Dims, Counts> = HashMap::new();
    for (d, c) in window_rows(db, since_ms)? {
        by_dims.entry(d).or_default().merge(&c);
    }
    let mut total = Counts::default();
    let (mut by_provider, mut by_model, mut by_experiment, mut by_client) = (
        HashMap::new(),
        HashMap::new(),
        HashMap::new(),
        HashMap::new(),
    );
    for (d, c) in &by_dims {
        total.merge(c);
        let add =
            |m: &mut HashMap<String, Counts>, k: &str| m.entry(k.to_string()).or_default().merge(c);
        add(&mut by_provider, &d.provider);
        add(&mut by_model, &d.model);
        add(&mut by_client, &d.client);
        if !d.experiment.is_empty() {
            add(&mut by_experiment, &format!("{}/{}", d.experiment, d.arm));
        }
    }
    let exact = total.requests <= EXACT_QUANTILES_UP_TO;
    let mut quantile = |q: f64| -> Result<i64> {
        if exact {
            exact_quantile(db, since_ms, total.requests, q)
        } else {
            Ok(total.latency_quantile(q).round() as i64)
        }
    };
    let (p50, p95, p99) = (quantile(0.5)?, quantile(0.95)?, quantile(0.99)?);
    let failed_attempts = failures(db, since_ms)?;
    Ok(Summary {
        failed_attempts,
        since_ms,
        total: total.requests,
        success_rate: ratio(total.ok, total.requests),
        cache_hit_rate: ratio(total.cache_hits, total.requests),
        fallbacks: total.fallbacks,
        avg_latency_ms: ratio(total.latency_sum_ms, total.requests),
        p50_latency_ms: p50,
        p95_latency_ms: p95,
        p99_latency_ms: p99,
        latency_quantiles: if exact { "exact" } else { "histogram" },
        streams: i64::try_from(total.streams()).unwrap_or(i64::MAX),
        p50_ttft_ms: total.ttft_quantile(0.5).round() as i64,
        p95_ttft_ms: total.ttft_quantile(0.95).round() as i64,
        prompt_tokens: total.prompt_tokens,
        completion_tokens: total.completion_tokens,
        cost_usd: total.cost_micros as f64 / 1e6,
        by_provider: ranked(by_provider),
        by_model: ranked(by_model),
        by_experiment: ranked(by_experiment),
        by_client: ranked(by_client),
    })
}

pub fn recent(db: &mut Db, limit: i64) -> Result<Vec<serde_json::Value>> {
    Ok(db.recent(limit)?.iter().map(Recent::json).collect())
}

/// One point of a time series: a whole minute or hour.
#[derive(Debug, Serialize, PartialEq)]
pub struct Point {
    pub start_ms: i64,
    pub requests: i64,
    pub client_errors: i64,
    pub server_errors: i64,
    pub cache_hits: i64,
    pub fallbacks: i64,
    pub p50_latency_ms: i64,
    pub p95_latency_ms: i64,
    /// Streams' median time to first token (0: no stream).
    pub p50_ttft_ms: i64,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cost_usd: f64,
}

#[derive(Debug, Serialize, PartialEq)]
pub struct Series {
    pub since_ms: i64,
    pub step_ms: i64,
    pub points: Vec<Point>,
}

/// Windows up to this long are drawn per minute, longer ones per hour.
pub const MINUTE_STEPS_UP_TO_MS: i64 = 3 * HOUR_MS;

/// The window since `since_ms` as a series of whole minutes (windows up to
/// three hours) or whole hours, from the rollups; percentiles from each
/// point's histogram (within 10%). Buckets without requests are left out.
pub fn timeseries(db: &mut Db, since_ms: i64, now_ms: i64) -> Result<Series> {
    let (table, step) = if now_ms.saturating_sub(since_ms) <= MINUTE_STEPS_UP_TO_MS {
        (Table::Minute, MINUTE_MS)
    } else {
        (Table::Hour, HOUR_MS)
    };
    let since_ms = since_ms.max(0) - since_ms.max(0).rem_euclid(step);
    let mut by_start: std::collections::BTreeMap<i64, Counts> = Default::default();
    for (start, _, c) in db.rollup_rows(table, since_ms, i64::MAX)? {
        by_start.entry(start).or_default().merge(&c);
    }
    let points = by_start
        .into_iter()
        .map(|(start_ms, c)| Point {
            start_ms,
            requests: c.requests,
            client_errors: c.client_errors,
            server_errors: c.server_errors,
            cache_hits: c.cache_hits,
            fallbacks: c.fallbacks,
            p50_latency_ms: c.latency_quantile(0.5).round() as i64,
            p95_latency_ms: c.latency_quantile(0.95).round() as i64,
            p50_ttft_ms: c.ttft_quantile(0.5).round() as i64,
            prompt_tokens: c.prompt_tokens,
            completion_tokens: c.completion_tokens,
            cost_usd: c.cost_micros as f64 / 1e6,
        })
        .collect();
    Ok(Series {
        since_ms,
        step_ms: step,
        points,
    })
}
