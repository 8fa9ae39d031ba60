//! The writer: one thread owns the database connection (SQLite or
//! PostgreSQL: the same loop for both, `Db` speaks each one's SQL) and
//! commits batches in transactions; callers hand it work through a bounded
//! queue and get their answer once the batch is committed.

use crate::db::Db;
use crate::proto::RequestRecord;
use crate::rollup::Known;
pub use crate::sqlite::{count, exists, migrate, open};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{
    sync_channel, Receiver, RecvTimeoutError, SyncSender, TryRecvError, TrySendError,
};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Counters for `/metrics`.
#[derive(Default)]
pub struct Stats {
    pub ingested: AtomicU64,
    pub duplicates: AtomicU64,
    pub rejected: AtomicU64,
    pub batches: AtomicU64,
    pub queue_depth: AtomicU64,
    pub commit_micros_total: AtomicU64,
    pub commits: AtomicU64,
    pub failed_commits: AtomicU64,
    /// Ingest calls refused for a missing or wrong token.
    pub unauthenticated: AtomicU64,
}

pub type Ack = Result<(u32, u32), String>;

struct Job {
    records: Vec<RequestRecord>,
    done: oneshot::Sender<Ack>,
}

#[derive(Clone)]
pub struct Writer {
    tx: SyncSender<Job>,
    pub stats: Arc<Stats>,
}

#[derive(Debug)]
pub enum SubmitError {
    /// The queue is full: the caller should retry later.
    Full,
    /// The writer is gone.
    Closed,
}

impl Writer {
    /// Start the writer thread over `db`, with a queue of `capacity` batches.
    pub fn start(db: Db, capacity: usize, retention: Retention) -> Writer {
        Self::start_with(db, capacity, retention, None)
    }

    /// The same, handing every committed batch to the OTLP export.
    pub fn start_with(
        db: Db,
        capacity: usize,
        retention: Retention,
        export: Option<crate::otlp::Sink>,
    ) -> Writer {
        let (tx, rx) = sync_channel(capacity);
        let stats = Arc::new(Stats::default());
        let s = stats.clone();
        std::thread::Builder::new()
            .name("sqlite-writer".into())
            .spawn(move || run(db, rx, s, retention, export))
            .map(|_| ())
            .unwrap_or_else(|e| {
                eprintln!("portcullis-collector: cannot start the writer thread: {e}")
            });
        Writer { tx, stats }
    }

    /// Queue a batch; the receiver resolves once it is committed.
    pub fn submit(
        &self,
        records: Vec<RequestRecord>,
    ) -> Result<oneshot::Receiver<Ack>, SubmitError> {
        let (done, rx) = oneshot::channel();
        match self.tx.try_send(Job { records, done }) {
            Ok(()) => {
                self.stats.queue_depth.fetch_add(1, Ordering::Relaxed);
                Ok(rx)
            }
            Err(TrySendError::Full(_)) => {
                self.stats.rejected.fetch_add(1, Ordering::Relaxed);
                Err(SubmitError::Full)
            }
            Err(TrySendError::Disconnected(_)) => Err(SubmitError::Closed),
        }
    }
}

/// Most batches folded into one transaction.
const GROUP: usize = 64;

/// What the store keeps: records younger than `days`, and at most
/// `max_records` of them (the oldest go first). Rollups follow the age
/// limit only: they are small and keep the history the records lose.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Retention {
    pub days: Option<u64>,
    pub max_records: Option<u64>,
}

/// Rows one prune step deletes at most: the writer commits a group of
/// batches between two steps, so it never stalls behind a prune.
const PRUNE_STEP: i64 = 10_000;

/// How often the writer looks for something to prune when nothing is left.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

fn run(
    mut db: Db,
    rx: Receiver<Job>,
    stats: Arc<Stats>,
    retention: Retention,
    export: Option<crate::otlp::Sink>,
) {
    let mut known = Known::default();
    let mut more = prune(&mut db, &retention, now_ms());
    let mut last_prune = Instant::now();
    loop {
        // While pruning has more to do, it goes on between batches.
        let next = if more {
            match rx.try_recv() {
                Ok(j) => Some(j),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return,
            }
        } else {
            match rx.recv_timeout(Duration::from_secs(1)) {
                Ok(j) => Some(j),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return,
            }
        };
        if let Some(first) = next {
            commit_group(&mut db, &rx, first, &stats, &mut known, export.as_ref());
        }
        if more || last_prune.elapsed() >= PRUNE_EVERY {
            more = prune(&mut db, &retention, now_ms());
            last_prune = Instant::now();
        }
    }
}

/// Commit `first` and whatever else waits (up to [`GROUP`] batches) in one
/// transaction, then answer each batch.
fn commit_group(
    db: &mut Db,
    rx: &Receiver<Job>,
    first: Job,
    stats: &Stats,
    known: &mut Known,
    export: Option<&crate::otlp::Sink>,
) {
    let mut jobs = vec![first];
    while jobs.len() < GROUP {
        match rx.try_recv() {
            Ok(j) => jobs.push(j),
            Err(_) => break,
        }
    }
    stats
        .queue_depth
        .fetch_sub(jobs.len() as u64, Ordering::Relaxed);
    let started = Instant::now();
    let batches: Vec<&[RequestRecord]> = jobs.iter().map(|j| j.records.as_slice()).collect();
    let result = db.write(&batches, known);
    match &result {
        Ok(counts) => {
            stats.commits.fetch_add(1, Ordering::Relaxed);
            stats
                .commit_micros_total
                .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            for (stored, dup) in counts {
                stats
                    .ingested
                    .fetch_add(u64::from(*stored), Ordering::Relaxed);
                stats
                    .duplicates
                    .fetch_add(u64::from(*dup), Ordering::Relaxed);
            }
            stats
                .batches
                .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        }
        Err(_) => {
            // The rows it knew may not have been committed.
            known.forget();
            stats.failed_commits.fetch_add(1, Ordering::Relaxed);
        }
    }
    for (i, job) in jobs.into_iter().enumerate() {
        let ack = match &result {
            Ok(counts) => Ok(counts.get(i).copied().unwrap_or((0, 0))),
            Err(e) => Err(e.to_string()),
        };
        let _ = job.done.send(ack.clone());
        // Committed and not a re-send: exported (the records move over).
        if let (Some(sink), Ok((stored, _))) = (export, ack) {
            if stored > 0 {
                sink.offer(job.records);
            }
        }
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// One prune step, on either database.
fn prune(db: &mut Db, r: &Retention, now_ms: i64) -> bool {
    let cutoff = r
        .days
        .map(|d| now_ms.saturating_sub((d as i64).saturating_mul(86_400_000)));
    let max = r.max_records.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
    db.prune_step(cutoff, max, PRUNE_STEP)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlite::{fingerprint, MIGRATIONS};
    use rusqlite::Connection;

    /// The SQLite write of these jobs' batches (as the writer does it).
    fn write(
        conn: &mut Connection,
        jobs: &[Job],
        known: &mut Known,
    ) -> rusqlite::Result<Vec<(u32, u32)>> {
        let batches: Vec<&[RequestRecord]> = jobs.iter().map(|j| j.records.as_slice()).collect();
        crate::sqlite::write(conn, &batches, known)
    }

    /// One SQLite prune step under a retention, at `now_ms`.
    fn prune_step(conn: &Connection, r: &Retention, now_ms: i64) -> bool {
        let cutoff = r
            .days
            .map(|d| now_ms.saturating_sub((d as i64).saturating_mul(86_400_000)));
        let max = r.max_records.map(|m| i64::try_from(m).unwrap_or(i64::MAX));
        crate::sqlite::prune_step(conn, cutoff, max, PRUNE_STEP)
    }

    /// Run `f` on the connection as a [`Db`], then give it back.
    fn with_db<T>(conn: &mut Connection, f: impl FnOnce(&mut Db) -> T) -> T {
        let c = std::mem::replace(conn, Connection::open_in_memory().unwrap());
        let mut db = Db::Sqlite(c);
        let out = f(&mut db);
        if let Db::Sqlite(c) = db {
            *conn = c;
        }
        out
    }

    fn record(id: &str, time_ms: u64) -> RequestRecord {
        RequestRecord {
            request_id: id.into(),
            time_ms,
            ..Default::default()
        }
    }

    #[test]
    fn migrations_are_idempotent_and_retention_prunes_only_old_records() {
        let mut conn = Connection::open_in_memory().unwrap();
        assert_eq!(migrate(&mut conn).unwrap(), MIGRATIONS.len());
        assert_eq!(
            migrate(&mut conn).unwrap(),
            MIGRATIONS.len(),
            "a second run changes nothing"
        );
        let (done, _rx) = oneshot::channel();
        let job = Job {
            records: vec![record("old", 1_000), record("new", 10 * 86_400_000)],
            done,
        };
        assert_eq!(
            write(&mut conn, std::slice::from_ref(&job), &mut Known::default()).unwrap(),
            vec![(2, 0)]
        );
        assert_eq!(
            write(&mut conn, std::slice::from_ref(&job), &mut Known::default()).unwrap(),
            vec![(0, 2)],
            "re-sent ids are skipped"
        );
        prune_step(&conn, &Retention::default(), 10 * 86_400_000);
        assert_eq!(count(&conn).unwrap(), 2, "no retention keeps everything");
        let week = Retention {
            days: Some(7),
            max_records: None,
        };
        prune_step(&conn, &week, 10 * 86_400_000);
        assert!(!exists(&conn, "old").unwrap());
        assert!(exists(&conn, "new").unwrap());
        // The old record's rollups went with it; the new one's stay.
        assert_eq!(
            with_db(&mut conn, |d| crate::summary::summary(d, 0).unwrap()).total,
            1
        );
    }

    #[test]
    fn a_resent_record_is_skipped_but_another_request_reusing_its_id_is_kept() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let job = |records: Vec<RequestRecord>| Job {
            records,
            done: oneshot::channel().0,
        };
        let first = job(vec![record("fixed", 1_000)]);
        assert_eq!(
            write(
                &mut conn,
                std::slice::from_ref(&first),
                &mut Known::default()
            )
            .unwrap(),
            vec![(1, 0)]
        );
        assert_eq!(
            write(
                &mut conn,
                std::slice::from_ref(&first),
                &mut Known::default()
            )
            .unwrap(),
            vec![(0, 1)],
            "the same record sent again"
        );
        // Two more requests from a client that always sends x-request-id: fixed.
        let later = job(vec![record("fixed", 2_000), record("fixed", 3_000)]);
        assert_eq!(
            write(
                &mut conn,
                std::slice::from_ref(&later),
                &mut Known::default()
            )
            .unwrap(),
            vec![(2, 0)]
        );
        assert_eq!(
            write(
                &mut conn,
                std::slice::from_ref(&later),
                &mut Known::default()
            )
            .unwrap(),
            vec![(0, 2)],
            "and those sent again"
        );
        assert_eq!(count(&conn).unwrap(), 3);
        let reused = format!("fixed~{:016x}", fingerprint(&record("fixed", 2_000)));
        assert!(exists(&conn, &reused).unwrap());
    }

    /// 1,500 records under one id once took 2.9 s of the writer (a probe per
    /// earlier reuse) and dropped those past 1,000: now each is kept, and a
    /// re-send of all of them adds nothing. Counted in statements, not time.
    #[test]
    fn a_much_reused_id_keeps_every_request_at_a_constant_cost() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let records: Vec<_> = (0..1_500).map(|i| record("fixed", 1_000 + i)).collect();
        let job = Job {
            records,
            done: oneshot::channel().0,
        };
        let steps = Arc::new(AtomicU64::new(0));
        let seen = steps.clone();
        conn.progress_handler(
            1_000,
            Some(move || {
                seen.fetch_add(1, Ordering::Relaxed);
                false
            }),
        );
        assert_eq!(
            write(&mut conn, std::slice::from_ref(&job), &mut Known::default()).unwrap(),
            vec![(1_500, 0)]
        );
        let first = steps.swap(0, Ordering::Relaxed);
        assert_eq!(
            write(&mut conn, std::slice::from_ref(&job), &mut Known::default()).unwrap(),
            vec![(0, 1_500)]
        );
        assert_eq!(count(&conn).unwrap(), 1_500);
        // With a probe per earlier reuse, the VM ran ~1.1 million steps of
        // 1,000 instructions here; a constant cost stays within a few thousand.
        assert!(first < 20_000, "{first} progress steps");
    }

    fn job(records: Vec<RequestRecord>) -> Job {
        Job {
            records,
            done: oneshot::channel().0,
        }
    }

    fn served(id: &str, time_ms: u64, latency_ms: u64, status: u32) -> RequestRecord {
        RequestRecord {
            provider: if status == 200 { "primary" } else { "backup" }.into(),
            model: "gpt-4o-mini".into(),
            latency_ms,
            status,
            prompt_tokens: 10,
            cost_micros: 7,
            ..record(id, time_ms)
        }
    }

    /// The summary from the rollups agrees with the records, a re-sent batch
    /// adds nothing to either, and windows cut at minutes and hours.
    #[test]
    fn rollups_follow_what_was_stored_and_never_count_a_resend() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let t0 = 1_800_000_000_000u64; // an hour start (500,000 hours)
                                       // 60 records a minute apart from 30 minutes before t0 on.
        let recs: Vec<_> = (0..60u64)
            .map(|i| {
                let mut r = served(
                    &format!("r{i}"),
                    t0 - 1_800_000 + i * 60_000,
                    10 + i,
                    if i % 10 == 9 { 502 } else { 200 },
                );
                // Every third request fell back from a failed primary.
                if i % 3 == 0 {
                    r.attempts = vec![
                        crate::proto::Attempt {
                            provider: "primary".into(),
                            status: 503,
                            cause: "http_5xx".into(),
                            ..Default::default()
                        },
                        crate::proto::Attempt {
                            provider: "backup".into(),
                            status: 200,
                            cause: String::new(),
                            ..Default::default()
                        },
                    ];
                }
                r
            })
            .collect();
        let (early, late) = recs.split_at(30);
        let (early, late) = (job(early.to_vec()), job(late.to_vec()));
        // One writer: the rows it wrote are merged without a read, and a
        // re-send of the first batch after the second adds nothing.
        let mut known = Known::default();
        for (batch, want) in [(&early, (30, 0)), (&late, (30, 0)), (&early, (0, 30))] {
            let got = write(&mut conn, std::slice::from_ref(batch), &mut known).unwrap();
            assert_eq!(got, vec![want]);
        }
        let s = with_db(&mut conn, |d| crate::summary::summary(d, 0).unwrap());
        assert_eq!((s.total, s.prompt_tokens, s.cost_usd), (60, 600, 420e-6));
        assert_eq!(s.success_rate, 54.0 / 60.0);
        assert_eq!(s.avg_latency_ms, (10..70).sum::<u64>() as f64 / 60.0);
        assert_eq!(s.latency_quantiles, "exact");
        assert_eq!((s.p50_latency_ms, s.p95_latency_ms), (39, 66));
        assert_eq!(s.by_provider[0].key, "primary");
        // The failed attempts, counted once (the re-send added none).
        let f: Vec<(&str, &str, i64)> = s
            .failed_attempts
            .iter()
            .map(|f| (f.provider.as_str(), f.cause.as_str(), f.count))
            .collect();
        assert_eq!(f, [("primary", "http_5xx", 20)]);
        assert_eq!(s.fallbacks, 20);
        // Per minute over the last 3 hours: a point a minute, errors apart.
        let now = (t0 + 1_800_000) as i64;
        let series = with_db(&mut conn, |d| {
            crate::summary::timeseries(d, now - 3 * 3_600_000, now)
        })
        .unwrap();
        assert_eq!((series.step_ms, series.points.len()), (60_000, 60));
        assert_eq!(
            series.points.iter().map(|p| p.server_errors).sum::<i64>(),
            6
        );
        assert_eq!(series.points[0].p50_latency_ms, 10);
        // Longer windows per hour: the half hour before t0 and the one after.
        let series = with_db(&mut conn, |d| {
            crate::summary::timeseries(d, now - 86_400_000, now)
        })
        .unwrap();
        let per_hour: Vec<i64> = series.points.iter().map(|p| p.requests).collect();
        assert_eq!((series.step_ms, per_hour), (3_600_000, vec![30, 30]));
        assert_eq!(
            s.by_client.len(),
            0,
            "records without a client are not a group"
        );
        // From 10 minutes before the hour: 40 records (minute rows, then the hour).
        let s = with_db(&mut conn, |d| {
            crate::summary::summary(d, (t0 - 600_000) as i64)
        })
        .unwrap();
        assert_eq!(s.total, 40);
        // r21, r24, ..., r57 (minute rows, then the hour): 13 failures.
        assert_eq!(s.failed_attempts[0].count, 13);
        // Mid-minute starts round down to the minute.
        let s = with_db(&mut conn, |d| {
            crate::summary::summary(d, (t0 - 600_000 + 59_999) as i64)
        })
        .unwrap();
        assert_eq!((s.total, s.since_ms), (40, (t0 - 600_000) as i64));
    }

    /// Records stored before the rollups existed get them at migration.
    #[test]
    fn the_rollup_migration_builds_rollups_for_stored_records() {
        let mut conn = Connection::open_in_memory().unwrap();
        let tx = conn.transaction().unwrap();
        tx.execute_batch(MIGRATIONS[0]).unwrap();
        tx.pragma_update(None, "user_version", 1).unwrap();
        tx.commit().unwrap();
        conn.execute(
            r#"INSERT INTO requests VALUES ('old', 1000, 'demo', 'm', 'm', 'p', '', '', 'hit',
                '[{"provider":"q","status":0,"cause":"connect"},{"provider":"p","status":200,"cause":""}]',
                2, 200, '', 25, 0, 0, 3, 4, 0, 0, 9, NULL, NULL)"#,
            [],
        )
        .unwrap();
        migrate(&mut conn).unwrap();
        let s = with_db(&mut conn, |d| crate::summary::summary(d, 0).unwrap());
        assert_eq!(
            (s.total, s.fallbacks, s.prompt_tokens, s.completion_tokens),
            (1, 1, 3, 4)
        );
        assert_eq!((s.cache_hit_rate, s.avg_latency_ms), (1.0, 25.0));
        // The failed attempt of the stored record, from its JSON.
        let f = &s.failed_attempts;
        assert_eq!(
            (
                f.len(),
                f[0].provider.as_str(),
                f[0].cause.as_str(),
                f[0].count
            ),
            (1, "q", "connect", 1)
        );
    }

    /// A cap on stored records prunes the oldest in steps of at most
    /// PRUNE_STEP rows, so the writer commits batches between steps; the
    /// rollups keep the history.
    #[test]
    fn a_record_cap_prunes_the_oldest_in_small_steps() {
        let mut conn = Connection::open_in_memory().unwrap();
        migrate(&mut conn).unwrap();
        let recs: Vec<_> = (0..25_000u64)
            .map(|i| record(&format!("c{i}"), 1_000 + i))
            .collect();
        write(&mut conn, &[job(recs)], &mut Known::default()).unwrap();
        let cap = Retention {
            days: None,
            max_records: Some(1_000),
        };
        let mut steps = 0;
        while prune_step(&conn, &cap, 0) {
            steps += 1;
            assert!(count(&conn).unwrap() >= 1_000);
        }
        assert_eq!((steps, count(&conn).unwrap()), (2, 1_000));
        assert!(!exists(&conn, "c23999").unwrap());
        assert!(exists(&conn, "c24000").unwrap());
        assert_eq!(
            with_db(&mut conn, |d| crate::summary::summary(d, 0).unwrap()).total,
            25_000
        );
    }
}
