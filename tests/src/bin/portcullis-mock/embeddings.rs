//! The mock's embeddings, `POST <prefix>/embeddings` (OpenAI) and
//! `.../openai/deployments/<d>/embeddings?api-version=…` (Azure): checks
//! what OpenAI checks (the table in `tests/MOCK.md`) and answers with
//! real-shaped vectors (a deterministic function of each input; 8
//! dimensions unless `dimensions` says), as floats or, with
//! `encoding_format: base64`, as little-endian f32 bytes in base64, with
//! `usage.prompt_tokens`.

use super::openai_checks::Refusal;
use super::{json_response, Body, State};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;

const FIELDS: &[&str] = &["model", "input", "dimensions", "encoding_format", "user"];

fn bad(message: String, param: Option<&str>, code: Option<&str>) -> Refusal {
    Refusal(
        400,
        json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}),
    )
}

/// The inputs as (text, tokens) pairs, or the refusal OpenAI gives.
fn check(req: &Value) -> Result<Vec<(String, u64)>, Refusal> {
    let Some(fields) = req.as_object() else {
        return Err(bad(
            "We could not parse the JSON body of your request.".into(),
            None,
            None,
        ));
    };
    if let Some(k) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(
            format!("Unrecognized request argument supplied: {k}"),
            None,
            None,
        ));
    }
    if !req.get("model").is_some_and(Value::is_string) {
        return Err(bad("you must provide a model parameter".into(), None, None));
    }
    match req.get("encoding_format").map(|v| v.as_str()) {
        None | Some(Some("float" | "base64")) => {}
        Some(_) => {
            return Err(bad(
                "Invalid value for 'encoding_format': expected 'float' or 'base64'.".into(),
                Some("encoding_format"),
                Some("invalid_value"),
            ))
        }
    }
    if let Some(d) = req.get("dimensions") {
        if !d.as_u64().is_some_and(|d| (1..=3072).contains(&d)) {
            return Err(bad(
                "Invalid 'dimensions': must be a positive integer.".into(),
                Some("dimensions"),
                Some("invalid_value"),
            ));
        }
    }
    let words = |s: &str| (s.split_whitespace().count() as u64).max(1);
    let invalid = || {
        bad("'$.input' is invalid. Please check the API reference: https://platform.openai.com/docs/api-reference.".into(), Some("input"), None)
    };
    let inputs = match req.get("input") {
        None => {
            return Err(bad(
                "Missing required parameter: 'input'.".into(),
                Some("input"),
                Some("missing_required_parameter"),
            ))
        }
        Some(Value::String(s)) if !s.is_empty() => vec![(s.clone(), words(s))],
        Some(Value::Array(items)) if !items.is_empty() => {
            let mut out = Vec::new();
            for i in items {
                match i {
                    Value::String(s) if !s.is_empty() => out.push((s.clone(), words(s))),
                    Value::Number(n) if n.is_u64() => out.push((n.to_string(), 1)),
                    Value::Array(t) if !t.is_empty() && t.iter().all(Value::is_u64) => {
                        out.push((Value::Array(t.clone()).to_string(), t.len() as u64))
                    }
                    _ => return Err(invalid()),
                }
            }
            // A flat array of token ids is one input.
            if items.iter().all(Value::is_u64) {
                out = vec![(Value::Array(items.clone()).to_string(), items.len() as u64)];
            }
            out
        }
        Some(_) => return Err(invalid()),
    };
    Ok(inputs)
}

/// Words that carry no meaning for [`words_vector`].
const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "of", "in", "on", "to", "for", "is", "are", "was", "what", "whats", "which",
    "please", "can", "could", "would", "you", "me", "tell", "i", "want", "know", "do", "does",
    "quick", "question", "give", "say", "hey", "kindly", "and", "it", "my",
];

/// The model `mock-semantic` (the tests' embedding model for the semantic
/// cache, `tests/MOCK.md`): the vector a test set for the text
/// (`POST /__mock/vectors`, `{text: [numbers]}`), else a bag of the text's content words (lowercased,
/// punctuation and a trailing `'s` dropped, stop words left out), each
/// hashed to one of `dims` dimensions with a sign. Texts with the same
/// content words get the same vector whatever their order, case,
/// punctuation and filler; texts that differ in one word of three get a
/// cosine of about 2/3.
pub(crate) fn words_vector(text: &str, dims: usize) -> Vec<f32> {
    let mut v = vec![0f32; dims.max(1)];
    for w in text.split(|c: char| !c.is_alphanumeric() && c != '\'') {
        let w = w.to_lowercase();
        let w = w.trim_matches('\'');
        let w = w.strip_suffix("'s").unwrap_or(w);
        if w.is_empty() || STOP_WORDS.contains(&w) {
            continue;
        }
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in w.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let i = (h % v.len() as u64) as usize;
        v[i] += if (h >> 63) == 1 { 1.0 } else { -1.0 };
    }
    v
}

/// A deterministic unit-ish vector for a text.
pub(crate) fn vector(text: &str, dims: usize) -> Vec<f32> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    (0..dims)
        .map(|i| {
            for b in text.bytes().chain(std::iter::once(i as u8)) {
                h ^= u64::from(b);
                h = h.wrapping_mul(0x0100_0000_01b3);
            }
            ((h >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for c in bytes.chunks(3) {
        let n = (u32::from(c[0]) << 16)
            | (u32::from(*c.get(1).unwrap_or(&0)) << 8)
            | u32::from(*c.get(2).unwrap_or(&0));
        for (i, shift) in [18, 12, 6, 0].into_iter().enumerate() {
            if i <= c.len() {
                out.push(char::from(T[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub async fn embeddings(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (path, headers) = super::request_facts(&req);
    let auth = super::openai_auth(&req, &path);
    let (parsed, step) = super::receive(&state, &path, headers, req.into_body()).await?;
    if let Some(refusal) = super::wrong_key(&state, auth.as_deref()) {
        return Ok(refusal);
    }
    let inputs = match check(&parsed) {
        Ok(i) => i,
        Err(Refusal(status, body)) => return Ok(json_response(status, &body)),
    };
    let status = step.status.unwrap_or(200);
    if status != 200 {
        return Ok(json_response(
            status,
            &json!({"error": {"message": format!("mock {}: scripted status {status}", state.name), "type": "server_error", "code": null}}),
        ));
    }
    let semantic = parsed.get("model").and_then(Value::as_str) == Some("mock-semantic");
    let dims = parsed
        .get("dimensions")
        .and_then(Value::as_u64)
        .unwrap_or(if semantic { 256 } else { 8 }) as usize;
    let b64 = parsed.get("encoding_format").and_then(Value::as_str) == Some("base64");
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, (text, _))| {
            let set = state
                .vectors
                .lock()
                .ok()
                .and_then(|v| v.get(text.trim()).cloned());
            let v = if let (true, Some(mut set)) = (semantic, set) {
                set.resize(dims, 0.0);
                set
            } else if semantic {
                words_vector(text, dims)
            } else {
                vector(text, dims)
            };
            let embedding = if b64 {
                let bytes: Vec<u8> = v.iter().flat_map(|f| f.to_le_bytes()).collect();
                Value::String(base64(&bytes))
            } else {
                json!(v)
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let tokens: u64 = step
        .usage
        .map_or_else(|| inputs.iter().map(|(_, t)| t).sum(), |u| u.prompt_tokens);
    Ok(json_response(
        200,
        &json!({"object": "list", "data": data, "model": parsed.get("model").cloned().unwrap_or(Value::Null),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    ))
}
