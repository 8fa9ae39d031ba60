//! `build`: a checked `RawConfig` into the `Gateway` the request path uses,
//! as a short sequence of named steps. Every step records its problems and
//! goes on, so one report lists them all.

use super::raw::{check_breaker, RawConfig, DEFAULT_MAX_ATTEMPTS};
use super::{clients, guardrails, mcp, models, policy, sections, Gateway};
use crate::health::breaker::BreakerConfig;

pub(super) fn build(mut raw: RawConfig, problems: &mut Vec<String>) -> Option<Gateway> {
    for (i, p) in raw.providers.iter_mut().enumerate() {
        let at = format!("providers[{i}] ({})", p.name);
        p.apply_preset(&at, problems);
        p.apply_bedrock(&at, problems);
    }
    let by_name = models::check_providers(&raw.providers, problems);
    let order = models::chain_order(&raw, &by_name, problems);
    let default_breaker = raw.breaker.over(&BreakerConfig::default());
    check_breaker("breaker", &default_breaker, problems);
    let (providers, mut models, model_idx) =
        models::providers_and_models(&raw, &order, &default_breaker, problems);
    let names = models::aliases(&raw, &model_idx, &mut models, problems);
    let auto = models::auto_weights(&raw, &order, &model_idx, problems);
    let teams = clients::teams(&raw, problems);
    let clients = clients::clients(&raw, &names, &teams, problems);
    clients::budget_routes(&clients, &teams, &names, problems);
    let previous_keys = clients::previous_keys(&raw, &clients, problems);
    let max_attempts = raw.routing.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    if max_attempts == 0 {
        problems.push("routing.max_attempts must be at least 1".into());
    }
    let prices = clients::prices(&raw, &names, &models, &clients, &teams, problems);
    let global_limits = clients::global_limits(&raw, &clients, &teams, problems);
    let max_users_per_key = raw.limits.max_users_per_key.unwrap_or(10_000);
    if max_users_per_key == 0 {
        problems.push("limits.max_users_per_key must be at least 1".into());
    }
    let budget_offset_ms = match raw.limits.budget_utc_offset.as_deref() {
        None => 0,
        Some(s) => crate::limits::period::parse_offset(s).unwrap_or_else(|| {
            problems.push(format!(
                "limits.budget_utc_offset: `{s}` is not an offset from UTC (expected UTC, +HH:MM or -HH:MM, within 14 hours)"
            ));
            0
        }),
    };
    let guardrails = guardrails::guardrails(&raw, &names, problems);
    let provider_names: Vec<String> = providers.iter().map(|p| p.name.clone()).collect();
    let policy = policy::policy(&raw, &names, &provider_names, problems);
    let trace_sample_rate = raw.tracing.as_ref().map_or(0.0, |t| t.sample_rate);
    if !(0.0..=1.0).contains(&trace_sample_rate) {
        problems.push(format!(
            "tracing.sample_rate must be from 0 to 1 (it is {trace_sample_rate})"
        ));
    }
    Some(Gateway {
        trace_sample_rate,
        policy,
        guardrails,
        cache: sections::cache(&raw.cache, problems),
        experiments: sections::experiments(&raw, &names, problems),
        log: sections::log(&raw, problems),
        providers,
        models,
        names,
        auto,
        clients,
        previous_keys,
        max_body_bytes: raw
            .limits
            .defaults
            .max_body_bytes
            .unwrap_or(super::raw::DEFAULT_MAX_BODY_BYTES),
        max_attempts,
        prices,
        global_limits,
        teams,
        budget_offset_ms,
        clock_offset_ms: raw.testing.as_ref().map_or(0, |t| t.clock_offset_ms),
        user_header: raw
            .limits
            .user_header
            .as_ref()
            .map(|h| h.to_ascii_lowercase()),
        max_users_per_key,
        mcp: mcp::mcp(&raw, problems),
    })
}
