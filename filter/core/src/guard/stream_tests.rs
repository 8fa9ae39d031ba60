//! Output checks over streams in each API's events: text and tool-call
//! arguments, split at every byte.

use super::stream::StreamGuard;
use super::tests::gateway;
use super::texts::Shape;
use super::{Guardrails, Stage};
use serde_json::{json, Value};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const GUARDS: &str = r#"
  lookbehind_bytes: 24
  output:
    - {name: mail, pii: [email], action: redact}
    - {name: cards, pii: [card], action: redact}
    - {name: secret, regex: "top secret", action: deny}
"#;

fn sse(events: &[Value], named: bool) -> String {
    let mut s = String::new();
    for e in events {
        if named {
            s.push_str(&format!("event: {}\n", e["type"].as_str().unwrap()));
        }
        s.push_str(&format!("data: {e}\n\n"));
    }
    s
}

/// The stream through a guard, cut at `split`.
fn through(g: &Guardrails, shape: Shape, stream: &str, split: usize) -> (Vec<Value>, StreamGuard) {
    let mut guard = StreamGuard::new(g, shape, g.active(Stage::Output, "bob", 0), false);
    let bytes = stream.as_bytes();
    let mut out = guard.chunk(g, &bytes[..split]);
    out.extend(guard.chunk(g, &bytes[split..]));
    out.extend(guard.finish(g));
    let text = String::from_utf8(out).unwrap();
    let events = text
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    (events, guard)
}

fn chunk(delta: Value, finish: Option<&str>) -> Value {
    json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
}

#[test]
fn chat_tool_call_arguments_are_held_whole_and_redacted() {
    let gw = gateway(GUARDS);
    let g = gw.guardrails.as_ref().unwrap();
    let call = |args: &str| json!({"tool_calls": [{"index": 0, "function": {"arguments": args}}]});
    let mut stream = sse(
        &[
            chunk(
                json!({"role": "assistant", "content": "Mail 4111 1111 "}),
                None,
            ),
            chunk(json!({"content": "1111 1111 now."}), None),
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                    "function": {"name": "send", "arguments": ""}}]}),
                None,
            ),
            chunk(call("{\"to\": \"ali"), None),
            chunk(call("ce@exa"), None),
            chunk(call("mple.com\"}"), None),
            chunk(json!({}), Some("tool_calls")),
        ],
        false,
    );
    stream.push_str("data: [DONE]\n\n");
    for split in 0..=stream.len() {
        let (events, guard) = through(g, Shape::Chat, &stream, split);
        let mut text = String::new();
        let mut args = String::new();
        let mut names = String::new();
        for e in &events {
            let d = &e["choices"][0]["delta"];
            text.push_str(d["content"].as_str().unwrap_or_default());
            for c in d["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(c["index"], 0);
                args.push_str(c["function"]["arguments"].as_str().unwrap_or_default());
                names.push_str(c["function"]["name"].as_str().unwrap_or_default());
            }
        }
        assert_eq!(text, "Mail [REDACTED:card] now.", "split {split}");
        assert_eq!(args, r#"{"to":"[REDACTED:email]"}"#, "split {split}");
        assert_eq!(names, "send");
        assert_eq!(
            events.last().unwrap()["choices"][0]["finish_reason"],
            "tool_calls"
        );
        assert!(guard.changed);
        let hits: Vec<(String, u32)> = guard
            .verdicts
            .iter()
            .map(|v| (v.check.clone(), v.hits))
            .collect();
        assert_eq!(hits, [("cards".to_string(), 1), ("mail".to_string(), 1)]);
    }
}

fn messages_stream() -> String {
    let delta = |i: u32, d: Value| json!({"type": "content_block_delta", "index": i, "delta": d});
    sse(
        &[
            json!({"type": "message_start", "message": {"id": "msg_1", "type": "message", "role": "assistant",
                "content": [], "model": "m", "usage": {"input_tokens": 3, "output_tokens": 1}}}),
            json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            delta(0, json!({"type": "text_delta", "text": "Card 4111 1111 "})),
            delta(0, json!({"type": "text_delta", "text": "1111 1111, done."})),
            json!({"type": "content_block_stop", "index": 0}),
            json!({"type": "content_block_start", "index": 1,
                "content_block": {"type": "tool_use", "id": "toolu_1", "name": "send", "input": {}}}),
            delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "{\"to\": \"bob@ex"}),
            ),
            delta(
                1,
                json!({"type": "input_json_delta", "partial_json": "ample.org\"}"}),
            ),
            json!({"type": "content_block_stop", "index": 1}),
            json!({"type": "message_delta", "delta": {"stop_reason": "tool_use"}, "usage": {"output_tokens": 9}}),
            json!({"type": "message_stop"}),
        ],
        true,
    )
}

#[test]
fn messages_text_and_tool_use_input_are_redacted_in_anthropic_events() {
    let gw = gateway(GUARDS);
    let g = gw.guardrails.as_ref().unwrap();
    let stream = messages_stream();
    for split in 0..=stream.len() {
        let (events, guard) = through(g, Shape::Messages, &stream, split);
        let mut text = String::new();
        let mut json_in = String::new();
        let mut stops = Vec::new();
        for e in &events {
            match (e["type"].as_str().unwrap(), e["index"].as_u64()) {
                ("content_block_delta", Some(0)) => {
                    text.push_str(e["delta"]["text"].as_str().unwrap())
                }
                ("content_block_delta", Some(1)) => {
                    json_in.push_str(e["delta"]["partial_json"].as_str().unwrap())
                }
                ("content_block_stop", Some(i)) => stops.push(i),
                _ => {}
            }
        }
        assert_eq!(text, "Card [REDACTED:card], done.", "split {split}");
        assert_eq!(json_in, r#"{"to":"[REDACTED:email]"}"#, "split {split}");
        assert_eq!(stops, [0, 1]);
        assert_eq!(events.last().unwrap()["type"], "message_stop");
        assert!(guard.changed && guard.denied.is_none());
    }
}

#[test]
fn a_messages_deny_ends_with_an_anthropic_error_event() {
    let gw = gateway(GUARDS);
    let g = gw.guardrails.as_ref().unwrap();
    let stream = messages_stream().replace("1111 1111, done.", "this is top secret.");
    let (events, guard) = through(g, Shape::Messages, &stream, 0);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["error"]["type"], "invalid_request_error");
    assert!(last["error"]["message"]
        .as_str()
        .unwrap()
        .contains("`secret`"));
    assert!(!events.iter().any(|e| e.to_string().contains("top secret")));
    assert!(guard.denied.is_some());
}

fn responses_stream() -> String {
    let item = json!({"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Write to carol@example.net now.", "annotations": []}]});
    let call = json!({"id": "fc_1", "type": "function_call", "call_id": "call_1", "name": "send",
        "arguments": "{\"card\":\"4111 1111 1111 1111\"}", "status": "completed"});
    let text_delta = |d: &str| {
        json!({"type": "response.output_text.delta", "item_id": "msg_1",
        "output_index": 0, "content_index": 0, "delta": d})
    };
    let args_delta = |d: &str| {
        json!({"type": "response.function_call_arguments.delta", "item_id": "fc_1",
        "output_index": 1, "delta": d})
    };
    sse(
        &[
            json!({"type": "response.created", "response": {"id": "resp_1", "status": "in_progress", "output": []}}),
            json!({"type": "response.output_item.added", "output_index": 0,
                "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []}}),
            text_delta("Write to carol@"),
            text_delta("example.net now."),
            json!({"type": "response.output_text.done", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "text": "Write to carol@example.net now."}),
            json!({"type": "response.content_part.done", "item_id": "msg_1", "output_index": 0,
                "content_index": 0, "part": item["content"][0]}),
            json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
            args_delta("{\"card\":\"4111 1111"),
            args_delta(" 1111 1111\"}"),
            json!({"type": "response.function_call_arguments.done", "item_id": "fc_1", "output_index": 1,
                "arguments": call["arguments"]}),
            json!({"type": "response.output_item.done", "output_index": 1, "item": call}),
            json!({"type": "response.completed", "response": {"id": "resp_1", "status": "completed",
                "output": [item, call]}}),
        ],
        true,
    )
}

#[test]
fn responses_text_arguments_and_whole_repeats_are_redacted() {
    let gw = gateway(GUARDS);
    let g = gw.guardrails.as_ref().unwrap();
    let stream = responses_stream();
    let want_text = "Write to [REDACTED:email] now.";
    let want_args = r#"{"card":"[REDACTED:card]"}"#;
    for split in 0..=stream.len() {
        let (events, guard) = through(g, Shape::Responses, &stream, split);
        let mut text = String::new();
        let mut args = String::new();
        for e in &events {
            match e["type"].as_str().unwrap() {
                "response.output_text.delta" => text.push_str(e["delta"].as_str().unwrap()),
                "response.function_call_arguments.delta" => {
                    assert_eq!(e["item_id"], "fc_1");
                    args.push_str(e["delta"].as_str().unwrap())
                }
                _ => {}
            }
        }
        assert_eq!(text, want_text, "split {split}");
        assert_eq!(args, want_args, "split {split}");
        let all = serde_json::to_string(&events).unwrap();
        assert!(
            !all.contains("carol@") && !all.contains("4111"),
            "split {split}: {all}"
        );
        let done = events
            .iter()
            .find(|e| e["type"] == "response.output_text.done")
            .unwrap();
        assert_eq!(done["text"], want_text);
        let completed = events.last().unwrap();
        assert_eq!(completed["type"], "response.completed");
        assert_eq!(
            completed["response"]["output"][0]["content"][0]["text"],
            want_text
        );
        assert_eq!(completed["response"]["output"][1]["arguments"], want_args);
        // Each value counted once, however often it is repeated whole.
        let hits: Vec<(String, u32)> = guard
            .verdicts
            .iter()
            .map(|v| (v.check.clone(), v.hits))
            .collect();
        assert_eq!(
            hits,
            [("mail".to_string(), 1), ("cards".to_string(), 1)],
            "split {split}"
        );
    }
}

#[test]
fn a_responses_deny_ends_with_an_error_event_the_sdk_raises() {
    let gw = gateway(GUARDS);
    let g = gw.guardrails.as_ref().unwrap();
    let stream = responses_stream().replace("example.net now.", "top secret.");
    let (events, guard) = through(g, Shape::Responses, &stream, 7);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "error");
    assert_eq!(last["code"], "guardrail_denied");
    assert_eq!(last["error"]["code"], "guardrail_denied");
    assert!(!events.iter().any(|e| e.to_string().contains("top secret")));
    assert!(guard.denied.is_some());
}

#[test]
fn a_denied_value_in_streamed_arguments_ends_the_stream_before_any_of_them() {
    let gw = gateway(GUARDS);
    let g = gw.guardrails.as_ref().unwrap();
    let call = |args: &str| json!({"tool_calls": [{"index": 0, "function": {"arguments": args}}]});
    let stream = sse(
        &[
            chunk(
                json!({"tool_calls": [{"index": 0, "id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{\"a\": \"top "}}]}),
                None,
            ),
            chunk(call("secret\"}"), None),
            chunk(json!({}), Some("tool_calls")),
        ],
        false,
    );
    let (events, guard) = through(g, Shape::Chat, &stream, 0);
    assert!(!serde_json::to_string(&events).unwrap().contains("secret\""));
    assert_eq!(events.last().unwrap()["error"]["code"], "guardrail_denied");
    assert!(guard.denied.is_some());
}
