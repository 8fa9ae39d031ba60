//! The mock's Responses API, stateful as OpenAI's: `POST <prefix>/responses`
//! (and Azure's `/openai/responses?api-version=…`) checks what OpenAI
//! checks (the table in `tests/MOCK.md`), answers a response (a message,
//! and a function call when a step scripts `tool_call` and the request has
//! tools) or its stream of events, and keeps it by id unless `store:
//! false`; `previous_response_id` must name a kept response;
//! `GET .../responses/{id}`, `DELETE` and `.../input_items` read and drop
//! them.

use super::openai_checks::Refusal;
use super::{json_response, Body, ChanBody, State, Step};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::sync::mpsc;

const FIELDS: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "previous_response_id",
    "store",
    "stream",
    "text",
    "reasoning",
    "metadata",
    "user",
    "truncation",
    "include",
    "background",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "top_logprobs",
    "conversation",
    "max_tool_calls",
    "prompt",
    "stream_options",
];

fn bad(status: u16, message: String, param: Option<&str>, code: Option<&str>) -> Refusal {
    Refusal(
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}),
    )
}

fn check(state: &State, req: &Value) -> Result<(), Refusal> {
    let Some(fields) = req.as_object() else {
        return Err(bad(
            400,
            "We could not parse the JSON body of your request.".into(),
            None,
            None,
        ));
    };
    if let Some(k) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(
            400,
            format!("Unknown parameter: '{k}'."),
            Some(k),
            Some("unknown_parameter"),
        ));
    }
    if !req.get("model").is_some_and(Value::is_string) {
        return Err(bad(
            400,
            "Missing required parameter: 'model'.".into(),
            Some("model"),
            Some("missing_required_parameter"),
        ));
    }
    match req.get("input") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(Value::Array(a)) if !a.is_empty() => {}
        _ => {
            return Err(bad(
                400,
                "Invalid 'input': expected a string or a non-empty array of items.".into(),
                Some("input"),
                Some("invalid_value"),
            ))
        }
    }
    for (i, t) in req
        .get("tools")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if t.get("type").and_then(Value::as_str) == Some("function")
            && !t.get("name").is_some_and(Value::is_string)
        {
            return Err(bad(
                400,
                format!("Missing required parameter: 'tools[{i}].name'."),
                Some("tools"),
                Some("missing_required_parameter"),
            ));
        }
    }
    if let Some(prev) = req.get("previous_response_id").and_then(Value::as_str) {
        let known = state.responses.lock().is_ok_and(|r| r.contains_key(prev));
        if !known {
            return Err(bad(
                404,
                format!("Previous response with id '{prev}' not found."),
                Some("previous_response_id"),
                Some("previous_response_not_found"),
            ));
        }
    }
    Ok(())
}

fn words(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.split_whitespace().count() as u64,
        Value::Array(a) => a.iter().map(words).sum(),
        Value::Object(o) => o
            .iter()
            .filter(|(k, _)| matches!(k.as_str(), "content" | "text" | "output"))
            .map(|(_, v)| words(v))
            .sum(),
        _ => 0,
    }
}

/// A whole response object, every member OpenAI writes (the request's
/// settings echoed, OpenAI's defaults where it sent none).
fn response(id: &str, req: &Value, status: &str, output: Vec<Value>, usage: Value) -> Value {
    let given = |k: &str, default: Value| {
        req.get(k)
            .filter(|v| !v.is_null())
            .cloned()
            .unwrap_or(default)
    };
    let tools: Vec<Value> = req
        .get("tools")
        .and_then(Value::as_array)
        .map(|ts| {
            ts.iter()
                .map(|t| match t.get("type").and_then(Value::as_str) {
                    Some("function") => json!({"type": "function", "name": t["name"],
                        "description": t.get("description").cloned().unwrap_or(Value::Null),
                        "parameters": t.get("parameters").cloned().unwrap_or(Value::Null),
                        "strict": t.get("strict").cloned().unwrap_or(json!(true))}),
                    _ => t.clone(),
                })
                .collect()
        })
        .unwrap_or_default();
    // OpenAI echoes a json_schema format whole, its schema included.
    let format = match req.pointer("/text/format") {
        Some(f) if f["type"] == "json_schema" => json!({"type": "json_schema", "name": f["name"],
            "description": f.get("description").cloned().unwrap_or(Value::Null),
            "schema": f.get("schema").cloned().unwrap_or(Value::Null),
            "strict": f.get("strict").cloned().unwrap_or(json!(false))}),
        Some(f) => f.clone(),
        None => json!({"type": "text"}),
    };
    let done = matches!(status, "completed" | "incomplete");
    json!({"id": id, "object": "response", "created_at": 1_700_000_000u64,
        "completed_at": if done { json!(1_700_000_001u64) } else { Value::Null },
        "status": status, "error": null, "incomplete_details": null,
        "instructions": given("instructions", Value::Null), "metadata": given("metadata", json!({})),
        "model": given("model", json!("")), "output": output,
        "parallel_tool_calls": given("parallel_tool_calls", json!(true)),
        "previous_response_id": given("previous_response_id", Value::Null),
        "temperature": given("temperature", json!(1.0)), "top_p": given("top_p", json!(1.0)),
        "presence_penalty": 0.0, "frequency_penalty": 0.0, "top_logprobs": given("top_logprobs", json!(0)),
        "tool_choice": given("tool_choice", json!("auto")), "tools": tools,
        "text": {"format": format, "verbosity": "medium"},
        "truncation": given("truncation", json!("disabled")),
        "reasoning": {"effort": null, "summary": null},
        "max_output_tokens": given("max_output_tokens", Value::Null),
        "max_tool_calls": given("max_tool_calls", Value::Null),
        "store": given("store", json!(true)), "background": given("background", json!(false)),
        "service_tier": "default", "safety_identifier": given("safety_identifier", Value::Null),
        "prompt_cache_key": given("prompt_cache_key", Value::Null), "user": null, "usage": usage})
}

pub async fn create(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (path, headers) = super::request_facts(&req);
    let auth = super::openai_auth(&req, &path);
    let (parsed, step) = super::receive(&state, &path, headers, req.into_body()).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Err(Refusal(status, body)) = check(&state, &parsed) {
        return Ok(json_response(status, &body));
    }
    let status = step.status.unwrap_or(200);
    if status != 200 {
        return Ok(json_response(
            status,
            &json!({"error": {"message": format!("mock {}: scripted status {status}", state.name), "type": "server_error", "code": null}}),
        ));
    }
    let n = state.hits.load(Ordering::Relaxed);
    let id = format!("resp_mock_{}_{n}", state.name);
    let text = step
        .content
        .clone()
        .unwrap_or_else(|| format!("Hello from {}! This is a mock response.", state.name));
    let mut output = vec![
        json!({"type": "message", "id": format!("msg_mock_{n}"), "status": "completed", "role": "assistant",
        "content": [{"type": "output_text", "text": text, "annotations": []}]}),
    ];
    let tool = step
        .tool_call
        .clone()
        .filter(|_| parsed.get("tools").is_some_and(Value::is_array));
    if let Some(t) = &tool {
        output.push(json!({"type": "function_call", "id": format!("fc_mock_{n}"), "call_id": format!("call_mock_{n}"),
            "name": t.name, "arguments": t.input.to_string(), "status": "completed"}));
    }
    let input_tokens = step.usage.map_or_else(
        || words(parsed.get("input").unwrap_or(&Value::Null)) + 1,
        |u| u.prompt_tokens,
    );
    let output_tokens = step
        .usage
        .map_or(text.split_whitespace().count() as u64, |u| {
            u.completion_tokens
        });
    let usage = json!({"input_tokens": input_tokens, "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": output_tokens, "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": input_tokens + output_tokens});
    let done = response(&id, &parsed, "completed", output.clone(), usage);
    if parsed.get("store") != Some(&Value::Bool(false)) {
        if let Ok(mut r) = state.responses.lock() {
            r.insert(
                id.clone(),
                (
                    done.clone(),
                    parsed.get("input").cloned().unwrap_or(Value::Null),
                ),
            );
        }
    }
    if parsed.get("stream") != Some(&Value::Bool(true)) {
        return Ok(json_response(200, &done));
    }
    Ok(stream(&id, &parsed, &output, &done, &step))
}

/// The response as OpenAI streams it: created, in_progress, each item
/// added / its deltas / done, completed.
fn stream(id: &str, req: &Value, output: &[Value], done: &Value, step: &Step) -> Response<Body> {
    let mut seq = 0u64;
    let mut events = Vec::new();
    let mut ev = |kind: &str, mut v: Value| {
        v["type"] = json!(kind);
        v["sequence_number"] = json!(seq);
        seq += 1;
        events.push(Bytes::from(format!("event: {kind}\ndata: {v}\n\n")));
    };
    let started = response(id, req, "in_progress", Vec::new(), Value::Null);
    ev("response.created", json!({"response": started.clone()}));
    ev("response.in_progress", json!({"response": started}));
    for (i, item) in output.iter().enumerate() {
        let item_id = item["id"].clone();
        if item["type"] == "message" {
            let text = item["content"][0]["text"]
                .as_str()
                .unwrap_or("")
                .to_string();
            let mut open = item.clone();
            open["content"] = json!([]);
            open["status"] = json!("in_progress");
            ev(
                "response.output_item.added",
                json!({"output_index": i, "item": open}),
            );
            ev(
                "response.content_part.added",
                json!({"item_id": item_id, "output_index": i, "content_index": 0, "part": {"type": "output_text", "text": "", "annotations": []}}),
            );
            for w in text.split_inclusive(' ') {
                ev(
                    "response.output_text.delta",
                    json!({"item_id": item_id, "output_index": i, "content_index": 0, "delta": w, "logprobs": []}),
                );
            }
            ev(
                "response.output_text.done",
                json!({"item_id": item_id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
            );
            ev(
                "response.content_part.done",
                json!({"item_id": item_id, "output_index": i, "content_index": 0, "part": item["content"][0].clone()}),
            );
        } else {
            let args = item["arguments"].as_str().unwrap_or("").to_string();
            let mut open = item.clone();
            open["arguments"] = json!("");
            open["status"] = json!("in_progress");
            ev(
                "response.output_item.added",
                json!({"output_index": i, "item": open}),
            );
            let (a, b) = args.split_at(args.len() / 2);
            for part in [a, b] {
                ev(
                    "response.function_call_arguments.delta",
                    json!({"item_id": item_id, "output_index": i, "delta": part}),
                );
            }
            ev(
                "response.function_call_arguments.done",
                json!({"item_id": item_id, "output_index": i, "arguments": args}),
            );
        }
        ev(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
        );
    }
    if step.cut_after.is_none() {
        ev("response.completed", json!({"response": done}));
    }
    let (tx, rx) = mpsc::channel(8);
    tokio::spawn(async move {
        for e in events {
            if tx.send(Ok(e)).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream; charset=utf-8")
        .body(ChanBody(rx).boxed())
        .unwrap_or_else(|_| json_response(500, &Value::Null))
}

/// `GET .../responses/{id}`, `DELETE .../responses/{id}`, `GET
/// .../responses/{id}/input_items`.
pub async fn by_id(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let (path, headers) = super::request_facts(&req);
    let auth = super::openai_auth(&req, &path);
    let method = req.method().clone();
    let _ = super::receive_quiet(&state, &path, headers, req.into_body()).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    let rest = path
        .split("/responses/")
        .nth(1)
        .unwrap_or("")
        .split('?')
        .next()
        .unwrap_or("");
    let (id, items) = match rest.strip_suffix("/input_items") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    let Ok(mut store) = state.responses.lock() else {
        return Ok(json_response(500, &Value::Null));
    };
    let Some((resp, input)) = store.get(id).cloned() else {
        return Ok(json_response(
            404,
            &json!({"error": {"message": format!("Response with id '{id}' not found."), "type": "invalid_request_error", "param": null, "code": null}}),
        ));
    };
    Ok(match (method.as_str(), items) {
        ("GET", false) => json_response(200, &resp),
        ("GET", true) => {
            let data = match input {
                Value::String(s) => vec![
                    json!({"type": "message", "id": "msg_in_0", "role": "user", "content": [{"type": "input_text", "text": s}]}),
                ],
                Value::Array(a) => a,
                _ => Vec::new(),
            };
            json_response(
                200,
                &json!({"object": "list", "data": data, "has_more": false, "first_id": null, "last_id": null}),
            )
        }
        ("DELETE", false) => {
            store.remove(id);
            json_response(
                200,
                &json!({"id": id, "object": "response.deleted", "deleted": true}),
            )
        }
        _ => json_response(
            405,
            &json!({"error": {"message": "mock: method not allowed", "type": "invalid_request_error"}}),
        ),
    })
}
