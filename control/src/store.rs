//! The store: one thread owns the database (PostgreSQL's sync client runs
//! its own runtime, which may not run inside the server's) and runs the
//! jobs the API hands it in order. A change is applied to the state read
//! in the same locked transaction, rendered, compiled by the filter's own
//! core, and written (rows that changed, the new version, the audit line)
//! only if the core accepts it.

use crate::db::{Db, DbError, Tx, Val};
use crate::secret;
use crate::state::{mapping_text, text_mapping, ClientRow, PreviousKey, State, TeamRow};
use std::sync::mpsc;

/// Why a call failed, as the API answers it.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub message: String,
    /// The core's problems, one per item, when it refused the config.
    pub problems: Vec<String>,
}

impl Refusal {
    pub fn new(status: u16, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            message: message.into(),
            problems: Vec::new(),
        }
    }

    /// The core refused the config the change would make.
    pub fn refused_config(report: &str) -> Refusal {
        let problems = report
            .lines()
            .filter_map(|l| l.trim_start().strip_prefix("- "))
            .map(str::to_string)
            .collect();
        Refusal {
            status: 422,
            message: format!("the change was refused, nothing was pushed: {report}"),
            problems,
        }
    }
}

impl From<DbError> for Refusal {
    fn from(e: DbError) -> Refusal {
        Refusal::new(500, e.to_string())
    }
}

/// A config version the filter accepts.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub version: i64,
    pub yaml: String,
}

/// Who made a change, and what it was, for the audit log.
#[derive(Debug, Clone)]
pub struct Change {
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: String,
}

pub struct Inner {
    db: Db,
    /// The state at a version, so a change does not read every row again
    /// (re-read when another control plane wrote a newer version).
    cache: Option<(i64, State)>,
}

type Job = Box<dyn FnOnce(&mut Inner) + Send>;

#[derive(Clone)]
pub struct Store {
    jobs: mpsc::Sender<Job>,
}

impl Store {
    /// Connect, migrate, and start the store's thread.
    pub fn open(spec: &str) -> Result<Store, DbError> {
        let mut db = Db::connect(spec)?;
        db.migrate()?;
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("control-store".into())
            .spawn(move || {
                let mut inner = Inner { db, cache: None };
                while let Ok(job) = rx.recv() {
                    job(&mut inner);
                }
            })
            .map_err(|e| DbError(format!("cannot start the store thread: {e}")))?;
        Ok(Store { jobs })
    }

    /// Run `f` on the store's thread and wait for its answer.
    pub async fn call<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.jobs
            .send(Box::new(move |inner| {
                let _ = tx.send(f(inner));
            }))
            .map_err(|_| Refusal::new(500, "the store has stopped"))?;
        rx.await
            .map_err(|_| Refusal::new(500, "the store has stopped"))?
    }

    /// [`Store::call`] from a thread outside the runtime (the CLI).
    pub fn call_blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Inner) -> Result<T, Refusal> + Send + 'static,
    ) -> Result<T, Refusal> {
        let (tx, rx) = mpsc::channel();
        self.jobs
            .send(Box::new(move |inner| {
                let _ = tx.send(f(inner));
            }))
            .map_err(|_| Refusal::new(500, "the store has stopped"))?;
        rx.recv()
            .map_err(|_| Refusal::new(500, "the store has stopped"))?
    }
}

fn first_int(rows: &[Vec<Val>]) -> Option<i64> {
    rows.first()?.first()?.int()
}

fn current_version(tx: &mut dyn Tx) -> Result<i64, DbError> {
    Ok(first_int(&tx.rows("SELECT max(version) FROM control_versions", &[])?).unwrap_or(0))
}

/// The state at the database's version: the cached one when it is of that
/// version (no other control plane wrote since), else read again.
fn state_at(tx: &mut dyn Tx, cached: Option<(i64, State)>) -> Result<(i64, State), DbError> {
    let version = current_version(tx)?;
    match cached {
        Some((v, s)) if v == version => Ok((v, s)),
        _ => Ok((version, load_state(tx)?)),
    }
}

fn load_state(tx: &mut dyn Tx) -> Result<State, DbError> {
    let base = tx
        .rows("SELECT v FROM control_meta WHERE k = 'base'", &[])?
        .first()
        .and_then(|r| r.first())
        .and_then(|v| v.text().map(text_mapping))
        .unwrap_or_default();
    let mut clients = Vec::new();
    for r in tx.rows(
        "SELECT name, pos, key_sha256, entry, previous, created_ms, revoked_ms \
         FROM control_clients ORDER BY pos",
        &[],
    )? {
        let text = |i: usize| r.get(i).and_then(|v| v.text()).unwrap_or_default();
        let int = |i: usize| r.get(i).and_then(Val::int);
        clients.push(ClientRow {
            name: text(0).to_string(),
            pos: int(1).unwrap_or(0),
            key_sha256: text(2).to_string(),
            entry: text_mapping(text(3)),
            previous: serde_json::from_str::<Vec<PreviousKey>>(text(4)).unwrap_or_default(),
            created_ms: int(5).unwrap_or(0),
            revoked_ms: int(6),
        });
    }
    let mut teams = Vec::new();
    for r in tx.rows(
        "SELECT name, pos, entry FROM control_teams ORDER BY pos",
        &[],
    )? {
        let text = |i: usize| r.get(i).and_then(|v| v.text()).unwrap_or_default();
        teams.push(TeamRow {
            name: text(0).to_string(),
            pos: r.get(1).and_then(Val::int).unwrap_or(0),
            entry: text_mapping(text(2)),
        });
    }
    Ok(State {
        base,
        clients,
        teams,
    })
}

/// Write what differs between `old` and `new`.
fn write_diff(tx: &mut dyn Tx, old: &State, new: &State) -> Result<(), DbError> {
    if old.base != new.base {
        tx.exec(
            "INSERT INTO control_meta (k, v) VALUES ('base', $1) \
             ON CONFLICT (k) DO UPDATE SET v = excluded.v",
            &[mapping_text(&new.base).into()],
        )?;
    }
    for c in &new.clients {
        if old.client(&c.name) == Some(c) {
            continue;
        }
        tx.exec(
            "INSERT INTO control_clients (name, pos, key_sha256, entry, previous, created_ms, revoked_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (name) DO UPDATE SET \
             pos = excluded.pos, key_sha256 = excluded.key_sha256, entry = excluded.entry, \
             previous = excluded.previous, created_ms = excluded.created_ms, \
             revoked_ms = excluded.revoked_ms",
            &[
                c.name.as_str().into(),
                c.pos.into(),
                c.key_sha256.as_str().into(),
                mapping_text(&c.entry).into(),
                serde_json::to_string(&c.previous).unwrap_or_default().into(),
                c.created_ms.into(),
                c.revoked_ms.into(),
            ],
        )?;
    }
    for c in &old.clients {
        if new.client(&c.name).is_none() {
            tx.exec(
                "DELETE FROM control_clients WHERE name = $1",
                &[c.name.as_str().into()],
            )?;
        }
    }
    for t in &new.teams {
        if old.team(&t.name) == Some(t) {
            continue;
        }
        tx.exec(
            "INSERT INTO control_teams (name, pos, entry) VALUES ($1, $2, $3) \
             ON CONFLICT (name) DO UPDATE SET pos = excluded.pos, entry = excluded.entry",
            &[
                t.name.as_str().into(),
                t.pos.into(),
                mapping_text(&t.entry).into(),
            ],
        )?;
    }
    for t in &old.teams {
        if new.team(&t.name).is_none() {
            tx.exec(
                "DELETE FROM control_teams WHERE name = $1",
                &[t.name.as_str().into()],
            )?;
        }
    }
    Ok(())
}

/// One audit line.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AuditEntry {
    pub seq: i64,
    pub at_ms: i64,
    pub actor: String,
    pub action: String,
    pub target: String,
    pub detail: String,
    /// The config version after the change.
    pub version: i64,
}

/// An admin token's holder.
#[derive(Debug, Clone, PartialEq)]
pub struct Holder {
    pub name: String,
    pub role: Role,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Read,
    Write,
}

impl Role {
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "read" => Some(Role::Read),
            "write" => Some(Role::Write),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
        }
    }
}

impl Inner {
    /// Read the state, without changing it.
    pub fn read<T>(&mut self, f: impl FnOnce(i64, &State) -> T) -> Result<T, Refusal> {
        let mut db_cache = self.cache.take();
        let out = self.db.tx(|tx| -> Result<T, Refusal> {
            let (version, state) = state_at(tx, db_cache.take())?;
            let out = f(version, &state);
            db_cache = Some((version, state));
            Ok(out)
        });
        self.cache = db_cache;
        out
    }

    /// Apply a change: `f` edits the state; the result is rendered and
    /// compiled by the filter's core, and written only if the core accepts
    /// it. Returns `f`'s answer and the version now served (a new one when
    /// the config changed).
    pub fn change<T>(
        &mut self,
        change: Change,
        now_ms: i64,
        f: impl FnOnce(&mut State) -> Result<T, Refusal>,
    ) -> Result<(T, Version), Refusal> {
        let mut cached = self.cache.take();
        let result = self.db.tx(|tx| -> Result<(T, Version, State), Refusal> {
            let (version, old) = state_at(tx, cached.take())?;
            let mut new = old.clone();
            let out = f(&mut new)?;
            let yaml = new.render();
            portcullis_core::compile::compile(yaml.as_bytes())
                .map_err(|report| Refusal::refused_config(&report))?;
            write_diff(tx, &old, &new)?;
            let previous_yaml = tx
                .rows(
                    "SELECT yaml FROM control_versions WHERE version = $1",
                    &[version.into()],
                )?
                .first()
                .and_then(|r| r.first())
                .and_then(|v| v.text().map(str::to_string));
            let version = if previous_yaml.as_deref() == Some(yaml.as_str()) {
                version
            } else {
                let next = version.saturating_add(1);
                tx.exec(
                    "INSERT INTO control_versions (version, yaml, at_ms) VALUES ($1, $2, $3)",
                    &[next.into(), yaml.as_str().into(), now_ms.into()],
                )?;
                next
            };
            let seq = first_int(&tx.rows("SELECT max(seq) FROM control_audit", &[])?)
                .unwrap_or(0)
                .saturating_add(1);
            tx.exec(
                "INSERT INTO control_audit (seq, at_ms, actor, action, target, detail, version) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7)",
                &[
                    seq.into(),
                    now_ms.into(),
                    change.actor.into(),
                    change.action.into(),
                    change.target.into(),
                    change.detail.into(),
                    version.into(),
                ],
            )?;
            Ok((out, Version { version, yaml }, new))
        });
        match result {
            Ok((out, v, state)) => {
                self.cache = Some((v.version, state));
                Ok((out, v))
            }
            Err(e) => Err(e),
        }
    }

    /// The version served now, if there is one.
    pub fn current(&mut self) -> Result<Option<Version>, Refusal> {
        self.db.tx(|tx| -> Result<Option<Version>, Refusal> {
            let rows = tx.rows(
                "SELECT version, yaml FROM control_versions ORDER BY version DESC LIMIT 1",
                &[],
            )?;
            Ok(rows.first().and_then(|r| {
                Some(Version {
                    version: r.first()?.int()?,
                    yaml: r.get(1)?.text()?.to_string(),
                })
            }))
        })
    }

    /// The newest audit lines, newest first.
    pub fn audit(&mut self, limit: i64) -> Result<Vec<AuditEntry>, Refusal> {
        self.db.tx(|tx| -> Result<Vec<AuditEntry>, Refusal> {
            let rows = tx.rows(
                "SELECT seq, at_ms, actor, action, target, detail, version FROM control_audit \
                 ORDER BY seq DESC LIMIT $1",
                &[limit.into()],
            )?;
            Ok(rows
                .iter()
                .map(|r| {
                    let int = |i: usize| r.get(i).and_then(Val::int).unwrap_or(0);
                    let text = |i: usize| {
                        r.get(i)
                            .and_then(|v| v.text())
                            .unwrap_or_default()
                            .to_string()
                    };
                    AuditEntry {
                        seq: int(0),
                        at_ms: int(1),
                        actor: text(2),
                        action: text(3),
                        target: text(4),
                        detail: text(5),
                        version: int(6),
                    }
                })
                .collect())
        })
    }

    /// A new admin token: returned once, kept as its SHA-256.
    pub fn create_token(&mut self, name: &str, role: Role, now_ms: i64) -> Result<String, Refusal> {
        let token = secret::new_secret("pct-")
            .map_err(|e| Refusal::new(500, format!("cannot make a token: {e}")))?;
        self.add_token(&token, name, role, now_ms)?;
        Ok(token)
    }

    /// Keep a token chosen elsewhere (once: adding it again changes
    /// nothing, not even its name or role).
    pub fn add_token(
        &mut self,
        token: &str,
        name: &str,
        role: Role,
        now_ms: i64,
    ) -> Result<(), Refusal> {
        let hash = secret::sha256_hex(token);
        self.db.tx(|tx| -> Result<(), Refusal> {
            tx.exec(
                "INSERT INTO control_tokens (sha256, name, role, created_ms) VALUES ($1, $2, $3, $4) \
                 ON CONFLICT (sha256) DO NOTHING",
                &[
                    hash.as_str().into(),
                    name.into(),
                    role.as_str().into(),
                    now_ms.into(),
                ],
            )?;
            Ok(())
        })
    }

    /// Who holds a token, if anyone.
    pub fn holder(&mut self, token: &str) -> Result<Option<Holder>, Refusal> {
        let hash = secret::sha256_hex(token);
        self.db.tx(|tx| -> Result<Option<Holder>, Refusal> {
            let rows = tx.rows(
                "SELECT name, role FROM control_tokens WHERE sha256 = $1",
                &[hash.as_str().into()],
            )?;
            Ok(rows.first().and_then(|r| {
                Some(Holder {
                    name: r.first()?.text()?.to_string(),
                    role: Role::parse(r.get(1)?.text()?)?,
                })
            }))
        })
    }
}
