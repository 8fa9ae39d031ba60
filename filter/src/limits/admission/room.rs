//! What a request's levels have room for before anything is taken: the
//! completion cap of `max_tokens_mode`, and the cheaper model of
//! `on_budget_low`. Both read the levels' local counters without writing.

use crate::host::Host;
use portcullis_core::config::{Client, Gateway, MaxTokensMode};
use portcullis_core::error::GatewayError;
use portcullis_core::limits::ratelimit::{self, Price};
use portcullis_core::limits::stream_cap;

/// Decide a request's completion cap before it is reserved: a level in
/// `refuse` mode needs a cap named; a level in `clamp` mode lowers it (or
/// sets `default_max_tokens` when none was named) to the room its local
/// token bucket and budgets have after the prompt estimate. Room counted by
/// the rate limit service is not read here (the reservation still holds
/// it). No room at all: the request goes on to be refused by the limit.
/// `Some(n)`: the cap a level in `clamp` mode holds the request to (set in
/// its body when it differs). A stream's cap leaves room for what the
/// gateway lets past it before ending a provider that ignores the cap
/// ([`stream_cap::cap_within`]), so a clamped stream never passes the
/// limit.
pub fn completion_cap(
    host: &impl Host,
    gw: &Gateway,
    (client, user): (&Client, Option<&str>),
    (prompt_est, asked, stream): (u64, Option<u64>, bool),
    price: Option<Price>,
    now_ms: u64,
) -> Result<Option<u64>, GatewayError> {
    let mut room: Option<u64> = None;
    let mut clamps = false;
    for level in gw.levels_of(client, user) {
        let l = level.limits;
        match l.max_tokens_mode {
            MaxTokensMode::Estimate => continue,
            MaxTokensMode::Refuse if asked.is_none() => {
                return Err(GatewayError::bad_request(
                    "max_tokens_required",
                    format!(
                        "The limits of {} need every request to name its completion cap: set `max_tokens` (`max_completion_tokens` for chat completions, `max_output_tokens` for responses).",
                        level.owner.describe()
                    ),
                ));
            }
            MaxTokensMode::Refuse => continue,
            MaxTokensMode::Clamp => clamps = true,
        }
        let mut fits = |n: u64| room = Some(room.map_or(n, |r| r.min(n)));
        let tpm = l
            .tokens_per_minute
            .filter(|_| l.scope.tokens_per_minute.local());
        let price = price.filter(|_| l.scope.budgets.local() && !l.budgets.is_empty());
        if tpm.is_none() && price.is_none() {
            continue;
        }
        let Some(c) = super::read_counters(host, &level) else {
            continue;
        };
        if let Some(tpm) = tpm {
            let left = ratelimit::level(&c.tokens, tpm, now_ms).remaining;
            fits(left.saturating_sub(prompt_est));
        }
        let Some(price) = price else {
            continue;
        };
        for b in &l.budgets {
            let spent = c.spent(b.period, b.period.index(now_ms, gw.budget_offset_ms));
            let left = b.micros.saturating_sub(spent);
            fits(price.completion_room(left, prompt_est));
        }
    }
    if !clamps {
        return Ok(None);
    }
    let want = asked.unwrap_or(client.limits.default_max_tokens);
    let room = if stream {
        room.map(stream_cap::cap_within)
    } else {
        room
    };
    let n = room.map_or(want, |r| r.min(want));
    Ok((n > 0).then_some(n))
}

/// The cheaper model a low budget sends a request to: the first level
/// (the key's, then its team's) with `on_budget_low` whose tightest local
/// budget has less than its threshold left.
pub fn budget_low_model(
    host: &impl Host,
    gw: &Gateway,
    (client, user): (&Client, Option<&str>),
    now_ms: u64,
) -> Option<String> {
    gw.levels_of(client, user).find_map(|level| {
        let low = level.limits.on_budget_low.as_ref()?;
        let c = super::read_counters(host, &level).unwrap_or_default();
        let tightest = level
            .limits
            .budgets
            .iter()
            .map(|b| {
                let spent = c.spent(b.period, b.period.index(now_ms, gw.budget_offset_ms));
                b.micros.saturating_sub(spent)
            })
            .min()?;
        (tightest < low.below_micros).then(|| low.model.clone())
    })
}
