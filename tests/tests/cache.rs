//! The prompt cache in real Envoy (2 workers): hits never reach a provider,
//! streamed hits replay as SSE, memory stays bounded.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

fn plugin(cache: &str) -> String {
    format!(
        "{}\ncache:\n{cache}\n",
        test_plugin().split("\ncache:\n").next().unwrap()
    )
}

const ON: &str = "  enabled: true\n  ttl_s: 600";

fn ask_with(s: &Stack, body: &Value, extra: &[(&str, &str)]) -> Resp {
    let auth = format!("Bearer {DEMO_KEY}");
    let mut h = vec![("authorization", auth.as_str())];
    h.extend_from_slice(extra);
    post(&s.envoy.url("/v1/chat/completions"), &h, &body.to_string())
}

fn chat(text: &str) -> Value {
    json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": text}], "temperature": 0})
}

fn streamed_text(body: &str) -> String {
    body.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect()
}

/// The gateway reads answers, so it asks providers for uncompressed ones
/// (the client's `accept-encoding` stays with Envoy); an answer that comes
/// compressed anyway passes through untouched and is never stored.
#[test]
fn answers_are_asked_uncompressed_and_a_compressed_one_is_passed_through_not_stored() {
    let s = Stack::start(&plugin(ON), 1);
    let q = chat("compressed?");
    let gz = [("accept-encoding", "gzip, br")];
    s.primary
        .script(json!([{"content_encoding": "gzip", "content": "packed"}]));
    let r = ask_with(&s, &q, &gz);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-encoding"), Some("gzip"));
    assert!(r.body.contains("packed"));
    let seen = &s.primary.requests()[0];
    assert!(seen["headers"].get("accept-encoding").is_none(), "{seen}");
    // Not stored: the same question reaches the provider again, and that
    // plain answer is stored and then served.
    let r = ask_with(&s, &q, &gz);
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    assert_eq!(r.header("content-encoding"), None);
    let hit = ask_with(&s, &q, &gz);
    assert_eq!(hit.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(hit.json(), r.json());
    assert_eq!(s.primary.hits(), 2);
}

/// A stored answer with tool calls serves plain requests as it is, but a
/// streamed request cannot get it as a text replay: that is a miss, and the
/// provider streams the answer.
#[test]
fn a_tool_call_answer_is_a_hit_for_plain_requests_and_a_miss_for_streamed_ones() {
    let s = Stack::start(&plugin(ON), 1);
    let tool_answer = json!({
        "id": "chatcmpl-tools", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",
        "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {"role": "assistant", "content": null,
            "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "weather", "arguments": "{\"city\":\"Oslo\"}"}}]}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}
    });
    s.primary.script(json!([{"body": tool_answer.to_string()}]));
    let q = chat("weather in Oslo?");
    let first = ask_with(&s, &q, &[]);
    assert_eq!(first.header("x-portcullis-cache"), Some("miss"));
    let again = ask_with(&s, &q, &[]);
    assert_eq!(again.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(again.json(), tool_answer);
    let mut streamed = q.clone();
    streamed["stream"] = json!(true);
    let r = ask_with(&s, &streamed, &[]);
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(!streamed_text(&r.body).is_empty(), "{}", r.body);
    assert_eq!(s.primary.hits(), 2);
}

#[test]
fn miss_then_hits_on_both_workers_without_reaching_the_provider() {
    let s = Stack::start(&plugin(ON), 2);
    let first = ask_with(&s, &chat("what is 2+2?"), &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("x-portcullis-cache"), Some("miss"));
    for _ in 0..40 {
        let r = ask_with(&s, &chat("what is 2+2?"), &[]);
        assert_eq!(r.status, 200);
        assert_eq!(r.header("x-portcullis-cache"), Some("hit"));
        assert_eq!(r.header("x-portcullis-provider"), Some("primary"));
        assert_eq!(r.json(), first.json());
    }
    assert_eq!(s.primary.hits(), 1);
    // Each request came on a new connection; both workers accepted some.
    let cx = |w: u32| {
        s.envoy
            .stat(&format!(
                "listener.127.0.0.1_0.worker_{w}.downstream_cx_total"
            ))
            .unwrap_or(0)
    };
    assert!(
        cx(0) > 0 && cx(1) > 0,
        "worker_0 {} worker_1 {}",
        cx(0),
        cx(1)
    );
    s.envoy.wait_stat("wasmcustom.portcullis.cache.hits", 40);
    s.envoy.wait_stat("wasmcustom.portcullis.cache.misses", 1);
    // A different request (another field that changes the answer) misses.
    let mut other = chat("what is 2+2?");
    other["temperature"] = json!(1);
    assert_eq!(
        ask_with(&s, &other, &[]).header("x-portcullis-cache"),
        Some("miss")
    );
}

#[test]
fn normalization_is_off_by_default_and_on_when_configured() {
    let off = Stack::start(&plugin(ON), 1);
    let first = ask_with(&off, &chat("Hello   World"), &[]);
    assert_eq!(
        (first.status, first.header("x-portcullis-cache")),
        (200, Some("miss"))
    );
    assert_eq!(
        ask_with(&off, &chat("hello world"), &[]).header("x-portcullis-cache"),
        Some("miss")
    );
    assert_eq!(off.primary.hits(), 2, "both prompts reached the provider");

    let on = Stack::start(&plugin(&format!("{ON}\n  normalize: true")), 1);
    let first = ask_with(&on, &chat("Hello   World"), &[]);
    assert_eq!(
        (first.status, first.header("x-portcullis-cache")),
        (200, Some("miss"))
    );
    assert_eq!(
        ask_with(&on, &chat("hello world"), &[]).header("x-portcullis-cache"),
        Some("hit")
    );
    assert_eq!(on.primary.hits(), 1);
}

#[test]
fn entries_expire_after_the_ttl() {
    let s = Stack::start(&plugin("  enabled: true\n  ttl_s: 1"), 1);
    assert_eq!(
        ask_with(&s, &chat("ttl"), &[]).header("x-portcullis-cache"),
        Some("miss")
    );
    assert_eq!(
        ask_with(&s, &chat("ttl"), &[]).header("x-portcullis-cache"),
        Some("hit")
    );
    poll_until(Duration::from_secs(10), "the entry to expire", || {
        (ask_with(&s, &chat("ttl"), &[]).header("x-portcullis-cache") == Some("miss")).then_some(())
    });
    assert_eq!(s.primary.hits(), 2);
}

#[test]
fn no_cache_refreshes_and_no_store_neither_reads_nor_writes() {
    let s = Stack::start(&plugin(ON), 1);
    s.primary
        .script(json!([{"content": "first"}, {"content": "second"}, {"content": "third"}]));
    let content = |r: &Resp| {
        r.json()["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(content(&ask_with(&s, &chat("q"), &[])), "first");
    let r = ask_with(&s, &chat("q"), &[("cache-control", "no-cache")]);
    assert_eq!(
        (r.header("x-portcullis-cache"), content(&r).as_str()),
        (Some("refresh"), "second")
    );
    let r = ask_with(&s, &chat("q"), &[]);
    assert_eq!(
        (r.header("x-portcullis-cache"), content(&r).as_str()),
        (Some("hit"), "second")
    );
    let r = ask_with(&s, &chat("q"), &[("cache-control", "no-store")]);
    assert_eq!(
        (r.header("x-portcullis-cache"), content(&r).as_str()),
        (Some("off"), "third")
    );
    let r = ask_with(&s, &chat("q"), &[]);
    assert_eq!(
        (r.header("x-portcullis-cache"), content(&r).as_str()),
        (Some("hit"), "second"),
        "no-store wrote nothing"
    );
    assert_eq!(s.primary.hits(), 3);
}

#[test]
fn streamed_answer_fills_the_cache_and_replays_as_a_stream_or_json() {
    let s = Stack::start(&plugin(ON), 2);
    s.primary.script(json!([{"content": "alpha beta gamma delta", "usage": {"prompt_tokens": 7, "completion_tokens": 4}}]));
    let mut req = chat("stream me");
    req["stream"] = json!(true);
    let live = ask_with(&s, &req, &[]);
    assert_eq!(live.header("x-portcullis-cache"), Some("miss"));
    assert_eq!(streamed_text(&live.body), "alpha beta gamma delta");
    // The gateway asked the provider for usage on the client's behalf, and
    // the client, who did not ask, does not get the extra chunk.
    assert_eq!(
        s.primary.requests()[0]["body"]["stream_options"]["include_usage"],
        true
    );
    assert!(!live.body.contains("\"usage\""), "{}", live.body);
    assert!(live.body.trim_end().ends_with("data: [DONE]"));

    let hit = ask_with(&s, &req, &[]);
    assert_eq!(hit.status, 200);
    assert_eq!(hit.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(hit.header("content-type"), Some("text/event-stream"));
    assert_eq!(streamed_text(&hit.body), "alpha beta gamma delta");
    assert!(hit.body.trim_end().ends_with("data: [DONE]"));
    assert!(!hit.body.contains("\"usage\""), "usage only when asked");

    req["stream_options"] = json!({"include_usage": true});
    let with_usage = ask_with(&s, &req, &[]);
    assert_eq!(with_usage.header("x-portcullis-cache"), Some("hit"));
    assert!(
        with_usage.body.contains("\"completion_tokens\":4"),
        "{}",
        with_usage.body
    );

    let mut plain = req.clone();
    plain.as_object_mut().unwrap().remove("stream");
    plain.as_object_mut().unwrap().remove("stream_options");
    let json_hit = ask_with(&s, &plain, &[]);
    assert_eq!(json_hit.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(
        json_hit.json()["choices"][0]["message"]["content"],
        "alpha beta gamma delta"
    );
    assert_eq!(s.primary.hits(), 1);
}

#[test]
fn errors_are_never_stored() {
    let s = Stack::start(&plugin(ON), 1);
    let raw = r#"{"error":{"message":"bad","type":"invalid_request_error","code":null}}"#;
    s.primary.script(json!([{"status": 400, "body": raw}]));
    assert_eq!(ask_with(&s, &chat("e"), &[]).status, 400);
    let r = ask_with(&s, &chat("e"), &[]);
    assert_eq!(
        (r.status, r.header("x-portcullis-cache")),
        (200, Some("miss"))
    );
}

fn allocated(s: &Stack) -> u64 {
    get(&s.envoy.admin("/memory"), &[]).json()["allocated"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[test]
fn filling_ten_times_the_capacity_keeps_memory_bounded() {
    // 256 KiB of 4 KiB slots = 64 entries; each answer is about 3.6 KB.
    let s = Stack::start(
        &plugin("  enabled: true\n  max_bytes: 262144\n  max_entry_bytes: 4096\n  ways: 4"),
        1,
    );
    s.primary.default_step(json!({"content": "x".repeat(3400)}));
    let fill = |from: u32, to: u32| {
        for i in from..to {
            let r = ask_with(&s, &chat(&format!("fill {i}")), &[]);
            assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
        }
    };
    fill(0, 64);
    let at_capacity = allocated(&s);
    fill(64, 640);
    let after = allocated(&s);
    // Counters and the bytes gauge reach Envoy at the same tick.
    s.envoy.wait_stat("wasmcustom.portcullis.cache.stores", 640);
    let held = s.envoy.stat("wasmcustom.portcullis.cache.bytes").unwrap();
    let evictions = s
        .envoy
        .stat("wasmcustom.portcullis.cache.evictions")
        .unwrap();
    eprintln!(
        "cache bytes {held}, evictions {evictions}, envoy allocated {at_capacity} -> {after}"
    );
    assert!(held <= 64 * 4096, "cache holds {held} bytes");
    assert!(evictions >= 640 - 64, "{evictions} evictions");
    // Storing all 640 answers would take ~2.3 MB more; bounded, it is flat.
    assert!(
        after < at_capacity + 1_000_000,
        "Envoy memory grew from {at_capacity} to {after}"
    );
}

/// A repeated request is answered from the worker's own copy (no canonical
/// key, no shared-data read): counted in `worker_hits` as well as `hits`.
/// The copy is found by the exact bytes: the same question written
/// otherwise is a hit from the shared table first, then from its own copy.
#[test]
fn repeated_requests_are_answered_from_the_workers_copy_by_their_exact_bytes() {
    let s = Stack::start(&plugin(ON), 1);
    s.primary.script(json!([{"content": "only once"}]));
    let body =
        r#"{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"user","content":"copy"}]}"#;
    let reordered =
        r#"{"messages":[{"content":"copy","role":"user"}],"temperature":0,"model":"gpt-4o-mini"}"#;
    let auth = format!("Bearer {DEMO_KEY}");
    let ask = |b: &str| {
        post(
            &s.envoy.url("/v1/chat/completions"),
            &[("authorization", auth.as_str())],
            b,
        )
    };
    assert_eq!(ask(body).header("x-portcullis-cache"), Some("miss"));
    for b in [body, reordered, reordered, body] {
        let r = ask(b);
        assert_eq!(r.header("x-portcullis-cache"), Some("hit"), "{b}");
        assert_eq!(r.json()["choices"][0]["message"]["content"], "only once");
    }
    assert_eq!(s.primary.hits(), 1);
    // Counters reach Envoy together at the VM's tick.
    s.envoy.wait_stat("wasmcustom.portcullis.cache.hits", 4);
    assert_eq!(
        s.envoy.stat("wasmcustom.portcullis.cache.worker_hits"),
        Some(3)
    );
}

/// An agent-sized prompt (#29): a 1 MB conversation asked twice is a hit
/// the second time, without reaching the provider.
#[test]
fn a_one_megabyte_prompt_is_a_hit_the_second_time() {
    let s = Stack::start(&plugin(ON), 1);
    let text = "Context line of a long agent conversation, resent every turn. ".repeat(17_000);
    assert!(text.len() > 1 << 20);
    let first = ask_with(&s, &chat(&text), &[]);
    assert_eq!(first.status, 200, "{}", first.body);
    assert_eq!(first.header("x-portcullis-cache"), Some("miss"));
    let second = ask_with(&s, &chat(&text), &[]);
    assert_eq!(second.status, 200, "{}", second.body);
    assert_eq!(second.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(second.json()["choices"], first.json()["choices"]);
    assert_eq!(s.primary.hits(), 1);
}
