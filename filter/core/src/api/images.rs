//! OpenAI's images: `POST /v1/images/generations` (JSON: `model`,
//! `prompt`, `n`, `size`, `quality`, `response_format`, ...) and
//! `POST /v1/images/edits` (multipart: one or more `image` files, an
//! optional `mask`, `prompt`, `model`, `n`, `size`, `quality`). Never
//! streamed by the gateway. Priced per image by size and quality
//! (`price.per_image`), and by tokens when the answer reports `usage`
//! (`gpt-image-1`'s). Served by OpenAI-compatible and Azure OpenAI
//! providers (Azure's deployment path).

use super::Units;
use crate::error::GatewayError;
use serde_json::{Map, Value};

pub const GENERATIONS: &str = "/v1/images/generations";
pub const EDITS: &str = "/v1/images/edits";

/// Images one request may ask for (OpenAI's bound).
const MAX_N: u64 = 10;

/// A field that may come as a JSON number or, in a multipart body, as
/// text.
pub(crate) fn number(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A text field (`size`, `quality`), if given.
fn text<'a>(doc: &'a Map<String, Value>, key: &str) -> &'a str {
    doc.get(key).and_then(Value::as_str).unwrap_or("")
}

/// The body's checks (a non-empty `prompt`, `n` in 1..=10) and its units:
/// the images it asks for, with their size and quality.
pub fn units(doc: &Map<String, Value>) -> Result<Units, GatewayError> {
    match doc.get("prompt") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(_) => {
            return Err(GatewayError::bad_request(
                "invalid_prompt",
                "`prompt` must be a non-empty string.",
            ))
        }
        None => {
            return Err(GatewayError::bad_request(
                "missing_prompt",
                "Missing required parameter: `prompt`.",
            ))
        }
    }
    let n = match doc.get("n") {
        None | Some(Value::Null) => 1,
        Some(v) => number(v)
            .filter(|n| (1..=MAX_N).contains(n))
            .ok_or_else(|| {
                GatewayError::bad_request(
                    "invalid_n",
                    format!("`n` must be an integer from 1 to {MAX_N}."),
                )
            })?,
    };
    Ok(Units {
        count: n,
        image: Some(crate::units::ImageKey::of(
            text(doc, "quality"),
            text(doc, "size"),
        )),
    })
}
