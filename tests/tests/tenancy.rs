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
