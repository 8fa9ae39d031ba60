//! One JSON-RPC message as an MCP client POSTs it (streamable HTTP), read
//! once in place, and the errors the gateway answers in JSON-RPC's shape.
//!
//! What is refused before any server sees it (HTTP 400, the error's `id`
//! `null` when none could be read): a body that is not JSON (`-32700`), a
//! batch (`-32600`: MCP 2025-06-18 removed batching, and a batch would
//! carry calls past the per-call policy), an envelope without `"jsonrpc":
//! "2.0"` or with neither a `method` nor a `result`/`error`, an `id` that is
//! not a string or a number, and a `tools/call` without a tool name
//! (`-32602`).

use crate::error::GatewayError;
use crate::wire::borrowed::Str;
use serde::Deserialize;
pub use serde_json::value::RawValue;
use std::borrow::Cow;

pub const PARSE_ERROR: i64 = -32700;
pub const INVALID_REQUEST: i64 = -32600;
pub const METHOD_NOT_FOUND: i64 = -32601;
pub const INVALID_PARAMS: i64 = -32602;
pub const INTERNAL_ERROR: i64 = -32603;
/// JSON-RPC's range for implementation-defined server errors: the
/// gateway's refusals (a key, a limit, a budget, a guardrail).
pub const GATEWAY_ERROR: i64 = -32000;

/// What a message asks, as far as the policy cares.
#[derive(Debug, Clone)]
pub enum Method<'a> {
    /// `tools/call`: the tool's name as the client sent it, its arguments
    /// as sent (absent: none).
    ToolCall {
        name: Cow<'a, str>,
        arguments: Option<&'a RawValue>,
    },
    /// `tools/list`: its answer is filtered to the caller's tools.
    ToolsList,
    /// `initialize`.
    Initialize,
    /// Any other request (`ping`, `resources/*`, `prompts/*`, ...): passed
    /// to the server, which answers what it does not know with -32601.
    Other(Cow<'a, str>),
    /// A notification (no `id`): passed, answered 202 by the server.
    Notification(Cow<'a, str>),
    /// The client's answer to a server's request (sampling, elicitation).
    Response,
}

/// One message, read in place.
#[derive(Debug)]
pub struct Message<'a> {
    /// The request's id as sent (a string or a number), for the errors
    /// the gateway answers in its place.
    pub id: Option<&'a RawValue>,
    pub method: Method<'a>,
    /// The request's `params` as sent.
    pub params: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct Envelope<'a> {
    #[serde(borrow, default)]
    jsonrpc: Str<'a>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
    #[serde(borrow, default)]
    error: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct CallParams<'a> {
    #[serde(borrow, default)]
    name: Str<'a>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
}

/// A refusal of the message itself, before anything else is read.
fn refused(code: i64, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

/// Why a message was refused: its JSON-RPC code and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: i64,
    pub message: String,
}

impl Refusal {
    /// As the gateway's error (HTTP 400), for the error path every refusal
    /// takes.
    pub fn into_error(self) -> GatewayError {
        let code = match self.code {
            PARSE_ERROR => "parse_error",
            INVALID_PARAMS => "invalid_params",
            _ => "invalid_request",
        };
        GatewayError::new(400, "invalid_request_error", code, self.message)
    }
}

fn id_ok(id: &RawValue) -> bool {
    matches!(id.get().as_bytes().first(), Some(b'"' | b'-' | b'0'..=b'9'))
}

impl<'a> Message<'a> {
    /// Read a POSTed body: one JSON-RPC message.
    pub fn read(body: &'a [u8]) -> Result<Message<'a>, Refusal> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first == Some(&b'[') {
            return Err(refused(
                INVALID_REQUEST,
                "JSON-RPC batches are not accepted: send one message per request (MCP 2025-06-18 removed batching)",
            ));
        }
        let text = std::str::from_utf8(body)
            .map_err(|_| refused(PARSE_ERROR, "Parse error: the body is not UTF-8"))?;
        let env: Envelope<'a> = serde_json::from_str(text).map_err(|e| {
            refused(
                PARSE_ERROR,
                format!("Parse error: the body is not one JSON-RPC object ({e})"),
            )
        })?;
        if !env.jsonrpc.is("2.0") {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid request: `jsonrpc` must be \"2.0\"",
            ));
        }
        if let Some(id) = env.id {
            if !id_ok(id) {
                return Err(refused(
                    INVALID_REQUEST,
                    "Invalid request: `id` must be a string or a number",
                ));
            }
        }
        let Some(method) = env.method else {
            if env.id.is_some() && (env.result.is_some() || env.error.is_some()) {
                return Ok(Message {
                    id: env.id,
                    method: Method::Response,
                    params: None,
                });
            }
            return Err(refused(
                INVALID_REQUEST,
                "Invalid request: a message needs a `method` (or, answering the server, a `result` or an `error`)",
            ));
        };
        let Ok(Str(Some(name))) = serde_json::from_str::<Str<'a>>(method.get()) else {
            return Err(refused(
                INVALID_REQUEST,
                "Invalid request: `method` must be a string",
            ));
        };
        if env.id.is_none() {
            return Ok(Message {
                id: None,
                method: Method::Notification(name),
                params: env.params,
            });
        }
        let method = match name.as_ref() {
            "tools/call" => {
                let p: CallParams<'a> = env
                    .params
                    .and_then(|p| serde_json::from_str(p.get()).ok())
                    .ok_or_else(|| {
                        refused(
                            INVALID_PARAMS,
                            "Invalid params: `tools/call` needs `params`",
                        )
                    })?;
                let Some(tool) = p.name.0.filter(|n| !n.is_empty()) else {
                    return Err(refused(
                        INVALID_PARAMS,
                        "Invalid params: `tools/call` needs the tool's `name` (a string)",
                    ));
                };
                if p.arguments.is_some_and(|a| !a.get().starts_with('{')) {
                    return Err(refused(
                        INVALID_PARAMS,
                        "Invalid params: a tool's `arguments` must be an object",
                    ));
                }
                Method::ToolCall {
                    name: tool,
                    arguments: p.arguments,
                }
            }
            "tools/list" => Method::ToolsList,
            "initialize" => Method::Initialize,
            _ => Method::Other(name),
        };
        Ok(Message {
            id: env.id,
            method,
            params: env.params,
        })
    }

    /// The method's name, for records and metrics.
    pub fn method_name(&self) -> &str {
        match &self.method {
            Method::ToolCall { .. } => "tools/call",
            Method::ToolsList => "tools/list",
            Method::Initialize => "initialize",
            Method::Other(m) | Method::Notification(m) => m,
            Method::Response => "response",
        }
    }
}

/// The JSON-RPC code of a gateway error: what the error's own code says.
pub fn code_of(e: &GatewayError) -> i64 {
    match e.code {
        "parse_error" | "invalid_json" => PARSE_ERROR,
        "invalid_request" | "session_not_found" => INVALID_REQUEST,
        "invalid_params" | "tool_not_allowed" => INVALID_PARAMS,
        "method_not_found" => METHOD_NOT_FOUND,
        _ if e.status >= 500 => INTERNAL_ERROR,
        _ => GATEWAY_ERROR,
    }
}

#[derive(serde::Serialize)]
struct ErrorBody<'a> {
    jsonrpc: &'static str,
    id: Option<&'a RawValue>,
    error: ErrorObject<'a>,
}

#[derive(serde::Serialize)]
struct ErrorObject<'a> {
    code: i64,
    message: &'a str,
    data: ErrorData<'a>,
}

#[derive(serde::Serialize)]
struct ErrorData<'a> {
    status: u16,
    #[serde(rename = "type")]
    kind: &'a str,
    code: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after_seconds: Option<u64>,
}

/// A gateway error as a JSON-RPC error response to the request `id`
/// (`null` when the request's id was never read): the JSON-RPC code from
/// [`code_of`], the gateway's status, type, code and wait in `data`.
pub fn error_body(id: Option<&RawValue>, e: &GatewayError) -> Vec<u8> {
    let body = ErrorBody {
        jsonrpc: "2.0",
        id,
        error: ErrorObject {
            code: code_of(e),
            message: &e.message,
            data: ErrorData {
                status: e.status,
                kind: e.kind,
                code: e.code,
                retry_after_seconds: e.retry_after_s,
            },
        },
    };
    serde_json::to_vec(&body).unwrap_or_default()
}
