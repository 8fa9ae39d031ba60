//! OpenAI's Realtime API (GA event names) and Azure OpenAI's:
//! `GET <prefix>/realtime?model=M` (Azure: `/openai/realtime?api-version=V&deployment=D`,
//! key in `api-key`) upgraded to a WebSocket by `tokio-tungstenite`, not
//! by the gateway's frame reader. Refused before the upgrade as OpenAI
//! refuses: a wrong key (401), no model (400), not an upgrade (400).
//!
//! A session: `session.created` first; `session.update` answers
//! `session.updated` (without `session.type`: the `error` event of a
//! missing parameter, as the GA API); `conversation.item.create` adds a text item
//! (`conversation.item.added`, `.done`); `input_audio_buffer.append` and
//! `.commit` add audio (a token per 4 base64 characters);
//! `response.create` answers "You said: <last text>" (or the text after
//! `say:` in it), 8 characters a `response.output_text.delta`, then
//! `response.done` with usage: input tokens a quarter of the
//! conversation's characters (and the audio's), output tokens a quarter of
//! the answer's (or N when the last text holds `usage:N`). An event that
//! is not JSON, of an unknown type, or a binary message gets an `error`
//! event and the session goes on, as OpenAI's does. A close is answered.
//! Every text event the mock hears is logged (`/__mock/requests`, path
//! `/v1/realtime#event`), so a test can say what reached the provider.

use super::{empty_body, json_response, log_request, request_facts, wrong_key, Body, State};
use futures_util::{SinkExt, StreamExt};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;
use tokio_tungstenite::tungstenite::handshake::derive_accept_key;
use tokio_tungstenite::tungstenite::protocol::Role;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

fn query_param(path: &str, name: &str) -> Option<String> {
    let q = path.split_once('?')?.1;
    q.split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v.replace("%2F", "/").replace("%3A", ":"))
        .filter(|v| !v.is_empty())
}

fn error(status: u16, code: &str, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"error": {"message": message, "type": "invalid_request_error", "code": code, "param": null}}),
    )
}

pub(crate) async fn serve(
    state: Arc<State>,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (path, headers) = request_facts(&req);
    log_request(&state, &path, headers, &Value::Null);
    let azure = path.contains("/openai/realtime");
    let auth = if azure {
        if !path.contains("api-version=") {
            return Ok(json_response(
                404,
                &json!({"error": {"code": "404", "message": "Resource not found (mock: api-version is required)"}}),
            ));
        }
        req.headers()
            .get("api-key")
            .and_then(|v| v.to_str().ok())
            .map(|v| format!("Bearer {v}"))
    } else {
        req.headers()
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    if let Some(r) = wrong_key(&state, auth.as_deref()) {
        return Ok(r);
    }
    let model = query_param(&path, if azure { "deployment" } else { "model" });
    let Some(model) = model else {
        return Ok(error(
            400,
            "missing_model",
            "Missing required parameter: 'model'.",
        ));
    };
    let upgrade = req
        .headers()
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    let key = req
        .headers()
        .get("sec-websocket-key")
        .map(|k| derive_accept_key(k.as_bytes()));
    let (true, Some(accept)) = (upgrade, key) else {
        return Ok(error(
            400,
            "invalid_request",
            "This endpoint takes a WebSocket upgrade.",
        ));
    };
    let protocol = req
        .headers()
        .get("sec-websocket-protocol")
        .and_then(|v| v.to_str().ok())
        .filter(|v| v.split(',').any(|p| p.trim() == "realtime"))
        .map(|_| "realtime");
    let on = hyper::upgrade::on(&mut req);
    let st = state.clone();
    tokio::spawn(async move {
        if let Ok(up) = on.await {
            let ws = WebSocketStream::from_raw_socket(
                hyper_util::rt::TokioIo::new(up),
                Role::Server,
                None,
            )
            .await;
            session(ws, model, st).await;
        }
    });
    let mut r = Response::builder()
        .status(101)
        .header("upgrade", "websocket")
        .header("connection", "Upgrade")
        .header("sec-websocket-accept", accept);
    if let Some(p) = protocol {
        r = r.header("sec-websocket-protocol", p);
    }
    r.body(empty_body()).map_err(io::Error::other)
}

/// What a session has heard.
#[derive(Default)]
struct Heard {
    n: u64,
    conversation: usize,
    last_text: String,
    audio_chars: u64,
    audio_pending: u64,
    session: Value,
}

impl Heard {
    fn id(&mut self, prefix: &str) -> String {
        self.n += 1;
        format!("{prefix}_mock{}", self.n)
    }
}

fn err_event(h: &mut Heard, code: &str, message: &str, param: Option<&str>) -> Value {
    json!({"type": "error", "event_id": h.id("event"), "error": {"type": "invalid_request_error", "code": code, "message": message, "param": param, "event_id": null}})
}

async fn session<S>(ws: WebSocketStream<S>, model: String, state: Arc<State>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let (mut tx, mut rx) = ws.split();
    let mut h = Heard {
        session: json!({"object": "realtime.session", "type": "realtime", "model": model, "output_modalities": ["text"], "instructions": ""}),
        ..Heard::default()
    };
    let id = h.id("sess");
    h.session["id"] = json!(id);
    let created =
        json!({"type": "session.created", "event_id": h.id("event"), "session": h.session});
    if tx.send(Message::text(created.to_string())).await.is_err() {
        return;
    }
    while let Some(m) = rx.next().await {
        let out = match m {
            Ok(Message::Text(t)) => {
                // Every event heard is in the request log, so a test can
                // say what reached the provider.
                log_request(
                    &state,
                    "/v1/realtime#event",
                    serde_json::Map::new(),
                    &json!({"event": t.as_str()}),
                );
                on_event(&mut h, t.as_str())
            }
            Ok(Message::Binary(_)) => vec![err_event(
                &mut h,
                "invalid_value",
                "Binary messages are not supported: send JSON events as text.",
                None,
            )],
            // tungstenite answers a close and pings itself.
            Ok(_) => Vec::new(),
            Err(_) => break,
        };
        for e in out {
            if tx.send(Message::text(e.to_string())).await.is_err() {
                return;
            }
        }
    }
}

fn texts_of(item: &Value) -> Vec<String> {
    item.get("content")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter(|p| {
                    matches!(
                        p.get("type").and_then(Value::as_str),
                        Some("input_text" | "text")
                    )
                })
                .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

fn on_event(h: &mut Heard, t: &str) -> Vec<Value> {
    let Ok(ev) = serde_json::from_str::<Value>(t) else {
        return vec![err_event(
            h,
            "invalid_json",
            "The event is not valid JSON.",
            None,
        )];
    };
    let kind = ev
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    match kind.as_str() {
        "session.update" => {
            if !ev["session"]["type"].is_string() {
                return vec![err_event(
                    h,
                    "missing_required_parameter",
                    "Missing required parameter: 'session.type'.",
                    Some("session.type"),
                )];
            }
            if let Some(s) = ev.get("session").and_then(Value::as_object) {
                for (k, v) in s {
                    h.session[k] = v.clone();
                }
            }
            vec![json!({"type": "session.updated", "event_id": h.id("event"), "session": h.session})]
        }
        "conversation.item.create" => {
            let Some(mut item) = ev.get("item").cloned().filter(Value::is_object) else {
                return vec![err_event(h, "missing_required_parameter", "Missing required parameter: 'item'.", Some("item"))];
            };
            let texts = texts_of(&item);
            for t in &texts {
                h.conversation += t.len();
                h.last_text = t.clone();
            }
            let id = h.id("item");
            item["id"] = json!(id);
            item["object"] = json!("realtime.item");
            item["status"] = json!("completed");
            vec![
                json!({"type": "conversation.item.added", "event_id": h.id("event"), "previous_item_id": null, "item": item}),
                json!({"type": "conversation.item.done", "event_id": h.id("event"), "previous_item_id": null, "item": item}),
            ]
        }
        "input_audio_buffer.append" => {
            let n = ev.get("audio").and_then(Value::as_str).map_or(0, str::len) as u64;
            h.audio_chars += n;
            h.audio_pending += n;
            Vec::new()
        }
        "input_audio_buffer.commit" => {
            h.audio_pending = 0;
            let item = h.id("item");
            vec![json!({"type": "input_audio_buffer.committed", "event_id": h.id("event"), "previous_item_id": null, "item_id": item})]
        }
        "response.create" => respond(h),
        "response.cancel" => Vec::new(),
        other => vec![err_event(
            h,
            "invalid_value",
            &format!("Invalid value: '{other}'. Supported values are: 'session.update', 'input_audio_buffer.append', 'input_audio_buffer.commit', 'input_audio_buffer.clear', 'conversation.item.create', 'conversation.item.retrieve', 'conversation.item.truncate', 'conversation.item.delete', 'response.create', 'response.cancel' and 'output_audio_buffer.clear'."),
            Some("type"),
        )],
    }
}

fn respond(h: &mut Heard) -> Vec<Value> {
    let last = h.last_text.clone();
    let text = match last.split_once("say:") {
        Some((_, said)) => said.split(" usage:").next().unwrap_or("").to_string(),
        None => format!("You said: {last}"),
    };
    let output_tokens = last
        .split_once("usage:")
        .and_then(|(_, n)| n.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or_else(|| (text.len() as u64).div_ceil(4));
    let audio_tokens = h.audio_chars.div_ceil(4);
    let text_tokens = (h.conversation as u64).div_ceil(4) + 1;
    h.conversation += text.len();
    let resp = h.id("resp");
    let item = h.id("item");
    let mut out = vec![
        json!({"type": "response.created", "event_id": h.id("event"), "response": {"object": "realtime.response", "id": resp, "status": "in_progress", "output": [], "usage": null}}),
        json!({"type": "response.output_item.added", "event_id": h.id("event"), "response_id": resp, "output_index": 0, "item": {"id": item, "object": "realtime.item", "type": "message", "status": "in_progress", "role": "assistant", "content": []}}),
        json!({"type": "response.content_part.added", "event_id": h.id("event"), "response_id": resp, "item_id": item, "output_index": 0, "content_index": 0, "part": {"type": "text", "text": ""}}),
    ];
    let chars: Vec<char> = text.chars().collect();
    for piece in chars.chunks(8) {
        let delta: String = piece.iter().collect();
        out.push(json!({"type": "response.output_text.delta", "event_id": h.id("event"), "response_id": resp, "item_id": item, "output_index": 0, "content_index": 0, "delta": delta}));
    }
    let done_item = json!({"id": item, "object": "realtime.item", "type": "message", "status": "completed", "role": "assistant", "content": [{"type": "text", "text": text}]});
    let input_tokens = text_tokens + audio_tokens;
    out.extend([
        json!({"type": "response.output_text.done", "event_id": h.id("event"), "response_id": resp, "item_id": item, "output_index": 0, "content_index": 0, "text": text}),
        json!({"type": "response.content_part.done", "event_id": h.id("event"), "response_id": resp, "item_id": item, "output_index": 0, "content_index": 0, "part": {"type": "text", "text": text}}),
        json!({"type": "response.output_item.done", "event_id": h.id("event"), "response_id": resp, "output_index": 0, "item": done_item}),
        json!({"type": "response.done", "event_id": h.id("event"), "response": {
            "object": "realtime.response", "id": resp, "status": "completed", "status_details": null,
            "output": [done_item], "conversation_id": "conv_mock", "output_modalities": ["text"],
            "usage": {
                "total_tokens": input_tokens + output_tokens,
                "input_tokens": input_tokens,
                "output_tokens": output_tokens,
                "input_token_details": {"text_tokens": text_tokens, "audio_tokens": audio_tokens, "image_tokens": 0, "cached_tokens": 0},
                "output_token_details": {"text_tokens": output_tokens, "audio_tokens": 0}
            },
            "metadata": null
        }}),
    ]);
    h.audio_chars = 0;
    out
}
