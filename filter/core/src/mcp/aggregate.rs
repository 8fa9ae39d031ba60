//! The aggregated endpoint (`{mcp.path}` itself): every server the caller
//! may reach behind one URL, its tools and prompts named
//! `{server}__{name}`. Envoy's `mcp_router` does this too, but forwards
//! none of the client's headers to the servers (no credential, no trace;
//! `tests/tests/mcp_envoy.rs`), so the gateway fans out by callouts, each
//! with the server's own credential and session. Pure: the session the
//! client holds, the servers' answers read and merged.

use super::answer::Message;
use super::SEPARATOR;
use crate::credentials::seal::Seal;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use serde_json::{json, Map, Value};

/// The start of a gateway session id (`Mcp-Session-Id`).
const SESSION_PREFIX: &str = "pcs3-";

/// How long a session the gateway hands out lives, by default (a client
/// past it gets MCP's 404 and starts a new one).
pub const SESSION_TTL_MS: u64 = 24 * 3600 * 1000;

/// What a session id is sealed to: the client's key (its name) and, for a
/// caller that logged in, the user its login names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Holder<'a> {
    pub key: &'a str,
    pub user: Option<&'a str>,
}

/// The servers' sessions as bytes: for each, its name and its session,
/// each after two bytes of length.
fn pairs_bytes(sessions: &[(String, String)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, session) in sessions {
        for part in [name, session] {
            let n = u16::try_from(part.len()).unwrap_or(u16::MAX);
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(part.as_bytes().get(..usize::from(n)).unwrap_or_default());
        }
    }
    out
}

fn pairs_of(mut bytes: &[u8]) -> Option<Vec<(String, String)>> {
    let mut take = || -> Option<String> {
        let n = usize::from(u16::from_le_bytes([*bytes.first()?, *bytes.get(1)?]));
        let part = bytes.get(2..n.checked_add(2)?)?;
        bytes = bytes.get(n.checked_add(2)?..)?;
        String::from_utf8(part.to_vec()).ok()
    };
    // The bytes are the gateway's (their MAC was checked first).
    let mut out = Vec::new();
    while let Some(name) = take() {
        out.push((name, take()?));
    }
    Some(out)
}

fn session_parts<'a>(pairs: &'a [u8], expiry: &'a [u8; 8], holder: Holder<'a>) -> [&'a [u8]; 5] {
    [
        b"s",
        pairs,
        expiry,
        holder.key.as_bytes(),
        holder.user.unwrap_or("\0").as_bytes(),
    ]
}

/// The session id the client holds for its servers' sessions (`[server,
/// its session]` pairs; one pair at `{path}/{server}`), sealed to its
/// holder until `expires_ms` (#61): `pcs3-` and the base64url of the
/// pairs, the expiry and the gateway's MAC over them and the holder. The
/// client can read its servers' session ids, but nothing it changes, and
/// no other caller, gets past [`sessions_of`].
pub fn session_id(
    sessions: &[(String, String)],
    holder: Holder<'_>,
    expires_ms: u64,
    seal: &Seal,
) -> String {
    let mut bytes = pairs_bytes(sessions);
    let expiry = expires_ms.to_le_bytes();
    let mac = seal.mac(&session_parts(&bytes, &expiry, holder));
    bytes.extend_from_slice(&expiry);
    bytes.extend_from_slice(&mac);
    let mut out = String::from(SESSION_PREFIX);
    URL_SAFE_NO_PAD.encode_string(&bytes, &mut out);
    out
}

/// The servers' sessions a client's session id holds, when the gateway
/// sealed it to this holder and it has not expired (`None`: no server is
/// asked with it; MCP's 404 tells the client to start again).
pub fn sessions_of(
    id: &str,
    holder: Holder<'_>,
    now_ms: u64,
    seal: &Seal,
) -> Option<Vec<(String, String)>> {
    let bytes = URL_SAFE_NO_PAD
        .decode(id.strip_prefix(SESSION_PREFIX)?)
        .ok()?;
    let mac_at = bytes
        .len()
        .checked_sub(crate::credentials::seal::MAC_BYTES)?;
    let expiry_at = mac_at.checked_sub(8)?;
    let pairs = bytes.get(..expiry_at)?;
    let expiry: [u8; 8] = bytes.get(expiry_at..mac_at)?.try_into().ok()?;
    if now_ms >= u64::from_le_bytes(expiry) {
        return None;
    }
    if !seal.verify(&session_parts(pairs, &expiry, holder), bytes.get(mac_at..)?) {
        return None;
    }
    pairs_of(pairs)
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
    let mut parser = crate::wire::sse::SseParser::default();
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
    let p = crate::wire::borrowed::Obj::of(params?)?;
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
