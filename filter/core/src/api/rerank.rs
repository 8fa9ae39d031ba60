//! Rerank, `POST /v1/rerank` (Jina's, vLLM's and Cohere's v1 shape) and
//! `POST /v2/rerank` (Cohere's v2): `model`, a non-empty `query`, a
//! non-empty `documents` array (strings, or objects with `text`), optional
//! `top_n`. Priced per search (`price.per_thousand_searches`: one per 100
//! documents, as Cohere bills) and by tokens when the answer's `usage`
//! counts them (Jina's, vLLM's). Served by OpenAI-compatible providers at
//! `{base_path}/rerank` (a Cohere provider's base path is `/v2`).

use super::Units;
use crate::error::GatewayError;
use serde_json::{Map, Value};

pub const PATH: &str = "/v1/rerank";
/// Cohere's v2 path, the same API.
pub const V2: &str = "/v2/rerank";

/// Documents one search unit covers (Cohere's billing).
const PER_SEARCH: u64 = 100;

/// The body's checks and its units (searches).
pub fn units(doc: &Map<String, Value>) -> Result<Units, GatewayError> {
    match doc.get("query") {
        Some(Value::String(s)) if !s.is_empty() => {}
        Some(_) => {
            return Err(GatewayError::bad_request(
                "invalid_query",
                "`query` must be a non-empty string.",
            ))
        }
        None => {
            return Err(GatewayError::bad_request(
                "missing_query",
                "Missing required parameter: `query`.",
            ))
        }
    }
    let docs = match doc.get("documents") {
        Some(Value::Array(d)) if !d.is_empty() => d.len() as u64,
        Some(_) => {
            return Err(GatewayError::bad_request(
                "invalid_documents",
                "`documents` must be a non-empty array of strings or of objects with `text`.",
            ))
        }
        None => {
            return Err(GatewayError::bad_request(
                "missing_documents",
                "Missing required parameter: `documents`.",
            ))
        }
    };
    Ok(Units {
        count: docs.div_ceil(PER_SEARCH),
        image: None,
    })
}
