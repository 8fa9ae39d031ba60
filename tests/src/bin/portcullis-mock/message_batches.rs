//! The mock's Anthropic Message Batches: `POST <prefix>/messages/batches`
//! (`{"requests": [{"custom_id", "params"}]}`, each `params` checked as a
//! Message is), `GET .../{id}` (a batch ends the first time it is read
//! after its creation: each request answered as a Message with usage, its
//! `results_url` set), `GET .../{id}/results` (JSONL), `POST .../{id}/cancel`,
//! `DELETE .../{id}` (an ended batch only), `GET <prefix>/messages/batches`.
//! `x-api-key` and `anthropic-version` as the Messages API; errors in
//! Anthropic's shape (`tests/MOCK.md`).

use super::{body_bytes, json_response, Body, State};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;

/// The batches the mock keeps: id -> (object, results).
#[derive(Default)]
pub struct Kept {
    next: u64,
    batches: std::collections::BTreeMap<String, (Value, String)>,
}

fn error(status: u16, kind: &str, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"type": "error", "error": {"type": kind, "message": message}}),
    )
}

fn now() -> String {
    let s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // RFC 3339 from Unix seconds (UTC), without a date crate.
    let days = s / 86_400;
    let (h, m, sec) = ((s % 86_400) / 3600, (s % 3600) / 60, s % 60);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!("{y:04}-{mo:02}-{d:02}T{h:02}:{m:02}:{sec:02}Z")
}

pub async fn serve(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let (logged_path, headers) = super::request_facts(&req);
    let key = req
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let version = req.headers().get("anthropic-version").is_some();
    let host = req
        .headers()
        .get("host")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("api.anthropic.com")
        .to_string();
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let body = body_bytes(req).await?;
    state
        .hits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    super::log_request(&state, &logged_path, headers, &parsed);
    if let Some(refusal) = super::anthropic::refused(&state, key.as_deref(), version) {
        return Ok(refusal);
    }
    let rest = path
        .find("/messages/batches")
        .and_then(|i| path.get(i + "/messages/batches".len()..))
        .unwrap_or("");
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let Ok(mut kept) = state.msg_batches.lock() else {
        return Ok(error(500, "api_error", "mock: lock"));
    };
    let missing = |id: &str| {
        error(
            404,
            "not_found_error",
            &format!("Message batch {id} not found"),
        )
    };
    Ok(match (method.as_str(), parts.as_slice()) {
        ("POST", []) => create(&mut kept, &parsed),
        ("GET", []) => {
            let data: Vec<Value> = kept
                .batches
                .values()
                .rev()
                .map(|(b, _)| b.clone())
                .collect();
            let first = data.first().map(|b| b["id"].clone()).unwrap_or(Value::Null);
            let last = data.last().map(|b| b["id"].clone()).unwrap_or(Value::Null);
            json_response(
                200,
                &json!({"data": data, "has_more": false, "first_id": first, "last_id": last}),
            )
        }
        ("GET", [id]) => match end(&mut kept, id, &host) {
            Some(b) => json_response(200, &b),
            None => missing(id),
        },
        ("GET", [id, "results"]) => match kept.batches.get(*id) {
            Some((b, results)) if b["processing_status"] == "ended" => {
                let mut r = json_response(200, &Value::Null);
                *r.body_mut() = http_body_util::Full::new(Bytes::from(results.clone()))
                    .map_err(|never| match never {})
                    .boxed();
                r.headers_mut().insert(
                    "content-type",
                    hyper::header::HeaderValue::from_static("application/binary"),
                );
                r
            }
            Some(_) => error(
                400,
                "invalid_request_error",
                "Message batch results are not available until processing ends.",
            ),
            None => missing(id),
        },
        ("POST", [id, "cancel"]) => match kept.batches.get_mut(*id) {
            Some((b, _)) if b["processing_status"] == "in_progress" => {
                b["processing_status"] = json!("canceling");
                b["cancel_initiated_at"] = json!(now());
                json_response(200, b)
            }
            Some(_) => error(
                400,
                "invalid_request_error",
                "Only in-progress batches can be canceled.",
            ),
            None => missing(id),
        },
        ("DELETE", [id]) => match kept.batches.get(*id) {
            Some((b, _)) if b["processing_status"] == "ended" => {
                kept.batches.remove(*id);
                json_response(200, &json!({"id": id, "type": "message_batch_deleted"}))
            }
            Some(_) => error(
                400,
                "invalid_request_error",
                "Batches must finish processing before they can be deleted.",
            ),
            None => missing(id),
        },
        _ => error(
            404,
            "not_found_error",
            &format!("mock: no route {method} {path}"),
        ),
    })
}

fn create(kept: &mut Kept, v: &Value) -> Response<Body> {
    let Some(requests) = v.get("requests").and_then(Value::as_array) else {
        return error(400, "invalid_request_error", "requests: Field required");
    };
    if requests.is_empty() {
        return error(
            400,
            "invalid_request_error",
            "requests: List should have at least 1 item after validation, not 0",
        );
    }
    let mut seen = std::collections::HashSet::new();
    for (i, r) in requests.iter().enumerate() {
        let Some(id) = r.get("custom_id").and_then(Value::as_str) else {
            return error(
                400,
                "invalid_request_error",
                &format!("requests.{i}.custom_id: Field required"),
            );
        };
        if !seen.insert(id.to_string()) {
            return error(
                400,
                "invalid_request_error",
                &format!("Duplicate custom_id: {id}"),
            );
        }
        let Some(params) = r.get("params") else {
            return error(
                400,
                "invalid_request_error",
                &format!("requests.{i}.params: Field required"),
            );
        };
        if let Err(why) = super::anthropic::check_as(params, true) {
            return error(
                400,
                "invalid_request_error",
                &format!("requests.{i}.params.{why}"),
            );
        }
    }
    kept.next += 1;
    let id = format!("msgbatch_mock{:06}", kept.next);
    let n = requests.len();
    let mut results = String::new();
    for r in requests {
        let words: usize = r["params"]["messages"].as_array().map_or(1, |m| {
            m.iter()
                .map(|x| {
                    x["content"]
                        .as_str()
                        .unwrap_or("")
                        .split_whitespace()
                        .count()
                })
                .sum::<usize>()
                .max(1)
        });
        let message = json!({"id": format!("msg_{}", r["custom_id"].as_str().unwrap_or("")), "type": "message", "role": "assistant",
            "model": r["params"]["model"], "content": [{"type": "text", "text": "batch answer"}], "stop_reason": "end_turn",
            "stop_sequence": null, "usage": {"input_tokens": words, "output_tokens": 2}});
        results.push_str(&json!({"custom_id": r["custom_id"], "result": {"type": "succeeded", "message": message}}).to_string());
        results.push('\n');
    }
    let b = json!({"id": id, "type": "message_batch", "processing_status": "in_progress",
        "request_counts": {"processing": n, "succeeded": 0, "errored": 0, "canceled": 0, "expired": 0},
        "ended_at": null, "created_at": now(), "expires_at": now(), "archived_at": null,
        "cancel_initiated_at": null, "results_url": null});
    kept.batches.insert(id, (b.clone(), results));
    json_response(200, &b)
}

/// A batch read: one in progress ends now, its `results_url` at this host.
fn end(kept: &mut Kept, id: &str, host: &str) -> Option<Value> {
    let (b, _) = kept.batches.get_mut(id)?;
    if b["processing_status"] == "in_progress" {
        let n = b["request_counts"]["processing"].clone();
        b["processing_status"] = json!("ended");
        b["ended_at"] = json!(now());
        b["request_counts"] =
            json!({"processing": 0, "succeeded": n, "errored": 0, "canceled": 0, "expired": 0});
        b["results_url"] = json!(format!("https://{host}/v1/messages/batches/{id}/results"));
    }
    Some(b.clone())
}
