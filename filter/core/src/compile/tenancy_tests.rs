//! Teams, budget periods and the test clock in the config compiler.
use super::tests::{day_budget, GOOD};
use super::*;
use crate::limits::period::Period;
use crate::shared::keys::Owner;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const PRICES: &str = "prices:\n  gpt-4o-mini: {input: 1, output: 1}\n  gpt-4o: {input: 1, output: 1}\n  llama-3: {input: 1, output: 1}\n";

fn with_teams(teams: &str, limited_extra: &str) -> String {
    GOOD.replace(
        "    models: [mini]\n",
        &format!("    models: [mini]\n{limited_extra}"),
    ) + teams
        + PRICES
}

#[test]
fn a_key_in_a_team_passes_both_levels_in_order() {
    let text = with_teams(
        "teams:\n  - name: research\n    limits:\n      requests_per_minute: 100\n      max_concurrent: 5\n      budgets: [{usd: 100, period: week}, {usd: 300, period: month}]\n      scope: {budgets: global}\nlimits:\n  budget_usd_per_day: 2\n  budget_utc_offset: '+02:00'\n  global: {cluster: rls}\n",
        "    team: research\n",
    );
    let g = compile(text.as_bytes()).unwrap();
    assert_eq!(g.budget_offset_ms, 2 * 3_600_000);
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    let levels: Vec<_> = g.levels(limited).collect();
    assert_eq!(levels.len(), 2);
    assert_eq!(levels[0].owner, Owner::Key("limited"));
    assert_eq!(levels[0].limits.budgets, vec![day_budget(2_000_000)]);
    assert_eq!(levels[1].owner, Owner::Team("research"));
    let team = levels[1].limits;
    assert_eq!(
        (team.requests_per_minute, team.max_concurrent),
        (Some(100), Some(5))
    );
    assert_eq!(
        team.budgets
            .iter()
            .map(|b| (b.period, b.micros))
            .collect::<Vec<_>>(),
        vec![(Period::Week, 100_000_000), (Period::Month, 300_000_000)]
    );
    assert_eq!(team.scope.budgets, Scope::Global);
    assert_eq!(
        team.tokens_per_minute, None,
        "a team does not inherit the keys' defaults"
    );
    let demo = g.clients.values().find(|c| c.name == "demo").unwrap();
    assert_eq!(g.levels(demo).count(), 1, "a key without a team");
    // The counters' keys the config holds are the names a reload keeps (a
    // key's and a team's), and an end user's is built the same way.
    for level in &levels {
        assert_eq!(
            level.counters_key(),
            crate::shared::keys::counters(level.owner)
        );
    }
    assert_eq!(levels[0].counters_key(), "portcullis:level:limited");
    assert_eq!(levels[1].counters_key(), "portcullis:team:level:research");
    let user = crate::config::Level::new(Owner::User("limited/u1"), &limited.limits);
    assert_eq!(user.counters_key(), "portcullis:user:level:limited/u1");
}

#[test]
fn a_keys_budgets_replace_the_defaults_budgets_as_a_whole() {
    let text = with_teams(
        "limits:\n  budgets: [{usd: 10, period: week}, {usd: 1, period: day}]\n",
        "    limits: {budgets: [{usd: 50, period: total}]}\n",
    );
    let g = compile(text.as_bytes()).unwrap();
    let demo = g.clients.values().find(|c| c.name == "demo").unwrap();
    assert_eq!(
        demo.limits
            .budgets
            .iter()
            .map(|b| b.period)
            .collect::<Vec<_>>(),
        vec![Period::Day, Period::Week],
        "in period order"
    );
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    assert_eq!(
        limited.limits.budgets,
        vec![Budget {
            micros: 50_000_000,
            period: Period::Total
        }]
    );
}

#[test]
fn team_and_budget_problems_are_reported_together() {
    let text = with_teams(
        "teams:\n  - name: research\n    limits: {max_body_bytes: 5, budgets: [{usd: -1, period: fortnight}, {usd: 1, period: week}, {usd: 2, period: week}], tokens_per_minute: 9000000000, scope: global}\n  - name: research\n  - name: ''\nlimits:\n  budget_utc_offset: CET\n",
        "    team: nobody\n    limits: {budget_usd_per_day: 1, budgets: [{usd: 1, period: day, scope: global}]}\n",
    );
    let e = compile(text.as_bytes()).unwrap_err();
    for want in [
        "teams[0] (research).limits: `max_body_bytes`, `default_max_tokens` and `per_user` are a key's",
        "teams[0] (research).limits.budgets[0]: `usd` must be a non-negative number",
        "teams[0] (research).limits.budgets[0]: `fortnight` is not a period",
        "teams[0] (research).limits.budgets[2]: a second budget per week",
        "teams[1] (research): duplicate team name",
        "teams[2]: `name` is empty",
        "clients[1] (limited): team `nobody` is not in `teams`",
        "clients[1].limits.budgets[0]: unknown key `scope`",
        "limits.global is required: teams (research)",
        "teams (research): a global limit counts at most",
        "limits.budget_utc_offset: `CET` is not an offset",
    ] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
    // The day shorthand and a day in `budgets` are two budgets per day.
    let text = with_teams(
        "",
        "    limits: {budget_usd_per_day: 1, budgets: [{usd: 1, period: day}]}\n",
    );
    let e = compile(text.as_bytes()).unwrap_err();
    assert!(e.contains("a second budget per day"), "{e}");
}

#[test]
fn a_team_budget_needs_prices_like_a_keys() {
    let text = GOOD.to_string()
        + "teams:\n  - name: t\n    limits: {budgets: [{usd: 5, period: month}]}\n";
    let e = compile(text.as_bytes()).unwrap_err();
    // gpt-4o-mini and gpt-4o are in the default table; llama-3 is not.
    assert!(
        e.contains("a budget is set, but no price is known for these models (add them to `prices`, or a provider model's `price`): llama-3\n")
            || e.ends_with("llama-3"),
        "{e}"
    );
}

#[test]
fn the_test_clock_is_read_and_defaults_to_none() {
    let g = compile(GOOD.as_bytes()).unwrap();
    assert_eq!((g.clock_offset_ms, g.budget_offset_ms), (0, 0));
    let text = format!("{GOOD}testing: {{clock_offset_ms: 604800000}}\n");
    assert_eq!(
        compile(text.as_bytes()).unwrap().clock_offset_ms,
        604_800_000
    );
}

#[test]
fn clamping_and_budget_routing_are_checked() {
    let text = with_teams(
        "teams:\n  - name: t\n    limits: {max_tokens_mode: squeeze, on_budget_low: {below_usd: 0, use_model: nowhere}}\n",
        "    limits: {on_budget_low: {below_usd: 1, use_model: mini}, budget_usd_per_day: 3, max_tokens_mode: clamp}\n",
    );
    let e = compile(text.as_bytes()).unwrap_err();
    for want in [
        "teams[0] (t).limits.max_tokens_mode: `squeeze` is not a mode",
        "teams[0] (t).limits.on_budget_low.below_usd must be a positive number",
        "teams (t): on_budget_low.use_model `nowhere` is not a model any provider serves",
        "teams (t): on_budget_low needs a budget on the same level to watch",
    ] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
    assert!(
        !e.contains("clients (limited)"),
        "an alias is a served model: {e}"
    );
    let ok = with_teams(
        "",
        "    limits: {on_budget_low: {below_usd: 1, use_model: mini}, budget_usd_per_day: 3, max_tokens_mode: clamp}\n",
    );
    let g = compile(ok.as_bytes()).unwrap();
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    assert_eq!(limited.limits.max_tokens_mode, MaxTokensMode::Clamp);
    assert_eq!(
        limited.limits.on_budget_low,
        Some(BudgetLow {
            below_micros: 1_000_000,
            model: "mini".into()
        })
    );
}

#[test]
fn per_user_limits_are_a_keys_and_read_like_any_level() {
    let text = with_teams(
        "limits:\n  user_header: X-End-User\n  max_users_per_key: 50\n  per_user: {requests_per_minute: 5, budgets: [{usd: 2, period: week}]}\n",
        "    limits: {per_user: {tokens_per_minute: 1000}}\n",
    );
    let g = compile(text.as_bytes()).unwrap();
    assert_eq!(
        (g.user_header.as_deref(), g.max_users_per_key),
        (Some("x-end-user"), 50)
    );
    let demo = g.clients.values().find(|c| c.name == "demo").unwrap();
    let u = demo.limits.per_user.as_deref().unwrap();
    assert_eq!(u.requests_per_minute, Some(5));
    assert_eq!(u.budgets[0].period, Period::Week);
    let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
    let u = limited.limits.per_user.as_deref().unwrap();
    assert_eq!(
        (u.tokens_per_minute, u.requests_per_minute),
        (Some(1000), None),
        "replaced, not merged"
    );
    let levels: Vec<_> = g
        .levels_of(demo, Some("demo/alice"))
        .map(|l| l.owner)
        .collect();
    assert_eq!(levels, [Owner::Key("demo"), Owner::User("demo/alice")]);
    let bad = with_teams(
        "teams:\n  - name: t\n    limits: {per_user: {requests_per_minute: 1}}\nlimits:\n  max_users_per_key: 0\n",
        "    limits: {per_user: {default_max_tokens: 5, per_user: {requests_per_minute: 1}}}\n",
    );
    let e = compile(bad.as_bytes()).unwrap_err();
    for want in [
        "teams[0] (t).limits: `max_body_bytes`, `default_max_tokens` and `per_user` are a key's",
        "clients[1] (limited).limits.per_user: a user's limits are",
        "limits.max_users_per_key must be at least 1",
    ] {
        assert!(e.contains(want), "{want} missing from: {e}");
    }
}
