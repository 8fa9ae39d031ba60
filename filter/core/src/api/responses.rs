//! OpenAI's Responses API, `POST /v1/responses` (the OpenAI Agents SDK's
//! default, Codex's wire API). OpenAI and Azure providers get it in its own
//! shape, every field passed as it is (the model id spliced in). Any other
//! provider is reached through the pivot: the request is translated to a
//! chat completion ([`to_chat`]) and the answer back ([`answer_from_chat`],
//! [`FromChatStream`]); what a stateless translation cannot honour
//! (`previous_response_id`, `background`, `conversation`, built-in tools)
//! is a 400 naming it. Usage comes from the answer's `usage` or the
//! `response.completed` event ([`StreamUsage`]).

use crate::error::GatewayError;
use crate::wire::borrowed::{self, Count};
use crate::wire::chat::{self, Completion};
use serde::Serialize;
use serde_json::{Map, Value};
use std::borrow::Cow;

pub const PATH: &str = "/v1/responses";

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

/// Responses' usage, as written back.
#[derive(Serialize)]
pub(super) struct ResponsesUsage {
    input_tokens: u64,
    input_tokens_details: Cached,
    output_tokens: u64,
    output_tokens_details: Reasoning,
    total_tokens: u64,
}

#[derive(Serialize)]
struct Cached {
    cached_tokens: u64,
}

#[derive(Serialize)]
struct Reasoning {
    reasoning_tokens: u64,
}

impl ResponsesUsage {
    fn new(input: u64, output: u64, cached: u64, reasoning: u64) -> Self {
        ResponsesUsage {
            input_tokens: input,
            input_tokens_details: Cached {
                cached_tokens: cached,
            },
            output_tokens: output,
            output_tokens_details: Reasoning {
                reasoning_tokens: reasoning,
            },
            total_tokens: input.saturating_add(output),
        }
    }

    fn of(u: &chat::Usage) -> Self {
        let n = |c: Count| c.0.unwrap_or(0);
        Self::new(
            n(u.prompt_tokens),
            n(u.completion_tokens),
            u.prompt_tokens_details
                .as_ref()
                .map_or(0, |d| n(d.cached_tokens)),
            u.completion_tokens_details
                .as_ref()
                .map_or(0, |d| n(d.reasoning_tokens)),
        )
    }
}

/// Responses' usage from chat's (a tree: the stream keeps the usage as one).
pub(super) fn usage(u: Option<&Value>) -> Value {
    let n = |p: &str| {
        u.and_then(|u| u.pointer(p))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    let usage = ResponsesUsage::new(
        n("/prompt_tokens"),
        n("/completion_tokens"),
        n("/prompt_tokens_details/cached_tokens"),
        n("/completion_tokens_details/reasoning_tokens"),
    );
    serde_json::to_value(usage).unwrap_or(Value::Null)
}

/// A response object around its output items: one shape for the whole
/// answer (typed items) and the stream's events (trees). The request's
/// settings ([`Echo`]) are spliced in after it.
#[derive(Serialize)]
struct Response<'a, M, I, U> {
    id: &'a str,
    object: &'static str,
    created_at: u64,
    completed_at: Option<u64>,
    status: &'a str,
    error: Option<Failure<'a>>,
    incomplete_details: Option<Incomplete>,
    model: M,
    output: Vec<I>,
    usage: Option<U>,
}

#[derive(Serialize)]
struct Incomplete {
    reason: &'static str,
}

/// A failed response's `error`.
#[derive(Serialize)]
struct Failure<'a> {
    code: &'static str,
    message: &'a str,
}

/// How a response ended, and when.
#[derive(Clone, Copy)]
pub(super) enum End<'a> {
    /// Still being written.
    InProgress,
    Completed(u64),
    /// Cut at `max_output_tokens`.
    Incomplete(u64),
    Failed(&'a str),
}

impl<'a, M: Serialize, I: Serialize, U: Serialize> Response<'a, M, I, U> {
    fn new(
        id: &'a str,
        model: M,
        created: u64,
        end: End<'a>,
        output: Vec<I>,
        usage: Option<U>,
    ) -> Self {
        let (status, completed_at) = match end {
            End::InProgress => ("in_progress", None),
            End::Completed(at) => ("completed", Some(at)),
            End::Incomplete(at) => ("incomplete", Some(at)),
            End::Failed(_) => ("failed", None),
        };
        Response {
            id,
            object: "response",
            created_at: created,
            completed_at,
            status,
            error: match end {
                End::Failed(message) => Some(Failure {
                    code: "server_error",
                    message,
                }),
                _ => None,
            },
            incomplete_details: matches!(end, End::Incomplete(_)).then_some(Incomplete {
                reason: "max_output_tokens",
            }),
            model,
            output,
            usage,
        }
    }

    /// The object, the request's settings spliced in.
    fn write(&self, echo: &Echo, out: &mut Vec<u8>) -> Option<()> {
        serde_json::to_writer(&mut *out, self).ok()?;
        if out.last() == Some(&b'}') && !echo.members().is_empty() {
            out.pop();
            out.push(b',');
            out.extend_from_slice(echo.members().as_bytes());
            out.push(b'}');
        }
        Some(())
    }
}

/// A response object around its output items (trees), the request's
/// settings (as a tree) joined.
pub(super) fn response(
    id: &str,
    model: &Value,
    created: u64,
    end: End<'_>,
    output: Vec<Value>,
    usage: Option<Value>,
    echo: &Map<String, Value>,
) -> Value {
    let mut v = serde_json::to_value(Response::new(id, model, created, end, output, usage))
        .unwrap_or(Value::Null);
    if let Some(o) = v.as_object_mut() {
        o.extend(echo.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    v
}

/// An output item, as written back.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Item<'a, C, N> {
    Message {
        id: Cow<'a, str>,
        status: &'a str,
        role: &'static str,
        content: [OutputText<'a>; 1],
    },
    FunctionCall {
        id: String,
        call_id: C,
        name: N,
        arguments: Cow<'a, str>,
        status: &'a str,
    },
}

#[derive(Serialize)]
struct OutputText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: Cow<'a, str>,
    annotations: [(); 0],
}

fn message<'a, C, N>(id: Cow<'a, str>, text: Cow<'a, str>, status: &'a str) -> Item<'a, C, N> {
    Item::Message {
        id,
        status,
        role: "assistant",
        content: [OutputText {
            kind: "output_text",
            text,
            annotations: [],
        }],
    }
}

/// `fc_` and the call's id.
fn call_item_id(call_id: Option<&str>) -> String {
    format!("fc_{}", call_id.unwrap_or("call"))
}

pub(super) fn message_item(id: &str, text: &str, status: &str) -> Value {
    serde_json::to_value(message::<(), ()>(
        Cow::Borrowed(id),
        Cow::Borrowed(text),
        status,
    ))
    .unwrap_or(Value::Null)
}

pub(super) fn call_item(call_id: &Value, name: &Value, arguments: &str, status: &str) -> Value {
    serde_json::to_value(Item::FunctionCall {
        id: call_item_id(call_id.as_str()),
        call_id,
        name,
        arguments: Cow::Borrowed(arguments),
        status,
    })
    .unwrap_or(Value::Null)
}

/// A whole chat completion as a response, completed at `now` (seconds),
/// echoing the request's settings; `None` when it does not read.
pub fn answer_from_chat(body: &[u8], now: u64, echo: &Echo) -> Option<Vec<u8>> {
    let v = Completion::read(body)?;
    let choice = v.choices.into_iter().next()?;
    let chat_id = v.id.0.unwrap_or(Cow::Borrowed("gateway"));
    let mut output: Vec<Item<Cow<str>, Cow<str>>> = Vec::new();
    if let Some(t) = choice.message.content.0.filter(|t| !t.is_empty()) {
        output.push(message(
            Cow::Owned(format!("msg_{chat_id}")),
            t,
            "completed",
        ));
    }
    for (i, c) in choice
        .message
        .tool_calls
        .unwrap_or_default()
        .into_iter()
        .enumerate()
    {
        let f = c.function.unwrap_or_default();
        let call_id =
            c.id.and_then(borrowed::str_of)
                .unwrap_or_else(|| Cow::Owned(format!("call_{chat_id}_{i}")));
        output.push(Item::FunctionCall {
            id: call_item_id(Some(&call_id)),
            call_id,
            name: f.name.and_then(borrowed::str_of).unwrap_or_default(),
            arguments: f.arguments.0.unwrap_or(Cow::Borrowed("{}")),
            status: "completed",
        });
    }
    let length = choice.finish_reason.is("length");
    let id = format!("resp_{chat_id}");
    let created = v.created.0.unwrap_or(now).min(now);
    let model = v.model.and_then(borrowed::str_of).unwrap_or_default();
    let out = Response::new(
        &id,
        model,
        created,
        if length {
            End::Incomplete(now)
        } else {
            End::Completed(now)
        },
        output,
        Some(ResponsesUsage::of(&v.usage.unwrap_or_default())),
    );
    let mut bytes = Vec::with_capacity(body.len().saturating_add(1024));
    out.write(echo, &mut bytes)?;
    Some(bytes)
}

/// The id of the response an answer carries, read from its first bytes (a
/// response object, or a stream whose first event is `response.created`:
/// either way the first `"id"` is the response's).
pub fn response_id(head: &[u8]) -> Option<&str> {
    const KEY: &[u8] = b"\"id\"";
    let head = head.get(..head.len().min(2048))?;
    let at = head.windows(KEY.len()).position(|w| w == KEY)?;
    let rest = head.get(at.checked_add(KEY.len())?..)?;
    let rest = std::str::from_utf8(rest).ok().or_else(|| {
        // Cut inside a character: what reads is enough.
        let valid = std::str::from_utf8(rest).err()?.valid_up_to();
        std::str::from_utf8(rest.get(..valid)?).ok()
    })?;
    let rest = rest
        .trim_start()
        .strip_prefix(':')?
        .trim_start()
        .strip_prefix('"')?;
    let id = rest.get(..rest.find('"')?)?;
    (!id.is_empty() && !id.contains('\\')).then_some(id)
}

/// The response a request is chained to (`previous_response_id`).
pub fn previous_id(doc: &Map<String, Value>) -> Option<&str> {
    doc.get("previous_response_id").and_then(Value::as_str)
}

/// `/v1/responses/{id}` and `/v1/responses/{id}/input_items`: the id and
/// what follows it (`""` or `/input_items`).
pub fn by_id(path: &str) -> Option<(&str, &str)> {
    let rest = path.strip_prefix(PATH)?.strip_prefix('/')?;
    let (id, tail) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    (!id.is_empty() && matches!(tail, "" | "/input_items")).then_some((id, tail))
}

mod echo;
mod request;
mod stream;
pub use echo::Echo;
pub use request::to_chat;
pub use stream::{FromChatStream, StreamUsage};

#[cfg(test)]
mod tests;
