//! Spend against budget, per key and team and period, for the dashboard
//! (`GET /v1/budgets`). The budgets are the plugin config's
//! (`--plugin-config`, the same file Envoy's filter reads, read again when
//! it changes), compiled by the filter's own config compiler; the spend is
//! the recorded cost since each period began, read from the rollups (a
//! team's is its keys'). The filter's counters decide admissions; this is
//! the view of what the records say was spent.

use crate::db::{Db, Result};
use portcullis_core::limits::period::Period;
use portcullis_core::{
    compile::compile,
    config::{Gateway, Limits},
};
use serde::Serialize;
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

/// The plugin config file, compiled, kept until it changes.
pub struct PluginConfig {
    path: PathBuf,
    cached: Mutex<Option<(SystemTime, Arc<Gateway>)>>,
}

impl PluginConfig {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            cached: Mutex::new(None),
        }
    }

    /// The config as the file now holds it (the last one that compiled
    /// while the file does not).
    pub fn current(&self) -> std::result::Result<Arc<Gateway>, String> {
        let read_error = |e: std::io::Error| format!("{}: {e}", self.path.display());
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .map_err(read_error)?;
        let mut cached = self
            .cached
            .lock()
            .map_err(|_| "the plugin config cache is poisoned".to_string())?;
        if let Some((at, gw)) = cached.as_ref() {
            if *at == modified {
                return Ok(gw.clone());
            }
        }
        let bytes = std::fs::read(&self.path).map_err(read_error)?;
        match compile(&bytes) {
            Ok(gw) => {
                let gw = Arc::new(gw);
                *cached = Some((modified, gw.clone()));
                Ok(gw)
            }
            Err(e) => match cached.as_ref() {
                Some((_, gw)) => Ok(gw.clone()),
                None => Err(e),
            },
        }
    }
}

/// One budget and what the records say was spent of it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// `key` or `team`.
    pub level: &'static str,
    pub name: String,
    pub period: &'static str,
    pub budget_usd: f64,
    pub spent_usd: f64,
    pub left_usd: f64,
    /// Until the period ends (`None`: a `total` budget).
    pub resets_in_ms: Option<u64>,
}

/// Every budget of every key and team, tightest (least left) first.
pub fn budgets(db: &mut Db, gw: &Gateway, now_ms: i64) -> Result<Vec<Row>> {
    let now = u64::try_from(now_ms).unwrap_or(0);
    let offset = gw.budget_offset_ms;
    let levels: Vec<(&'static str, String, &Limits, Vec<String>)> = gw
        .clients
        .values()
        .map(|c| ("key", c.name.clone(), &c.limits, vec![c.name.clone()]))
        .chain(gw.teams.iter().enumerate().map(|(i, t)| {
            let members = gw
                .clients
                .values()
                .filter(|c| c.team == Some(i))
                .map(|c| c.name.clone())
                .collect();
            ("team", t.name.clone(), &t.limits, members)
        }))
        .filter(|(_, _, l, _)| !l.budgets.is_empty())
        .collect();
    // Spend per key since each period's start, one read of the rollups per
    // distinct start.
    let mut spent: HashMap<(i64, String), i64> = HashMap::new();
    let mut read: Vec<i64> = Vec::new();
    let mut rows = Vec::new();
    for (level, name, limits, members) in levels {
        for b in &limits.budgets {
            let since = period_start(b.period, now, offset);
            if !read.contains(&since) {
                for (d, c) in crate::summary::window_rows(db, since)? {
                    let e = spent.entry((since, d.client.clone())).or_default();
                    *e = e.saturating_add(c.cost_micros);
                }
                read.push(since);
            }
            let micros: i64 = members
                .iter()
                .map(|m| spent.get(&(since, m.clone())).copied().unwrap_or(0))
                .fold(0, i64::saturating_add);
            rows.push(Row {
                level,
                name: name.clone(),
                period: b.period.name(),
                budget_usd: b.micros as f64 / 1e6,
                spent_usd: micros as f64 / 1e6,
                left_usd: b.micros.saturating_sub(micros).max(0) as f64 / 1e6,
                resets_in_ms: b.period.ms_to_end(now, offset),
            });
        }
    }
    rows.sort_by(|a, b| {
        a.left_usd
            .total_cmp(&b.left_usd)
            .then_with(|| (a.level, &a.name, a.period).cmp(&(b.level, &b.name, b.period)))
    });
    Ok(rows)
}

/// When the period containing `now` began, in ms since the epoch (a
/// `total` budget: the first record kept).
fn period_start(p: Period, now: u64, offset_ms: i64) -> i64 {
    let Some(to_end) = p.ms_to_end(now, offset_ms) else {
        return 0;
    };
    let end = now.saturating_add(to_end);
    // The period before the end: step back one millisecond and find its
    // start by walking days (a month is at most 31).
    let index = p.index(now, offset_ms);
    let mut start = end;
    for _ in 0..32 {
        let prev = start.saturating_sub(86_400_000);
        if p.index(prev, offset_ms) != index {
            break;
        }
        start = prev;
    }
    i64::try_from(start).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::RequestRecord;

    /// 2026-12-02T07:30:00Z, a Wednesday.
    const NOW: i64 = 1_796_196_600_000;
    const DAY: i64 = 86_400_000;

    #[test]
    fn periods_start_at_their_calendar_start() {
        let now = NOW as u64;
        let day = period_start(Period::Day, now, 0);
        assert_eq!(day, NOW - 7 * 3_600_000 - 1_800_000, "midnight");
        assert_eq!(period_start(Period::Week, now, 0), day - 2 * DAY, "Monday");
        assert_eq!(period_start(Period::Month, now, 0), day - DAY, "the 1st");
        assert_eq!(period_start(Period::Total, now, 0), 0);
        // At +09:00 the day began at 15:00 UTC the day before.
        assert_eq!(
            period_start(Period::Day, now, 9 * 3_600_000),
            day - 9 * 3_600_000
        );
    }

    #[test]
    fn spend_is_summed_per_key_and_per_team_since_each_period_began() {
        let conn = rusqlite::Connection::open_in_memory().unwrap();
        let mut db = Db::Sqlite(conn);
        crate::db::migrate(&mut db).unwrap();
        let record = |id: &str, client: &str, time_ms: i64, cost: i64| RequestRecord {
            request_id: id.into(),
            client: client.into(),
            time_ms: time_ms as u64,
            status: 200,
            cost_micros: cost,
            ..RequestRecord::default()
        };
        let batch = [
            record("a1", "alice", NOW - 3_600_000, 1_000_000), // today
            record("a2", "alice", NOW - 2 * DAY, 2_000_000),   // this week (Monday)
            record("b1", "bob", NOW - 3_600_000, 500_000),     // today
            record("b2", "bob", NOW - 20 * DAY, 4_000_000),    // last month
        ];
        let mut known = crate::rollup::Known::default();
        let Db::Sqlite(conn) = &mut db else {
            unreachable!()
        };
        crate::sqlite::write(conn, &[&batch], &mut known).unwrap();
        let gw = compile(
            format!(
                "providers:\n  - {{name: p, cluster: p, host: p, models: [{{name: m}}]}}\nprices:\n  m: {{input: 1, output: 1}}\nteams:\n  - name: t\n    limits: {{budgets: [{{usd: 10, period: week}}, {{usd: 20, period: total}}]}}\nclients:\n  - {{name: alice, key_sha256: \"{}\", team: t, limits: {{budget_usd_per_day: 5}}}}\n  - {{name: bob, key_sha256: \"{}\", team: t}}\n",
                "1".repeat(64),
                "2".repeat(64)
            )
            .as_bytes(),
        )
        .unwrap();
        let rows = budgets(&mut db, &gw, NOW).unwrap();
        let row = |level: &str, name: &str, period: &str| {
            rows.iter()
                .find(|r| r.level == level && r.name == name && r.period == period)
                .cloned()
                .unwrap_or_else(|| panic!("no {level} {name} {period} in {rows:?}"))
        };
        let alice = row("key", "alice", "day");
        assert_eq!((alice.spent_usd, alice.left_usd), (1.0, 4.0));
        assert_eq!(
            alice.resets_in_ms,
            Some((16 * 3_600_000 + 1_800_000) as u64)
        );
        let week = row("team", "t", "week");
        assert_eq!(
            (week.spent_usd, week.left_usd),
            (3.5, 6.5),
            "alice 3 + bob 0.5"
        );
        let total = row("team", "t", "total");
        assert_eq!((total.spent_usd, total.resets_in_ms), (7.5, None));
        assert_eq!(rows.len(), 3, "bob has no budget of his own");
        assert_eq!(rows[0].name, "alice", "least left first");
    }
}
