//! The control plane's database: SQLite by default, PostgreSQL for a fleet
//! (`postgres://...`). Every statement is written once, in the SQL both
//! speak (`$1` parameters, `ON CONFLICT`), and runs in a transaction that
//! holds the writers' lock: SQLite's `BEGIN IMMEDIATE`, PostgreSQL's
//! transaction-scoped advisory lock. Several control planes may share one
//! PostgreSQL database; their writes take turns.

use std::fmt;

/// A column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Int(i64),
    Text(String),
    Null,
}

impl Val {
    pub fn int(&self) -> Option<i64> {
        match self {
            Val::Int(i) => Some(*i),
            _ => None,
        }
    }

    pub fn text(&self) -> Option<&str> {
        match self {
            Val::Text(s) => Some(s),
            _ => None,
        }
    }
}

impl From<&str> for Val {
    fn from(s: &str) -> Val {
        Val::Text(s.to_string())
    }
}

impl From<String> for Val {
    fn from(s: String) -> Val {
        Val::Text(s)
    }
}

impl From<i64> for Val {
    fn from(i: i64) -> Val {
        Val::Int(i)
    }
}

impl From<Option<i64>> for Val {
    fn from(i: Option<i64>) -> Val {
        i.map_or(Val::Null, Val::Int)
    }
}

#[derive(Debug)]
pub struct DbError(pub String);

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "database: {}", self.0)
    }
}

impl std::error::Error for DbError {}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> DbError {
        DbError(e.to_string())
    }
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> DbError {
        DbError(e.to_string())
    }
}

pub type Result<T> = std::result::Result<T, DbError>;

/// Statements inside one transaction.
pub trait Tx {
    /// Run a statement; rows changed.
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64>;
    /// Run a query; every row, every column.
    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>>;
}

pub enum Db {
    Sqlite(rusqlite::Connection),
    Postgres(Box<postgres::Client>),
}

/// The schema, one step per version; `control_meta.schema` says how many
/// steps a database has taken.
const MIGRATIONS: &[&[&str]] = &[&[
    "CREATE TABLE IF NOT EXISTS control_meta (k TEXT PRIMARY KEY, v TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS control_clients (name TEXT PRIMARY KEY, pos BIGINT NOT NULL, \
     key_sha256 TEXT NOT NULL, entry TEXT NOT NULL, previous TEXT NOT NULL, \
     created_ms BIGINT NOT NULL, revoked_ms BIGINT)",
    "CREATE TABLE IF NOT EXISTS control_teams (name TEXT PRIMARY KEY, pos BIGINT NOT NULL, \
     entry TEXT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS control_tokens (sha256 TEXT PRIMARY KEY, name TEXT NOT NULL, \
     role TEXT NOT NULL, created_ms BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS control_audit (seq BIGINT PRIMARY KEY, at_ms BIGINT NOT NULL, \
     actor TEXT NOT NULL, action TEXT NOT NULL, target TEXT NOT NULL, detail TEXT NOT NULL, \
     version BIGINT NOT NULL)",
    "CREATE TABLE IF NOT EXISTS control_versions (version BIGINT PRIMARY KEY, \
     yaml TEXT NOT NULL, at_ms BIGINT NOT NULL)",
]];

pub fn is_postgres(spec: &str) -> bool {
    spec.starts_with("postgres://") || spec.starts_with("postgresql://")
}

impl Db {
    pub fn connect(spec: &str) -> Result<Db> {
        if is_postgres(spec) {
            let c = postgres::Client::connect(spec, postgres::NoTls)?;
            Ok(Db::Postgres(Box::new(c)))
        } else {
            let c = rusqlite::Connection::open(spec)?;
            c.busy_timeout(std::time::Duration::from_secs(10))?;
            c.pragma_update(None, "journal_mode", "WAL")?;
            Ok(Db::Sqlite(c))
        }
    }

    /// Bring the schema up to date; the steps taken.
    pub fn migrate(&mut self) -> Result<usize> {
        self.tx(|tx| {
            tx.exec(
                MIGRATIONS
                    .first()
                    .map_or("", |m| m.first().copied().unwrap_or("")),
                &[],
            )?;
            let done = tx
                .rows("SELECT v FROM control_meta WHERE k = 'schema'", &[])?
                .first()
                .and_then(|r| r.first())
                .and_then(|v| v.text().and_then(|t| t.parse::<usize>().ok()))
                .unwrap_or(0);
            let mut taken = 0;
            for step in MIGRATIONS.iter().skip(done) {
                for sql in *step {
                    tx.exec(sql, &[])?;
                }
                taken += 1;
            }
            tx.exec(
                "INSERT INTO control_meta (k, v) VALUES ('schema', $1) \
                 ON CONFLICT (k) DO UPDATE SET v = excluded.v",
                &[Val::Text((done + taken).to_string())],
            )?;
            Ok(taken)
        })
    }

    /// Run `f` in a transaction that holds the writers' lock: committed
    /// when it returns `Ok`, rolled back otherwise.
    pub fn tx<T, E: From<DbError>>(
        &mut self,
        f: impl FnOnce(&mut dyn Tx) -> std::result::Result<T, E>,
    ) -> std::result::Result<T, E> {
        match self {
            Db::Sqlite(c) => {
                let mut t = SqliteTx(
                    c.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                        .map_err(DbError::from)?,
                );
                let out = f(&mut t)?;
                t.0.commit().map_err(DbError::from)?;
                Ok(out)
            }
            Db::Postgres(c) => {
                let mut t = PgTx(c.transaction().map_err(DbError::from)?);
                // One writer at a time across control planes (the key is
                // the ASCII of "portcull").
                t.0.execute("SELECT pg_advisory_xact_lock(8029759185213795436)", &[])
                    .map_err(DbError::from)?;
                let out = f(&mut t)?;
                t.0.commit().map_err(DbError::from)?;
                Ok(out)
            }
        }
    }
}

struct SqliteTx<'a>(rusqlite::Transaction<'a>);

fn sqlite_params(params: &[Val]) -> Vec<rusqlite::types::Value> {
    params
        .iter()
        .map(|p| match p {
            Val::Int(i) => rusqlite::types::Value::Integer(*i),
            Val::Text(s) => rusqlite::types::Value::Text(s.clone()),
            Val::Null => rusqlite::types::Value::Null,
        })
        .collect()
}

impl Tx for SqliteTx<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let n = self
            .0
            .execute(sql, rusqlite::params_from_iter(sqlite_params(params)))?;
        Ok(n as u64)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>> {
        let mut stmt = self.0.prepare(sql)?;
        let cols = stmt.column_count();
        let mut rows = stmt.query(rusqlite::params_from_iter(sqlite_params(params)))?;
        let mut out = Vec::new();
        while let Some(row) = rows.next()? {
            let mut r = Vec::with_capacity(cols);
            for i in 0..cols {
                r.push(match row.get_ref(i)? {
                    rusqlite::types::ValueRef::Integer(n) => Val::Int(n),
                    rusqlite::types::ValueRef::Text(t) => {
                        Val::Text(String::from_utf8_lossy(t).into_owned())
                    }
                    _ => Val::Null,
                });
            }
            out.push(r);
        }
        Ok(out)
    }
}

struct PgTx<'a>(postgres::Transaction<'a>);

/// PostgreSQL wants parameters of the column's type: integers are BIGINT
/// (i64), text is TEXT, and NULL an `Option`.
enum PgParam {
    Int(Option<i64>),
    Text(String),
}

fn pg_params(params: &[Val]) -> Vec<PgParam> {
    params
        .iter()
        .map(|p| match p {
            Val::Int(i) => PgParam::Int(Some(*i)),
            Val::Text(s) => PgParam::Text(s.clone()),
            Val::Null => PgParam::Int(None),
        })
        .collect()
}

fn pg_refs(ps: &[PgParam]) -> Vec<&(dyn postgres::types::ToSql + Sync)> {
    ps.iter()
        .map(|p| match p {
            PgParam::Int(i) => i as &(dyn postgres::types::ToSql + Sync),
            PgParam::Text(s) => s as &(dyn postgres::types::ToSql + Sync),
        })
        .collect()
}

impl Tx for PgTx<'_> {
    fn exec(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let ps = pg_params(params);
        Ok(self.0.execute(sql, &pg_refs(&ps))?)
    }

    fn rows(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Vec<Val>>> {
        let ps = pg_params(params);
        let rows = self.0.query(sql, &pg_refs(&ps))?;
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let mut r = Vec::with_capacity(row.len());
            for (i, col) in row.columns().iter().enumerate() {
                let v = if *col.type_() == postgres::types::Type::INT8 {
                    row.try_get::<_, Option<i64>>(i)?
                        .map_or(Val::Null, Val::Int)
                } else if *col.type_() == postgres::types::Type::INT4 {
                    row.try_get::<_, Option<i32>>(i)?
                        .map_or(Val::Null, |n| Val::Int(i64::from(n)))
                } else {
                    row.try_get::<_, Option<String>>(i)?
                        .map_or(Val::Null, Val::Text)
                };
                r.push(v);
            }
            out.push(r);
        }
        Ok(out)
    }
}
