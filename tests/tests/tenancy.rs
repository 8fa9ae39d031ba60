//! Teams and budget periods in real Envoy with 2 workers: a team's limits
//! shared by its keys, a refusal at the team level that takes nothing from
//! the key's counters, a burst against a team budget, and week and month
//! budgets rolling over on the filter's test clock (reloaded, never slept).
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;
use std::sync::{Arc, Barrier};
use std::time::Duration;

const RELOADS: &str = "extension_config_discovery.http_filter.portcullis.config_reload";
const FAILS: &str = "extension_config_discovery.http_filter.portcullis.config_fail";

/// The test plugin with the demo and mini-only keys in team `research`
/// (with `team` limits), each key with `key` limits, gpt-4o-mini at $1000
/// per 1M tokens (a token costs $0.001), and `extra` sections.
fn team_plugin(key: &str, team: &str, extra: &str) -> String {
    let p = test_plugin();
    let shipped = "  gpt-4o-mini: {input: 0.15, output: 0.60, cached_input: 0.075}\n";
    assert!(p.contains(shipped), "envoy/plugin.yaml prices changed");
    // The key lines of the two clients follow (the order of keys in a
    // YAML mapping does not matter).
    let (demo, mini) = ("  - name: demo\n", "  - name: mini-only\n");
    assert!(p.contains(demo) && p.contains(mini));
    let member = |c: &str| format!("{c}    team: research\n    limits: {key}\n");
    p.replace(shipped, "  gpt-4o-mini: {input: 1000, output: 1000}\n")
        .replace(demo, &member(demo))
        .replace(mini, &member(mini))
        + &format!("teams:\n  - name: research\n    limits: {team}\n")
        + extra
}

/// A request whose reservation is `reserve` tokens (its prompt estimate,
/// bytes / 4, plus `max_tokens`).
fn exact_request() -> (String, u64) {
    let body = json!({"model": "gpt-4o-mini", "max_tokens": 10,
        "messages": [{"role": "user", "content": "budget"}]})
    .to_string();
    let reserve = body.len().div_ceil(4) as u64 + 10;
    (body, reserve)
}

/// The mock answers with usage of exactly the reservation: every admitted
/// request spends what it reserved, so a budget of n reservations admits n.
fn spend_what_is_reserved(s: &Stack, reserve: u64) {
    s.primary
        .default_step(json!({"usage": {"prompt_tokens": reserve - 10, "completion_tokens": 10}}));
}

/// USD for `n` reservations of `reserve` tokens at $0.001 a token.
fn usd(n: u64, reserve: u64) -> f64 {
    (n * reserve) as f64 / 1000.0
}

fn burst(s: &Stack, keys: &[&str], n: usize, body: &str) -> Vec<Resp> {
    let url = s.envoy.url("/v1/chat/completions");
    let gate = Arc::new(Barrier::new(n));
    std::thread::scope(|sc| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let (url, gate) = (&url, gate.clone());
                let auth = format!("Bearer {}", keys[i % keys.len()]);
                sc.spawn(move || {
                    gate.wait();
                    post(url, &[("authorization", &auth)], body)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn count(rs: &[Resp], status: u16) -> usize {
    rs.iter().filter(|r| r.status == status).count()
}

#[test]
fn fifty_requests_from_two_keys_against_a_team_budget_for_five_admit_five() {
    let (body, reserve) = exact_request();
    // The team's budget is exactly five reservations; each key's is ample.
    let plugin = team_plugin(
        "{budget_usd_per_day: 100}",
        &format!("{{budget_usd_per_day: {}}}", usd(5, reserve)),
        "",
    );
    let s = Stack::start(&plugin, 2);
    spend_what_is_reserved(&s, reserve);
    let rs = burst(&s, &[DEMO_KEY, MINI_KEY], 50, &body);
    assert_eq!((count(&rs, 200), count(&rs, 429)), (5, 45));
    let refused = rs.iter().find(|r| r.status == 429).unwrap();
    let msg = openai_error_message(refused, 429, "budget_exceeded");
    assert!(
        msg.starts_with("Daily budget of $") && msg.contains("team `research`"),
        "{msg}"
    );
    assert!(refused.header_u64("retry-after") <= 86_400);
    // Each admitted answer says what was left of the tightest budget (the
    // team's): five different amounts, the last one 0.
    let mut left: Vec<f64> = rs
        .iter()
        .filter(|r| r.status == 200)
        .map(|r| {
            r.header("x-portcullis-budget-remaining-usd")
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    left.sort_by(f64::total_cmp);
    assert_eq!(left[0], 0.0, "{left:?}");
    assert!(left.windows(2).all(|w| w[0] < w[1]), "{left:?}");
    assert!(rs.iter().filter(|r| r.status == 200).all(|r| r
        .header("x-portcullis-budget-reset")
        .is_some_and(|v| v.ends_with('s'))));
    assert_eq!(s.primary.hits(), 5);
}

#[test]
fn a_team_refusal_leaves_the_keys_own_slot_free() {
    // Each key may have one request in flight, the team one for both.
    let s = Stack::start(
        &team_plugin("{max_concurrent: 1}", "{max_concurrent: 1}", ""),
        2,
    );
    s.primary.default_step(json!({"hold": true}));
    let body = chat_body("gpt-4o-mini", "hold");
    let stream = json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "held"}]})
    .to_string();
    std::thread::scope(|sc| {
        // A stream the mock holds after its first event: the request is in
        // flight, holding a slot of its key and of the team.
        let held = sc.spawn(|| s.chat(DEMO_KEY, &stream));
        poll_until(
            Duration::from_secs(10),
            "the first request at the provider",
            || (s.primary.hits() == 1).then_some(()),
        );
        // The team's slot is taken: the other key is refused by the team,
        // not by its own limit.
        for _ in 0..3 {
            let r = s.chat(MINI_KEY, &body);
            let msg = openai_error_message(&r, 429, "concurrency_limit_exceeded");
            assert!(msg.contains("team `research`"), "{msg}");
        }
        s.primary.release();
        assert_eq!(held.join().unwrap().status, 200);
    });
    // Had a team refusal kept the key's slot, its own limit of 1 would
    // refuse it now.
    s.primary.default_step(json!({}));
    let r = s.chat(MINI_KEY, &body);
    assert_eq!(r.status, 200, "{}", r.body);
}

/// Milliseconds from now to a UTC date and time.
fn offset_to(y: i32, m: u32, d: u32, h: u32) -> i64 {
    let days = days_from_civil(y, m, d);
    let target = (days * 86_400 + i64::from(h) * 3600) * 1000;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    target - now
}

/// Days since 1970-01-01 of a civil date (test-side arithmetic, checked
/// against the filter's by the labels the answers carry).
fn days_from_civil(y: i32, m: u32, d: u32) -> i64 {
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = i64::from(y - era * 400);
    let doy = (153 * i64::from(m) + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    i64::from(era) * 146_097 + doe - 719_468
}

fn clock_plugin(reserve: u64, offset_ms: i64) -> String {
    team_plugin(
        &format!("{{budgets: [{{usd: {}, period: month}}]}}", usd(4, reserve)),
        &format!("{{budgets: [{{usd: {}, period: week}}]}}", usd(3, reserve)),
        &format!("testing: {{clock_offset_ms: {offset_ms}}}\n"),
    )
}

fn start_with_test_clock(plugin: &str) -> Stack {
    let primary = mock("primary", Some(PRIMARY_KEY));
    let backup = mock("backup", Some(BACKUP_KEY));
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: plugin,
        primary_port: primary.port,
        backup_port: backup.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 2,
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("BACKUP_API_KEY", BACKUP_KEY),
            ("PORTCULLIS_TESTING", "1"),
        ],
    });
    Stack {
        primary,
        backup,
        envoy,
    }
}

fn move_clock(s: &Stack, plugin: &str) {
    let reloads = s.envoy.stat(RELOADS).unwrap_or(0);
    s.envoy.reload(plugin);
    poll_until(Duration::from_secs(20), "the reload", || {
        (s.envoy.stat(RELOADS).unwrap_or(0) > reloads).then_some(())
    });
}

#[test]
fn week_and_month_budgets_roll_over_on_the_test_clock() {
    // Wednesday 2027-03-10 12:00 UTC: the team's week began on Monday the
    // 8th and ends Monday the 15th; the key's month ends April the 1st.
    let (body, reserve) = exact_request();
    let s = start_with_test_clock(&clock_plugin(reserve, offset_to(2027, 3, 10, 12)));
    spend_what_is_reserved(&s, reserve);
    let ok = |why: &str| {
        let r = s.chat(DEMO_KEY, &body);
        assert_eq!(r.status, 200, "{why}: {}", r.body);
        r
    };
    for i in 0..3 {
        ok(&format!("request {i} within the team's week"));
    }
    let r = s.chat(DEMO_KEY, &body);
    let msg = openai_error_message(&r, 429, "budget_exceeded");
    assert!(
        msg.starts_with("Weekly budget") && msg.contains("team `research`"),
        "{msg}"
    );
    // 4.5 days to Monday 00:00, less the seconds this test has taken.
    let retry = r.header_u64("retry-after");
    assert!((388_000..=388_800).contains(&retry), "retry-after {retry}");

    // Monday the 15th, 10:00: a new week for the team; the key's month
    // holds one more.
    move_clock(&s, &clock_plugin(reserve, offset_to(2027, 3, 15, 10)));
    let r = ok("a new week");
    let left: f64 = r
        .header("x-portcullis-budget-remaining-usd")
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(left, 0.0, "the key's month is spent: {:?}", r.headers);
    let reset = r.header("x-portcullis-budget-reset").unwrap();
    assert!(
        reset.starts_with("398h") || reset.starts_with("397h"),
        "to April 1st: {reset}"
    );
    let r = s.chat(DEMO_KEY, &body);
    let msg = openai_error_message(&r, 429, "budget_exceeded");
    assert!(
        msg.starts_with("Monthly budget") && msg.contains("key `demo`"),
        "{msg}"
    );
    // The other key of the team has its own month.
    let r = s.chat(MINI_KEY, &body);
    assert_eq!(r.status, 200, "{}", r.body);

    // Thursday April the 1st: a new month (and week).
    move_clock(&s, &clock_plugin(reserve, offset_to(2027, 4, 1, 10)));
    ok("a new month");
}

#[test]
fn the_test_clock_is_refused_without_the_testing_environment() {
    let s = Stack::start(&test_plugin(), 1);
    let fails = s.envoy.stat(FAILS).unwrap_or(0);
    s.envoy.reload(&format!(
        "{}testing: {{clock_offset_ms: 86400000}}\n",
        test_plugin()
    ));
    poll_until(Duration::from_secs(20), "config_fail to rise", || {
        (s.envoy.stat(FAILS).unwrap_or(0) > fails).then_some(())
    });
    assert!(s
        .envoy
        .log()
        .contains("accepted only when the VM's environment has PORTCULLIS_TESTING=1"));
    assert_eq!(
        s.chat(DEMO_KEY, &chat_body("gpt-4o-mini", "hi")).status,
        200
    );
}

/// The largest cap `n` whose stream, allowance included (`n + n/8 + 8`
/// tokens, docs/tenancy.md), fits `room`: found by search here, not by the
/// code under test.
fn largest_cap(room: u64) -> u64 {
    (0..=room)
        .rev()
        .find(|n| n + n / 8 + 8 <= room)
        .unwrap_or(0)
}

/// A stream under a 200-token limit with no `max_tokens`: the gateway sets
/// the cap the limit has room for, the provider honours it, and the limit
/// is never passed.
#[test]
fn a_stream_without_max_tokens_is_clamped_to_the_room_left_and_never_exceeds_it() {
    let s = Stack::start(
        &team_plugin("{tokens_per_minute: 200, max_tokens_mode: clamp}", "{}", ""),
        2,
    );
    let long: String = (0..1000).map(|i| format!("w{:02} ", i % 100)).collect();
    s.primary.default_step(json!({"content": long}));
    let body = json!({"model": "gpt-4o-mini", "stream": true,
        "messages": [{"role": "user", "content": "Write at length"}]})
    .to_string();
    let prompt_est = body.len().div_ceil(4) as u64;
    let r = s.chat(DEMO_KEY, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let cap = r.header_u64("x-portcullis-max-tokens-clamped");
    // The room after the prompt estimate, less what the gateway would let
    // past the cap before ending a provider that ignored it.
    assert_eq!(
        cap,
        largest_cap(200 - prompt_est),
        "the largest cap whose allowance fits the room"
    );
    assert!(cap + cap / 8 + 8 <= 200 - prompt_est);
    let sent = &s.primary.requests()[0];
    assert_eq!(sent["body"]["max_completion_tokens"], cap);
    let (text, _, _) = stream_text(&r.body);
    assert_eq!(
        text.split_whitespace().count() as u64,
        cap,
        "the provider stopped at the cap"
    );
    assert!(r.body.contains("\"finish_reason\":\"length\""));
    // What the first stream left (its allowance, unused by a provider that
    // honours the cap) is the next request's room: refused, or clamped
    // again to a cap whose allowance fits what is left.
    let again = s.chat(DEMO_KEY, &body);
    if again.status == 200 {
        let cap2 = again.header_u64("x-portcullis-max-tokens-clamped");
        let left = (200 + 1 - cap).saturating_sub(prompt_est);
        assert!(
            cap2 < cap && cap2 <= largest_cap(left),
            "second cap {cap2} after {cap}"
        );
    } else {
        assert_openai_error(&again, 429, "rate_limit_exceeded");
    }
}

/// A provider that ignores the cap is ended at it, and both official SDKs
/// read the ending as a normal end at the length. Each key has its own
/// 120 tokens a minute (the provider's real usage, far past the cap, is
/// settled against the key whose stream it was).
#[test]
fn a_provider_that_ignores_the_cap_is_ended_cleanly_for_both_sdks() {
    let s = Stack::start(
        &team_plugin(
            "{tokens_per_minute: 120, max_tokens_mode: clamp, default_max_tokens: 40}",
            "{}",
            "",
        ),
        2,
    );
    // 500 words of four bytes: a token each; far past a cap of 40.
    let long: String = (0..500).map(|i| format!("w{:02} ", i % 100)).collect();
    s.primary
        .default_step(json!({"content": long, "ignore_max_tokens": true, "chunk_delay_ms": 1}));
    let v = sdk_script(
        "stream_cap_check.py",
        &[&s.envoy.url(""), DEMO_KEY, MINI_KEY, "gpt-4o-mini"],
    );
    let o = &v["openai"];
    assert_eq!(o["raised"], json!(null), "{v}");
    assert_eq!(o["finish"], "length");
    // 40 + 40/8 + 8 = 53 tokens at most reach the client.
    let chars = o["chars"].as_u64().unwrap();
    assert!(chars > 40 * 4 && chars <= 53 * 4, "{chars} characters");
    assert!(o["completion_tokens"].as_u64().unwrap() <= 53);
    // Messages asked for 4096; the key's room (120 less the prompt
    // estimate) bounds the cap with its allowance: the stream delivers no
    // more than the limit (#46: it once passed it by an eighth).
    let a = &v["anthropic"];
    assert_eq!(a["raised"], json!(null), "{v}");
    assert_eq!(a["stop"], "max_tokens");
    let room = 120;
    let chars = a["chars"].as_u64().unwrap();
    assert!(chars > 40 * 4 && chars <= room * 4, "{chars} characters");
    assert!(a["output_tokens"].as_u64().unwrap() <= room);
}

/// A provider that reports no usage (vLLM's default): the gateway counts
/// the streamed answer and settles with that, instead of letting the
/// reservation stand or counting nothing.
#[test]
fn a_stream_without_usage_is_settled_with_what_the_gateway_counted() {
    let s = Stack::start(&team_plugin("{tokens_per_minute: 6000}", "{}", ""), 2);
    // 50 words of four bytes: 50 tokens counted.
    let words: String = (0..50).map(|i| format!("w{:02} ", i)).collect();
    s.primary
        .default_step(json!({"content": words, "no_usage": true}));
    let body = json!({"model": "gpt-4o-mini", "stream": true, "max_tokens": 2000,
        "messages": [{"role": "user", "content": "Write"}]})
    .to_string();
    let prompt_est = body.len().div_ceil(4) as u64;
    let first = s.chat(DEMO_KEY, &body);
    assert_eq!(first.status, 200, "{}", first.body);
    let (text, _, usage) = stream_text(&first.body);
    assert_eq!(text.split_whitespace().count(), 50);
    assert!(usage.is_none(), "the client did not ask for usage");
    // The second request's reservation is taken after the first was
    // settled: 6000 less (prompt + 50 counted) less its own reservation
    // (prompt + 2000), plus what refilled in between (100 a second).
    let second = s.chat(DEMO_KEY, &body);
    assert_eq!(second.status, 200);
    let left = second.header_u64("x-ratelimit-remaining-tokens");
    let settled = 6000 - (prompt_est + 50) - (prompt_est + 2000);
    assert!(
        left >= settled && left < settled + 500,
        "{left} left; with the first reservation standing it would be {}",
        6000 - 2 * (prompt_est + 2000)
    );
}

/// Which layer priced each request is in its record, with the key's team
/// and whether its usage was counted by the gateway; a model no layer
/// prices is counted in a metric and recorded unpriced, never as free.
#[test]
fn records_say_which_layer_priced_a_request_and_unpriced_models_are_counted() {
    let dir = TempDir::new("collector");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    // gpt-4o-mini is priced by `prices`; gpt-4.1-mini only by the default
    // table; house-model by nothing.
    let plugin = team_plugin("{}", "{}", "")
        .replace("flush_interval_ms: 250", "flush_interval_ms: 100")
        .replace(
            "      - name: gpt-4o\n        id: gpt-4o-2024-08-06",
            "      - {name: gpt-4.1-mini, weight: 0}\n      - {name: house-model, weight: 0}\n      - name: gpt-4o\n        id: gpt-4o-2024-08-06",
        );
    assert!(plugin.contains("house-model"));
    let s = Stack::start_full(&plugin, 1, false, c.grpc_port);
    s.primary.script(json!([
        {"usage": {"prompt_tokens": 10, "completion_tokens": 10}},
        {"usage": {"prompt_tokens": 10, "completion_tokens": 10}},
        {"usage": {"prompt_tokens": 10, "completion_tokens": 10}},
        {"content": "four byte word here", "no_usage": true}
    ]));
    let auth = format!("Bearer {DEMO_KEY}");
    let url = s.envoy.url("/v1/chat/completions");
    for (id, model) in [
        ("config", "gpt-4o-mini"),
        ("default", "gpt-4.1-mini"),
        ("unpriced", "house-model"),
        ("counted", "gpt-4o-mini"),
    ] {
        let r = post(
            &url,
            &[("authorization", &auth), ("x-request-id", id)],
            &chat_body(model, "price me"),
        );
        assert_eq!(r.status, 200, "{id}: {}", r.body);
    }
    let records = poll_until(Duration::from_secs(15), "4 records", || {
        let r = c.recent(100);
        (r.len() >= 4).then_some(r)
    });
    let rec = |id: &str| {
        records
            .iter()
            .find(|r| r["request_id"] == id)
            .unwrap()
            .clone()
    };
    let config = rec("config");
    assert_eq!(config["price_source"], "config");
    assert_eq!(config["team"], "research");
    // $1000 per 1M tokens both ways (the team plugin's price): 20 tokens.
    assert_eq!(config["cost_usd"], 0.02);
    let default = rec("default");
    assert_eq!(default["price_source"], "default");
    // gpt-4.1-mini's list price: 10 x $0.40 + 10 x $1.60 per 1M.
    assert_eq!(default["cost_usd"], 0.00002);
    let unpriced = rec("unpriced");
    assert_eq!(
        (
            unpriced["price_source"].as_str(),
            unpriced["cost_usd"].as_f64()
        ),
        (Some(""), Some(0.0))
    );
    let counted = rec("counted");
    assert_eq!(counted["usage_estimated"], true, "{counted}");
    assert_eq!(
        counted["completion_tokens"], 5,
        "19 bytes of text, four to a token"
    );
    assert_eq!(config["usage_estimated"], false);
    s.envoy.wait_stat(
        "wasmcustom.portcullis.unpriced_requests.model.house-model.total",
        1,
    );
    let prom = s.envoy.prometheus();
    assert!(
        prom.contains("portcullis_unpriced_requests_total{model=\"house-model\"} 1"),
        "{}",
        prom.lines()
            .filter(|l| l.contains("unpriced"))
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A key whose day budget runs low is sent to a cheaper model instead of
/// being refused while budget remains; the answer says so.
#[test]
fn a_low_budget_routes_to_the_cheaper_model_and_says_so() {
    let p = test_plugin();
    let demo = "  - name: demo\n";
    assert!(p.contains(demo));
    // $0.001 a day; below $0.0006 left, gpt-4o-mini instead.
    let plugin = p.replace(
        demo,
        "  - name: demo\n    limits: {budget_usd_per_day: 0.001, on_budget_low: {below_usd: 0.0006, use_model: gpt-4o-mini}}\n",
    );
    let s = Stack::start(&plugin, 2);
    // Each answer: 10 + 10 tokens; at gpt-4o's $2.50/$10 that is $0.000125.
    s.primary
        .default_step(json!({"usage": {"prompt_tokens": 10, "completion_tokens": 10}}));
    let body = json!({"model": "gpt-4o", "max_tokens": 10,
        "messages": [{"role": "user", "content": "hi"}]})
    .to_string();
    let mut models = Vec::new();
    for _ in 0..8 {
        let r = s.chat(DEMO_KEY, &body);
        assert_eq!(r.status, 200, "{}", r.body);
        let model = r.header("x-portcullis-model").unwrap().to_string();
        let routed = r.header("x-portcullis-budget-routed").map(str::to_string);
        assert_eq!(
            routed.is_some(),
            model == "gpt-4o-mini",
            "{model} {routed:?}"
        );
        if let Some(asked) = routed {
            assert_eq!(asked, "gpt-4o");
        }
        models.push(model);
    }
    // $0.001 - 4 x $0.000125 = $0.0005 < $0.0006: the fifth goes to mini,
    // and every one after it (the budget only goes down).
    assert_eq!(models[..4], ["gpt-4o"; 4], "{models:?}");
    assert!(models[4..].iter().all(|m| m == "gpt-4o-mini"), "{models:?}");
    let sent: Vec<String> = s
        .primary
        .requests()
        .iter()
        .map(|r| r["body"]["model"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(
        sent[4], "gpt-4o-mini",
        "the provider got the cheaper model's id"
    );
}

/// The end users of one key (its request's `user`, or a header) each have
/// the key's `per_user` limits, across 2 workers.
#[test]
fn each_end_user_of_a_key_is_limited_on_its_own() {
    let p = test_plugin();
    let demo = "  - name: demo\n";
    assert!(p.contains(demo));
    let plugin = p.replace(
        demo,
        "  - name: demo\n    limits: {per_user: {requests_per_minute: 3}}\n",
    ) + "";
    let plugin = plugin.replace(
        "  max_body_bytes: 33554432\n",
        "  max_body_bytes: 33554432\n  user_header: x-end-user\n",
    );
    assert!(plugin.contains("user_header"));
    let s = Stack::start(&plugin, 2);
    let ask = |user: &str, header: Option<&str>| {
        let body = json!({"model": "gpt-4o-mini", "user": user,
            "messages": [{"role": "user", "content": "hi"}]})
        .to_string();
        let auth = format!("Bearer {DEMO_KEY}");
        let mut h = vec![("authorization", auth.as_str())];
        if let Some(v) = header {
            h.push(("x-end-user", v));
        }
        post(&s.envoy.url("/v1/chat/completions"), &h, &body)
    };
    let rs = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..6).map(|_| sc.spawn(|| ask("alice", None))).collect();
        hs.into_iter()
            .map(|h| h.join().unwrap())
            .collect::<Vec<_>>()
    });
    assert_eq!((count(&rs, 200), count(&rs, 429)), (3, 3));
    let refused = rs.iter().find(|r| r.status == 429).unwrap();
    let msg = openai_error_message(refused, 429, "rate_limit_exceeded");
    assert!(msg.contains("user `demo/alice`: limit 3"), "{msg}");
    assert_eq!(ask("bob", None).status, 200, "another user of the key");
    // The header names the user before the body: bob's bucket, not alice's.
    assert_eq!(ask("alice", Some("bob")).status, 200);
}
