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
    let body = serde_json::to_vec(&case["request"]).unwrap();
    let req = ChatRequest::parse_for(api, &body).unwrap();
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
    // Embeddings answers depend on what the request asked (the encoding,
    // the dimensions): their way back is the request's, as the gateway's.
    let back = if api == Api::Embeddings {
        translate::back_for(p, &req)
    } else {
        translate::back(p, api)
    };
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
    // AWS's binary event stream, written as its frames' types and payloads.
    let frames = case
        .get("provider_eventstream")
        .and_then(Value::as_array)
        .map(|f| {
            f.iter()
                .flat_map(|e| {
                    let kind = e["type"].as_str().unwrap_or("");
                    portcullis_core::eventstream::encode(
                        &[
                            (":event-type", kind),
                            (":content-type", "application/json"),
                            (":message-type", "event"),
                        ],
                        e["payload"].to_string().as_bytes(),
                    )
                })
                .collect::<Vec<u8>>()
        });
    let stream = case
        .get("provider_stream")
        .and_then(Value::as_str)
        .map(|s| s.as_bytes().to_vec())
        .or(frames);
    if let Some(stream) = stream {
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
