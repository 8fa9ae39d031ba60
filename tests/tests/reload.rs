//! Live config through ECDS: a good config applies, a bad one is rejected
//! while the previous one keeps serving.
mod common;
use common::*;
use portcullis_tests::*;
use std::time::Duration;

const FAIL: &str = "extension_config_discovery.http_filter.portcullis.config_fail";
const RELOAD: &str = "extension_config_discovery.http_filter.portcullis.config_reload";

fn auto_model(s: &Stack) -> String {
    let r = s.chat(DEMO_KEY, &chat_body("auto", "hi"));
    assert_eq!(r.status, 200, "{}", r.body);
    r.header("x-portcullis-model").unwrap().to_string()
}

#[test]
fn new_weights_apply_live_and_a_bad_config_is_rejected_while_the_old_one_serves() {
    let only_mini = test_plugin().replace("weight: 1\n", "weight: 0\n");
    let s = Stack::start(&only_mini, 2);
    for _ in 0..20 {
        assert_eq!(auto_model(&s), "gpt-4o-mini");
    }
    let reloads = s.envoy.stat(RELOAD).unwrap_or(0);

    // Flip the weights: only gpt-4o now.
    let only_4o = test_plugin().replace("weight: 3\n", "weight: 0\n");
    s.envoy.reload(&only_4o);
    poll_until(Duration::from_secs(20), "the reload to apply", || {
        (s.envoy.stat(RELOAD).unwrap_or(0) > reloads).then_some(())
    });
    poll_until(
        Duration::from_secs(10),
        "new weights on every worker",
        || (0..20).all(|_| auto_model(&s) == "gpt-4o").then_some(()),
    );

    // A config with several problems is rejected as a whole.
    let fails = s.envoy.stat(FAIL).unwrap_or(0);
    let bad = only_4o
        .replace("chain: [primary, backup]", "chain: [primary, nowhere]")
        .replace("timeout_ms: 30000", "timeout_ms: 30000\n    colour: blue");
    s.envoy.reload(&bad);
    poll_until(Duration::from_secs(20), "config_fail to rise", || {
        (s.envoy.stat(FAIL).unwrap_or(0) > fails).then_some(())
    });
    for _ in 0..20 {
        assert_eq!(
            auto_model(&s),
            "gpt-4o",
            "the previous config must keep serving"
        );
    }
    let log = s.envoy.log();
    assert!(
        log.contains("no provider named `nowhere`") && log.contains("unknown key `colour`"),
        "every problem is logged in one message"
    );
}

/// A plugin config over the size limit (4 MiB by default) is refused before
/// it is read into the VM, with a message naming its size and the limit;
/// the previous config keeps serving.
#[test]
fn an_oversize_config_is_refused_naming_its_size_and_the_old_one_serves() {
    let s = Stack::start(&test_plugin(), 1);
    let fails = s.envoy.stat(FAIL).unwrap_or(0);
    // A valid config padded past the limit with a YAML comment.
    let big = format!("{}\n# {}\n", test_plugin(), "x".repeat(5 << 20));
    s.envoy.reload(&big);
    poll_until(Duration::from_secs(30), "config_fail to rise", || {
        (s.envoy.stat(FAIL).unwrap_or(0) > fails).then_some(())
    });
    assert_eq!(
        s.chat(DEMO_KEY, &chat_body("mini", "still here")).status,
        200
    );
    let log = s.envoy.log();
    assert!(
        log.contains("over the limit of 4194304 bytes"),
        "the refusal names the limit"
    );
}
