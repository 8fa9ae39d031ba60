//! OpenAI's embeddings (`POST /v1/embeddings`) to Gemini's
//! `models/{id}:batchEmbedContents` and back: each input a request with
//! `model: models/{id}` and one text part, `dimensions` as
//! `outputDimensionality`; the answer's `embeddings[].values` become
//! `data[].embedding`, as floats or, when the client asked
//! `encoding_format: base64` (the OpenAI SDKs' default), as the base64 of
//! little-endian float32s. Gemini reports no token count for embeddings:
//! `usage.prompt_tokens` is the gateway's estimate (4 characters a token,
//! rounded up per input), as `count_tokens` estimates.

use crate::error::GatewayError;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::borrow::Cow;

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

#[derive(Deserialize)]
pub(crate) struct In<'a> {
    pub input: Value,
    #[serde(default)]
    pub dimensions: Option<u32>,
    #[serde(default, borrow)]
    pub encoding_format: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct Batch<'a> {
    requests: Vec<One<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct One<'a> {
    model: &'a str,
    content: Content<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    output_dimensionality: Option<u32>,
}

#[derive(Serialize)]
struct Content<'a> {
    parts: [Part<'a>; 1],
}

#[derive(Serialize)]
struct Part<'a> {
    text: &'a str,
}

/// What the answer's translation needs from the request.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Answer {
    /// The client asked `encoding_format: base64`.
    pub base64: bool,
    /// The estimate of the inputs' tokens.
    pub prompt_tokens: u64,
    /// The model the client asked for (the answer's `model`).
    pub model: String,
}

/// The request's texts: a string or strings (Gemini embeds text; token
/// arrays cannot be sent).
fn texts(input: &Value) -> Result<Vec<&str>, GatewayError> {
    texts_for(input, "Gemini")
}

/// The request's texts for a provider that embeds text only.
pub(crate) fn texts_for<'a>(input: &'a Value, who: &str) -> Result<Vec<&'a str>, GatewayError> {
    let not_text = || {
        bad(format!("{who} embeds text: `input` must be a string or an array of strings (token arrays cannot be sent to it)."))
    };
    match input {
        Value::String(s) => Ok(vec![s.as_str()]),
        Value::Array(items) => items
            .iter()
            .map(|v| v.as_str().ok_or_else(not_text))
            .collect(),
        _ => Err(not_text()),
    }
}

/// The client's request, its `encoding_format` and `dimensions` checked.
pub(crate) fn read(body: &[u8]) -> Result<In<'_>, GatewayError> {
    let req: In =
        serde_json::from_slice(body).map_err(|e| bad(format!("embeddings request: {e}")))?;
    if !matches!(
        req.encoding_format.as_deref(),
        None | Some("float" | "base64")
    ) {
        return Err(bad(format!(
            "`encoding_format` `{}` is not one of float, base64",
            req.encoding_format.as_deref().unwrap_or_default()
        )));
    }
    if req.dimensions == Some(0) {
        return Err(bad("`dimensions` must be at least 1"));
    }
    Ok(req)
}

/// The inputs' tokens as the gateway estimates them: 4 characters a token,
/// rounded up per input.
pub(crate) fn estimate(texts: &[&str]) -> u64 {
    texts
        .iter()
        .map(|t| (t.chars().count() as u64).div_ceil(4))
        .fold(0, u64::saturating_add)
}

/// The body for `batchEmbedContents`.
pub fn request(body: &[u8], model_id: &str) -> Result<Vec<u8>, GatewayError> {
    let req = read(body)?;
    let texts = texts(&req.input)?;
    let name = format!("models/{model_id}");
    let batch = Batch {
        requests: texts
            .iter()
            .map(|t| One {
                model: &name,
                content: Content {
                    parts: [Part { text: t }],
                },
                output_dimensionality: req.dimensions,
            })
            .collect(),
    };
    serde_json::to_vec(&batch)
        .map_err(|e| GatewayError::internal(format!("embeddings request: {e}")))
}

/// What the answer's translation needs, read from the client's body (one
/// that does not read, which [`request`] refused, gets floats and no
/// estimate).
pub fn answer_for(body: &[u8], model: &str) -> Answer {
    let req = read(body).ok();
    Answer {
        base64: req
            .as_ref()
            .is_some_and(|r| r.encoding_format.as_deref() == Some("base64")),
        prompt_tokens: req
            .as_ref()
            .and_then(|r| texts(&r.input).ok())
            .map_or(0, |t| estimate(&t)),
        model: model.to_string(),
    }
}

#[derive(Deserialize)]
struct Out {
    embeddings: Vec<Values>,
}

#[derive(Deserialize)]
struct Values {
    values: Vec<f32>,
}

#[derive(Serialize)]
struct List<'a> {
    object: &'static str,
    data: Vec<Item>,
    model: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
struct Item {
    object: &'static str,
    index: usize,
    embedding: Embedding,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Embedding {
    Floats(Vec<f32>),
    Base64(String),
}

#[derive(Serialize)]
struct Usage {
    prompt_tokens: u64,
    total_tokens: u64,
}

/// A `batchEmbedContents` answer in OpenAI's shape; `None` when it does not
/// read.
pub fn answer(body: &[u8], a: &Answer) -> Option<Vec<u8>> {
    let out: Out = serde_json::from_slice(body).ok()?;
    list(
        out.embeddings.into_iter().map(|e| e.values).collect(),
        a,
        a.prompt_tokens,
    )
}

/// Vectors as OpenAI's embeddings list, floats or base64 as the client
/// asked, with `prompt_tokens` as the usage.
pub(crate) fn list(vectors: Vec<Vec<f32>>, a: &Answer, prompt_tokens: u64) -> Option<Vec<u8>> {
    let data = vectors
        .into_iter()
        .enumerate()
        .map(|(index, values)| Item {
            object: "embedding",
            index,
            embedding: if a.base64 {
                let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
                Embedding::Base64(base64(&bytes))
            } else {
                Embedding::Floats(values)
            },
        })
        .collect();
    serde_json::to_vec(&List {
        object: "list",
        data,
        model: &a.model,
        usage: Usage {
            prompt_tokens,
            total_tokens: prompt_tokens,
        },
    })
    .ok()
}

/// Standard base64 with padding (RFC 4648), for the vectors: a few lines
/// on the answer's path rather than a dependency.
fn base64(bytes: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let sym = |n: u32, shift: u32| {
        char::from(T.get(((n >> shift) & 63) as usize).copied().unwrap_or(b'A'))
    };
    let mut out = String::with_capacity(bytes.len().div_ceil(3).saturating_mul(4));
    for c in bytes.chunks(3) {
        let b = |i: usize| u32::from(c.get(i).copied().unwrap_or(0));
        let n = (b(0) << 16) | (b(1) << 8) | b(2);
        out.push(sym(n, 18));
        out.push(sym(n, 12));
        out.push(if c.len() > 1 { sym(n, 6) } else { '=' });
        out.push(if c.len() > 2 { sym(n, 0) } else { '=' });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn base64_matches_the_rfc_vectors() {
        // RFC 4648, section 10.
        for (plain, encoded) in [
            ("", ""),
            ("f", "Zg=="),
            ("fo", "Zm8="),
            ("foo", "Zm9v"),
            ("foob", "Zm9vYg=="),
            ("fooba", "Zm9vYmE="),
            ("foobar", "Zm9vYmFy"),
        ] {
            assert_eq!(base64(plain.as_bytes()), encoded);
        }
    }

    #[test]
    fn inputs_become_one_request_each_and_vectors_come_back_in_either_encoding() {
        let client = br#"{"model":"emb","input":["hello world","abc"],"dimensions":3,"encoding_format":"base64","user":"u1"}"#;
        let body = request(client, "gemini-embedding-001").unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(
            v,
            json!({"requests": [
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "hello world"}]}, "outputDimensionality": 3},
                {"model": "models/gemini-embedding-001", "content": {"parts": [{"text": "abc"}]}, "outputDimensionality": 3}
            ]})
        );
        let a = answer_for(client, "emb");
        assert_eq!(
            a,
            Answer {
                base64: true,
                prompt_tokens: 3 + 1,
                model: "emb".into()
            }
        );
        let gemini = br#"{"embeddings":[{"values":[1.0,-0.5,0.25]},{"values":[0,0,1]}]}"#;
        let out: Value = serde_json::from_slice(&answer(gemini, &a).unwrap()).unwrap();
        assert_eq!(out["object"], "list");
        assert_eq!(out["model"], "emb");
        assert_eq!(out["usage"], json!({"prompt_tokens": 4, "total_tokens": 4}));
        let first = out["data"][0]["embedding"].as_str().unwrap();
        let bytes: Vec<u8> = [1.0f32, -0.5, 0.25]
            .iter()
            .flat_map(|f| f.to_le_bytes())
            .collect();
        assert_eq!(first, base64(&bytes));
        assert_eq!(out["data"][1]["index"], 1);
        let floats = Answer { base64: false, ..a };
        let out: Value = serde_json::from_slice(&answer(gemini, &floats).unwrap()).unwrap();
        assert_eq!(out["data"][0]["embedding"], json!([1.0, -0.5, 0.25]));
        assert_eq!(answer(b"{\"candidates\":[]}", &floats), None);
    }

    #[test]
    fn what_gemini_cannot_embed_is_refused_clearly() {
        for (body, says) in [
            (r#"{"model":"e","input":[[1,2,3]]}"#, "token arrays"),
            (
                r#"{"model":"e","input":7}"#,
                "string or an array of strings",
            ),
            (
                r#"{"model":"e","input":"x","encoding_format":"int8"}"#,
                "not one of float, base64",
            ),
            (r#"{"model":"e","input":"x","dimensions":0}"#, "at least 1"),
        ] {
            let e = request(body.as_bytes(), "g").unwrap_err();
            assert_eq!(e.status, 400);
            assert!(e.message.contains(says), "{body}: {}", e.message);
        }
    }
}
