//! OpenAI's embeddings (`POST /v1/embeddings`) to Bedrock's InvokeModel
//! (`/model/{id}/invoke`) for the two embedding families it serves, told
//! apart by the model id:
//!
//! - Amazon Titan Text Embeddings (`amazon.titan-embed-*`): one text per
//!   request (`inputText`), `dimensions` as is; its answer's
//!   `inputTextTokenCount` is the usage.
//! - Cohere Embed (`cohere.embed-*`): up to 96 texts (`texts`, with
//!   `input_type: search_document` and float embeddings), `dimensions` as
//!   `output_dimension`; Cohere reports no token count, so the usage is the
//!   gateway's estimate (4 characters a token, as for Gemini).
//!
//! The vectors go back as floats or base64, as the client asked.

use crate::error::GatewayError;
use crate::providers::gemini::embeddings::{self as common, Answer};
use serde::{Deserialize, Serialize};

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

/// The embedding family of a model id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Titan,
    Cohere,
}

pub fn family(model_id: &str) -> Option<Family> {
    // Cross-region inference profiles prefix the id (`us.cohere.embed-...`).
    let id = model_id.to_ascii_lowercase();
    if id.contains("amazon.titan-embed") {
        Some(Family::Titan)
    } else if id.contains("cohere.embed") {
        Some(Family::Cohere)
    } else {
        None
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Titan<'a> {
    input_text: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    dimensions: Option<u32>,
}

#[derive(Serialize)]
struct Cohere<'a> {
    texts: Vec<&'a str>,
    input_type: &'static str,
    embedding_types: [&'static str; 1],
    #[serde(skip_serializing_if = "Option::is_none")]
    output_dimension: Option<u32>,
}

/// The InvokeModel body for an embeddings request.
pub fn request(body: &[u8], model_id: &str) -> Result<Vec<u8>, GatewayError> {
    let req = common::read(body)?;
    let texts = common::texts_for(&req.input, "AWS Bedrock")?;
    let out = match family(model_id) {
        Some(Family::Titan) => {
            let [text] = texts.as_slice() else {
                return Err(bad(format!(
                    "Titan embeds one text per request: send `input` as one string ({} given), or use a Cohere embedding model for batches.",
                    texts.len()
                )));
            };
            serde_json::to_vec(&Titan {
                input_text: text,
                dimensions: req.dimensions,
            })
        }
        Some(Family::Cohere) => {
            if texts.is_empty() || texts.len() > 96 {
                return Err(bad(format!(
                    "Cohere embeds 1 to 96 texts per request ({} given).",
                    texts.len()
                )));
            }
            serde_json::to_vec(&Cohere {
                texts,
                input_type: "search_document",
                embedding_types: ["float"],
                output_dimension: req.dimensions,
            })
        }
        None => {
            return Err(bad(format!(
                "`{model_id}` is not an embedding model this gateway knows on AWS Bedrock (amazon.titan-embed-* or cohere.embed-*)."
            )))
        }
    };
    out.map_err(|e| GatewayError::internal(format!("embeddings request: {e}")))
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct TitanOut {
    embedding: Vec<f32>,
    #[serde(default)]
    input_text_token_count: Option<u64>,
}

/// Cohere's vectors: a list (`embeddings_floats`) or by type
/// (`embeddings_by_type`).
#[derive(Deserialize)]
#[serde(untagged)]
enum CohereVectors {
    Floats(Vec<Vec<f32>>),
    ByType { float: Vec<Vec<f32>> },
}

#[derive(Deserialize)]
struct CohereOut {
    embeddings: CohereVectors,
}

/// An InvokeModel embeddings answer in OpenAI's shape; `None` when it does
/// not read as either family's.
pub fn answer(body: &[u8], a: &Answer) -> Option<Vec<u8>> {
    if let Ok(t) = serde_json::from_slice::<TitanOut>(body) {
        let tokens = t.input_text_token_count.unwrap_or(a.prompt_tokens);
        return common::list(vec![t.embedding], a, tokens);
    }
    let c: CohereOut = serde_json::from_slice(body).ok()?;
    let vectors = match c.embeddings {
        CohereVectors::Floats(v) | CohereVectors::ByType { float: v } => v,
    };
    common::list(vectors, a, a.prompt_tokens)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    fn body(v: Value) -> Vec<u8> {
        v.to_string().into_bytes()
    }

    #[test]
    fn titan_takes_one_text_and_cohere_a_batch() {
        let titan = "amazon.titan-embed-text-v2:0";
        let got: Value = serde_json::from_slice(
            &request(
                &body(json!({"model": "e", "input": "hi", "dimensions": 256})),
                titan,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(got, json!({"inputText": "hi", "dimensions": 256}));
        let e = request(&body(json!({"model": "e", "input": ["a", "b"]})), titan).unwrap_err();
        assert!(e.message.contains("one text per request"), "{}", e.message);
        let cohere = "us.cohere.embed-v4:0";
        let got: Value = serde_json::from_slice(
            &request(
                &body(json!({"model": "e", "input": ["a", "b"], "dimensions": 512})),
                cohere,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            got,
            json!({"texts": ["a", "b"], "input_type": "search_document", "embedding_types": ["float"], "output_dimension": 512})
        );
        for (input, says) in [
            (json!([[1, 2]]), "token arrays"),
            (json!(vec!["x"; 97]), "1 to 96 texts"),
        ] {
            let e = request(&body(json!({"model": "e", "input": input})), cohere).unwrap_err();
            assert!(e.message.contains(says), "{}", e.message);
        }
        let e = request(&body(json!({"model": "e", "input": "x"})), "meta.llama3").unwrap_err();
        assert!(
            e.message.contains("not an embedding model"),
            "{}",
            e.message
        );
    }

    #[test]
    fn answers_become_openai_lists_with_each_familys_usage() {
        let a = Answer {
            base64: false,
            prompt_tokens: 7,
            model: "emb".into(),
        };
        let titan: Value = serde_json::from_slice(
            &answer(
                &body(json!({"embedding": [0.5, -1.0], "inputTextTokenCount": 3})),
                &a,
            )
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            titan,
            json!({"object": "list", "model": "emb", "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -1.0]}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3}})
        );
        for out in [
            json!({"embeddings": [[1.0], [2.0]], "response_type": "embeddings_floats"}),
            json!({"embeddings": {"float": [[1.0], [2.0]]}, "response_type": "embeddings_by_type"}),
        ] {
            let v: Value = serde_json::from_slice(&answer(&body(out), &a).unwrap()).unwrap();
            assert_eq!(v["data"][1]["embedding"], json!([2.0]));
            assert_eq!(v["usage"]["prompt_tokens"], 7, "the estimate");
        }
        let b64 = Answer { base64: true, ..a };
        let v: Value =
            serde_json::from_slice(&answer(&body(json!({"embedding": [1.0]})), &b64).unwrap())
                .unwrap();
        // 1.0f32 little-endian: 00 00 80 3f.
        assert_eq!(v["data"][0]["embedding"], "AACAPw==");
        assert!(answer(b"{}", &b64).is_none());
    }
}
