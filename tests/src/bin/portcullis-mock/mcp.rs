//! MCP mode (`/mcp`): a small MCP server over streamable HTTP, answering
//! JSON, for the demo (`make run`) and the benchmarks (a server that costs
//! next to nothing, where the SDK's Python servers would dominate). What
//! the SDK's servers do and refuse, it does: a session made by
//! `initialize` (`Mcp-Session-Id`) and required after it (400 without one,
//! 404 for an unknown or ended one), `DELETE` ends it, notifications get
//! 202, a POST must accept both JSON and SSE (406), an unknown tool is
//! -32602 and an unknown method -32601. As the spec says (2025-06-18 and
//! later): a JSON array (batching was removed) or a message without
//! `jsonrpc: "2.0"` is 400 -32600, and an `MCP-Protocol-Version` it does
//! not support is 400. With `--api-key`, calls without
//! `Authorization: Bearer KEY` get 401 (the credential the gateway sends).
//! The tool `credential` is a careless server's fault: it echoes the
//! `authorization` it got in an answer header (`x-debug-authorization`)
//! and in a 500 body, as a server's debug output might.

use super::{json_response, Body, State};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

const VERSIONS: &[&str] = &["2025-11-25", "2025-06-18", "2025-03-26"];

fn rpc_error(status: u16, id: &Value, code: i64, message: &str) -> Response<Body> {
    json_response(
        status,
        &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
    )
}

fn tools(name: &str) -> Value {
    json!([
        {"name": "echo", "description": format!("Echo the text back, with {name}'s name."),
         "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}},
        {"name": "add", "description": "Add two numbers.",
         "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}},
        {"name": "credential", "description": "Fails, echoing the credential it got.",
         "inputSchema": {"type": "object", "properties": {}}},
    ])
}

fn call(name: &str, params: &Value) -> Result<Value, (i64, String)> {
    let args = &params["arguments"];
    let text = match params["name"].as_str() {
        Some("echo") => format!("{name}: {}", args["text"].as_str().unwrap_or_default()),
        Some("add") => {
            let n = |k: &str| {
                args[k]
                    .as_i64()
                    .ok_or((-32602, format!("`{k}` must be an integer")))
            };
            n("a")?.saturating_add(n("b")?).to_string()
        }
        Some(other) => return Err((-32602, format!("Unknown tool: {other}"))),
        None => return Err((-32602, "Invalid params: no tool name".into())),
    };
    Ok(json!({"content": [{"type": "text", "text": text}], "isError": false}))
}

pub async fn serve(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    state.hits.fetch_add(1, Ordering::Relaxed);
    let header = |k: &str| {
        req.headers()
            .get(k)
            .and_then(|v| v.to_str().ok())
            .map(String::from)
    };
    if let Some(key) = &state.api_key {
        if header("authorization").as_deref() != Some(format!("Bearer {key}").as_str()) {
            return Ok(rpc_error(
                401,
                &Value::Null,
                -32001,
                "Unauthorized: wrong or missing credential",
            ));
        }
    }
    let session = header("mcp-session-id");
    let version = header("mcp-protocol-version");
    let authorization = header("authorization").unwrap_or_default();
    let known = |s: &str| state.mcp_sessions.lock().is_ok_and(|set| set.contains(s));
    if req.method() == hyper::Method::DELETE {
        let removed = session
            .as_deref()
            .is_some_and(|s| state.mcp_sessions.lock().is_ok_and(|mut set| set.remove(s)));
        return Ok(if removed {
            json_response(200, &Value::Null)
        } else {
            rpc_error(404, &Value::Null, -32600, "Session not found")
        });
    }
    if req.method() != hyper::Method::POST {
        return Ok(rpc_error(405, &Value::Null, -32000, "Method not allowed"));
    }
    let accept = header("accept").unwrap_or_default();
    if !(accept.contains("application/json") && accept.contains("text/event-stream")) {
        return Ok(rpc_error(
            406,
            &Value::Null,
            -32600,
            "Not Acceptable: the client must accept application/json and text/event-stream",
        ));
    }
    let body = super::body_bytes(req).await?;
    let Ok(msg) = serde_json::from_slice::<Value>(&body) else {
        return Ok(rpc_error(400, &Value::Null, -32700, "Parse error"));
    };
    if !msg.is_object() || msg["jsonrpc"] != "2.0" {
        return Ok(rpc_error(
            400,
            &Value::Null,
            -32600,
            "Invalid Request: one JSON-RPC 2.0 message (`jsonrpc: \"2.0\"`), not a batch",
        ));
    }
    if let Some(v) = version {
        if !VERSIONS.contains(&v.as_str()) {
            return Ok(rpc_error(
                400,
                &Value::Null,
                -32600,
                &format!("Bad Request: Unsupported protocol version: {v}"),
            ));
        }
    }
    let id = msg.get("id").cloned();
    let method = msg["method"].as_str().unwrap_or_default();
    if method == "initialize" {
        let asked = msg["params"]["protocolVersion"]
            .as_str()
            .unwrap_or_default();
        let version = VERSIONS
            .iter()
            .find(|v| **v == asked)
            .unwrap_or(&VERSIONS[0]);
        let sid = format!("{:032x}", rand_u128(&state));
        if let Ok(mut set) = state.mcp_sessions.lock() {
            set.insert(sid.clone());
        }
        let mut r = json_response(
            200,
            &json!({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": version,
                "capabilities": {"tools": {"listChanged": false}},
                "serverInfo": {"name": state.name, "version": "1.0.0"}}}),
        );
        if let Ok(v) = sid.parse() {
            r.headers_mut().insert("mcp-session-id", v);
        }
        return Ok(r);
    }
    match session.as_deref() {
        None => {
            return Ok(rpc_error(
                400,
                &Value::Null,
                -32600,
                "Bad Request: No valid session ID provided",
            ))
        }
        Some(s) if !known(s) => {
            return Ok(rpc_error(404, &Value::Null, -32600, "Session not found"))
        }
        Some(_) => {}
    }
    let Some(id) = id else {
        // A notification, or the client's answer to a request.
        return Ok(Response::builder()
            .status(202)
            .body(super::empty_body())
            .unwrap_or_else(|_| json_response(202, &Value::Null)));
    };
    if method == "tools/call" && msg["params"]["name"] == "credential" {
        let got = authorization;
        let mut r = rpc_error(
            500,
            &id,
            -32603,
            &format!("Internal error: the upstream refused authorization `{got}`"),
        );
        if let Ok(v) = got.parse() {
            r.headers_mut().insert("x-debug-authorization", v);
        }
        return Ok(r);
    }
    let result = match method {
        "ping" => Ok(json!({})),
        "tools/list" => Ok(json!({"tools": tools(&state.name)})),
        "tools/call" => call(&state.name, &msg["params"]),
        other => Err((-32601, format!("Method not found: {other}"))),
    };
    Ok(match result {
        Ok(r) => json_response(200, &json!({"jsonrpc": "2.0", "id": id, "result": r})),
        Err((code, message)) => json_response(
            200,
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        ),
    })
}

/// A session id nobody can guess from the ones before it.
fn rand_u128(state: &State) -> u128 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(state.hits.load(Ordering::Relaxed));
    let hi = h.finish();
    let mut h2 = std::collections::hash_map::RandomState::new().build_hasher();
    h2.write_u64(hi);
    (u128::from(hi) << 64) | u128::from(h2.finish())
}
