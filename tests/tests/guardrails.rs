//! Guardrails in real Envoy: input checks that deny for one client and
//! redact for another, output checks on plain and streamed answers (a match
//! split across chunks included), the external guard (the mock's
//! `/__mock/guard`, reached through the `backup` cluster) allowing, denying,
//! redacting and failing under both failure modes, a bad pattern rejected
//! while the previous config serves, and the official SDK's exceptions.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};
use std::time::Duration;

fn plugin(failure_mode: &str, secret_pattern: &str) -> String {
    format!(
        "{}
guardrails:
  lookbehind_bytes: 24
  input:
    - {{name: no-email, pii: [email], action: deny, clients: [demo]}}
    - {{name: scrub-email, pii: [email], action: redact, clients: [mini-only]}}
    - {{name: guard, clients: [demo], external: {{cluster: backup, authority: backup.mock, path: /__mock/guard, timeout_ms: 300, failure_mode: {failure_mode}}}}}
  output:
    - {{name: secret, regex: '{secret_pattern}', action: deny}}
    - {{name: cards, pii: [card], action: redact}}
",
        test_plugin()
    )
}

fn stack(failure_mode: &str) -> Stack {
    Stack::start(&plugin(failure_mode, "top secret"), 2)
}

fn last_prompt(m: &Mock) -> Value {
    let reqs = m.requests();
    let chat = reqs
        .iter()
        .rev()
        .find(|r| {
            r["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/chat/completions"))
        })
        .expect("a chat request reached the provider");
    chat["body"]["messages"][0]["content"].clone()
}

fn stream_body(text: &str) -> String {
    json!({"model": "mini", "stream": true, "messages": [{"role": "user", "content": text}]})
        .to_string()
}

/// The contents a client reads from a stream, and its error event.
fn read_stream(body: &str) -> (String, Option<Value>) {
    let (text, error, _) = stream_text(body);
    (text, error)
}

#[test]
fn an_email_is_denied_for_one_client_and_redacted_for_another() {
    let s = stack("allow");
    let r = s.chat(DEMO_KEY, &chat_body("mini", "mail jane@example.com please"));
    assert_openai_error(&r, 400, "guardrail_denied");
    assert!(
        !r.body.contains("jane"),
        "the match is never echoed: {}",
        r.body
    );
    assert_eq!(s.primary.hits(), 0, "nothing reached a provider");
    assert!(
        s.backup.requests().is_empty(),
        "a local deny comes before the external guard"
    );

    let r = s.chat(MINI_KEY, &chat_body("mini", "mail jane@example.com please"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(last_prompt(&s.primary), "mail [REDACTED:email] please");
    s.envoy.wait_stat(
        "wasmcustom.portcullis.guardrail.stage.input.check.no-email.deny",
        1,
    );
    s.envoy.wait_stat(
        "wasmcustom.portcullis.guardrail.stage.input.check.scrub-email.redact",
        1,
    );
}

/// The placements that once slipped past a redacting check: a value split
/// across two text parts, a message's `name`, an assistant's tool-call
/// arguments. Each arrives at the provider redacted.
#[test]
fn values_split_across_parts_in_names_and_in_tool_call_arguments_are_redacted() {
    let s = stack("allow");
    let body = json!({"model": "mini", "messages": [
        {"role": "user", "name": "carol@example.com", "content": [
            {"type": "text", "text": "mail alice@exa"}, {"type": "text", "text": "mple.com please"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "send", "arguments": "{\"to\":\"bob@example.com\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "done"}]});
    let r = s.chat(MINI_KEY, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let reqs = s.primary.requests();
    let sent = &reqs.last().expect("the request reached the provider")["body"]["messages"];
    assert_eq!(sent[0]["name"], "[REDACTED:email]");
    assert_eq!(sent[0]["content"][0]["text"], "mail [REDACTED:email]");
    assert_eq!(sent[0]["content"][1]["text"], " please");
    let args: Value = serde_json::from_str(
        sent[1]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args, json!({"to": "[REDACTED:email]"}));
    let text = sent.to_string();
    for leaked in ["carol", "alice", "bob@"] {
        assert!(
            !text.contains(leaked),
            "{leaked} reached the provider: {text}"
        );
    }
    // The deny check reads the same placements.
    let r = s.chat(DEMO_KEY, &body.to_string());
    assert_openai_error(&r, 400, "guardrail_denied");
}

#[test]
fn an_output_check_denies_plain_and_streamed_answers_and_redacts_across_chunks() {
    let s = stack("allow");
    let secret = "as I said before this is top secret stuff";
    s.primary
        .default_step(json!({"content": secret, "chunk_delay_ms": 20}));
    let r = s.chat(MINI_KEY, &chat_body("mini", "hi"));
    assert_openai_error(&r, 400, "guardrail_denied");
    assert!(r.body.contains("`secret`"), "{}", r.body);

    // "top " and "secret " arrive in separate chunks 20 ms apart.
    let r = s.chat(MINI_KEY, &stream_body("hi"));
    assert_eq!(r.status, 200);
    let (text, error) = read_stream(&r.body);
    assert_eq!(error.unwrap()["error"]["code"], "guardrail_denied");
    // What came before the match, up to the look-behind, was sent; nothing
    // of the match was.
    assert!(secret.starts_with(&text) && !text.is_empty(), "{text:?}");
    assert!(!text.contains("top"), "{text:?}");
    assert!(!r.body.contains("[DONE]"));

    // A card number whose groups arrive in four chunks is redacted whole.
    s.primary.default_step(
        json!({"content": "card 4111 1111 1111 1111 is on file", "chunk_delay_ms": 10}),
    );
    let r = s.chat(MINI_KEY, &stream_body("hi"));
    let (text, error) = read_stream(&r.body);
    assert!(error.is_none(), "{}", r.body);
    assert_eq!(text, "card [REDACTED:card] is on file");
    assert!(r.body.ends_with("data: [DONE]\n\n"));
    let r = s.chat(MINI_KEY, &chat_body("mini", "hi"));
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        "card [REDACTED:card] is on file"
    );
}

#[test]
fn the_external_guard_allows_denies_redacts_and_fails_by_its_mode() {
    let s = stack("allow");
    let r = s.chat(DEMO_KEY, &chat_body("mini", "hello guard:deny"));
    assert_openai_error(&r, 400, "guardrail_denied");
    assert!(r.body.contains("mock guard: denied"), "{}", r.body);
    let r = s.chat(DEMO_KEY, &chat_body("mini", "hello"));
    assert_eq!(r.status, 200, "{}", r.body);
    let guard_call = s
        .backup
        .requests()
        .into_iter()
        .find(|r| r["path"] == "/__mock/guard")
        .expect("the guard was asked");
    assert_eq!(guard_call["body"]["client"], "demo");
    assert_eq!(guard_call["body"]["stage"], "input");
    let r = s.chat(DEMO_KEY, &chat_body("mini", "hello guard:redact"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(last_prompt(&s.primary), "hello [REDACTED:guard]");
    // Late (2 s against 300 ms) or unreadable: allowed, counted.
    let r = s.chat(DEMO_KEY, &chat_body("mini", "guard:slow"));
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.chat(DEMO_KEY, &chat_body("mini", "guard:garbage"));
    assert_eq!(r.status, 200, "{}", r.body);
    s.envoy
        .wait_stat("wasmcustom.portcullis.guardrail.guard_errors", 2);

    // The same guard with failure_mode deny.
    s.envoy.reload(&plugin("deny", "top secret"));
    let r = poll_until(
        Duration::from_secs(30),
        "failure_mode deny to apply",
        || {
            let r = s.chat(DEMO_KEY, &chat_body("mini", "guard:slow"));
            (r.status != 200).then_some(r)
        },
    );
    assert_openai_error(&r, 503, "guardrail_unavailable");
    assert_eq!(r.header("retry-after"), Some("1"));
    let r = s.chat(DEMO_KEY, &chat_body("mini", "guard:garbage"));
    assert_openai_error(&r, 503, "guardrail_unavailable");
    let r = s.chat(DEMO_KEY, &chat_body("mini", "fine"));
    assert_eq!(r.status, 200, "{}", r.body);
}

#[test]
fn a_bad_pattern_is_rejected_and_the_previous_config_keeps_serving() {
    let s = stack("allow");
    let failed = "extension_config_discovery.http_filter.portcullis.config_fail";
    let before = s.envoy.stat(failed).unwrap_or(0);
    s.envoy.reload(&plugin("allow", "([a-z]"));
    s.envoy.wait_stat(failed, before + 1);
    assert!(
        s.envoy.log().contains("not a valid regular expression"),
        "the log says why"
    );
    s.primary.default_step(json!({"content": "top secret"}));
    let r = s.chat(MINI_KEY, &chat_body("mini", "hi"));
    assert_openai_error(&r, 400, "guardrail_denied");
}

#[test]
fn the_openai_sdk_raises_for_denied_prompts_answers_and_streams() {
    let s = stack("allow");
    let secret = "as I said before this is top secret stuff";
    s.primary.script(json!([
        {"content": secret},
        {"content": secret, "chunk_delay_ms": 10},
        {"content": "card 4111 1111 1111 1111 is on file", "chunk_delay_ms": 10}
    ]));
    let v = sdk_script("guardrails_sdk_check.py", &[&s.envoy.url("/v1"), DEMO_KEY]);
    assert_eq!(v["prompt_denied"]["class"], "BadRequestError");
    assert_eq!(v["prompt_denied"]["code"], "guardrail_denied");
    assert_eq!(v["answer_denied"]["class"], "BadRequestError");
    assert_eq!(v["stream_denied"]["raised"], "APIError");
    assert_eq!(v["stream_denied"]["code"], "guardrail_denied");
    let received = v["stream_denied"]["received"].as_str().unwrap();
    assert!(
        secret.starts_with(received) && !received.contains("top"),
        "{received:?}"
    );
    assert_eq!(v["stream_redacted"], "card [REDACTED:card] is on file");
}

#[test]
fn the_cache_never_serves_one_clients_redaction_or_the_raw_answer_to_a_client_that_redacts() {
    // The shipped plugin has the cache on (shared by clients); only
    // `mini-only` redacts card numbers in answers (the shipped config, its
    // own demo guardrails left out, the cache on).
    let plugin = format!(
        "{}
guardrails:
  output:
    - {{name: cards, pii: [card], action: redact, clients: [mini-only]}}
",
        without_demo(&shipped_plugin())
    );
    let s = Stack::start(&plugin, 1);
    s.primary
        .default_step(json!({"content": "card 4111 1111 1111 1111 is on file"}));
    let ask = |key: &str| s.chat(key, &chat_body("mini", "which card?"));
    let content = |r: &Resp| r.json()["choices"][0]["message"]["content"].clone();

    let r = ask(MINI_KEY);
    assert_eq!(content(&r), "card [REDACTED:card] is on file");
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    // The redacted answer was not stored: the next client reaches the
    // provider and gets the answer as it came, which is stored.
    let r = ask(DEMO_KEY);
    assert_eq!(r.header("x-portcullis-cache"), Some("miss"));
    assert_eq!(content(&r), "card 4111 1111 1111 1111 is on file");
    assert_eq!(s.primary.hits(), 2);
    let r = ask(DEMO_KEY);
    assert_eq!(r.header("x-portcullis-cache"), Some("hit"));
    // A hit for the redacting client is redacted on the way out.
    let r = ask(MINI_KEY);
    assert_eq!(r.header("x-portcullis-cache"), Some("hit"));
    assert_eq!(content(&r), "card [REDACTED:card] is on file");
    assert_eq!(s.primary.hits(), 2);
}

#[test]
fn verdicts_reach_the_collector_without_the_matched_text() {
    let dir = TempDir::new("guard-records");
    let c = Collector::start(&dir.0.join("log.db"), 0);
    let plugin =
        plugin("allow", "top secret").replace("flush_interval_ms: 250", "flush_interval_ms: 100");
    let s = Stack::start_full(&plugin, 1, false, c.grpc_port);
    let r = s.chat(
        MINI_KEY,
        &chat_body("mini", "mail jane@example.com and joe@example.org"),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let r = s.chat(DEMO_KEY, &chat_body("mini", "mail jane@example.com"));
    assert_openai_error(&r, 400, "guardrail_denied");
    let records = poll_until(Duration::from_secs(30), "two records", || {
        let r = c.recent(10);
        (r.len() >= 2).then_some(r)
    });
    let of = |client: &str| {
        records
            .iter()
            .find(|r| r["client"] == client)
            .unwrap_or_else(|| panic!("no record for {client}: {records:?}"))
            .clone()
    };
    assert_eq!(
        of("mini-only")["guardrails"],
        json!([{"stage": "input", "check": "scrub-email", "action": "redact", "hits": 2}])
    );
    let denied = of("demo");
    assert_eq!(denied["status"], 400);
    assert_eq!(denied["error"], "guardrail_denied");
    assert_eq!(denied["guardrails"][0]["action"], "deny");
    assert!(
        !records.iter().any(|r| r.to_string().contains("jane")),
        "{records:?}"
    );
}

/// Output checks read whole answers of every API in its own shape: a
/// response's output text is redacted, a message through the pivot is
/// denied in Anthropic's error shape.
#[test]
fn output_checks_read_responses_and_messages_answers() {
    let s = stack("allow");
    s.primary.script(json!([
        {"content": "your card 4111 1111 1111 1111 is fine"},
        {"content": "this is top secret stuff"}
    ]));
    let auth = format!("Bearer {MINI_KEY}");
    let r = post(
        &s.envoy.url("/v1/responses"),
        &[("authorization", auth.as_str())],
        &json!({"model": "mini", "input": "hi"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["output"][0]["content"][0]["text"],
        "your card [REDACTED:card] is fine"
    );
    let r = post(
        &s.envoy.url("/v1/messages"),
        &[("x-api-key", MINI_KEY), ("anthropic-version", "2023-06-01")],
        &json!({"model": "mini", "max_tokens": 20, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 400, "{}", r.body);
    assert_eq!(r.json()["type"], "error");
    assert!(!r.body.contains("top secret"), "{}", r.body);
}

/// Every data event of a stream, parsed (`[DONE]` left out).
fn events(body: &str) -> Vec<Value> {
    body.split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{e}: {d}")))
        .collect()
}

/// Streamed answers of every API are checked as they pass, in the API's
/// own events: the text (a card number whose groups arrive in separate
/// events) and a tool call's arguments (split in two by the provider) are
/// redacted in chat chunks, Responses events (passed through, with the
/// events that repeat the whole text) and Messages events (through the
/// pivot); a deny ends a Messages stream with Anthropic's error event.
#[test]
fn streamed_answers_of_every_api_are_checked_tool_call_arguments_included() {
    let s = stack("allow");
    let card = "4111 1111 1111 1111";
    s.primary
        .default_step(json!({"content": format!("card {card} is on file"),
        "chunk_delay_ms": 5, "tool_call": {"name": "lookup", "input": {"card": card}}}));
    let auth = format!("Bearer {MINI_KEY}");
    let want_text = "card [REDACTED:card] is on file";
    let want_args = json!({"card": "[REDACTED:card]"});
    let params = json!({"type": "object", "properties": {"card": {"type": "string"}}});

    // Chat completions.
    let body = json!({"model": "mini", "stream": true, "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": params}}]});
    let r = s.chat(MINI_KEY, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("4111"), "{}", r.body);
    let (mut text, mut args) = (String::new(), String::new());
    for e in events(&r.body) {
        let d = &e["choices"][0]["delta"];
        text.push_str(d["content"].as_str().unwrap_or_default());
        for c in d["tool_calls"].as_array().into_iter().flatten() {
            args.push_str(c["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    assert_eq!(text, want_text);
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), want_args);
    assert!(r.body.ends_with("data: [DONE]\n\n"));

    // Responses, passed through to the OpenAI-format provider.
    let body = json!({"model": "mini", "stream": true, "input": "hi",
        "tools": [{"type": "function", "name": "lookup", "parameters": params}]});
    let r = post(
        &s.envoy.url("/v1/responses"),
        &[("authorization", auth.as_str())],
        &body.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("4111"), "{}", r.body);
    let evs = events(&r.body);
    let (mut text, mut args) = (String::new(), String::new());
    for e in &evs {
        match e["type"].as_str().unwrap_or_default() {
            "response.output_text.delta" => text.push_str(e["delta"].as_str().unwrap()),
            "response.function_call_arguments.delta" => args.push_str(e["delta"].as_str().unwrap()),
            _ => {}
        }
    }
    assert_eq!(text, want_text);
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), want_args);
    let done = evs.last().unwrap();
    assert_eq!(done["type"], "response.completed");
    assert_eq!(
        done["response"]["output"][0]["content"][0]["text"],
        want_text
    );

    // Messages, through the pivot.
    let body = json!({"model": "mini", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [{"name": "lookup", "input_schema": params}]});
    let headers = [("x-api-key", MINI_KEY), ("anthropic-version", "2023-06-01")];
    let r = post(&s.envoy.url("/v1/messages"), &headers, &body.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains("4111"), "{}", r.body);
    let (mut text, mut args) = (String::new(), String::new());
    for e in events(&r.body) {
        match e["delta"]["type"].as_str().unwrap_or_default() {
            "text_delta" => text.push_str(e["delta"]["text"].as_str().unwrap()),
            "input_json_delta" => args.push_str(e["delta"]["partial_json"].as_str().unwrap()),
            _ => {}
        }
    }
    assert_eq!(text, want_text);
    assert_eq!(serde_json::from_str::<Value>(&args).unwrap(), want_args);

    s.primary.default_step(
        json!({"content": "as I said this is top secret stuff", "chunk_delay_ms": 5}),
    );
    let body = json!({"model": "mini", "max_tokens": 50, "stream": true,
        "messages": [{"role": "user", "content": "hi"}]});
    let r = post(&s.envoy.url("/v1/messages"), &headers, &body.to_string());
    assert!(!r.body.contains("secret stuff"), "{}", r.body);
    let last = events(&r.body).pop().unwrap();
    assert_eq!(last["type"], "error", "{}", r.body);
    assert!(last["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`secret`"));
    assert!(r.body.contains("event: error\n"), "{}", r.body);
}

/// Guardrails on an agent-sized prompt (#29): a 2 MB conversation with an
/// email in its middle is denied for one client and redacted in place for
/// another (the rest reaching the provider byte for byte); a 1 MB base64
/// image whose data holds a valid card number is not text and is not
/// scanned, while the same number in the text is denied.
#[test]
fn checks_on_a_one_megabyte_prompt_deny_and_redact_and_skip_image_data() {
    let plugin = format!(
        "{}
guardrails:
  input:
    - {{name: no-email, pii: [email], action: deny, clients: [demo]}}
    - {{name: scrub-email, pii: [email], action: redact, clients: [mini-only]}}
    - {{name: cards, pii: [card], action: deny}}
",
        test_plugin()
    );
    let s = Stack::start(&plugin, 1);
    let filler = "Context line of a long agent conversation, resent every turn. ".repeat(16_000);
    let text = format!("{filler}mail jane@example.com about it. {filler}");
    assert!(text.len() > 1 << 20, "{}", text.len());
    let r = s.chat(DEMO_KEY, &chat_body("mini", &text));
    assert_openai_error(&r, 400, "guardrail_denied");
    assert_eq!(s.primary.hits(), 0);
    let r = s.chat(MINI_KEY, &chat_body("mini", &text));
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
    let want = format!("{filler}mail [REDACTED:email] about it. {filler}");
    assert!(
        last_prompt(&s.primary).as_str() == Some(want.as_str()),
        "the 2 MB prompt (2 x 1 MB of context) reached the provider redacted in place and otherwise whole"
    );
    // A card number inside base64 image data is not text.
    let data = format!(
        // Between `/` and `+` (both base64): a card's word boundaries.
        "{}/4111111111111111+{}",
        "iVBORw0KGgo".repeat(50_000),
        "AAAA".repeat(100_000)
    );
    let with_image = |words: &str| {
        json!({"model": "mini", "messages": [{"role": "user", "content": [
            {"type": "text", "text": words},
            {"type": "image_url", "image_url": {"url": format!("data:image/png;base64,{data}")}}]}]})
        .to_string()
    };
    let r = s.chat(MINI_KEY, &with_image("What is in this screenshot?"));
    assert_eq!(r.status, 200, "{}", &r.body[..r.body.len().min(300)]);
    let r = s.chat(MINI_KEY, &with_image("my card is 4111 1111 1111 1111"));
    assert_openai_error(&r, 400, "guardrail_denied");
}
