//! Clients (by the SHA-256 of their key), the limits each one gets (the
//! `limits` defaults under its own), and the price table budgets need.

use super::raw::{check_limits, RawClient, RawConfig, DEFAULT_MAX_TOKENS};
use super::{
    parse_sha256_hex, Client, GlobalFailure, GlobalLimits, Limits, Model, PreviousKey, Team,
};
use crate::limits::ratelimit::Price;
use crate::limits::rls;
use hashbrown::HashMap;

/// Teams: their names and their own limits (a team does not inherit the
/// `limits` defaults, which are each key's).
pub(super) fn teams(raw: &RawConfig, problems: &mut Vec<String>) -> Vec<Team> {
    let mut out: Vec<Team> = Vec::with_capacity(raw.teams.len());
    for (i, t) in raw.teams.iter().enumerate() {
        let at = format!("teams[{i}] ({})", t.name);
        if t.name.trim().is_empty() {
            problems.push(format!("teams[{i}]: `name` is empty"));
        } else if out.iter().any(|o| o.name == t.name) {
            problems.push(format!("{at}: duplicate team name"));
        }
        let limits = match &t.limits {
            Some(l) => {
                check_limits(&format!("{at}.limits"), l, problems);
                if l.key_only() || l.per_user.is_some() {
                    problems.push(format!(
                        "{at}.limits: `max_body_bytes`, `default_max_tokens` and `per_user` are a key's (set them under `limits` or the client's `limits`)"
                    ));
                }
                l.over(&Limits::default())
            }
            None => Limits::default(),
        };
        out.push(Team {
            name: t.name.clone(),
            limits,
            counters_key: crate::shared::keys::counters(crate::shared::keys::Owner::Team(&t.name)),
        });
    }
    out
}

pub(super) fn clients(
    raw: &RawConfig,
    names: &HashMap<String, usize>,
    teams: &[Team],
    problems: &mut Vec<String>,
) -> HashMap<[u8; 32], Client> {
    if raw.clients.is_empty() {
        problems.push("clients: at least one client is required (name + key_sha256)".into());
    }
    check_limits("limits", &raw.limits.defaults, problems);
    let base_limits = raw.limits.defaults.over(&Limits {
        default_max_tokens: DEFAULT_MAX_TOKENS,
        max_body_bytes: super::raw::DEFAULT_MAX_BODY_BYTES,
        ..Limits::default()
    });
    let mut clients = HashMap::new();
    let mut client_names = hashbrown::HashSet::new();
    for (i, c) in raw.clients.iter().enumerate() {
        let at = format!("clients[{i}] ({})", c.name);
        if c.name.trim().is_empty() {
            problems.push(format!("clients[{i}]: `name` is empty"));
        } else if !client_names.insert(c.name.as_str()) {
            problems.push(format!("{at}: duplicate client name"));
        }
        let allowed = allowed_models(&at, c, names, problems);
        let Some(hash) = parse_sha256_hex(&c.key_sha256) else {
            problems.push(format!(
                "{at}: `key_sha256` must be 64 hex characters (the SHA-256 of the key)"
            ));
            continue;
        };
        if let Some(l) = &c.limits {
            check_limits(&format!("{at}.limits"), l, problems);
        }
        let limits = c
            .limits
            .as_ref()
            .map_or_else(|| base_limits.clone(), |l| l.over(&base_limits));
        let team = c.team.as_ref().and_then(|t| {
            let idx = teams.iter().position(|x| &x.name == t);
            if idx.is_none() {
                problems.push(format!("{at}: team `{t}` is not in `teams`"));
            }
            idx
        });
        let client = Client {
            name: c.name.clone(),
            allowed,
            limits,
            allow_overrides: c.allow_overrides,
            team,
            counters_key: crate::shared::keys::counters(crate::shared::keys::Owner::Key(&c.name)),
        };
        if clients.insert(hash, client).is_some() {
            problems.push(format!(
                "{at}: `key_sha256` is the same as another client's"
            ));
        }
    }
    clients
}

/// Rotated-out keys still in their grace period, each pointing at its
/// client's current key. An old key may not be any client's current key
/// nor another client's old key.
pub(super) fn previous_keys(
    raw: &RawConfig,
    clients: &HashMap<[u8; 32], Client>,
    problems: &mut Vec<String>,
) -> HashMap<[u8; 32], PreviousKey> {
    let mut out = HashMap::new();
    for (i, c) in raw.clients.iter().enumerate() {
        let Some(current) = parse_sha256_hex(&c.key_sha256) else {
            continue;
        };
        for (j, p) in c.previous_keys.iter().enumerate() {
            let at = format!("clients[{i}] ({}).previous_keys[{j}]", c.name);
            let Some(hash) = parse_sha256_hex(&p.sha256) else {
                problems.push(format!(
                    "{at}: `sha256` must be 64 hex characters (the SHA-256 of the old key)"
                ));
                continue;
            };
            if clients.contains_key(&hash) {
                problems.push(format!("{at}: `sha256` is a client's current key"));
            }
            let until_ms = p.until.saturating_mul(1000);
            if out
                .insert(hash, PreviousKey { current, until_ms })
                .is_some()
            {
                problems.push(format!("{at}: `sha256` is another previous key too"));
            }
        }
    }
    out
}

/// A client's allow-list as model indexes (`None`: every model).
fn allowed_models(
    at: &str,
    c: &RawClient,
    names: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Option<Vec<usize>> {
    let ms = c.models.as_ref()?;
    let mut out = Vec::new();
    for m in ms {
        match names.get(m) {
            Some(&idx) => out.push(idx),
            None => problems.push(format!(
                "{at}: allowed model `{m}` is not served by any provider"
            )),
        }
    }
    Some(out)
}

/// Every key's and team's limits, each named for a problem report.
fn named_levels<'a>(
    clients: &'a HashMap<[u8; 32], Client>,
    teams: &'a [Team],
) -> impl Iterator<Item = (String, &'a Limits)> {
    clients
        .values()
        .map(|c| (format!("clients ({})", c.name), &c.limits))
        .chain(
            teams
                .iter()
                .map(|t| (format!("teams ({})", t.name), &t.limits)),
        )
}

/// Each level's `on_budget_low` names a served model and has a budget to
/// watch.
pub(super) fn budget_routes(
    clients: &HashMap<[u8; 32], Client>,
    teams: &[Team],
    names: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) {
    let levels = named_levels(clients, teams);
    let mut found: Vec<String> = Vec::new();
    for (at, l) in levels {
        let Some(low) = &l.on_budget_low else {
            continue;
        };
        if !names.contains_key(&low.model) {
            found.push(format!(
                "{at}: on_budget_low.use_model `{}` is not a model any provider serves",
                low.model
            ));
        }
        if l.budgets.is_empty() {
            found.push(format!(
                "{at}: on_budget_low needs a budget on the same level to watch"
            ));
        }
    }
    found.sort();
    found.dedup();
    problems.extend(found);
}

/// A price as the config gives it (`at` names it in problems): every
/// number non-negative, per-image keys that read.
pub(super) fn price(at: &str, p: &super::raw::RawPrice, problems: &mut Vec<String>) -> Price {
    use super::raw::RawImagePrice;
    use crate::pricing::{ImageKey, ImagePrices};
    let bad = |x: &f64| !(x.is_finite() && *x >= 0.0);
    let units = [
        p.per_audio_minute,
        p.per_million_characters,
        p.per_thousand_searches,
    ];
    if [
        p.input,
        p.output,
        p.cached_input.unwrap_or(0.0),
        p.cache_write.unwrap_or(0.0),
        p.reasoning.unwrap_or(0.0),
        p.input_audio.unwrap_or(0.0),
        p.output_audio.unwrap_or(0.0),
    ]
    .iter()
    .chain(units.iter().flatten())
    .any(bad)
    {
        problems.push(format!(
            "{at}: prices must be non-negative numbers (USD per 1M tokens, per image, per audio minute, per 1M characters, per 1,000 searches)"
        ));
    }
    let mut images = ImagePrices::default();
    match &p.per_image {
        None => {}
        Some(RawImagePrice::One(usd)) => {
            if bad(usd) {
                problems.push(format!("{at}.per_image: must be a non-negative number"));
            }
            images.push(ImageKey::default(), usd * 1e6);
        }
        Some(RawImagePrice::By(by)) => {
            if by.len() > ImagePrices::MAX {
                problems.push(format!(
                    "{at}.per_image: at most {} prices",
                    ImagePrices::MAX
                ));
            }
            for (key, usd) in by {
                match ImageKey::of_price_key(key) {
                    Some(k) if !bad(usd) => {
                        images.push(k, usd * 1e6);
                    }
                    Some(_) => problems.push(format!(
                        "{at}.per_image.{key}: must be a non-negative number"
                    )),
                    None => problems.push(format!(
                        "{at}.per_image: `{key}` is not a size (`1024x1024`), a quality (standard, hd, low, medium, high, auto), both (`hd 1024x1792`) or `*`"
                    )),
                }
            }
        }
    }
    // Micro-dollars per unit: per second, per character, per search.
    let unit = p
        .per_audio_minute
        .map(|m| m * 1e6 / 60.0)
        .or(p.per_million_characters)
        .or(p.per_thousand_searches.map(|t| t * 1e3))
        .unwrap_or(0.0);
    if units.iter().flatten().count() > 1 {
        problems.push(format!(
            "{at}: give one of `per_audio_minute`, `per_million_characters`, `per_thousand_searches` (a model is priced by one unit)"
        ));
    }
    Price {
        input: p.input,
        output: p.output,
        cached_input: p.cached_input.unwrap_or(p.input),
        cache_write: p.cache_write.unwrap_or(p.input),
        reasoning: p.reasoning.unwrap_or(p.output),
        input_audio: p.input_audio.unwrap_or(p.input),
        output_audio: p.output_audio.unwrap_or(p.output),
        unit,
        images,
        units: 0,
    }
}

/// Prices per model index; a budget needs a price for every model.
pub(super) fn prices(
    raw: &RawConfig,
    names: &HashMap<String, usize>,
    models: &[Model],
    clients: &HashMap<[u8; 32], Client>,
    teams: &[Team],
    problems: &mut Vec<String>,
) -> Vec<Option<Price>> {
    let mut prices: Vec<Option<Price>> = vec![None; models.len()];
    for (name, p) in &raw.prices {
        let Some(&idx) = names.get(name) else {
            problems.push(format!(
                "prices: `{name}` is not a model any provider serves"
            ));
            continue;
        };
        let price = price(&format!("prices.{name}"), p, problems);
        if let Some(slot) = prices.get_mut(idx) {
            *slot = Some(price);
        }
    }
    let budgeted = clients
        .values()
        .map(|c| &c.limits)
        .chain(teams.iter().map(|t| &t.limits));
    if budgeted.into_iter().any(|l| !l.budgets.is_empty()) {
        let unpriced: Vec<&str> = models
            .iter()
            .zip(&prices)
            .filter(|(m, p)| !crate::pricing::priced(m, **p))
            .map(|(m, _)| m.name.as_str())
            .collect();
        if !unpriced.is_empty() {
            problems.push(format!(
                "a budget is set, but no price is known for these models (add them to `prices`, or a provider model's `price`): {}",
                unpriced.join(", ")
            ));
        }
    }
    prices
}

/// `limits.global`, checked against the keys and teams whose limits use it.
pub(super) fn global_limits(
    raw: &RawConfig,
    clients: &HashMap<[u8; 32], Client>,
    teams: &[Team],
    problems: &mut Vec<String>,
) -> Option<GlobalLimits> {
    let mut users: Vec<String> = Vec::new();
    let levels = named_levels(clients, teams);
    for (at, l) in levels {
        let s = l.scope;
        let budgets = l
            .budgets
            .iter()
            .map(|b| (s.budgets.global(), Some(rls::budget_units(b.micros))));
        let counted = [
            (s.requests_per_minute.global(), l.requests_per_minute),
            (s.tokens_per_minute.global(), l.tokens_per_minute),
        ]
        .into_iter()
        .chain(budgets);
        for (global, value) in counted {
            let Some(v) = value.filter(|_| global) else {
                continue;
            };
            if !users.contains(&at) {
                users.push(at.clone());
            }
            if u32::try_from(v).is_err() {
                problems.push(format!(
                    "{at}: a global limit counts at most {} per period (tokens, requests, or budget units of $0.0001); {v} is too large",
                    u32::MAX
                ));
            }
        }
    }
    users.sort_unstable();
    let Some(g) = raw.limits.global.as_ref() else {
        if !users.is_empty() {
            problems.push(format!(
                "limits.global is required: {} have limits scoped `global` or `both`, counted by the rate limit service it names (cluster, timeout_ms, failure_mode)",
                users.join(", ")
            ));
        }
        return None;
    };
    if g.cluster.trim().is_empty() {
        problems.push(
            "limits.global.cluster: the Envoy cluster of the rate limit service is required".into(),
        );
    }
    if g.timeout_ms == 0 || g.timeout_ms > 60_000 {
        problems.push("limits.global.timeout_ms must be between 1 and 60000".into());
    }
    let failure = match g.failure_mode.as_str() {
        "allow" => GlobalFailure::Allow,
        "deny" => GlobalFailure::Deny,
        "local_share" => GlobalFailure::LocalShare,
        other => {
            problems.push(format!(
                "limits.global.failure_mode: `{other}` is not a failure mode (expected local_share, allow or deny)"
            ));
            GlobalFailure::LocalShare
        }
    };
    if g.replicas == 0 {
        problems.push("limits.global.replicas must be at least 1".into());
    }
    Some(GlobalLimits {
        cluster: g.cluster.clone(),
        timeout_ms: g.timeout_ms,
        failure,
        replicas: g.replicas.max(1),
    })
}
