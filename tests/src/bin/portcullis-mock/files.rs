//! The mock's files and batches (OpenAI's): `POST <prefix>/files`
//! (multipart: `file`, `purpose`), `GET`/`DELETE <prefix>/files/{id}`,
//! `GET .../content`; `POST <prefix>/batches`, `GET <prefix>/batches/{id}`
//! (a batch completes the first time it is read after its creation: each
//! line of its input answered as a chat completion with usage, into an
//! output file), `POST .../cancel`, `GET <prefix>/batches`. Objects are
//! whole, as OpenAI writes them; refusals as OpenAI's (`tests/MOCK.md`).

use super::{body_bytes, json_response, Body, State};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;

/// What the mock keeps.
#[derive(Default)]
pub struct Kept {
    next: u64,
    /// id -> (object, content)
    files: std::collections::BTreeMap<String, (Value, Bytes)>,
    batches: std::collections::BTreeMap<String, Value>,
}

const PURPOSES: &[&str] = &[
    "assistants",
    "batch",
    "fine-tune",
    "vision",
    "user_data",
    "evals",
];
const ENDPOINTS: &[&str] = &[
    "/v1/chat/completions",
    "/v1/embeddings",
    "/v1/responses",
    "/v1/completions",
    "/v1/moderations",
];

fn error(status: u16, message: String, param: Option<&str>, code: Option<&str>) -> Response<Body> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}),
    )
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn raw(status: u16, content_type: &'static str, body: Bytes) -> Response<Body> {
    let mut r = json_response(status, &Value::Null);
    *r.body_mut() = http_body_util::Full::new(body)
        .map_err(|never| match never {})
        .boxed();
    r.headers_mut().insert(
        "content-type",
        hyper::header::HeaderValue::from_static(content_type),
    );
    r
}

/// Every call on files and batches.
pub async fn serve(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let (logged_path, headers) = super::request_facts(&req);
    let auth = super::openai_auth(&req, &logged_path);
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let ctype = super::content_type(&req);
    let body = body_bytes(req).await?;
    state
        .hits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let logged = serde_json::from_slice::<Value>(&body)
        .unwrap_or_else(|_| json!({"bytes": body.len(), "content_type": ctype}));
    super::log_request(&state, &logged_path, headers, &logged);
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    // `<prefix>/files...` or `<prefix>/batches...` (Azure: `/openai/...`).
    let (kind, rest) = match (path.find("/files"), path.find("/batches")) {
        (Some(i), _) => ("files", path.get(i + "/files".len()..).unwrap_or("")),
        (_, Some(i)) => ("batches", path.get(i + "/batches".len()..).unwrap_or("")),
        _ => return Ok(error(404, format!("mock: unknown path {path}"), None, None)),
    };
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    if (kind, method.as_str(), parts.as_slice()) == ("files", "POST", &[][..]) {
        return Ok(upload(&state, &ctype, body).await);
    }
    let Ok(mut kept) = state.kept.lock() else {
        return Ok(error(500, "mock: lock".into(), None, None));
    };
    Ok(match (kind, method.as_str(), parts.as_slice()) {
        ("files", "GET", []) => {
            let data: Vec<Value> = kept.files.values().map(|(o, _)| o.clone()).collect();
            json_response(
                200,
                &json!({"object": "list", "data": data, "has_more": false}),
            )
        }
        ("files", "GET", [id]) => match kept.files.get(*id) {
            Some((o, _)) => json_response(200, o),
            None => error(404, format!("No such File object: {id}"), Some("id"), None),
        },
        ("files", "GET", [id, "content"]) => match kept.files.get(*id) {
            Some((_, content)) => raw(200, "application/octet-stream", content.clone()),
            None => error(404, format!("No such File object: {id}"), Some("id"), None),
        },
        ("files", "DELETE", [id]) => match kept.files.remove(*id) {
            Some(_) => json_response(200, &json!({"id": id, "object": "file", "deleted": true})),
            None => error(404, format!("No such File object: {id}"), Some("id"), None),
        },
        ("batches", "POST", []) => create_batch(&mut kept, &body),
        ("batches", "GET", []) => {
            let data: Vec<Value> = kept.batches.values().rev().cloned().collect();
            let first = data.first().map(|b| b["id"].clone()).unwrap_or(Value::Null);
            let last = data.last().map(|b| b["id"].clone()).unwrap_or(Value::Null);
            json_response(
                200,
                &json!({"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": false}),
            )
        }
        ("batches", "GET", [id]) => match run_batch(&mut kept, id) {
            Some(b) => json_response(200, &b),
            None => error(404, format!("No such Batch object: {id}"), Some("id"), None),
        },
        ("batches", "POST", [id, "cancel"]) => cancel(&mut kept, id),
        _ => error(
            404,
            format!("mock: unknown path {method} {path}"),
            None,
            None,
        ),
    })
}

async fn upload(state: &State, ctype: &str, body: Bytes) -> Response<Body> {
    let Ok(boundary) = multer::parse_boundary(ctype) else {
        return error(
            400,
            "Invalid Content-Type header, expected multipart/form-data.".into(),
            None,
            None,
        );
    };
    let mut m = multer::Multipart::with_reader(std::io::Cursor::new(body), boundary);
    let (mut purpose, mut file) = (None, None);
    loop {
        match m.next_field().await {
            Ok(Some(f)) => {
                let name = f.name().unwrap_or("").to_string();
                let filename = f.file_name().map(str::to_string);
                let Ok(data) = f.bytes().await else {
                    return error(400, "Could not parse multipart form.".into(), None, None);
                };
                match (name.as_str(), filename) {
                    ("purpose", None) => {
                        purpose = Some(String::from_utf8_lossy(&data).into_owned())
                    }
                    ("file", Some(fname)) => file = Some((fname, data)),
                    _ => {}
                }
            }
            Ok(None) => break,
            Err(e) => {
                return error(
                    400,
                    format!("Could not parse multipart form: {e}"),
                    None,
                    None,
                )
            }
        }
    }
    let Some(purpose) = purpose else {
        return error(
            400,
            "Missing required parameter: 'purpose'.".into(),
            Some("purpose"),
            Some("missing_required_parameter"),
        );
    };
    if !PURPOSES.contains(&purpose.as_str()) {
        return error(
            400,
            format!("Invalid value for 'purpose': '{purpose}'."),
            Some("purpose"),
            Some("invalid_value"),
        );
    }
    let Some((filename, data)) = file else {
        return error(
            400,
            "Missing required parameter: 'file'.".into(),
            Some("file"),
            Some("missing_required_parameter"),
        );
    };
    if purpose == "batch" {
        if !filename.ends_with(".jsonl") {
            return error(
                400,
                "Invalid file format for Batch API. Must be .jsonl".into(),
                Some("file"),
                Some("invalid_file_format"),
            );
        }
        let bad = data
            .split(|b| *b == b'\n')
            .filter(|l| !l.iter().all(u8::is_ascii_whitespace))
            .any(|l| {
                serde_json::from_slice::<Value>(l).map_or(true, |v| {
                    !(v["custom_id"].is_string()
                        && v["method"] == "POST"
                        && v["url"].is_string()
                        && v["body"].is_object())
                })
            });
        if bad {
            return error(400, "Invalid file format for Batch API: each line must be a JSON object with custom_id, method, url and body.".into(), Some("file"), Some("invalid_file_format"));
        }
    }
    let Ok(mut kept) = state.kept.lock() else {
        return error(500, "mock: lock".into(), None, None);
    };
    kept.next += 1;
    let id = format!("file-mock{:06}", kept.next);
    let o = json!({"id": id, "object": "file", "bytes": data.len(), "created_at": now(), "filename": filename,
        "purpose": purpose, "status": "processed", "expires_at": null, "status_details": null});
    kept.files.insert(id, (o.clone(), data));
    json_response(200, &o)
}

fn create_batch(kept: &mut Kept, body: &[u8]) -> Response<Body> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return error(
            400,
            "We could not parse the JSON body of your request.".into(),
            None,
            None,
        );
    };
    for k in ["input_file_id", "endpoint", "completion_window"] {
        if v.get(k).is_none() {
            return error(
                400,
                format!("Missing required parameter: '{k}'."),
                Some(k),
                Some("missing_required_parameter"),
            );
        }
    }
    let file = v["input_file_id"].as_str().unwrap_or("");
    match kept.files.get(file) {
        Some((o, _)) if o["purpose"] == "batch" => {}
        Some(_) => {
            return error(
                400,
                format!("File {file} was not uploaded with purpose 'batch'."),
                Some("input_file_id"),
                Some("invalid_value"),
            )
        }
        None => {
            return error(
                404,
                format!("No such File object: {file}"),
                Some("input_file_id"),
                None,
            )
        }
    }
    let endpoint = v["endpoint"].as_str().unwrap_or("");
    if !ENDPOINTS.contains(&endpoint) {
        return error(
            400,
            format!("Invalid value for 'endpoint': '{endpoint}'."),
            Some("endpoint"),
            Some("invalid_value"),
        );
    }
    if v["completion_window"] != "24h" {
        return error(
            400,
            "Invalid value for 'completion_window': only '24h' is supported.".into(),
            Some("completion_window"),
            Some("invalid_value"),
        );
    }
    if let Some(m) = v.get("metadata").filter(|m| !m.is_null()) {
        let ok = m.as_object().is_some_and(|o| {
            o.len() <= 16
                && o.iter()
                    .all(|(k, v)| k.len() <= 64 && v.as_str().is_some_and(|s| s.len() <= 512))
        });
        if !ok {
            return error(
                400,
                "Invalid 'metadata': at most 16 keys of 64 characters, string values of 512."
                    .into(),
                Some("metadata"),
                Some("invalid_value"),
            );
        }
    }
    kept.next += 1;
    let id = format!("batch_mock{:06}", kept.next);
    let t = now();
    let b = json!({"id": id, "object": "batch", "endpoint": endpoint, "errors": null, "input_file_id": file,
        "completion_window": "24h", "status": "validating", "output_file_id": null, "error_file_id": null,
        "created_at": t, "in_progress_at": null, "expires_at": t + 86400, "finalizing_at": null,
        "completed_at": null, "failed_at": null, "expired_at": null, "cancelling_at": null, "cancelled_at": null,
        "request_counts": {"total": 0, "completed": 0, "failed": 0}, "metadata": v.get("metadata").cloned().unwrap_or(Value::Null)});
    kept.batches.insert(id, b.clone());
    json_response(200, &b)
}

/// A batch read: one still validating completes now, each input line
/// answered as a chat completion.
fn run_batch(kept: &mut Kept, id: &str) -> Option<Value> {
    let b = kept.batches.get(id)?.clone();
    if b["status"] != "validating" {
        return Some(b);
    }
    let input = b["input_file_id"].as_str().unwrap_or("");
    let lines: Vec<Value> = kept
        .files
        .get(input)
        .map(|(_, c)| {
            c.split(|x| *x == b'\n')
                .filter_map(|l| serde_json::from_slice::<Value>(l).ok())
                .collect()
        })
        .unwrap_or_default();
    let (mut out, mut tin, mut tout) = (String::new(), 0u64, 0u64);
    for (i, l) in lines.iter().enumerate() {
        let words = l["body"]["messages"].as_array().map_or(1, |m| {
            m.iter()
                .map(|x| {
                    x["content"]
                        .as_str()
                        .unwrap_or("")
                        .split_whitespace()
                        .count() as u64
                })
                .sum::<u64>()
                .max(1)
        });
        tin += words;
        tout += 2;
        let answer = json!({"id": format!("chatcmpl-b{i}"), "object": "chat.completion", "created": now(),
            "model": l["body"]["model"], "choices": [{"index": 0, "message": {"role": "assistant", "content": "batch answer"}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": words, "completion_tokens": 2, "total_tokens": words + 2}});
        out.push_str(&json!({"id": format!("batch_req_{i}"), "custom_id": l["custom_id"], "response": {"status_code": 200, "request_id": format!("req_{i}"), "body": answer}, "error": null}).to_string());
        out.push('\n');
    }
    kept.next += 1;
    let out_id = format!("file-mock{:06}", kept.next);
    let t = now();
    kept.files.insert(
        out_id.clone(),
        (
            json!({"id": out_id, "object": "file", "bytes": out.len(), "created_at": t, "filename": "batch_output.jsonl",
                "purpose": "batch_output", "status": "processed", "expires_at": null, "status_details": null}),
            Bytes::from(out),
        ),
    );
    let n = lines.len() as u64;
    let done = kept.batches.get_mut(id)?;
    done["status"] = json!("completed");
    // The model the batch ran on, as OpenAI names it (a dated snapshot).
    let model = lines
        .first()
        .and_then(|l| l["body"]["model"].as_str())
        .unwrap_or("");
    done["model"] = json!(format!("{model}-2024-07-18"));
    done["output_file_id"] = json!(out_id);
    done["in_progress_at"] = json!(t);
    done["finalizing_at"] = json!(t);
    done["completed_at"] = json!(t);
    done["request_counts"] = json!({"total": n, "completed": n, "failed": 0});
    done["usage"] = json!({"input_tokens": tin, "output_tokens": tout, "total_tokens": tin + tout,
        "input_tokens_details": {"cached_tokens": 0}, "output_tokens_details": {"reasoning_tokens": 0}});
    Some(done.clone())
}

fn cancel(kept: &mut Kept, id: &str) -> Response<Body> {
    let Some(b) = kept.batches.get_mut(id) else {
        return error(404, format!("No such Batch object: {id}"), Some("id"), None);
    };
    let status = b["status"].as_str().unwrap_or("").to_string();
    if !matches!(status.as_str(), "validating" | "in_progress") {
        return error(
            400,
            format!("Cannot cancel a batch with status '{status}'."),
            None,
            None,
        );
    }
    b["status"] = json!("cancelling");
    b["cancelling_at"] = json!(now());
    json_response(200, b)
}
