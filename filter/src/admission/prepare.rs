//! The limit counters, created before requests need them: every key's and
//! team's at configure time (and each day), an end user's on their first
//! request, within the key's bound on tracked users.

use crate::host::Host;
use portcullis_core::config::{Client, Gateway, Level};
use portcullis_core::keys::{self, Limit, Owner};
use portcullis_core::ratelimit::{self, Bucket};
use portcullis_core::store::update;

/// Create the limit keys that do not exist yet, before any request needs
/// them: Envoy's shared data has no atomic create (a write without a CAS
/// token is unconditional), so two workers both creating a key on first use
/// could each write and one reservation would be lost. Every update of an
/// existing key is a CAS. Counters are created at configure time; each
/// budget's keys for the period of `now_ms` and of the next day (the root
/// context calls this again when the local day changes).
pub fn prepare(host: &impl Host, gw: &Gateway, now_ms: u64) {
    let keys = gw.clients.values().map(|c| Level {
        owner: Owner::Key(&c.name),
        limits: &c.limits,
    });
    let teams = gw.teams.iter().map(|t| Level {
        owner: Owner::Team(&t.name),
        limits: &t.limits,
    });
    for level in keys.chain(teams) {
        prepare_level(host, gw, level, now_ms);
    }
}

/// Create one level's missing counters (see [`prepare`]).
fn prepare_level(host: &impl Host, gw: &Gateway, level: Level<'_>, now_ms: u64) {
    let tomorrow = now_ms.saturating_add(86_400_000);
    let create = |key: String, initial: &[u8]| {
        if let Ok((None, _)) = host.get(&key) {
            let _ = host.set(&key, initial, None);
        }
    };
    let (l, s) = (level.limits, level.limits.scope);
    if l.requests_per_minute.is_some() && s.requests_per_minute.local() {
        create(
            keys::limit(level.owner, Limit::RequestsPerMinute),
            &Bucket::default().encode(),
        );
    }
    if l.tokens_per_minute.is_some() && s.tokens_per_minute.local() {
        create(
            keys::limit(level.owner, Limit::TokensPerMinute),
            &Bucket::default().encode(),
        );
    }
    if l.max_concurrent.is_some() {
        create(
            keys::limit(level.owner, Limit::Concurrency),
            &0u32.to_le_bytes(),
        );
    }
    for b in l.budgets.iter().filter(|_| s.budgets.local()) {
        let mut made = None;
        for t in [now_ms, tomorrow] {
            let index = b.period.index(t, gw.budget_offset_ms);
            if made != Some(index) {
                create(
                    keys::budget(level.owner, b.period, index),
                    &0i64.to_le_bytes(),
                );
                made = Some(index);
            }
        }
    }
}

/// The owner of an end user's limits (`<key>/<user>`): a user seen before,
/// or a new one while the key tracks fewer than `max_users_per_key` (its
/// counters are created then); past that, new users share the key's
/// overflow level. A store problem tracks the user all the same.
pub fn track_user(
    host: &impl Host,
    gw: &Gateway,
    client: &Client,
    user: &str,
    now_ms: u64,
) -> String {
    let owner = keys::user_owner(&client.name, user);
    let seen = keys::user_seen(&owner);
    if !matches!(host.get(&seen), Ok((None, _))) {
        return owner;
    }
    let max = gw.max_users_per_key;
    let admitted = update(host, &keys::users(&client.name), |cur| {
        let n = ratelimit::decode_u32(cur);
        if n < max {
            (Some(n.saturating_add(1).to_le_bytes().to_vec()), true)
        } else {
            (None, false)
        }
    });
    let owner = match admitted {
        Ok(false) => keys::overflow_user(&client.name),
        _ => {
            let _ = host.set(&seen, &[1], None);
            owner
        }
    };
    if let Some(limits) = client.limits.per_user.as_deref() {
        let level = Level {
            owner: Owner::User(&owner),
            limits,
        };
        prepare_level(host, gw, level, now_ms);
    }
    owner
}
