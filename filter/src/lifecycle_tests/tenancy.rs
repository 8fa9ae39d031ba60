//! Teams and budget periods through the request lifecycle: every level is
//! passed or nothing is taken, periods roll over with the clock, and a
//! team's global limits go in the same call as the key's.

use super::*;

/// The demo key in team `research` with `team` limits.
fn team_config(key: &str, team: &str, extra: &str) -> String {
    config(key, extra).replace("    limits: ", "    team: research\n    limits: ")
        + &format!("teams:\n  - name: research\n    limits: {team}\n")
}

fn counter(g: &Gateway, key: &str) -> Option<Vec<u8>> {
    g.host.store.get(key).unwrap().0
}

fn spent(g: &Gateway, owner: Owner<'_>, period: Period, now: u64) -> i64 {
    g.counters(owner).spent(period, period.index(now, 0))
}

#[test]
fn a_refusal_at_the_team_level_takes_nothing_from_the_keys_counters() {
    let g = Gateway::new(&team_config(
        "{requests_per_minute: 100, tokens_per_minute: 100000, max_concurrent: 5, budget_usd_per_day: 1}",
        "{max_concurrent: 1, requests_per_minute: 1000}",
        "",
    ));
    let now = g.host.now_ms();
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    let key = Owner::Key("demo");
    let (_first, a) = g.chat(&[], &body("one"));
    assert_eq!(a, Action::Continue, "the first holds the team's one slot");
    let after_first = (
        g.counters(key).in_flight,
        g.tokens_level(),
        spent(&g, key, Period::Day, now),
    );
    assert_eq!(after_first.0, 1);
    assert!(after_first.2 > 0);
    let (second, _) = g.chat(&[], &body("two"));
    let (status, v) = sent_json(&second);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (429, Some("concurrency_limit_exceeded"))
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("team `research`: limit 1"), "{msg}");
    // The key's slot, tokens and budget are as the first request left them.
    assert_eq!(
        (
            g.counters(key).in_flight,
            g.tokens_level(),
            spent(&g, key, Period::Day, now),
        ),
        after_first
    );
    // Refused after its headers, it was still a request (as at one level).
    let rpm = g.counters(key).requests;
    assert_eq!(rpm.level_milli / 1000, 98);
}

#[test]
fn a_team_request_rate_refusal_gives_the_keys_take_back() {
    let g = Gateway::new(&team_config(
        "{requests_per_minute: 100}",
        "{requests_per_minute: 1}",
        "",
    ));
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    let (_first, a) = g.chat(&[], &body("one"));
    assert_eq!(a, Action::Continue);
    let (second, _) = g.chat(&[], &body("two"));
    let (status, hdrs, b) = second.host.sent().unwrap();
    let v: Value = serde_json::from_slice(&b).unwrap();
    assert_eq!(status, 429);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("requests per minute on team `research`: limit 1"),
        "{msg}"
    );
    let header = |name: &str| {
        hdrs.iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| String::from_utf8_lossy(v).to_string())
    };
    assert_eq!(
        header("x-ratelimit-limit-requests").as_deref(),
        Some("1"),
        "the team's, which refused"
    );
    let rpm = g.counters(Owner::Key("demo")).requests;
    assert_eq!(
        rpm.level_milli / 1000,
        99,
        "the key counts only the admitted request"
    );
}

#[test]
fn a_team_budget_is_shared_by_its_keys_and_refused_until_its_week_ends() {
    // $0.15 and $0.60 per 1M tokens; a request reserves 23 prompt tokens
    // (body/4) + 100 = 64 micro-USD; a week's team budget of $0.00015
    // admits two.
    let g = Gateway::new(&team_config(
        "{budget_usd_per_day: 5}",
        "{budgets: [{usd: 0.00015, period: week}]}",
        "",
    ));
    let now = g.host.now_ms();
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    let team = Owner::Team("research");
    for _ in 0..2 {
        let (ctx, a) = g.chat(&[], &body("hello"));
        assert_eq!(a, Action::Continue, "{:?}", ctx.host.sent());
    }
    let key_spent = spent(&g, Owner::Key("demo"), Period::Day, now);
    let (refused, _) = g.chat(&[], &body("hello"));
    let (status, hdrs, body_bytes) = refused.host.sent().unwrap();
    let v: Value = serde_json::from_slice(&body_bytes).unwrap();
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (429, Some("budget_exceeded"))
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.starts_with("Weekly budget of $0.00 for team `research`"),
        "{msg}"
    );
    let to_week_end = Period::Week.ms_to_end(now, 0).unwrap();
    let retry: u64 = hdrs
        .iter()
        .find(|(k, _)| k == "retry-after")
        .map(|(_, v)| String::from_utf8_lossy(v).parse().unwrap())
        .unwrap();
    assert_eq!(retry, to_week_end.div_ceil(1000));
    assert_eq!(
        spent(&g, Owner::Key("demo"), Period::Day, now),
        key_spent,
        "the key's daily budget gave its reservation back"
    );
    // Next Monday: a new week, a new team budget (it holds one request's,
    // where last week's held two).
    let last_week = spent(&g, team, Period::Week, now);
    let monday = now + to_week_end;
    g.host.state.borrow_mut().now_ms = monday;
    let (ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Continue, "{:?}", ctx.host.sent());
    let this_week = spent(&g, team, Period::Week, monday);
    assert!(
        this_week > 0 && this_week < last_week,
        "{this_week} {last_week}"
    );
}

#[test]
fn the_tightest_budget_is_in_the_answers_headers() {
    let g = Gateway::new(&team_config(
        "{budgets: [{usd: 5, period: day}, {usd: 20, period: month}]}",
        "{budgets: [{usd: 3, period: total}]}",
        "",
    ));
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    let (mut ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Continue);
    router_answers(&mut ctx, "200", ANSWER);
    let rate = ctx.limits.headers().to_vec();
    let left: f64 = rate
        .iter()
        .find(|(k, _)| *k == "x-portcullis-budget-remaining-usd")
        .map(|(_, v)| v.parse().unwrap())
        .expect("budget header");
    assert!(left < 3.0 && left > 2.99, "the team's total: {rate:?}");
    assert!(
        !rate.iter().any(|(k, _)| *k == "x-portcullis-budget-reset"),
        "a total budget does not reset: {rate:?}"
    );
    // Without the team's total, the key's day is tightest, and resets.
    let g = Gateway::new(&config(
        "{budgets: [{usd: 5, period: day}, {usd: 20, period: month}]}",
        "",
    ));
    let (ctx, _) = g.chat(&[], &body("hello"));
    let rate = ctx.limits.headers().to_vec();
    assert!(
        rate.iter()
            .any(|(k, v)| *k == "x-portcullis-budget-reset" && v.ends_with('s')),
        "{rate:?}"
    );
}

#[test]
fn a_teams_global_limits_go_in_the_keys_call_and_its_refusal_names_the_team() {
    let g = Gateway::new(&team_config(
        "{requests_per_minute: 10, scope: global}",
        "{requests_per_minute: 50, budgets: [{usd: 100, period: month}], scope: global}",
        GLOBAL,
    ));
    let (mut ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Pause);
    let calls = ctx.host.callouts();
    // One call (#34): the request rate of the key and the team, and the
    // team's budget.
    assert_eq!(calls.len(), 1);
    let text = String::from_utf8_lossy(&calls[0].body).to_string();
    assert!(
        text.contains("client") && text.contains("team") && text.contains("research"),
        "{text:?}"
    );
    assert!(
        text.contains("budget_usd_per_month") && text.contains("month"),
        "{text:?}"
    );
    // The team's request rate is over its limit.
    service_answers(
        &mut ctx,
        0,
        &rls_answers(
            2,
            &[(1, 10, 9, 6), (2, 50, 0, 6), (1, 1_000_000, 999_000, 60)],
        ),
    );
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (429, Some("rate_limit_exceeded"))
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("team `research`: limit 50 across the fleet"),
        "{msg}"
    );
}

/// The body the router sends upstream, as JSON.
fn upstream_body(ctx: &RequestContext<FakeHost>) -> Value {
    serde_json::from_slice(&ctx.host.body_of(Part::Request)).unwrap()
}

fn header(ctx: &RequestContext<FakeHost>, name: &str) -> Option<String> {
    ctx.limits
        .headers()
        .iter()
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.clone())
}

#[test]
fn a_clamp_sets_the_cap_to_the_room_the_team_has_and_says_so() {
    // The team's bucket has 300 tokens; the key's 100000. A request with
    // no cap gets the team's room after its prompt estimate.
    let g = Gateway::new(&team_config(
        "{tokens_per_minute: 100000}",
        "{tokens_per_minute: 300, max_tokens_mode: clamp}",
        "",
    ));
    let text = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}]}"#;
    let prompt_est = (text.len() as u64).div_ceil(4);
    let (ctx, a) = g.chat(&[], text);
    assert_eq!(a, Action::Continue, "{:?}", ctx.host.sent());
    let sent = upstream_body(&ctx);
    assert_eq!(sent["max_completion_tokens"], 300 - prompt_est);
    assert_eq!(
        header(&ctx, "x-portcullis-max-tokens-clamped"),
        Some((300 - prompt_est).to_string())
    );
    // The reservation was exactly the room: the team's bucket is empty.
    let team = g.counters(Owner::Team("research")).tokens;
    assert!(team.level_milli < 1000, "{team:?}");
}

#[test]
fn a_clamp_lowers_a_cap_past_the_budget_and_keeps_one_that_fits() {
    // $0.15/$0.60 per 1M tokens and a day's budget of $0.0002: 200
    // micro-USD pays for ~300 completion tokens after a short prompt.
    let g = Gateway::new(&config(
        "{budget_usd_per_day: 0.0002, max_tokens_mode: clamp}",
        "",
    ));
    let (ctx, a) = g.chat(&[], &body("hello"));
    assert_eq!(a, Action::Continue);
    assert_eq!(upstream_body(&ctx)["max_tokens"], 100, "100 fits: kept");
    assert_eq!(header(&ctx, "x-portcullis-max-tokens-clamped"), None);
    let big = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hello"}],"max_tokens":100000}"#;
    let (ctx, a) = g.chat(&[], big);
    assert_eq!(a, Action::Continue, "{:?}", ctx.host.sent());
    let n = upstream_body(&ctx)["max_tokens"].as_u64().unwrap();
    assert!(n > 100 && n < 300, "clamped to the budget's room: {n}");
}

#[test]
fn refuse_mode_needs_a_named_cap_and_estimate_sends_the_request_as_it_is() {
    let g = Gateway::new(&team_config("{}", "{max_tokens_mode: refuse}", ""));
    let (ctx, _) = g.chat(
        &[],
        r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#,
    );
    let (status, v) = sent_json(&ctx);
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (400, Some("max_tokens_required"))
    );
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("team `research`"));
    let (_ctx, a) = g.chat(&[], &body("named"));
    assert_eq!(a, Action::Continue);
    let g = Gateway::new(&config("{tokens_per_minute: 10000}", ""));
    let text = r#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}"#;
    let (ctx, a) = g.chat(&[], text);
    assert_eq!(a, Action::Continue);
    assert_eq!(
        ctx.host.body_of(Part::Request),
        text.as_bytes(),
        "untouched"
    );
}

fn user_body(user: &str) -> String {
    format!(
        r#"{{"model":"gpt-4o-mini","messages":[{{"role":"user","content":"hi"}}],"max_tokens":10,"user":"{user}"}}"#
    )
}

#[test]
fn each_end_user_of_a_key_has_its_own_limits_and_new_users_past_the_bound_share_one() {
    let g = Gateway::new(&config(
        "{requests_per_minute: 100, per_user: {requests_per_minute: 2, budgets: [{usd: 1, period: day}]}}",
        "limits:\n  max_users_per_key: 2\n",
    ));
    for _ in 0..2 {
        let (ctx, a) = g.chat(&[], &user_body("alice"));
        assert_eq!(a, Action::Continue, "{:?}", ctx.host.sent());
    }
    let (ctx, _) = g.chat(&[], &user_body("alice"));
    let (status, v) = sent_json(&ctx);
    assert_eq!(status, 429);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("user `demo/alice`: limit 2"), "{msg}");
    // Another user of the key has their own bucket; a request without a
    // user has the key's limits only.
    let (_ctx, a) = g.chat(&[], &user_body("bob"));
    assert_eq!(a, Action::Continue);
    let (_ctx, a) = g.chat(&[], &body("anyone"));
    assert_eq!(a, Action::Continue);
    // Past two tracked users, new ones share the overflow level.
    for u in ["carol", "dave"] {
        let (ctx, a) = g.chat(&[], &user_body(u));
        assert_eq!(a, Action::Continue, "{u}: {:?}", ctx.host.sent());
    }
    let (ctx, _) = g.chat(&[], &user_body("erin"));
    let (status, v) = sent_json(&ctx);
    assert_eq!(status, 429);
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("user `demo/~overflow`"));
    assert_eq!(
        decode_u32(counter(&g, &keys::users("demo")).as_deref()),
        2,
        "two users tracked"
    );
    // The user's budget was reserved under their own key.
    let now = g.host.now_ms();
    assert!(spent(&g, Owner::User("demo/bob"), Period::Day, now) > 0);
}

#[test]
fn a_header_names_the_end_user_before_the_body() {
    let g = Gateway::new(&config(
        "{per_user: {requests_per_minute: 1}}",
        "limits:\n  user_header: X-End-User\n",
    ));
    let (_ctx, a) = g.chat(&[("x-end-user", "zoe")], &user_body("alice"));
    assert_eq!(a, Action::Continue);
    // alice has not been seen: zoe was the user.
    let (_ctx, a) = g.chat(&[], &user_body("alice"));
    assert_eq!(a, Action::Continue);
    let (ctx, _) = g.chat(&[("x-end-user", "zoe")], &body("again"));
    assert_eq!(sent_json(&ctx).0, 429);
}

/// Each step of a request at a level is one read and one CAS of the
/// level's counters, whatever the number of its limits (#49): a key and its
/// team with five limits each cost a routed request 12 shared-data calls
/// (the rate at the headers, the admission, the settlement), not 36.
#[test]
fn a_request_at_two_levels_of_five_limits_makes_one_read_and_one_write_per_level_and_step() {
    let five = "{requests_per_minute: 1000, tokens_per_minute: 1000000, max_concurrent: 10, budgets: [{usd: 100, period: day}, {usd: 1000, period: month}]}";
    let g = Gateway::new(&team_config(five, five, ""));
    crate::limits::admission::prepare(&g.host, &g.loaded.gw);
    let (mut ctx, a) = g.send_chat(&[], &body("hello"), true);
    assert_eq!(a, Action::Continue);
    router_answers(&mut ctx, "200", ANSWER);
    ctx.on_log();
    let calls: Vec<String> = ctx
        .host
        .host_calls()
        .into_iter()
        .filter(|c| c.contains(":level:"))
        .collect();
    let key = "portcullis:level:demo";
    let team = "portcullis:team:level:research";
    let step = |k: &str| {
        [
            format!("get_shared_data {k}"),
            format!("set_shared_data {k}"),
        ]
    };
    let want: Vec<String> = [key, team, key, team, key, team]
        .iter()
        .flat_map(|k| step(k))
        .collect();
    assert_eq!(calls, want);
    // What the steps wrote: one request, its slot freed, the answer's 15
    // tokens and its cost settled at both levels.
    for owner in [Owner::Key("demo"), Owner::Team("research")] {
        let c = g.counters(owner);
        assert_eq!(c.in_flight, 0, "{owner:?}");
        assert_eq!(c.requests.level_milli / 1000, 999, "{owner:?}");
        assert_eq!(c.tokens.level_milli / 1000, 1_000_000 - 15, "{owner:?}");
        let day = Period::Day.index(g.host.now_ms(), 0);
        assert!(c.spent(Period::Day, day) > 0, "{owner:?}");
    }
}
