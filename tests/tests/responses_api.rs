//! `POST /v1/responses` in real Envoy with the official OpenAI SDK: passed
//! through to an OpenAI-backed model (every field as sent, the provider
//! keeps responses, `previous_response_id` works), and translated for an
//! Anthropic-backed one (through chat completions: answers, streams of
//! Responses events, function calls and their outputs, structured output;
//! stateful features refused by name). Usage reaches the records either way.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

/// The backup speaks Anthropic's API and serves `claude-sonnet`.
fn plugin() -> String {
    test_plugin()
        .replace("    host: backup.mock\n", "    host: backup.mock\n    schema: anthropic\n    drop_unsupported: true\n")
        .replace(
            "      - name: llama-3.1-8b\n",
            "      - name: llama-3.1-8b\n      - name: claude-sonnet\n        id: claude-sonnet-4-5\n",
        )
        .replace("flush_interval_ms: 250", "flush_interval_ms: 100")
}

fn script(m: &Mock) {
    m.script(responses_script());
}

#[test]
fn the_openai_sdk_uses_responses_passed_through_to_an_openai_backed_model() {
    let dir = TempDir::new("responses-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(&plugin(), 2, false, c.grpc_port);
    script(&s.primary);
    let v = sdk_script(
        "responses_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, "gpt-4o-mini", "1"],
    );
    assert_responses_run(&v);
    // The provider said it does not know that response: its 404 as it was.
    assert_eq!(v["errors"]["stale_previous"]["status"], 404);
    // Read back by id at the provider that made it, listed, deleted.
    assert_eq!(
        v["by_id"],
        json!({"same": true, "text": "It is sunny.", "items": 1, "deleted": true, "after_delete": 404})
    );
    assert_eq!(v["errors"]["unknown_id"]["status"], 404);
    assert!(v["errors"]["unknown_id"]["message"]
        .as_str()
        .unwrap()
        .contains("does not know"));
    // Passed through: the client's body with the provider's key.
    let reqs = s.primary.requests();
    let first = &reqs[0];
    assert_eq!(first["path"], "/v1/responses");
    assert_eq!(first["body"]["instructions"], "Be brief.");
    assert_eq!(
        first["headers"]["authorization"],
        format!("Bearer {PRIMARY_KEY}")
    );
    assert!(reqs
        .iter()
        .any(|r| r["body"]["previous_response_id"].is_string()));
    let records = poll_until(Duration::from_secs(30), "the records", || {
        let r = c.recent(50);
        (r.iter().filter(|x| x["status"] == 200).count() >= 5).then_some(r)
    });
    let mut ok: Vec<&Value> = records.iter().filter(|x| x["status"] == 200).collect();
    ok.sort_by_key(|x| x["time_ms"].as_i64());
    for (i, r) in ok.iter().take(2).enumerate() {
        assert_eq!(
            (&r["prompt_tokens"], &r["completion_tokens"]),
            (&json!(9), &json!(3)),
            "record {i}"
        );
    }
    assert_eq!(ok[1]["stream"], true);
}

#[test]
fn the_openai_sdk_uses_responses_translated_for_an_anthropic_backed_model() {
    let dir = TempDir::new("responses-translated");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let s = Stack::start_full(&plugin(), 2, false, c.grpc_port);
    script(&s.backup);
    let v = sdk_script(
        "responses_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, "claude-sonnet", "0"],
    );
    assert_responses_run(&v);
    let stale = &v["errors"]["stale_previous"];
    assert_eq!(stale["status"], 400);
    assert!(
        stale["message"]
            .as_str()
            .unwrap()
            .contains("previous_response_id"),
        "{stale}"
    );
    // Translated twice: Responses to chat completions to Anthropic's Messages.
    let reqs = s.backup.requests();
    assert_eq!(reqs[0]["path"], "/v1/messages");
    assert_eq!(reqs[0]["body"]["system"], "Be brief.");
    assert_eq!(reqs[0]["body"]["model"], "claude-sonnet-4-5");
    let turn = &reqs[3]["body"]["messages"];
    assert_eq!(turn[1]["content"][0]["type"], "tool_use");
    assert_eq!(turn[2]["content"][0]["type"], "tool_result");
    assert_eq!(s.primary.hits(), 0);
    let records = poll_until(Duration::from_secs(30), "the records", || {
        let r = c.recent(50);
        (r.iter().filter(|x| x["status"] == 200).count() >= 5).then_some(r)
    });
    let mut ok: Vec<&Value> = records.iter().filter(|x| x["status"] == 200).collect();
    ok.sort_by_key(|x| x["time_ms"].as_i64());
    assert_eq!(
        (&ok[0]["prompt_tokens"], &ok[0]["completion_tokens"]),
        (&json!(9), &json!(3))
    );
    assert_eq!(
        (&ok[1]["prompt_tokens"], &ok[1]["completion_tokens"]),
        (&json!(9), &json!(3))
    );
}

/// What `make run` ships serves every API out of the box: Responses to the
/// demo's Anthropic-format model (two hops), Messages to an OpenAI-backed
/// one (the pivot), embeddings, chat completions.
#[test]
fn the_shipped_config_serves_every_api() {
    let s = Stack::start(&shipped_plugin(), 1);
    let auth = format!("Bearer {DEMO_KEY}");
    let bearer = [("authorization", auth.as_str())];
    let r = post(
        &s.envoy.url("/v1/responses"),
        &bearer,
        &json!({"model": "claude-sonnet", "input": "Hello!"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["object"], "response");
    assert_eq!(r.header("x-portcullis-provider"), Some("claude"));
    let anthropic = [("x-api-key", DEMO_KEY), ("anthropic-version", "2023-06-01")];
    let r = post(&s.envoy.url("/v1/messages"), &anthropic,
        &json!({"model": "gpt-4o-mini", "max_tokens": 100, "messages": [{"role": "user", "content": "Hello!"}]}).to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");
    let r = post(&s.envoy.url("/v1/messages"), &anthropic,
        &json!({"model": "claude-sonnet", "max_tokens": 100, "messages": [{"role": "user", "content": "Hello!"}]}).to_string());
    assert_eq!(
        (r.status, r.header("x-portcullis-provider")),
        (200, Some("claude")),
        "{}",
        r.body
    );
    let r = post(
        &s.envoy.url("/v1/embeddings"),
        &bearer,
        &json!({"model": "text-embedding-3-small", "input": "x"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.chat(DEMO_KEY, &chat_body("auto", "Hello!"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_ne!(
        r.header("x-portcullis-model"),
        Some("text-embedding-3-small")
    );
    // The Anthropic-format provider got Anthropic's API with its key.
    let reqs = s.primary.requests();
    let m = reqs
        .iter()
        .find(|r| r["path"] == "/v1/messages")
        .expect("a Messages request");
    assert_eq!(m["headers"]["x-api-key"], PRIMARY_KEY);
}

/// The OpenAI Agents SDK (its default: the Responses API) runs an agent
/// with one tool through the gateway: passed through to an OpenAI-backed
/// model, and translated for an Anthropic-backed one.
#[test]
fn an_openai_agents_sdk_agent_with_a_tool_runs_through_the_gateway() {
    let s = Stack::start(&plugin(), 1);
    let tool = json!({"name": "get_weather", "input": {"city": "Paris"}});
    for (mock, model) in [(&s.primary, "gpt-4o-mini"), (&s.backup, "claude-sonnet")] {
        mock.script(json!([{"content": "Checking.", "tool_call": tool}, {"content": "It is sunny in Paris."}]));
        let v = sdk_script("agents_check.py", &[&s.envoy.url("/v1"), DEMO_KEY, model]);
        assert_eq!(
            v,
            json!({"final": "It is sunny in Paris.", "calls": ["Paris"]}),
            "{model}"
        );
    }
    // The second turn carried the tool's output back.
    let last = s.backup.requests().last().unwrap()["body"]["messages"].to_string();
    assert!(last.contains("sunny in Paris"), "{last}");
}

/// A request chained with `previous_response_id` goes to the provider that
/// made that response, even when another is first in the chain, and never
/// falls back to one that lacks the conversation.
#[test]
fn a_chained_request_goes_to_the_provider_that_made_its_previous_response() {
    let s = Stack::start(&test_plugin(), 1);
    let auth = format!("Bearer {DEMO_KEY}");
    let bearer = [("authorization", auth.as_str())];
    let create = |body: Value| post(&s.envoy.url("/v1/responses"), &bearer, &body.to_string());
    // llama-3.1-8b is the backup's alone: its response lives there.
    let r = create(json!({"model": "llama-3.1-8b", "input": "hi"}));
    assert_eq!(
        (r.status, r.header("x-portcullis-provider")),
        (200, Some("backup")),
        "{}",
        r.body
    );
    let id = r.json()["id"].as_str().unwrap().to_string();
    // mini is served by both, primary first: chained, it goes to the backup.
    let r = create(json!({"model": "mini", "previous_response_id": id, "input": "and?"}));
    assert_eq!(
        (r.status, r.header("x-portcullis-provider")),
        (200, Some("backup")),
        "{}",
        r.body
    );
    assert_eq!(s.primary.hits(), 0);
    // A response of the primary, chained while the primary fails: an error
    // naming it, not a fallback to the backup (which lacks the conversation).
    let r = create(json!({"model": "gpt-4o", "input": "hi"}));
    let first = r.json()["id"].as_str().unwrap().to_string();
    s.primary.script(json!([{"status": 503}]));
    let backup_hits = s.backup.hits();
    let r = create(json!({"model": "mini", "previous_response_id": first, "input": "and?"}));
    assert_openai_error(&r, 502, "upstream_failed");
    assert!(r.body.contains("primary: HTTP 503"), "{}", r.body);
    assert_eq!(
        s.backup.hits(),
        backup_hits,
        "no fallback without the conversation"
    );
}

/// A stored response belongs to the key that made it (#61): another key
/// can neither read it, list its input items, chain to it nor delete it —
/// each is the provider's 404 for a response it does not have, and none
/// reaches the provider — while its owner still can.
#[test]
fn a_stored_response_is_its_keys_alone() {
    let s = Stack::start(&test_plugin(), 1);
    let owner = format!("Bearer {DEMO_KEY}");
    let other = format!("Bearer {MINI_KEY}");
    let as_owner = [("authorization", owner.as_str())];
    let as_other = [("authorization", other.as_str())];
    let body = json!({"model": "gpt-4o-mini", "input": "hi"}).to_string();
    let r = post(&s.envoy.url("/v1/responses"), &as_owner, &body);
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let by_id = s.envoy.url(&format!("/v1/responses/{id}"));
    let items = format!("{by_id}/input_items");
    let hits = s.primary.hits();
    for (what, r) in [
        ("read", get(&by_id, &as_other)),
        ("input items", get(&items, &as_other)),
        ("delete", send("DELETE", &by_id, &as_other, "")),
    ] {
        assert_openai_error(&r, 404, "response_not_found");
        assert!(r.body.contains(&id), "{what}: {}", r.body);
    }
    let chained = json!({"model": "gpt-4o-mini", "previous_response_id": id, "input": "and?"});
    let r = post(
        &s.envoy.url("/v1/responses"),
        &as_other,
        &chained.to_string(),
    );
    assert_openai_error(&r, 404, "previous_response_not_found");
    assert!(
        r.body
            .contains(&format!("Previous response with id '{id}' not found.")),
        "{}",
        r.body
    );
    assert_eq!(
        s.primary.hits(),
        hits,
        "no other key's call reached the provider"
    );
    // The owner's response is still there, and still its owner's.
    let r = get(&by_id, &as_owner);
    assert_eq!(
        (r.status, r.json()["id"].as_str()),
        (200, Some(id.as_str())),
        "{}",
        r.body
    );
    assert_eq!(get(&items, &as_owner).status, 200);
    let r = post(
        &s.envoy.url("/v1/responses"),
        &as_owner,
        &chained.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(send("DELETE", &by_id, &as_owner, "").status, 200);
}
