use super::*;
use serde_json::json;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn chat_of(v: Value) -> Value {
    let (body, _) = to_chat(&serde_json::to_vec(&v).unwrap(), "gpt-x").unwrap();
    serde_json::from_slice(&body).unwrap()
}

#[test]
fn a_responses_request_becomes_a_chat_completion() {
    let c = chat_of(
        json!({"model": "m", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.2,
        "tools": [{"type": "function", "name": "get_weather", "description": "w", "parameters": {"type": "object"}, "strict": true}],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "text": {"format": {"type": "json_schema", "name": "answer", "schema": {"type": "object"}, "strict": true}},
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "weather?"}, {"type": "input_image", "image_url": "https://x/y.png"}]},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
            {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
            {"type": "reasoning", "summary": []}]}),
    );
    assert_eq!(
        c,
        json!({"model": "gpt-x", "max_tokens": 50, "temperature": 0.2,
        "tools": [{"type": "function", "function": {"name": "get_weather", "description": "w", "parameters": {"type": "object"}, "strict": true}}],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"}, "strict": true}},
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "weather?"}, {"type": "image_url", "image_url": {"url": "https://x/y.png"}}]},
            {"role": "assistant", "content": "Checking.", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]})
    );
    let s = chat_of(json!({"model": "m", "input": "hi", "stream": true}));
    assert_eq!(s["messages"], json!([{"role": "user", "content": "hi"}]));
    assert_eq!(s["stream_options"], json!({"include_usage": true}));
}

#[test]
fn stateful_features_and_built_in_tools_are_refused_by_name() {
    for (field, v) in [
        ("previous_response_id", json!("resp_1")),
        ("background", json!(true)),
        ("conversation", json!("c")),
    ] {
        let mut doc = json!({"model": "m", "input": "hi"});
        doc[field] = v;
        let e = to_chat(&serde_json::to_vec(&doc).unwrap(), "g").unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains(field), "{}", e.message);
    }
    let e = to_chat(
        &serde_json::to_vec(
            &json!({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}),
        )
        .unwrap(),
        "g",
    )
    .unwrap_err();
    assert!(e.message.contains("web_search"), "{}", e.message);
    let (_, dropped) = to_chat(
        &serde_json::to_vec(
            &json!({"model": "m", "input": "hi", "store": true, "reasoning": {"effort": "low"}}),
        )
        .unwrap(),
        "g",
    )
    .unwrap();
    assert_eq!(dropped, ["reasoning", "store"]);
}

#[test]
fn a_chat_answer_becomes_a_response() {
    let a = br#"{"id":"c1","object":"chat.completion","created":7,"model":"gpt-x","choices":[{"index":0,"message":{"role":"assistant","content":"Checking.","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":20,"completion_tokens":7,"prompt_tokens_details":{"cached_tokens":5}}}"#;
    let r: Value =
        serde_json::from_slice(&answer_from_chat(a, 1_700_000_100, &Echo::default()).unwrap())
            .unwrap();
    assert_eq!(r["id"], "resp_c1");
    assert_eq!(r["status"], "completed");
    assert_eq!(
        r["output"],
        json!([
        {"type": "message", "id": "msg_c1", "status": "completed", "role": "assistant", "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
        {"type": "function_call", "id": "fc_call_1", "call_id": "call_1", "name": "f", "arguments": "{\"a\":1}", "status": "completed"}])
    );
    assert_eq!(
        r["usage"],
        json!({"input_tokens": 20, "input_tokens_details": {"cached_tokens": 5}, "output_tokens": 7,
        "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 27})
    );
    let u = crate::usage::Usage::from_body(&serde_json::to_vec(&r).unwrap()).unwrap();
    assert_eq!((u.prompt, u.completion, u.cached), (20, 7, 5));
}

const STREAM: &str = "data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi \"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"there\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"id\":\"call_1\",\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{\\\"a\\\"\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{\"tool_calls\":[{\"index\":0,\"function\":{\"arguments\":\":1}\"}}]},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n\
data: {\"id\":\"c1\",\"model\":\"gpt-x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":4}}\n\n\
data: [DONE]\n\n";

fn events(out: &[u8]) -> Vec<Value> {
    String::from_utf8(out.to_vec())
        .unwrap()
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.split_once("\ndata: ").unwrap().1).unwrap())
        .collect()
}

#[test]
fn a_chat_stream_becomes_responses_events_split_anywhere() {
    let mut whole = FromChatStream::new(7, &Echo::default());
    let mut out = whole.push(STREAM.as_bytes());
    out.extend(whole.finish());
    let ev = events(&out);
    let kinds: Vec<&str> = ev.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.output_item.added",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.delta",
            "response.function_call_arguments.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, e) in ev.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64);
    }
    let done = &ev[14]["response"];
    assert_eq!(done["output"][0]["content"][0]["text"], "Hi there");
    assert_eq!(done["output"][1]["arguments"], "{\"a\":1}");
    assert_eq!(done["usage"]["input_tokens"], 9);
    let mut usage = StreamUsage::default();
    usage.push(&out);
    assert_eq!(
        usage.usage().map(|u| (u.prompt, u.completion)),
        Some((9, 4))
    );
    for split in [1, 9, 120, 400, STREAM.len() - 2] {
        let mut s = FromChatStream::new(7, &Echo::default());
        let (a, b) = STREAM.as_bytes().split_at(split);
        let mut o = s.push(a);
        o.extend(s.push(b));
        o.extend(s.finish());
        assert_eq!(o, out, "split at {split}");
    }
}

#[test]
fn a_cut_stream_ends_with_response_failed() {
    let mut s = FromChatStream::new(7, &Echo::default());
    let cut = &STREAM[..STREAM.find("\"finish_reason\":\"tool_calls\"").unwrap()];
    let mut out = s.push(cut.as_bytes());
    out.extend(s.finish());
    let ev = events(&out);
    assert_eq!(ev.last().unwrap()["type"], "response.failed");
    assert_eq!(ev.last().unwrap()["response"]["status"], "failed");
}

#[test]
fn the_response_id_is_read_from_an_answer_or_a_streams_first_event() {
    assert_eq!(
        response_id(br#"{"id":"resp_1","object":"response"}"#),
        Some("resp_1")
    );
    assert_eq!(
        response_id(b"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\": \"resp_2\",\"object\""),
        Some("resp_2")
    );
    assert_eq!(response_id(br#"{"object":"response","id":"#), None);
    assert_eq!(response_id(br#"{"id":""}"#), None);
    assert_eq!(by_id("/v1/responses/resp_1"), Some(("resp_1", "")));
    assert_eq!(
        by_id("/v1/responses/resp_1/input_items"),
        Some(("resp_1", "/input_items"))
    );
    assert_eq!(by_id("/v1/responses/resp_1/cancel"), None);
    assert_eq!(by_id("/v1/responses/"), None);
    assert_eq!(by_id("/v1/responses"), None);
}

#[test]
fn malformed_items_and_parts_are_refused_naming_their_path_never_rewritten() {
    let refused = |input: Value| -> String {
        let doc = json!({"model": "m", "input": input});
        let e = to_chat(&serde_json::to_vec(&doc).unwrap(), "g").unwrap_err();
        assert_eq!(e.status, 400, "{}", e.message);
        e.message
    };
    for (input, path) in [
        (
            json!([{"role": "user", "content": [{"type": "input_text"}]}]),
            "input.0.content.0.text is required",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_text", "text": 42}]}]),
            "input.0.content.0.text must be a string",
        ),
        (
            json!([{"role": "user", "content": "ok"}, {"role": "assistant", "content": [{"type": "output_text", "text": null}]}]),
            "input.1.content.0.text is required",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_text", "text": "a"}, 7]}]),
            "input.0.content.1 must be an object",
        ),
        (
            json!([{"role": "user", "content": [{"type": 3, "text": "a"}]}]),
            "input.0.content.0.type must be a string",
        ),
        (
            json!([{"role": "user", "content": [{"type": "input_image", "image_url": 5}]}]),
            "input.0.content.0.image_url must be a string",
        ),
        (
            json!([{"role": 1, "content": "hi"}]),
            "input.0.role must be a string",
        ),
        (
            json!([{"type": 1, "content": "hi"}]),
            "input.0.type must be a string",
        ),
        (
            json!([{"type": "function_call", "name": "f", "arguments": "{}"}]),
            "input.0.call_id is required",
        ),
        (
            json!([{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]),
            "input.0.arguments must be a string",
        ),
        (
            json!([{"type": "function_call_output", "call_id": "c"}]),
            "input.0.output must be a string or a list of parts",
        ),
        (
            json!([{"type": "function_call_output", "output": "x"}]),
            "input.0.call_id is required",
        ),
    ] {
        let message = refused(input.clone());
        assert!(message.contains(path), "{input}: {message}");
    }
    // What reads strictly still translates.
    let c = chat_of(json!({"model": "m", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": ""}]}]}));
    assert_eq!(c["messages"][0]["content"][0]["text"], "");
}
