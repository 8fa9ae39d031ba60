//! The mock's images, audio, moderations and rerank (OpenAI's shapes, and
//! Cohere's v2 rerank): `POST <prefix>/images/generations` (JSON) and
//! `/images/edits` (multipart), `/audio/speech` (JSON in, audio bytes out,
//! sent in pieces), `/audio/transcriptions` and `/audio/translations`
//! (multipart with a WAV `file`: its seconds read from the WAV header),
//! `/moderations`, `/rerank` (Jina's and vLLM's shape, with `usage`) and
//! `/v2/rerank` (Cohere's, with `meta.billed_units`). Azure's deployment
//! paths too. Each refuses what OpenAI refuses (`tests/MOCK.md`); multipart
//! bodies are read by the `multer` crate, not by the gateway's reader.
//! Requests are logged with their fields; a multipart body's files as
//! `{"filename", "content_type", "bytes"}`.

use super::openai_checks::Refusal;
use super::{json_response, Body, State};
use bytes::Bytes;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Map, Value};
use std::io;
use std::sync::Arc;

/// A 1x1 PNG, base64 (what `b64_json` carries).
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==";

const SIZES: &[&str] = &[
    "256x256",
    "512x512",
    "1024x1024",
    "1792x1024",
    "1024x1792",
    "1536x1024",
    "1024x1536",
    "auto",
];

fn bad(message: impl Into<String>, param: Option<&str>, code: Option<&str>) -> Refusal {
    Refusal(
        400,
        json!({"error": {"message": message.into(), "type": "invalid_request_error", "param": param, "code": code}}),
    )
}

fn missing(param: &str) -> Refusal {
    bad(
        format!("Missing required parameter: '{param}'."),
        Some(param),
        Some("missing_required_parameter"),
    )
}

/// A multipart body's text fields and files.
struct Form {
    fields: Map<String, Value>,
    files: Vec<(String, Value, Bytes)>,
}

async fn read_form(content_type: &str, body: Bytes) -> Result<Form, Refusal> {
    let boundary = multer::parse_boundary(content_type).map_err(|_| {
        bad(
            "Invalid Content-Type header: expected multipart/form-data with a boundary.",
            None,
            None,
        )
    })?;
    let mut m = multer::Multipart::with_reader(std::io::Cursor::new(body), boundary);
    let mut form = Form {
        fields: Map::new(),
        files: Vec::new(),
    };
    loop {
        let field = match m.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => {
                return Err(bad(
                    format!("Could not parse multipart form: {e}"),
                    None,
                    None,
                ))
            }
        };
        let name = field.name().unwrap_or("").to_string();
        let filename = field.file_name().map(str::to_string);
        let ctype = field.content_type().map(|m| m.to_string());
        let data = field
            .bytes()
            .await
            .map_err(|e| bad(format!("Could not parse multipart form: {e}"), None, None))?;
        match filename {
            Some(f) => form.files.push((
                name,
                json!({"filename": f, "content_type": ctype, "bytes": data.len()}),
                data,
            )),
            None => {
                form.fields.insert(
                    name,
                    Value::String(String::from_utf8_lossy(&data).into_owned()),
                );
            }
        }
    }
    Ok(form)
}

/// What a request's body was: JSON, or a form.
enum Input {
    Json(Value),
    Form(Form),
}

/// Read, count and log a request; the scripted step.
async fn receive(
    state: &State,
    req: Request<Incoming>,
) -> Result<(String, Option<String>, Result<Input, Refusal>, super::Step), io::Error> {
    let (path, headers) = super::request_facts(&req);
    let auth = super::openai_auth(&req, &path);
    let ctype = super::content_type(&req);
    let body = super::body_bytes(req).await?;
    state
        .hits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let input = if ctype.starts_with("multipart/") {
        read_form(&ctype, body).await.map(Input::Form)
    } else {
        serde_json::from_slice::<Value>(&body)
            .map(Input::Json)
            .map_err(|_| {
                bad(
                    "We could not parse the JSON body of your request.",
                    None,
                    None,
                )
            })
    };
    let logged = match &input {
        Ok(Input::Json(v)) => v.clone(),
        Ok(Input::Form(f)) => {
            let mut o = f.fields.clone();
            for (name, file, _) in &f.files {
                o.insert(name.clone(), file.clone());
            }
            Value::Object(o)
        }
        Err(_) => Value::Null,
    };
    super::log_request(state, &path, headers, &logged);
    let step = super::next_step(state);
    if let Some(ms) = step.delay_ms {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    Ok((path, auth, input, step))
}

fn scripted(state: &State, step: &super::Step) -> Option<Response<Body>> {
    let status = step.status.unwrap_or(200);
    (status != 200).then(|| {
        let mut r = json_response(
            status,
            &json!({"error": {"message": format!("mock {}: scripted status {status}", state.name), "type": "server_error", "code": null}}),
        );
        if let Some(s) = step.retry_after {
            if let Ok(v) = hyper::header::HeaderValue::from_str(&s.to_string()) {
                r.headers_mut().insert("retry-after", v);
            }
        }
        r
    })
}

fn reply(r: Result<Value, Refusal>) -> Response<Body> {
    match r {
        Ok(v) => json_response(200, &v),
        Err(Refusal(status, body)) => json_response(status, &body),
    }
}

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A field as text (a form's) or as its JSON value.
fn field<'a>(o: &'a Map<String, Value>, k: &str) -> Option<&'a Value> {
    o.get(k)
}

fn images_answer(o: &Map<String, Value>) -> Result<Value, Refusal> {
    let model = field(o, "model")
        .and_then(Value::as_str)
        .unwrap_or("dall-e-2");
    match field(o, "prompt") {
        Some(Value::String(s)) if !s.is_empty() => {}
        _ => return Err(missing("prompt")),
    }
    let n = match field(o, "n") {
        None => 1,
        Some(Value::Number(n)) => n.as_u64().unwrap_or(0),
        Some(Value::String(s)) => s.parse().unwrap_or(0),
        Some(_) => 0,
    };
    if !(1..=10).contains(&n) {
        return Err(bad(
            format!("Invalid 'n': integer below minimum value. Expected a value >= 1 and <= 10, but got {n} instead."),
            Some("n"),
            Some("integer_below_min_value"),
        ));
    }
    if let Some(size) = field(o, "size").and_then(Value::as_str) {
        if !SIZES.contains(&size) {
            return Err(bad(
                format!(
                    "Invalid value: '{size}'. Supported values are: {}.",
                    SIZES.join(", ")
                ),
                Some("size"),
                Some("invalid_value"),
            ));
        }
    }
    let b64 = model.starts_with("gpt-image")
        || field(o, "response_format").and_then(Value::as_str) == Some("b64_json");
    let data: Vec<Value> = (0..n)
        .map(|i| {
            if b64 {
                json!({"b64_json": PNG_B64})
            } else {
                json!({"url": format!("https://images.mock/{i}.png"), "revised_prompt": field(o, "prompt")})
            }
        })
        .collect();
    let mut out = json!({"created": now(), "data": data});
    if model.starts_with("gpt-image") {
        let words = field(o, "prompt")
            .and_then(Value::as_str)
            .map_or(1, |p| p.split_whitespace().count() as u64);
        out["usage"] = json!({"input_tokens": words, "output_tokens": 272 * n, "total_tokens": words + 272 * n,
            "input_tokens_details": {"text_tokens": words, "image_tokens": 0}});
    }
    Ok(out)
}

pub async fn images(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let edits = req.uri().path().ends_with("/edits");
    let (_, auth, input, step) = receive(&state, req).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Some(r) = scripted(&state, &step) {
        return Ok(r);
    }
    Ok(reply(match input {
        Err(e) => Err(e),
        Ok(Input::Json(_)) if edits => Err(bad(
            "Invalid Content-Type header (application/json), expected multipart/form-data.",
            None,
            None,
        )),
        Ok(Input::Json(Value::Object(o))) => images_answer(&o),
        Ok(Input::Json(_)) => Err(bad(
            "We could not parse the JSON body of your request.",
            None,
            None,
        )),
        Ok(Input::Form(f)) if edits => {
            if !f
                .files
                .iter()
                .any(|(n, _, _)| n == "image" || n == "image[]")
            {
                Err(missing("image"))
            } else {
                images_answer(&f.fields)
            }
        }
        Ok(Input::Form(_)) => Err(bad(
            "Invalid Content-Type header (multipart/form-data), expected application/json.",
            None,
            None,
        )),
    }))
}

pub async fn speech(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (_, auth, input, step) = receive(&state, req).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Some(r) = scripted(&state, &step) {
        return Ok(r);
    }
    let o = match input {
        Ok(Input::Json(Value::Object(o))) => o,
        Ok(_) => {
            return Ok(reply(Err(bad(
                "We could not parse the JSON body of your request.",
                None,
                None,
            ))))
        }
        Err(e) => return Ok(reply(Err(e))),
    };
    for k in ["model", "input", "voice"] {
        if !o.contains_key(k) {
            return Ok(reply(Err(missing(k))));
        }
    }
    let text = o.get("input").and_then(Value::as_str).unwrap_or("");
    if text.chars().count() > 4096 {
        return Ok(reply(Err(bad(
            "[{'type': 'string_too_long', 'loc': ('body', 'input'), 'msg': 'String should have at most 4096 characters'}]",
            Some("input"),
            Some("string_too_long"),
        ))));
    }
    // "Audio": 64 bytes a character, an ID3-like head, sent in pieces.
    let total = text.chars().count().max(1) * 64;
    let mut audio = b"ID3\x04\x00\x00".to_vec();
    audio.extend((0..total).map(|i| (i % 251) as u8));
    let pieces: Vec<Bytes> = audio.chunks(4096).map(Bytes::copy_from_slice).collect();
    let format = o
        .get("response_format")
        .and_then(Value::as_str)
        .unwrap_or("mp3");
    let ctype = match format {
        "wav" => "audio/wav",
        "opus" => "audio/opus",
        "aac" => "audio/aac",
        "flac" => "audio/flac",
        "pcm" => "audio/pcm",
        _ => "audio/mpeg",
    };
    super::event_stream(pieces, &step, ctype)
}

/// A WAV's seconds, from its header (byte rate, data size).
fn wav_seconds(b: &[u8]) -> Option<f64> {
    if b.len() < 44 || &b[..4] != b"RIFF" || &b[8..12] != b"WAVE" {
        return None;
    }
    let byte_rate = u32::from_le_bytes(b[28..32].try_into().ok()?);
    let data = u32::from_le_bytes(b[40..44].try_into().ok()?);
    (byte_rate > 0).then(|| f64::from(data) / f64::from(byte_rate))
}

pub async fn transcribe(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let translation = req.uri().path().ends_with("/translations");
    let (_, auth, input, step) = receive(&state, req).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Some(r) = scripted(&state, &step) {
        return Ok(r);
    }
    let f = match input {
        Ok(Input::Form(f)) => f,
        Ok(Input::Json(_)) => {
            return Ok(reply(Err(bad(
                "Invalid Content-Type header (application/json), expected multipart/form-data.",
                None,
                None,
            ))))
        }
        Err(e) => return Ok(reply(Err(e))),
    };
    let Some(model) = f
        .fields
        .get("model")
        .and_then(Value::as_str)
        .map(str::to_string)
    else {
        return Ok(reply(Err(missing("model"))));
    };
    let Some((_, _, audio)) = f.files.iter().find(|(n, _, _)| n == "file") else {
        return Ok(reply(Err(missing("file"))));
    };
    let Some(seconds) = wav_seconds(audio) else {
        return Ok(reply(Err(bad(
            "Invalid file format. Supported formats: ['flac', 'm4a', 'mp3', 'mp4', 'mpeg', 'mpga', 'oga', 'ogg', 'wav', 'webm']",
            Some("file"),
            Some("invalid_value"),
        ))));
    };
    let text = format!("mock transcript of {seconds:.1} seconds");
    let format = f
        .fields
        .get("response_format")
        .and_then(Value::as_str)
        .unwrap_or("json");
    if format == "text" {
        let mut r = json_response(200, &Value::Null);
        *r.body_mut() = http_body_util::Full::new(Bytes::from(text))
            .map_err(|never| match never {})
            .boxed();
        r.headers_mut().insert(
            "content-type",
            hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        return Ok(r);
    }
    let usage = if model.starts_with("whisper") {
        json!({"type": "duration", "seconds": seconds.ceil() as u64})
    } else {
        json!({"type": "tokens", "input_tokens": (seconds * 10.0).ceil() as u64, "output_tokens": 6,
            "total_tokens": (seconds * 10.0).ceil() as u64 + 6, "input_token_details": {"text_tokens": 0, "audio_tokens": (seconds * 10.0).ceil() as u64}})
    };
    let mut out = if translation {
        json!({"text": text})
    } else {
        json!({"text": text, "usage": usage})
    };
    if format == "verbose_json" {
        out["task"] = json!(if translation {
            "translate"
        } else {
            "transcribe"
        });
        out["language"] = json!("english");
        out["duration"] = json!(seconds);
        out["segments"] = json!([]);
    }
    Ok(json_response(200, &out))
}

pub async fn moderations(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (_, auth, input, step) = receive(&state, req).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Some(r) = scripted(&state, &step) {
        return Ok(r);
    }
    let o = match input {
        Ok(Input::Json(Value::Object(o))) => o,
        Ok(_) => {
            return Ok(reply(Err(bad(
                "We could not parse the JSON body of your request.",
                None,
                None,
            ))))
        }
        Err(e) => return Ok(reply(Err(e))),
    };
    let texts: Vec<String> = match o.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) if !a.is_empty() => a
            .iter()
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other
                    .get("text")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string(),
            })
            .collect(),
        _ => return Ok(reply(Err(missing("input")))),
    };
    let results: Vec<Value> = texts
        .iter()
        .map(|t| {
            let violent = t.contains("kill");
            json!({"flagged": violent,
                "categories": {"violence": violent, "harassment": false, "hate": false, "self-harm": false, "sexual": false},
                "category_scores": {"violence": if violent { 0.91 } else { 0.01 }, "harassment": 0.0, "hate": 0.0, "self-harm": 0.0, "sexual": 0.0},
                "category_applied_input_types": {"violence": ["text"]}})
        })
        .collect();
    Ok(json_response(
        200,
        &json!({"id": format!("modr-{}", now()), "model": o.get("model").cloned().unwrap_or(json!("omni-moderation-latest")), "results": results}),
    ))
}

pub async fn rerank(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let cohere = req.uri().path().ends_with("/v2/rerank");
    let (_, auth, input, step) = receive(&state, req).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Some(r) = scripted(&state, &step) {
        return Ok(r);
    }
    let o = match input {
        Ok(Input::Json(Value::Object(o))) => o,
        Ok(_) => {
            return Ok(reply(Err(bad(
                "We could not parse the JSON body of your request.",
                None,
                None,
            ))))
        }
        Err(e) => return Ok(reply(Err(e))),
    };
    for k in ["model", "query", "documents"] {
        if !o.contains_key(k) {
            return Ok(reply(Err(missing(k))));
        }
    }
    let query = o
        .get("query")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_lowercase();
    let docs: Vec<String> = o
        .get("documents")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .map(|d| {
                    d.as_str()
                        .or_else(|| d.get("text").and_then(Value::as_str))
                        .unwrap_or("")
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default();
    // Score: the share of the query's words a document holds.
    let words: Vec<&str> = query.split_whitespace().collect();
    let mut scored: Vec<(usize, f64)> = docs
        .iter()
        .enumerate()
        .map(|(i, d)| {
            let d = d.to_lowercase();
            let hits = words.iter().filter(|w| d.contains(*w)).count();
            (i, hits as f64 / words.len().max(1) as f64)
        })
        .collect();
    scored.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if let Some(n) = o.get("top_n").and_then(Value::as_u64) {
        scored.truncate(n as usize);
    }
    let results: Vec<Value> = scored
        .iter()
        .map(|(i, s)| json!({"index": i, "relevance_score": s}))
        .collect();
    let tokens: u64 = docs
        .iter()
        .chain(std::iter::once(&query))
        .map(|d| d.split_whitespace().count() as u64)
        .sum();
    Ok(json_response(
        200,
        &if cohere {
            json!({"id": format!("rr-{}", now()), "results": results,
                "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": (docs.len() as u64).div_ceil(100)}}})
        } else {
            json!({"id": format!("rr-{}", now()), "model": o.get("model"), "results": results,
                "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})
        },
    ))
}
