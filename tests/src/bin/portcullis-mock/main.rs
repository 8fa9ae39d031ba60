//! portcullis-mock: a fake OpenAI-compatible provider for demos, tests and
//! benchmarks.
//!
//! `POST <any prefix>/chat/completions` answers like OpenAI (with `usage`), or
//! as an SSE stream when `stream: true` (with the usage chunk when
//! `stream_options.include_usage` is set). Control endpoints script the next
//! answers and report what the mock saw:
//!
//! - `POST /__mock/script` — JSON array of steps, each used by one request:
//!   `{"status":500,"delay_ms":100,"reset":true,"cut_after":2,"hold":true,
//!   "chunk_delay_ms":10,"first_chunk_delay_ms":300,"content":"...","usage":{"prompt_tokens":1,"completion_tokens":2},"body":"raw",
//!   "note_latin1":"café","content_encoding":"gzip"}` (`note_latin1` adds a
//!   header whose value is not UTF-8; `content_encoding` labels the answer
//!   as compressed, as a provider that compresses would)
//! - `POST /__mock/default` — one step used whenever the script is empty.
//! - `POST /__mock/release` — let a held stream (`"hold":true`) finish.
//! - `GET /__mock/hits` — `{"hits":N}` chat requests seen.
//! - `GET /__mock/requests` — the last requests: headers and body.
//! - `POST /__mock/reset` — clear script, counters and log.
//! - `POST /__mock/guard` — an external guard (the contract of
//!   `portcullis_core::guard::external`): a `text` containing `guard:deny`
//!   is denied, `guard:redact` redacted (that word), `guard:slow` answered
//!   after 2 s, `guard:garbage` answered with a body that is not JSON; any
//!   other text is allowed. Each call is logged with the requests.
//!
//!   A step's `retry_after` adds that header (seconds) to a scripted error;
//!   each logged request has `at_ms` (Unix time, ms).
//! - `POST <prefix>/messages` — Anthropic's Messages API (see `anthropic.rs`);
//!   `POST <prefix>/openai/deployments/<d>/chat/completions?api-version=…`
//!   — Azure OpenAI (key in `api-key`); `POST <prefix>/embeddings` and
//!   Azure's `.../embeddings` — embeddings (see `embeddings.rs`);
//!   `POST <prefix>/models/<model>:generateContent` and
//!   `:streamGenerateContent?alt=sse` — Google's Gemini API (key in
//!   `x-goog-api-key`; see `gemini.rs`). A step's
//!   `tool_call` (`{"name","input"}`) answers with that call when the
//!   request offers tools; `cache_read` and `stream_error` apply to the
//!   Anthropic and Gemini modes.
//!
//! `POST /model/<modelId>/converse` and `/converse-stream` — AWS Bedrock's
//! Converse API (see `bedrock.rs`): with `--aws-access-key-id ID
//! --aws-secret-access-key S [--aws-session-token T] [--aws-region R]` every
//! request must carry a SigV4 signature the mock recomputes.
//!
//! `--refuse-fields a,b` refuses those top-level chat fields as Mistral
//! does (422 `extra_forbidden`), and with `stream_options` among them puts
//! a stream's usage in its last chunk unasked, as Mistral does.
//!
//! `POST <prefix>/images/generations`, `/images/edits`, `/audio/speech`,
//! `/audio/transcriptions`, `/audio/translations`, `/moderations`,
//! `/rerank` and `/v2/rerank` (Cohere's) — see `media.rs`.
//!
//! `<prefix>/files` and `<prefix>/batches` — files and batches (see
//! `files.rs`); `<prefix>/messages/batches` — Anthropic's Message Batches
//! (`message_batches.rs`).
//!
//! `POST /mcp` (and `DELETE`) — a small MCP server over streamable HTTP
//! (JSON answers, sessions, the tools `echo` and `add`; `mcp.rs`), for the
//! demo's MCP servers and the benchmarks.
//!
//! Every mode refuses what the real API refuses, in its own error shape:
//! the table of checks is `tests/MOCK.md` (a test sends each bad request).
//!
//! Usage: `portcullis-mock [--port N] [--name NAME] [--api-key KEY]`; prints
//! `portcullis-mock <name> listening on 127.0.0.1:<port>` once ready.

mod anthropic;
mod bedrock;
mod embeddings;
mod files;
mod gemini;
mod mcp;
mod media;
mod message_batches;
mod openai_checks;
mod realtime;
mod responses;
mod vendors;

use bytes::Bytes;
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

type Body = BoxBody<Bytes, io::Error>;

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    status: Option<u16>,
    delay_ms: Option<u64>,
    #[serde(default)]
    reset: bool,
    cut_after: Option<usize>,
    #[serde(default)]
    hold: bool,
    chunk_delay_ms: Option<u64>,
    /// A stream's headers at once, its first event after this long.
    first_chunk_delay_ms: Option<u64>,
    content: Option<String>,
    usage: Option<Usage>,
    body: Option<String>,
    /// Add `x-provider-note` with this text as Latin-1 bytes (not UTF-8).
    note_latin1: Option<String>,
    /// Label the (unchanged) answer with this `content-encoding`, as a
    /// provider that compresses would.
    content_encoding: Option<String>,
    /// Answer with this tool call when the request has tools (OpenAI and
    /// Anthropic modes).
    tool_call: Option<ToolCall>,
    /// Anthropic mode: cache reads in the usage.
    cache_read: Option<u64>,
    /// Anthropic mode: an `error` event in place of the stream's end.
    #[serde(default)]
    stream_error: bool,
    /// `retry-after` (seconds) on a scripted error.
    retry_after: Option<u64>,
    /// OpenAI mode: answer past the request's `max_completion_tokens` /
    /// `max_tokens` (a provider that ignores the cap); without it the
    /// answer stops at the cap (one word a token) with `length`.
    #[serde(default)]
    ignore_max_tokens: bool,
    /// OpenAI mode: no `usage` in the answer, even when the stream was
    /// asked for it (as vLLM by default).
    #[serde(default)]
    no_usage: bool,
    /// OpenAI mode: a stream framed by `Content-Length` (the whole stream
    /// sent at once, as some OpenAI-compatible servers and proxies do)
    /// instead of chunked.
    #[serde(default)]
    content_length: bool,
}

#[derive(Debug, Clone, Deserialize)]
struct ToolCall {
    name: String,
    input: Value,
}

/// A request's path and headers, for the log.
fn request_facts(req: &Request<Incoming>) -> (String, serde_json::Map<String, Value>) {
    let headers = req
        .headers()
        .iter()
        .map(|(k, v)| {
            (
                k.as_str().to_string(),
                // A value that is not UTF-8 is logged as its bytes.
                v.to_str()
                    .map(|t| Value::String(t.to_string()))
                    .unwrap_or_else(|_| json!(v.as_bytes())),
            )
        })
        .collect();
    let path = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_string(), |p| p.as_str().to_string());
    (path, headers)
}

fn log_request(state: &State, path: &str, headers: serde_json::Map<String, Value>, body: &Value) {
    if let Ok(mut log) = state.log.lock() {
        if log.len() >= LOG_KEEP {
            log.pop_front();
        }
        let at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        log.push_back(json!({"path": path, "headers": headers, "body": body, "at_ms": at_ms}));
    }
}

/// A request as an AWS-style handler reads it: its path, query, headers
/// and body, the body parsed (null when it is not JSON); counted and
/// logged.
async fn read_logged(
    state: &State,
    req: Request<Incoming>,
) -> Result<(String, String, hyper::HeaderMap, Bytes, Value), io::Error> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let headers = req.headers().clone();
    let (logged_path, logged_headers) = request_facts(&req);
    let body = body_bytes(req).await?;
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    state
        .hits
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    log_request(state, &logged_path, logged_headers, &parsed);
    Ok((path, query, headers, body, parsed))
}

/// A request's body read, counted and logged; the step that answers it
/// (after its delay).
async fn receive(
    state: &State,
    path: &str,
    headers: serde_json::Map<String, Value>,
    body: Incoming,
) -> Result<(Value, Step), io::Error> {
    let parsed = receive_quiet(state, path, headers, body).await?;
    let step = next_step(state);
    if let Some(ms) = step.delay_ms {
        tokio::time::sleep(Duration::from_millis(ms)).await;
    }
    Ok((parsed, step))
}

/// A request read, counted and logged, without using a scripted step.
async fn receive_quiet(
    state: &State,
    path: &str,
    headers: serde_json::Map<String, Value>,
    body: Incoming,
) -> Result<Value, io::Error> {
    let body = body.collect().await.map_err(io::Error::other)?.to_bytes();
    state.hits.fetch_add(1, Ordering::Relaxed);
    let parsed: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    log_request(state, path, headers, &parsed);
    Ok(parsed)
}

/// A request's `content-type` ("" without one).
fn content_type(req: &Request<Incoming>) -> String {
    req.headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

/// A request's whole body.
async fn body_bytes(req: Request<Incoming>) -> Result<Bytes, io::Error> {
    Ok(req
        .into_body()
        .collect()
        .await
        .map_err(io::Error::other)?
        .to_bytes())
}

/// The next scripted step, else the default one.
fn next_step(state: &State) -> Step {
    state
        .script
        .lock()
        .ok()
        .and_then(|mut s| s.pop_front())
        .or_else(|| state.default.lock().ok().map(|d| d.clone()))
        .unwrap_or_default()
}

/// Add the step's Latin-1 `x-provider-note` header, if it has one.
fn with_note(mut r: Response<Body>, note: Option<&str>) -> Response<Body> {
    if let Some(note) = note {
        let bytes: Vec<u8> = note
            .chars()
            .map(|c| u8::try_from(c).unwrap_or(b'?'))
            .collect();
        if let Ok(v) = hyper::header::HeaderValue::from_bytes(&bytes) {
            r.headers_mut().insert("x-provider-note", v);
        }
    }
    r
}

#[derive(Debug, Clone, Copy, Deserialize)]
struct Usage {
    prompt_tokens: u64,
    completion_tokens: u64,
}

struct State {
    name: String,
    api_key: Option<String>,
    /// `--refuse-fields a,b`: top-level chat fields refused with Mistral's
    /// 422 `extra_forbidden`; refusing `stream_options` also puts a
    /// stream's usage in its last chunk unasked, as Mistral does.
    refuse_fields: Vec<String>,
    script: Mutex<VecDeque<Step>>,
    /// Used when the script is empty (`POST /__mock/default`).
    default: Mutex<Step>,
    hits: AtomicU64,
    log: Mutex<VecDeque<Value>>,
    release: Notify,
    /// Responses kept by id (the Responses API is stateful), with their input.
    responses: Mutex<std::collections::HashMap<String, (Value, Value)>>,
    /// Bedrock mode's credentials: requests must be signed with them.
    aws: Option<bedrock::Aws>,
    /// Access tokens issued by the metadata endpoint, with when each
    /// expires (Vertex mode takes only these, unexpired).
    tokens: Mutex<Vec<(String, std::time::Instant)>>,
    /// `--token-ttl S`: the lifetime of the tokens issued (default 3600).
    token_ttl_s: u64,
    /// MCP mode's sessions (`/mcp`).
    mcp_sessions: Mutex<std::collections::HashSet<String>>,
    /// Files and batches (`files.rs`).
    kept: Mutex<files::Kept>,
    /// Anthropic's Message Batches (`message_batches.rs`).
    msg_batches: Mutex<message_batches::Kept>,
    /// `mock-semantic`'s vectors a test set for given texts
    /// (`/__mock/vectors`), over the bag of words.
    vectors: Mutex<std::collections::HashMap<String, Vec<f32>>>,
}

/// An empty body.
fn empty_body() -> Body {
    Full::new(Bytes::new())
        .map_err(|never| match never {})
        .boxed()
}

const LOG_KEEP: usize = 64;

fn json_response(status: u16, v: &Value) -> Response<Body> {
    let body = serde_json::to_vec(v).unwrap_or_default();
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(
            Full::new(Bytes::from(body))
                .map_err(|never| match never {})
                .boxed(),
        )
        .unwrap_or_else(|_| {
            Response::new(
                Full::new(Bytes::new())
                    .map_err(|never| match never {})
                    .boxed(),
            )
        })
}

/// A body fed by a channel, so a stream can pause, continue or break.
struct ChanBody(mpsc::Receiver<Result<Bytes, io::Error>>);

impl hyper::body::Body for ChanBody {
    type Data = Bytes;
    type Error = io::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        self.0.poll_recv(cx).map(|o| o.map(|r| r.map(Frame::data)))
    }
}

/// A stream of scripted events: the step's `chunk_delay_ms` between them,
/// cut (the connection reset) before event `cut_after`.
fn event_stream(
    events: Vec<Bytes>,
    step: &Step,
    content_type: &str,
) -> Result<Response<Body>, io::Error> {
    let (tx, rx) = mpsc::channel(8);
    let chunk_delay = step.chunk_delay_ms.unwrap_or(0);
    let cut_after = step.cut_after;
    tokio::spawn(async move {
        for (i, e) in events.into_iter().enumerate() {
            if cut_after == Some(i) {
                return;
            }
            if i > 0 && chunk_delay > 0 {
                tokio::time::sleep(Duration::from_millis(chunk_delay)).await;
            }
            if tx.send(Ok(e)).await.is_err() {
                return;
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", content_type)
        .header("cache-control", "no-cache")
        .body(ChanBody(rx).boxed())
        .map_err(io::Error::other)
}

fn estimate_tokens(messages: &Value) -> u64 {
    let mut n = 0u64;
    if let Some(arr) = messages.as_array() {
        for m in arr {
            if let Some(s) = m.get("content").and_then(Value::as_str) {
                n += s.split_whitespace().count() as u64 + 3;
            }
        }
    }
    n.max(1)
}

/// The key an OpenAI-shaped request carries, as a bearer value: Azure's
/// (deployments in the path) in `api-key`, OpenAI's in `authorization`.
fn openai_auth(req: &Request<Incoming>, path: &str) -> Option<String> {
    let (header, bearer) = if path.contains("/openai/deployments/") {
        ("api-key", true)
    } else {
        ("authorization", false)
    };
    let v = req.headers().get(header)?.to_str().ok()?;
    Some(if bearer {
        format!("Bearer {v}")
    } else {
        v.to_string()
    })
}

/// OpenAI's 401 when the mock expects a key and `auth` is not it.
fn wrong_key(state: &State, auth: Option<&str>) -> Option<Response<Body>> {
    let expected = state.api_key.as_ref()?;
    (auth != Some(format!("Bearer {expected}").as_str())).then(|| {
        json_response(
            401,
            &json!({"error": {"message": "mock: wrong provider key", "type": "invalid_request_error", "code": "invalid_api_key"}}),
        )
    })
}

async fn chat(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let (path, headers) = request_facts(&req);
    // Azure OpenAI: deployments in the path, `api-version`, `api-key`.
    let azure = path.contains("/openai/deployments/");
    let auth = openai_auth(&req, &path);
    if azure && !path.contains("api-version=") {
        return Ok(json_response(
            404,
            &json!({"error": {"code": "404", "message": "Resource not found (mock: api-version is required)"}}),
        ));
    }
    let (parsed, step) = receive(&state, &path, headers, req.into_body()).await?;
    if step.reset {
        return Err(io::Error::new(
            io::ErrorKind::ConnectionReset,
            "scripted reset",
        ));
    }
    if let Some(refusal) = wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    if let Some(f) = state
        .refuse_fields
        .iter()
        .find(|f| parsed.get(f.as_str()).is_some())
    {
        return Ok(json_response(
            422,
            &json!({"object": "error", "message": {"detail": [{"type": "extra_forbidden", "loc": ["body", f], "msg": "Extra inputs are not permitted"}]}, "type": "invalid_request_error", "param": null, "code": null}),
        ));
    }
    // What OpenAI refuses, the mock refuses (tests/MOCK.md).
    if let Err(openai_checks::Refusal(status, body)) = openai_checks::check(&parsed) {
        return Ok(json_response(status, &body));
    }
    let status = step.status.unwrap_or(200);
    let note = step.note_latin1.as_deref();
    if let Some(raw) = step.body {
        let mut r = json_response(status, &Value::Null);
        *r.body_mut() = Full::new(Bytes::from(raw))
            .map_err(|never| match never {})
            .boxed();
        return Ok(with_note(r, note));
    }
    let encoding = step.content_encoding.clone();
    if status != 200 {
        let mut r = with_note(
            json_response(
                status,
                &json!({"error": {"message": format!("mock {}: scripted status {status}", state.name), "type": "server_error", "code": null}}),
            ),
            note,
        );
        if let Some(v) = step.retry_after {
            r.headers_mut()
                .insert("retry-after", hyper::header::HeaderValue::from(v));
        }
        return Ok(r);
    }
    let model = parsed
        .get("model")
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_string();
    let mut content = step
        .content
        .clone()
        .unwrap_or_else(|| format!("Hello from {}! This is a mock completion.", state.name));
    // A real provider stops at the request's cap, with `length`.
    let cap = parsed
        .get("max_completion_tokens")
        .or_else(|| parsed.get("max_tokens"))
        .and_then(Value::as_u64);
    let mut stopped = false;
    if let Some(cap) = cap.filter(|_| !step.ignore_max_tokens) {
        let words: Vec<&str> = content.split_inclusive(' ').collect();
        if words.len() as u64 > cap {
            content = words[..cap as usize].concat();
            stopped = true;
        }
    }
    let usage = step.usage.unwrap_or(Usage {
        prompt_tokens: estimate_tokens(parsed.get("messages").unwrap_or(&Value::Null)),
        completion_tokens: content.split_whitespace().count() as u64,
    });
    let usage_json = if step.no_usage {
        Value::Null
    } else {
        json!({
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        })
    };
    let id = format!("chatcmpl-mock-{}", state.hits.load(Ordering::Relaxed));
    let stream = parsed
        .get("stream")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    // A scripted tool call, when the request offers tools.
    let tool = step
        .tool_call
        .clone()
        .filter(|_| parsed.get("tools").is_some_and(Value::is_array));
    let finish = if tool.is_some() {
        "tool_calls"
    } else if stopped {
        "length"
    } else {
        "stop"
    };
    if !stream {
        let mut message = json!({"role": "assistant", "content": content});
        if let Some(t) = &tool {
            message["tool_calls"] = json!([{"id": "call_mock_1", "type": "function",
                "function": {"name": t.name, "arguments": t.input.to_string()}}]);
        }
        let mut r = with_note(
            json_response(
                200,
                &json!({
                    "id": id, "object": "chat.completion", "created": 1_700_000_000u64, "model": model,
                    "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": null}],
                    "usage": usage_json,
                }),
            ),
            note,
        );
        if let Some(v) = encoding.and_then(|e| hyper::header::HeaderValue::from_str(&e).ok()) {
            r.headers_mut().insert("content-encoding", v);
        }
        return Ok(r);
    }
    let include_usage = parsed
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let chunk = |delta: Value, finish: Value| {
        let v = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000u64, "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": null}]});
        Bytes::from(format!("data: {v}\n\n"))
    };
    let mut events = vec![chunk(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    let words: Vec<&str> = content.split_inclusive(' ').collect();
    for w in words {
        events.push(chunk(json!({"content": w}), Value::Null));
    }
    if let Some(t) = &tool {
        let args = t.input.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        events.push(chunk(
            json!({"tool_calls": [{"index": 0, "id": "call_mock_1", "type": "function", "function": {"name": t.name, "arguments": a}}]}),
            Value::Null,
        ));
        events.push(chunk(
            json!({"tool_calls": [{"index": 0, "function": {"arguments": b}}]}),
            Value::Null,
        ));
    }
    let unasked = state.refuse_fields.iter().any(|f| f == "stream_options");
    if unasked && !step.no_usage {
        let v = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000u64, "model": model,
            "choices": [{"index": 0, "delta": {}, "finish_reason": finish, "logprobs": null}], "usage": usage_json});
        events.push(Bytes::from(format!("data: {v}\n\n")));
    } else {
        events.push(chunk(json!({}), json!(finish)));
    }
    if include_usage && !step.no_usage {
        let v = json!({"id": id, "object": "chat.completion.chunk", "created": 1_700_000_000u64, "model": model,
            "choices": [], "usage": usage_json});
        events.push(Bytes::from(format!("data: {v}\n\n")));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    if step.content_length {
        let whole: Vec<u8> = events.iter().flat_map(|e| e.iter().copied()).collect();
        return Response::builder()
            .status(200)
            .header("content-type", "text/event-stream")
            .header("content-length", whole.len())
            .body(
                Full::new(Bytes::from(whole))
                    .map_err(|never| match never {})
                    .boxed(),
            )
            .map_err(io::Error::other);
    }
    let (tx, rx) = mpsc::channel(8);
    let chunk_delay = step.chunk_delay_ms.unwrap_or(0);
    let first_delay = step.first_chunk_delay_ms.unwrap_or(0);
    let hold = step.hold;
    let cut_after = step.cut_after;
    let st = state.clone();
    tokio::spawn(async move {
        for (i, ev) in events.into_iter().enumerate() {
            if i == 0 && first_delay > 0 {
                tokio::time::sleep(Duration::from_millis(first_delay)).await;
            }
            if cut_after == Some(i) {
                let _ = tx
                    .send(Err(io::Error::new(
                        io::ErrorKind::BrokenPipe,
                        "scripted cut",
                    )))
                    .await;
                return;
            }
            if i > 0 && chunk_delay > 0 {
                tokio::time::sleep(Duration::from_millis(chunk_delay)).await;
            }
            if tx.send(Ok(ev)).await.is_err() {
                return;
            }
            if hold && i == 0 {
                st.release.notified().await;
            }
        }
    });
    Response::builder()
        .status(200)
        .header("content-type", "text/event-stream")
        .header("cache-control", "no-cache")
        .body(ChanBody(rx).boxed())
        .map_err(io::Error::other)
}

async fn control(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let body = body_bytes(req).await?;
    Ok(match (method.as_str(), path.as_str()) {
        ("POST", "/__mock/script") => match serde_json::from_slice::<Vec<Step>>(&body) {
            Ok(steps) => {
                if let Ok(mut s) = state.script.lock() {
                    s.extend(steps);
                }
                json_response(200, &json!({"ok": true}))
            }
            Err(e) => json_response(400, &json!({"error": e.to_string()})),
        },
        ("POST", "/__mock/default") => match serde_json::from_slice::<Step>(&body) {
            Ok(step) => {
                if let Ok(mut d) = state.default.lock() {
                    *d = step;
                }
                json_response(200, &json!({"ok": true}))
            }
            Err(e) => json_response(400, &json!({"error": e.to_string()})),
        },
        ("POST", "/__mock/vectors") => {
            match serde_json::from_slice::<std::collections::HashMap<String, Vec<f32>>>(&body) {
                Ok(set) => {
                    if let Ok(mut v) = state.vectors.lock() {
                        v.extend(set.into_iter().map(|(k, x)| (k.trim().to_string(), x)));
                    }
                    json_response(200, &json!({"ok": true}))
                }
                Err(e) => json_response(400, &json!({"error": e.to_string()})),
            }
        }
        ("POST", "/__mock/release") => {
            state.release.notify_waiters();
            state.release.notify_one();
            json_response(200, &json!({"ok": true}))
        }
        ("GET", "/__mock/tokens") => json_response(
            200,
            &json!({"issued": state.tokens.lock().map_or(0, |t| t.len())}),
        ),
        ("GET", "/__mock/hits") => {
            json_response(200, &json!({"hits": state.hits.load(Ordering::Relaxed)}))
        }
        ("GET", "/__mock/requests") => {
            let log: Vec<Value> = state
                .log
                .lock()
                .map(|l| l.iter().cloned().collect())
                .unwrap_or_default();
            json_response(200, &Value::Array(log))
        }
        ("POST", "/__mock/guard") => guard(&state, &body).await,
        ("POST", "/__mock/reset") => {
            if let Ok(mut s) = state.script.lock() {
                s.clear();
            }
            if let Ok(mut l) = state.log.lock() {
                l.clear();
            }
            state.hits.store(0, Ordering::Relaxed);
            json_response(200, &json!({"ok": true}))
        }
        _ => json_response(
            404,
            &json!({"error": {"message": format!("mock: no route {method} {path}"), "type": "invalid_request_error", "code": null}}),
        ),
    })
}

/// The mock external guard's verdict on a text.
async fn guard(state: &State, body: &[u8]) -> Response<Body> {
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if let Ok(mut log) = state.log.lock() {
        if log.len() >= LOG_KEEP {
            log.pop_front();
        }
        log.push_back(json!({"path": "/__mock/guard", "headers": {}, "body": parsed.clone()}));
    }
    let text = parsed.get("text").and_then(Value::as_str).unwrap_or("");
    if text.contains("guard:slow") {
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    if text.contains("guard:garbage") {
        let mut r = json_response(200, &Value::Null);
        *r.body_mut() = Full::new(Bytes::from_static(b"not json"))
            .map_err(|never| match never {})
            .boxed();
        return r;
    }
    let verdict = if text.contains("guard:deny") {
        json!({"verdict": "deny", "reason": "mock guard: denied"})
    } else if text.contains("guard:redact") {
        json!({"verdict": "redact", "redact": ["guard:redact"]})
    } else {
        json!({"verdict": "allow"})
    };
    json_response(200, &verdict)
}

async fn route(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let path = req.uri().path();
    if path.starts_with("/__mock/") {
        control(state, req).await
    } else if req.method() == hyper::Method::POST && vendors::is_vendor(path) {
        vendors::serve(state, req).await
    } else if path == "/mcp" {
        mcp::serve(state, req).await
    } else if req.method() == hyper::Method::GET && path == METADATA_TOKEN_PATH {
        Ok(metadata_token(&state, &req))
    } else if req.method() == hyper::Method::POST
        && path.contains("/publishers/anthropic/models/")
        && (path.ends_with(":rawPredict") || path.ends_with(":streamRawPredict"))
    {
        anthropic::vertex_raw_predict(state, req).await
    } else if req.method() == hyper::Method::POST
        && path.starts_with("/model/")
        && (path.ends_with("/converse")
            || path.ends_with("/converse-stream")
            || path.ends_with("/invoke"))
    {
        bedrock::converse(state, req).await
    } else if req.method() == hyper::Method::POST
        && path.contains("/models/")
        && path
            .rsplit('/')
            .next()
            .is_some_and(|last| last.contains(':'))
    {
        gemini::generate(state, req).await
    } else if req.method() == hyper::Method::GET && path.ends_with("/realtime") {
        realtime::serve(state, req).await
    } else if path.contains("/messages/batches") {
        message_batches::serve(state, req).await
    } else if path.contains("/files") || path.contains("/batches") {
        files::serve(state, req).await
    } else if req.method() == hyper::Method::POST
        && (path.ends_with("/images/generations") || path.ends_with("/images/edits"))
    {
        media::images(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/audio/speech") {
        media::speech(state, req).await
    } else if req.method() == hyper::Method::POST
        && (path.ends_with("/audio/transcriptions") || path.ends_with("/audio/translations"))
    {
        media::transcribe(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/moderations") {
        media::moderations(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/rerank") {
        media::rerank(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/chat/completions") {
        chat(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/responses") {
        responses::create(state, req).await
    } else if path.contains("/responses/") {
        responses::by_id(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/embeddings") {
        embeddings::embeddings(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/messages/count_tokens") {
        anthropic::count_tokens(state, req).await
    } else if req.method() == hyper::Method::POST && path.ends_with("/messages") {
        anthropic::messages(state, req).await
    } else {
        let p = path.to_string();
        Ok(json_response(
            404,
            &json!({"error": {"message": format!("mock: unknown path {p}"), "type": "invalid_request_error", "code": null}}),
        ))
    }
}

/// The GCE/GKE metadata server's token endpoint, which the mock plays for
/// Vertex mode.
const METADATA_TOKEN_PATH: &str = "/computeMetadata/v1/instance/service-accounts/default/token";

/// A new access token, as the metadata server issues them (it refuses a
/// call without `Metadata-Flavor: Google`, as the real one does).
fn metadata_token(state: &State, req: &Request<Incoming>) -> Response<Body> {
    let flavored = req
        .headers()
        .get("metadata-flavor")
        .is_some_and(|v| v.as_bytes() == b"Google");
    if !flavored {
        return json_response(
            403,
            &json!({"error": "Missing Metadata-Flavor:Google header."}),
        );
    }
    let Ok(mut tokens) = state.tokens.lock() else {
        return json_response(500, &json!({"error": "mock: lock"}));
    };
    let token = format!("ya29.mock-{}", tokens.len() + 1);
    let ttl = state.token_ttl_s;
    tokens.push((
        token.clone(),
        std::time::Instant::now() + Duration::from_secs(ttl),
    ));
    json_response(
        200,
        &json!({"access_token": token, "expires_in": ttl, "token_type": "Bearer"}),
    )
}

/// Whether `authorization` carries a token the metadata endpoint issued
/// and that has not expired.
fn live_token(state: &State, authorization: Option<&str>) -> bool {
    let Some(t) = authorization.and_then(|a| a.strip_prefix("Bearer ")) else {
        return false;
    };
    let now = std::time::Instant::now();
    state
        .tokens
        .lock()
        .is_ok_and(|tokens| tokens.iter().any(|(x, until)| x == t && *until > now))
}

fn arg(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let port: u16 = arg(&args, "--port")
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    let name = arg(&args, "--name").unwrap_or_else(|| "mock".into());
    let threads: usize = arg(&args, "--threads")
        .and_then(|p| p.parse().ok())
        .unwrap_or(1);
    let api_key = arg(&args, "--api-key");
    let refuse_fields: Vec<String> = arg(&args, "--refuse-fields")
        .map(|f| f.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let aws = arg(&args, "--aws-access-key-id").map(|access_key_id| bedrock::Aws {
        access_key_id,
        secret: arg(&args, "--aws-secret-access-key").unwrap_or_default(),
        session_token: arg(&args, "--aws-session-token"),
        region: arg(&args, "--aws-region").unwrap_or_else(|| "us-east-1".into()),
    });
    // Loopback unless told (containers listen on their network).
    let bind = arg(&args, "--bind").unwrap_or_else(|| "127.0.0.1".into());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()?;
    rt.block_on(async move {
        // A deep accept queue: Envoy opens thousands of upstream
        // connections in a burst (long_streams), and tokio's default
        // backlog of 1,024 drops the SYNs past it on a busy machine, which
        // Envoy's 2 s connect timeout then turns into a failover.
        let addr = tokio::net::lookup_host((bind.as_str(), port))
            .await?
            .next()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to bind"))?;
        let socket = if addr.is_ipv4() {
            tokio::net::TcpSocket::new_v4()?
        } else {
            tokio::net::TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(4096)?;
        let addr = listener.local_addr()?;
        println!("portcullis-mock {name} listening on {addr}");
        let state = Arc::new(State {
            name,
            api_key,
            refuse_fields,
            script: Mutex::new(VecDeque::new()),
            default: Mutex::new(Step::default()),
            hits: AtomicU64::new(0),
            log: Mutex::new(VecDeque::new()),
            release: Notify::new(),
            responses: Mutex::new(std::collections::HashMap::new()),
            aws,
            tokens: Mutex::new(Vec::new()),
            token_ttl_s: arg(&args, "--token-ttl")
                .and_then(|t| t.parse().ok())
                .unwrap_or(3600),
            mcp_sessions: Mutex::new(std::collections::HashSet::new()),
            kept: Mutex::new(files::Kept::default()),
            msg_batches: Mutex::new(message_batches::Kept::default()),
            vectors: Mutex::new(std::collections::HashMap::new()),
        });
        loop {
            let (sock, _) = listener.accept().await?;
            let _ = sock.set_nodelay(true);
            let st = state.clone();
            tokio::spawn(async move {
                let svc = service_fn(move |req| {
                    let st = st.clone();
                    async move { route(st, req).await }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(
                    hyper_util::rt::TokioExecutor::new(),
                )
                .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(sock), svc)
                .await;
            });
        }
        #[allow(unreachable_code)]
        Ok::<(), io::Error>(())
    })
}
