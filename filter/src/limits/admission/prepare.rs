//! The limit counters, created before requests need them: every key's and
//! team's at configure time (and each day), an end user's on their first
//! request, within the key's bound on tracked users.

use crate::host::Host;
use portcullis_core::config::{Client, Gateway, Level};
use portcullis_core::limits::counters::Counters;
use portcullis_core::limits::ratelimit;
use portcullis_core::shared::keys::{self, Owner};
use portcullis_core::shared::store::update;

/// Create the levels' counters that do not exist yet, before any request
/// needs them: Envoy's shared data has no atomic create (a write without a
/// CAS token is unconditional), so two workers both creating a value on
/// first use could each write and one reservation would be lost. Every
/// update of an existing value is a CAS. Counters are created at configure
/// time; a new budget period starts inside the same value.
pub fn prepare(host: &impl Host, gw: &Gateway) {
    let keys = gw.clients.values().map(Level::of_client);
    let teams = gw.teams.iter().map(Level::of_team);
    for level in keys.chain(teams) {
        prepare_level(host, level);
    }
}

/// Create one level's counters if it counts anything here (see [`prepare`]).
fn prepare_level(host: &impl Host, level: Level<'_>) {
    let (l, s) = (level.limits, level.limits.scope);
    let counts = (l.requests_per_minute.is_some() && s.requests_per_minute.local())
        || (l.tokens_per_minute.is_some() && s.tokens_per_minute.local())
        || l.max_concurrent.is_some()
        || (!l.budgets.is_empty() && s.budgets.local());
    if !counts {
        return;
    }
    let key = level.counters_key();
    if let Ok((None, _)) = host.get(&key) {
        let _ = host.set(&key, &Counters::default().encode(), None);
    }
}

/// The owner of an end user's limits (`<key>/<user>`): a user seen before,
/// or a new one while the key tracks fewer than `max_users_per_key` (its
/// counters are created then); past that, new users share the key's
/// overflow level. A store problem tracks the user all the same.
pub fn track_user(host: &impl Host, gw: &Gateway, client: &Client, user: &str) -> String {
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
        let level = Level::new(Owner::User(&owner), limits);
        prepare_level(host, level);
    }
    owner
}
