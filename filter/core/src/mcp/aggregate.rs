//! The aggregated endpoint (`{mcp.path}` itself): every server the caller
//! may reach behind one URL, its tools and prompts named
//! `{server}__{name}`. Envoy's `mcp_router` does this too, but forwards
//! none of the client's headers to the servers (no credential, no trace;
//! `tests/tests/mcp_envoy.rs`), so the gateway fans out by callouts, each
//! with the server's own credential and session. Pure: the session the
//! client holds, the servers' answers read and merged.

use super::answer::Message;
use super::SEPARATOR;
use serde_json::{json, Map, Value};

/// The start of a gateway session id (`Mcp-Session-Id`): what follows is
/// the hex of `[[server, its session], ...]` as JSON.
const SESSION_PREFIX: &str = "pcs1-";

/// The session id the client holds for its servers' sessions.
pub fn session_id(sessions: &[(String, String)]) -> String {
    let json = serde_json::to_vec(sessions).unwrap_or_default();
    let mut out = String::with_capacity(SESSION_PREFIX.len() + json.len() * 2);
    out.push_str(SESSION_PREFIX);
    let digit = |n: u8| char::from_digit(u32::from(n), 16).unwrap_or('0');
    for b in json {
        out.push(digit(b >> 4));
        out.push(digit(b & 15));
    }
    out
}

/// The servers' sessions a client's session id holds (`None`: not one the
/// gateway made, so no server is asked with it).
pub fn sessions_of(id: &str) -> Option<Vec<(String, String)>> {
    let hex = id.strip_prefix(SESSION_PREFIX)?.as_bytes();
    if hex.len() % 2 != 0 {
        return None;
    }
    let nibble = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let bytes: Option<Vec<u8>> = hex
        .chunks_exact(2)
        .map(|p| match p {
            [hi, lo] => Some((nibble(*hi)? << 4) | nibble(*lo)?),
            _ => None,
        })
        .collect();
    serde_json::from_slice(&bytes?).ok()
}

/// A qualified name's server and name (`alpha__echo`: `alpha`, `echo`).
pub fn split(qualified: &str) -> Option<(&str, &str)> {
    let (server, name) = qualified.split_once(SEPARATOR)?;
    (!server.is_empty() && !name.is_empty()).then_some((server, name))
}

/// The message answering request `id` (JSON text as sent) in a server's
/// answer: a JSON body, or the events of an SSE one.
pub fn answer_to(body: &[u8], id: &str) -> Option<Message> {
    let is_answer = |m: &Message| {
        m.get("id")
            .and_then(|v| serde_json::to_string(v).ok())
            .as_deref()
            == Some(id)
            && (m.contains_key("result") || m.contains_key("error"))
    };
    if let Ok(m) = serde_json::from_slice::<Message>(body) {
        return is_answer(&m).then_some(m);
    }
    let mut parser = crate::sse::SseParser::default();
    parser.push(body);
    parser.push(b"\n\n");
    while let Some(data) = parser.next_data() {
        if let Ok(m) = serde_json::from_str::<Message>(&data) {
            if is_answer(&m) {
                return Some(m);
            }
        }
    }
    None
}

/// The one `initialize` answer of the gateway for its servers' answers:
/// the oldest protocol version any of them speaks (each spoke it or an
/// older one), tools and prompts, the gateway as the server.
pub fn initialize(id: &str, answers: &[Message]) -> Vec<u8> {
    let version = answers
        .iter()
        .filter_map(|m| m.get("result")?.get("protocolVersion")?.as_str())
        .min()
        .unwrap_or("2025-06-18");
    let has = |cap: &str| {
        answers.iter().any(|m| {
            m.get("result")
                .and_then(|r| r.get("capabilities")?.get(cap))
                .is_some()
        })
    };
    let mut caps = Map::new();
    caps.insert("tools".into(), json!({"listChanged": false}));
    if has("prompts") {
        caps.insert("prompts".into(), json!({"listChanged": false}));
    }
    let id: Value = serde_json::from_str(id).unwrap_or(Value::Null);
    let out = json!({"jsonrpc": "2.0", "id": id, "result": {
        "protocolVersion": version,
        "capabilities": caps,
        "serverInfo": {"name": "portcullis", "version": env!("CARGO_PKG_VERSION")},
    }});
    serde_json::to_vec(&out).unwrap_or_default()
}

/// A list (`tools` or `prompts`) merged from the servers' answers, each
/// item's `name` qualified with its server, only those `keep` keeps.
pub fn merged_list(
    id: &str,
    member: &str,
    answers: &[(&str, Message)],
    keep: &dyn Fn(&str, &str) -> bool,
) -> Vec<u8> {
    let mut items = Vec::new();
    for (server, m) in answers {
        let Some(Value::Array(list)) = m.get("result").and_then(|r| r.get(member)) else {
            continue;
        };
        for item in list {
            let Some(name) = item.get("name").and_then(Value::as_str) else {
                continue;
            };
            if !keep(server, name) {
                continue;
            }
            let mut item = item.clone();
            if let Some(o) = item.as_object_mut() {
                o.insert("name".into(), Value::String(super::qualified(server, name)));
            }
            items.push(item);
        }
    }
    let id: Value = serde_json::from_str(id).unwrap_or(Value::Null);
    let mut result = Map::new();
    result.insert(member.into(), Value::Array(items));
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result})).unwrap_or_default()
}

/// A local answer: `result` to request `id`.
fn result(id: &str, result: Value) -> Vec<u8> {
    let id: Value = serde_json::from_str(id).unwrap_or(Value::Null);
    serde_json::to_vec(&json!({"jsonrpc": "2.0", "id": id, "result": result})).unwrap_or_default()
}

/// The answer to a `ping`.
pub fn pong(id: &str) -> Vec<u8> {
    result(id, json!({}))
}

/// An empty list (`member`) as the answer to request `id`.
pub fn empty(id: &str, member: &str) -> Vec<u8> {
    let mut r = Map::new();
    r.insert(member.into(), Value::Array(Vec::new()));
    result(id, Value::Object(r))
}

/// A request's `params.name`, if it is a string.
pub fn param_name(params: Option<&serde_json::value::RawValue>) -> Option<String> {
    let p = crate::borrowed::Obj::of(params?)?;
    p.str("name").map(|n| n.into_owned())
}

/// A request's body with `params.name` replaced (the server's own name
/// for a qualified tool or prompt); `None` when it does not read.
pub fn renamed(body: &[u8], name: &str) -> Option<Vec<u8>> {
    let mut doc: Message = serde_json::from_slice(body).ok()?;
    let params = doc.get_mut("params")?.as_object_mut()?;
    params.insert("name".into(), Value::String(name.into()));
    serde_json::to_vec(&doc).ok()
}
