//! Golden translations: one file per (inbound API, provider format) pair
//! and case in `tests/golden/`, each holding the client's request, what
//! the provider is sent, the provider's answer (whole and streamed) and
//! what the client gets back. A reviewer reads inputs and outputs, not
//! code. `PORTCULLIS_BLESS=1 cargo test --test golden` rewrites the
//! expected halves from the current translation (then read the diff).

use portcullis_core::api::Api;
use portcullis_core::request::ChatRequest;
use portcullis_core::translate;
use portcullis_core::{compile::compile, config::Gateway};
use portcullis_tests::repo_root;
use serde_json::{json, Value};

/// One provider of each format, serving model `m` as `provider-m`.
fn gateway() -> Gateway {
    let yaml = r#"
providers:
  - {name: openai, cluster: c1, host: h1, base_path: /v1, models: [{name: m, id: provider-m}]}
  - {name: azure, cluster: c2, host: h2, base_path: "", schema: azure_openai, api_version: 2024-10-21, models: [{name: m, id: provider-m}]}
  - {name: anthropic, cluster: c3, host: h3, base_path: /v1, schema: anthropic, default_max_tokens: 1000, models: [{name: m, id: provider-m}]}
  - {name: gemini, cluster: c4, host: h4, base_path: /v1beta, schema: gemini, models: [{name: m, id: provider-m}]}
  - {name: bedrock, cluster: c5, schema: bedrock, region: us-east-1, models: [{name: m, id: "provider.m:0"}]}
  - {name: vertex_anthropic, cluster: c6, schema: vertex, publisher: anthropic, project: p1, region: us-east5, models: [{name: m, id: provider-m}]}
  - {name: vertex_gemini, cluster: c7, schema: vertex, publisher: google, project: p1, region: us-central1, models: [{name: m, id: provider-m}]}
clients: [{name: c, key_sha256: "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3"}]
"#;
    compile(yaml.as_bytes()).expect("the golden gateway compiles")
}

fn api_of(name: &str) -> Api {
    *portcullis_core::api::ALL
        .iter()
        .find(|a| a.name() == name)
        .unwrap_or_else(|| panic!("no API named {name}"))
}

fn json_or_text(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

/// A multipart API's request, written in its case as an object: each
/// member a text field, `file`, `image` and `mask` file parts; the body
/// and its content type.
fn form_body(request: &Value) -> (Vec<u8>, String) {
    const B: &str = "goldenboundary";
    let mut out = String::new();
    for (k, v) in request
        .as_object()
        .expect("a multipart case's request is an object")
    {
        let text = v.as_str().map_or_else(|| v.to_string(), str::to_string);
        if ["file", "image", "mask"].contains(&k.as_str()) {
            out.push_str(&format!("--{B}\r\nContent-Disposition: form-data; name=\"{k}\"; filename=\"{k}.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n{text}\r\n"));
        } else {
            out.push_str(&format!(
                "--{B}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{text}\r\n"
            ));
        }
    }
    out.push_str(&format!("--{B}--\r\n"));
    (
        out.into_bytes(),
        format!("multipart/form-data; boundary={B}"),
    )
}

/// What the gateway makes of one case: the provider's path and body, and
/// the client's answer and stream.
fn translate(gw: &Gateway, case: &Value) -> Value {
    let api = api_of(case["api"].as_str().unwrap());
    let p = gw
        .providers
        .iter()
        .find(|p| p.name == case["provider"].as_str().unwrap())
        .unwrap();
    // The provider's model id: `provider-m` unless the case names another
    // (a format that tells model families apart by their ids).
    let model_id = case
        .get("model_id")
        .and_then(Value::as_str)
        .unwrap_or("provider-m");
    if api == Api::Realtime {
        return realtime_cell(p, case, model_id);
    }
    let (body, req) = if api.multipart() {
        let (body, content_type) = form_body(&case["request"]);
        let req = ChatRequest::parse_form(api, body.clone(), &content_type).unwrap();
        (body, req)
    } else {
        let body = serde_json::to_vec(&case["request"]).unwrap();
        let req = ChatRequest::parse_for(api, &body).unwrap();
        (body, req)
    };
    let mut out = serde_json::Map::new();
    match translate::reach(&p.schema, api) {
        translate::Reach::No => {
            // Routing never picks such a provider for the API.
            out.insert("served".into(), json!(false));
            return Value::Object(out);
        }
        translate::Reach::Local => {
            let doc = req.document().expect("the request reads");
            let (answer, (name, value)) =
                translate::pivot::local_answer(api, doc).expect("a local answer");
            out.insert(
                "answered_locally".into(),
                json!({"header": [name, value], "answer": json_or_text(&answer)}),
            );
            return Value::Object(out);
        }
        _ => {}
    }
    out.insert(
        "path".into(),
        json!(translate::path(p, api, model_id, req.stream)),
    );
    match translate::request_body(p, api, &req, model_id, false) {
        Ok(prepared) => {
            let sent = prepared.body.unwrap_or(body);
            out.insert("provider_request".into(), json_or_text(&sent));
            out.insert("dropped".into(), json!(prepared.dropped));
        }
        Err(e) => {
            out.insert(
                "refused".into(),
                json!({"status": e.status, "message": e.message}),
            );
            return Value::Object(out);
        }
    }
    // Answers depend on what the request asked (embeddings' encoding and
    // dimensions, the settings a response object echoes): the way back is
    // the request's, as the gateway's.
    let back = translate::back_for(p, &req);
    if let Some(answer) = case.get("provider_answer") {
        let bytes = serde_json::to_vec(answer).unwrap();
        let client = match &back {
            Some(b) => b
                .answer(&bytes, 1_700_000_000)
                .map_or(Value::Null, |a| json_or_text(&a)),
            None => answer.clone(),
        };
        out.insert("answer".into(), client);
    }
    if let Some(stream) = provider_stream(case) {
        let client = match back.and_then(|b| b.stream(1_700_000_000, false)) {
            Some(mut s) => {
                let mut o = s.push(&stream);
                o.extend(s.finish());
                String::from_utf8(o).unwrap()
            }
            None => String::from_utf8(stream).unwrap(),
        };
        let events: Vec<Value> = client
            .split("\n\n")
            .filter(|e| !e.trim().is_empty())
            .map(|e| json_or_text(e.rsplit("data: ").next().unwrap_or(e).as_bytes()))
            .collect();
        out.insert("stream".into(), Value::Array(events));
    }
    Value::Object(out)
}

/// A Realtime cell: where the upgrade goes, and what the gateway reads of
/// the provider's events as they pass (`provider_events`): each
/// `response.done`'s usage.
fn realtime_cell(p: &portcullis_core::config::Provider, case: &Value, model_id: &str) -> Value {
    use portcullis_core::api::realtime::{server_event, ServerEvent};
    let mut out = serde_json::Map::new();
    if translate::reach(&p.schema, Api::Realtime) == translate::Reach::No {
        out.insert("served".into(), json!(false));
        return Value::Object(out);
    }
    out.insert(
        "path".into(),
        json!(translate::path(p, Api::Realtime, model_id, true)),
    );
    let usage: Vec<Value> = case
        .get("provider_events")
        .and_then(Value::as_array)
        .map(|events| {
            events
                .iter()
                .filter_map(|e| match server_event(e.to_string().as_bytes()) {
                    ServerEvent::Done { usage: Some(u), .. } => Some(json!({
                        "prompt": u.prompt, "completion": u.completion, "cached": u.cached,
                        "audio_prompt": u.audio_prompt, "audio_completion": u.audio_completion,
                    })),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    out.insert("usage".into(), Value::Array(usage));
    Value::Object(out)
}

#[test]
fn every_golden_translation_reads_as_written() {
    let gw = gateway();
    let dir = repo_root().join("tests/golden");
    let bless = std::env::var_os("PORTCULLIS_BLESS").is_some();
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    assert!(
        files.len() >= 6,
        "golden cases in {}: {}",
        dir.display(),
        files.len()
    );
    let mut wrong = Vec::new();
    for f in &files {
        let mut case: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        let got = translate(&gw, &case);
        if bless {
            case["expected"] = got;
            std::fs::write(f, serde_json::to_string_pretty(&case).unwrap() + "\n").unwrap();
        } else if case["expected"] != got {
            wrong.push(format!(
                "{}:\n  expected {}\n  got      {}",
                f.display(),
                case["expected"],
                got
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "translations differ from their golden files:\n{}",
        wrong.join("\n")
    );
}

/// Every cell of the matrix (each inbound API against each provider kind
/// of the golden gateway) has at least one golden file, so a reviewer
/// reads every translation, every local answer and every refusal.
#[test]
fn every_cell_of_the_matrix_has_a_golden_file() {
    let gw = gateway();
    let dir = repo_root().join("tests/golden");
    let cells: std::collections::BTreeSet<(String, String)> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            let case: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
            (
                case["api"].as_str().unwrap_or_default().to_string(),
                case["provider"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    let mut missing = Vec::new();
    for api in portcullis_core::api::ALL {
        for p in &gw.providers {
            if !cells.contains(&(api.name().to_string(), p.name.clone())) {
                missing.push(format!("{} x {}", api.name(), p.name));
            }
        }
    }
    assert_eq!(gw.providers.len(), 7, "one provider of each kind");
    assert!(
        missing.is_empty(),
        "cells without a golden file: {missing:?}"
    );
}

/// The provider's stream of a case, as bytes (AWS's binary event stream is
/// written in the case as its frames' types and payloads).
fn provider_stream(case: &Value) -> Option<Vec<u8>> {
    let frames = case
        .get("provider_eventstream")
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .flat_map(|e| {
                    portcullis_core::wire::eventstream::encode(
                        &[
                            (":event-type", e["type"].as_str().unwrap_or("")),
                            (":content-type", "application/json"),
                            (":message-type", "event"),
                        ],
                        e["payload"].to_string().as_bytes(),
                    )
                })
                .collect::<Vec<u8>>()
        });
    case.get("provider_stream")
        .and_then(Value::as_str)
        .map(|s| s.as_bytes().to_vec())
        .or(frames)
}

/// A translated stream's events (`data:` JSON).
fn events_of(bytes: &[u8]) -> Vec<Value> {
    String::from_utf8(bytes.to_vec())
        .unwrap()
        .split("\n\n")
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap_or_else(|e| panic!("{d}: {e}")))
        .collect()
}

/// Every Responses object and streaming event the gateway writes for a
/// translated provider (each format: Anthropic, Gemini, Bedrock and both
/// Vertex publishers), whole and streamed, streams pushed whole and split
/// at every byte, cut short (`response.failed`), validated against the
/// Open Responses schema (`tests/sdk/open_responses.py`, the `jsonschema`
/// package) (#46 item 1).
#[test]
fn every_translated_responses_object_and_event_is_valid_open_responses() {
    let gw = gateway();
    let tools = json!([{"type": "function", "name": "get_weather", "description": "Weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}},
        {"type": "function", "name": "get_time", "strict": true}]);
    let requests = [
        json!({"model": "m", "input": "Say hi."}),
        json!({"model": "m", "instructions": "Be brief.", "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]}],
            "tools": tools, "tool_choice": "required", "temperature": 0.5, "top_p": 0.9,
            "max_output_tokens": 200, "metadata": {"team": "web"}, "store": true,
            "parallel_tool_calls": false, "truncation": "auto", "user": "u-1",
            "reasoning": {"effort": "low", "summary": "auto"}, "safety_identifier": "s-1",
            "prompt_cache_key": "k-1"}),
        json!({"model": "m", "input": "A JSON object please", "tool_choice": {"type": "function", "name": "get_weather"},
            "tools": tools, "stream": true, "text": {"format": {"type": "json_schema", "name": "answer",
            "schema": {"type": "object", "properties": {"a": {"type": "integer"}}}, "strict": true}}}),
    ];
    // The provider answers of each translated format's golden chat case.
    let cases = [
        "chat_completions-anthropic-tools",
        "chat_completions-gemini-tools",
        "chat_completions-bedrock-tools",
        "chat_completions-vertex_anthropic-translated",
        "chat_completions-vertex_gemini-translated",
    ];
    let mut values: Vec<Value> = Vec::new();
    let mut formats = std::collections::BTreeSet::new();
    for name in cases {
        let path = repo_root().join(format!("tests/golden/{name}.json"));
        let case: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        let p = gw
            .providers
            .iter()
            .find(|p| p.name == case["provider"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            translate::reach(&p.schema, Api::Responses),
            translate::Reach::ViaPivot,
            "{name}"
        );
        formats.insert(p.name.clone());
        for (r, request) in requests.iter().enumerate() {
            let body = serde_json::to_vec(request).unwrap();
            let req = ChatRequest::parse_for(Api::Responses, &body).unwrap();
            let back = translate::back_for(p, &req).expect("a way back");
            let mut add = |where_: String, kind: &str, value: Value| {
                values.push(json!({"where": where_, "kind": kind, "value": value}));
            };
            if let Some(answer) = case.get("provider_answer") {
                let bytes = serde_json::to_vec(answer).unwrap();
                let out = back
                    .answer(&bytes, 1_700_000_000)
                    .expect("the answer reads");
                let answer: Value = serde_json::from_slice(&out).unwrap();
                // The request's own settings, echoed.
                for key in [
                    "instructions",
                    "tool_choice",
                    "temperature",
                    "top_p",
                    "max_output_tokens",
                    "metadata",
                    "parallel_tool_calls",
                    "truncation",
                ] {
                    if let Some(sent) = request.get(key) {
                        assert_eq!(&answer[key], sent, "{name} request {r}: {key}");
                    }
                }
                let names: Vec<&Value> = answer["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| &t["name"])
                    .collect();
                let sent: Vec<&Value> = request
                    .get("tools")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|t| &t["name"])
                    .collect();
                assert_eq!(names, sent, "{name} request {r}: tools");
                add(format!("{name} request {r} answer"), "response", answer);
            }
            let Some(stream) = provider_stream(&case) else {
                continue;
            };
            let whole = {
                let mut s = back.stream(1_700_000_000, false).expect("a stream");
                let mut o = s.push(&stream);
                o.extend(s.finish());
                o
            };
            let split = {
                let mut s = back.stream(1_700_000_000, false).expect("a stream");
                let mut o = Vec::new();
                for b in &stream {
                    o.extend(s.push(std::slice::from_ref(b)));
                }
                o.extend(s.finish());
                o
            };
            let (whole, split) = (events_of(&whole), events_of(&split));
            assert_eq!(whole, split, "{name}: split at every byte, the same events");
            assert_eq!(
                whole.last().unwrap()["type"],
                "response.completed",
                "{name}"
            );
            for (i, e) in whole.into_iter().enumerate() {
                add(format!("{name} request {r} event {i}"), "event", e);
            }
            // Cut short: the stream fails in the schema's shape.
            let mut s = back.stream(1_700_000_000, false).expect("a stream");
            let mut o = s.push(stream.get(..stream.len() / 2).unwrap());
            o.extend(s.finish());
            let cut = events_of(&o);
            assert_eq!(cut.last().unwrap()["type"], "response.failed", "{name}");
            for (i, e) in cut.into_iter().enumerate() {
                add(format!("{name} request {r} cut event {i}"), "event", e);
            }
        }
    }
    assert_eq!(formats.len(), 5);
    // And the golden Responses cases as written.
    for f in std::fs::read_dir(repo_root().join("tests/golden"))
        .unwrap()
        .flatten()
    {
        let name = f.file_name().to_string_lossy().into_owned();
        if !name.starts_with("responses-") {
            continue;
        }
        let case: Value =
            serde_json::from_str(&std::fs::read_to_string(f.path()).unwrap()).unwrap();
        let expected = &case["expected"];
        if expected["provider_request"].get("messages").is_none()
            && expected["provider_request"].get("contents").is_none()
        {
            continue; // passed through or refused: not the gateway's object
        }
        if let Some(a) = expected.get("answer") {
            values.push(json!({"where": format!("{name} answer"), "kind": "response", "value": a}));
        }
        for (i, e) in expected["stream"]
            .as_array()
            .into_iter()
            .flatten()
            .enumerate()
        {
            values.push(json!({"where": format!("{name} event {i}"), "kind": "event", "value": e}));
        }
    }
    let report = open_responses_check(&values);
    assert_eq!(report["checked"], values.len(), "{report}");
    assert!(
        report["failures"].as_array().unwrap().is_empty(),
        "not valid Open Responses:\n{}",
        report["failures"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f.as_str().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(values.len() > 200, "{} values checked", values.len());
}

/// `tests/sdk/open_responses.py` over these values.
fn open_responses_check(values: &[Value]) -> Value {
    use std::io::Write;
    let python = std::env::var("PORTCULLIS_PYTHON")
        .unwrap_or_else(|_| repo_root().join(".venv/bin/python").display().to_string());
    let mut child = std::process::Command::new(&python)
        .arg(repo_root().join("tests/sdk/open_responses.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {python} (`make sdk` installs jsonschema): {e}"));
    {
        let mut stdin = child.stdin.take().unwrap();
        for v in values {
            writeln!(stdin, "{v}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "open_responses.py failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}
