//! The semantic tier of the prompt cache (`cache.semantic`): which requests
//! may be answered by a near-duplicate's answer, what is embedded, the
//! space a prompt is compared in, and the cache service's `Nearest` and
//! `PutVectors` calls on the wire.
//!
//! What it refuses, by default: anything but a chat completion of text
//! (tools, images, audio, files, several choices); a conversation (any
//! assistant or tool message, more than one user message) unless the
//! config says `multi_turn`. Every part of the request but the user's text
//! must be the same for two prompts to be compared at all (the system
//! prompt, the sampling settings, the response format, the route, the
//! scope), and so must every number in the user's text: "17 times 23" is
//! never answered with "17 times 24"'s answer however near their
//! embeddings.

use super::{Hash, SemanticTier};
use crate::request::ChatRequest;
use crate::wire::pb::{self, Reader, Value};
use serde_json::Value as Json;

pub const NEAREST: &str = "Nearest";
/// Where the gateway asks itself for a prompt's embedding.
pub const EMBEDDINGS_PATH: &str = "/v1/embeddings";
pub const PUT_VECTORS: &str = "PutVectors";

/// Longest embedding read (OpenAI's largest model has 3,072 dimensions).
pub const MAX_DIMS: usize = 8192;

/// Fields of a chat completion that never change whether two prompts may
/// share an answer (the rest go into the space).
const IGNORED: &[&str] = &["messages", "model", "stream", "stream_options", "user"];

/// Fields that make a request ineligible whatever their value.
const REFUSED: &[&str] = &[
    "tools",
    "functions",
    "tool_choice",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "logprobs",
];

/// A prompt the semantic tier may answer: the text to embed and the bytes
/// that must be equal for two prompts to be compared.
#[derive(Debug, Clone, PartialEq)]
pub struct Prompt {
    pub text: String,
    pub exact: Vec<u8>,
}

/// The text of a message's content, when it is text only.
fn text_of(content: &Json) -> Option<String> {
    match content {
        Json::String(s) => Some(s.clone()),
        Json::Array(parts) => {
            let mut out = String::new();
            for p in parts {
                if p.get("type").and_then(Json::as_str) != Some("text") {
                    return None;
                }
                out.push_str(p.get("text").and_then(Json::as_str)?);
                out.push('\n');
            }
            Some(out)
        }
        _ => None,
    }
}

/// Every run of digits in `text` (with a decimal point inside), in order.
fn numbers(text: &str) -> String {
    let mut out = String::new();
    let mut prev_digit = false;
    let chars: Vec<char> = text.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        let inside_number = *c == '.'
            && prev_digit
            && chars
                .get(i.saturating_add(1))
                .is_some_and(char::is_ascii_digit);
        if c.is_ascii_digit() || inside_number {
            out.push(*c);
            prev_digit = true;
        } else {
            if prev_digit {
                out.push(',');
            }
            prev_digit = false;
        }
    }
    if prev_digit {
        out.push(',');
    }
    out
}

/// The request as the semantic tier sees it, or `None` when it may not be
/// answered by a near-duplicate.
pub fn prompt(request: &ChatRequest, multi_turn: bool) -> Option<Prompt> {
    if request.api != crate::api::Api::ChatCompletions || request.is_form() {
        return None;
    }
    let doc = request.document().ok()?;
    if REFUSED.iter().any(|k| doc.contains_key(*k))
        || doc.get("n").and_then(Json::as_u64).is_some_and(|n| n > 1)
    {
        return None;
    }
    let messages = doc.get("messages")?.as_array()?;
    let mut user = String::new();
    let mut exact: Vec<u8> = Vec::new();
    let mut users = 0usize;
    for m in messages {
        let role = m.get("role").and_then(Json::as_str)?;
        if m.get("tool_calls").is_some() || m.get("function_call").is_some() {
            return None;
        }
        let text = text_of(m.get("content")?)?;
        match role {
            "user" => {
                users = users.saturating_add(1);
                user.push_str(&text);
                user.push('\n');
            }
            "system" | "developer" => {}
            "assistant" if multi_turn => {}
            _ => return None,
        }
        // Every message but the user's text is compared exactly; the
        // users' texts by their embedding (and their numbers, exactly).
        exact.extend_from_slice(role.as_bytes());
        exact.push(0);
        if role != "user" {
            exact.extend_from_slice(text.as_bytes());
        }
        exact.push(0);
    }
    if users == 0 || (users > 1 && !multi_turn) || user.trim().is_empty() {
        return None;
    }
    exact.extend_from_slice(numbers(&user).as_bytes());
    exact.push(0);
    for (k, v) in doc.iter().filter(|(k, _)| !IGNORED.contains(&k.as_str())) {
        exact.extend_from_slice(k.as_bytes());
        exact.push(b'=');
        exact.extend_from_slice(v.to_string().as_bytes());
        exact.push(0);
    }
    Some(Prompt {
        text: user.trim_end().to_string(),
        exact,
    })
}

/// The space a prompt is compared in: its route and scope (as the exact
/// key has them), the embedding model and the prompt's exact part.
pub fn space(
    route: &str,
    model_id: &str,
    scope: Option<&str>,
    tier: &SemanticTier,
    p: &Prompt,
) -> Hash {
    let mut h = blake3::Hasher::new();
    for part in [
        b"portcullis-semantic-v1".as_slice(),
        route.as_bytes(),
        model_id.as_bytes(),
        scope.unwrap_or("\0").as_bytes(),
        tier.embedding_model.as_bytes(),
        &p.exact,
    ] {
        h.update(&(part.len() as u64).to_le_bytes());
        h.update(part);
    }
    *h.finalize().as_bytes()
}

/// The embedding request the gateway sends itself (OpenAI's shape).
pub fn embedding_request(tier: &SemanticTier, text: &str) -> Vec<u8> {
    serde_json::json!({"model": tier.embedding_model, "input": text})
        .to_string()
        .into_bytes()
}

/// An embeddings answer's first vector, L2-normalized; `None` for anything
/// else (an error, no vector, a zero or non-finite one, too many
/// dimensions).
pub fn read_embedding(body: &[u8]) -> Option<Vec<f32>> {
    #[derive(serde::Deserialize)]
    struct Answer {
        data: Vec<Item>,
    }
    #[derive(serde::Deserialize)]
    struct Item {
        embedding: Vec<f32>,
    }
    let a: Answer = serde_json::from_slice(body).ok()?;
    let v = a.data.into_iter().next()?.embedding;
    if v.is_empty() || v.len() > MAX_DIMS || v.iter().any(|x| !x.is_finite()) {
        return None;
    }
    let norm = v
        .iter()
        .map(|x| f64::from(*x) * f64::from(*x))
        .sum::<f64>()
        .sqrt();
    if !norm.is_normal() {
        return None;
    }
    Some(v.iter().map(|x| (f64::from(*x) / norm) as f32).collect())
}

fn floats(out: &mut Vec<u8>, field: u32, v: &[f32]) {
    let mut bytes = Vec::with_capacity(v.len().saturating_mul(4));
    for x in v {
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    pb::bytes(out, field, &bytes);
}

/// `NearestRequest { space, vector, threshold_ppm }`.
pub fn encode_nearest(space: &Hash, vector: &[f32], threshold_ppm: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(vector.len().saturating_mul(4).saturating_add(48));
    pb::bytes(&mut out, 1, space);
    floats(&mut out, 2, vector);
    pb::uint(&mut out, 3, u64::from(threshold_ppm));
    out
}

/// One `VectorEntry` as it goes in a `PutVectorsRequest` (field 1).
pub fn encode_vector_entry(
    space: &Hash,
    vector: &[f32],
    answer: &[u8],
    expires_ms: u64,
) -> Vec<u8> {
    let mut e = Vec::with_capacity(
        answer
            .len()
            .saturating_add(vector.len().saturating_mul(4))
            .saturating_add(64),
    );
    pb::bytes(&mut e, 1, space);
    floats(&mut e, 2, vector);
    pb::bytes(&mut e, 3, answer);
    pb::uint(&mut e, 4, expires_ms);
    let mut out = Vec::with_capacity(e.len().saturating_add(6));
    pb::message(&mut out, 1, &e);
    out
}

/// A near-duplicate's stored answer, as `Nearest` found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Near {
    pub answer: Vec<u8>,
    pub similarity_ppm: u32,
    pub stored_ms: u64,
    pub expires_ms: u64,
}

/// A `NearestResponse` read for `space`: the entry when found, of this
/// space, at least `threshold_ppm` similar, unexpired at `now_ms` and at
/// most `max_len` bytes.
pub fn decode_nearest(
    bytes: &[u8],
    space: &Hash,
    threshold_ppm: u32,
    now_ms: u64,
    max_len: usize,
) -> Option<Near> {
    let mut r = Reader::new(bytes);
    let (mut found, mut answered, mut answer) = (false, None, None);
    let (mut similarity, mut stored_ms, mut expires_ms) = (0u64, 0u64, 0u64);
    while let Some((n, v)) = r.field().ok()? {
        match (n, v) {
            (1, Value::Varint(f)) => found = f != 0,
            (2, Value::Bytes(s)) => answered = Some(s),
            (3, Value::Bytes(a)) => answer = Some(a),
            (4, Value::Varint(s)) => similarity = s,
            (5, Value::Varint(s)) => stored_ms = s,
            (6, Value::Varint(e)) => expires_ms = e,
            (1..=6, _) => return None,
            _ => {}
        }
    }
    let answer = answer.filter(|a| !a.is_empty() && a.len() <= max_len)?;
    let similarity_ppm = u32::try_from(similarity).ok().filter(|s| *s <= 1_000_000)?;
    (found
        && answered == Some(space.as_slice())
        && similarity_ppm >= threshold_ppm
        && expires_ms > now_ms)
        .then(|| Near {
            answer: answer.to_vec(),
            similarity_ppm,
            stored_ms,
            expires_ms,
        })
}

#[cfg(test)]
#[path = "semantic_tests.rs"]
mod tests;
