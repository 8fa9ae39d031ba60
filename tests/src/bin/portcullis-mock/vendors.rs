//! The mock's content-safety vendors, each written from the vendor's public
//! API reference (the table in `tests/MOCK.md`): it refuses what the vendor
//! refuses (a wrong or missing key or signature, a missing field, a text
//! over the vendor's limit) and answers the vendor's whole documented
//! object. What it finds in a text:
//! - an e-mail address: personal data (Bedrock's `ANONYMIZED` PII entity,
//!   Model Armor's sensitive-data finding, Lakera's `pii/email` payload,
//!   Presidio's `EMAIL_ADDRESS`);
//! - `vendor:block`: harmful content (Bedrock's `VIOLENCE` filter, Azure's
//!   `Violence` severity 6, Model Armor's `dangerous` RAI filter, Lakera's
//!   `moderated_content/violence`, Presidio's `CRYPTO`-like `BLOCKWORD`);
//! - `vendor:attack`: a prompt attack (Prompt Shields, Lakera, Model
//!   Armor's `pi_and_jailbreak`);
//! - `vendor:slow` (2 s late), `vendor:wait` (400 ms late), `vendor:500`,
//!   `vendor:garbage` (not JSON), `vendor:shape` (JSON of another shape).
//!
//! Every request is logged (`/__mock/requests`) with its path and body.

use super::{json_response, Body, State};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::Arc;

/// Whether a path is one of the vendors'.
pub fn is_vendor(path: &str) -> bool {
    (path.starts_with("/guardrail/") && path.ends_with("/apply"))
        || path.starts_with("/contentsafety/")
        || (path.starts_with("/v1/projects/") && path.contains("/templates/"))
        || path == "/v2/guard"
        || path == "/analyze"
}

/// The e-mail addresses in a text: byte ranges.
fn emails(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut start = None;
    let bytes = text.as_bytes();
    let word = |b: u8| b.is_ascii_alphanumeric() || b"._%+-@".contains(&b);
    for i in 0..=bytes.len() {
        let inside = bytes.get(i).is_some_and(|&b| word(b));
        match (inside, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                let w = &text[s..i];
                let w = w.trim_end_matches('.');
                if let Some((user, domain)) = w.split_once('@') {
                    if !user.is_empty() && domain.contains('.') && !domain.ends_with('.') {
                        out.push((s, s + w.len()));
                    }
                }
                start = None;
            }
            _ => {}
        }
    }
    out
}

fn chars_at(text: &str, byte: usize) -> usize {
    text[..byte].chars().count()
}

/// A fault the text asks for, before any answer.
async fn fault(texts: &[String]) -> Option<Response<Body>> {
    let any = |w: &str| texts.iter().any(|t| t.contains(w));
    if any("vendor:slow") {
        tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    }
    if any("vendor:wait") {
        tokio::time::sleep(std::time::Duration::from_millis(400)).await;
    }
    if any("vendor:500") {
        return Some(json_response(
            500,
            &json!({"error": "mock vendor: internal error"}),
        ));
    }
    if any("vendor:garbage") {
        return Some(
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(
                    Full::new(Bytes::from_static(b"<html>not json"))
                        .map_err(|never| match never {})
                        .boxed(),
                )
                .expect("a valid response"),
        );
    }
    if any("vendor:shape") {
        return Some(json_response(200, &json!({"unexpected": true})));
    }
    None
}

pub async fn serve(state: Arc<State>, req: Request<Incoming>) -> Result<Response<Body>, io::Error> {
    let (path, query, headers, body, parsed) = super::read_logged(&state, req).await?;
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let bearer_ok = || match &state.api_key {
        Some(k) => header("authorization") == Some(format!("Bearer {k}").as_str()),
        None => true,
    };
    if path.starts_with("/guardrail/") {
        if let Some(aws) = &state.aws {
            if let Err(refusal) = super::bedrock::verify(aws, &path, &query, &headers, &body) {
                return Ok(*refusal);
            }
        }
        return Ok(bedrock(&parsed).await);
    }
    if path.starts_with("/contentsafety/") {
        if let Some(k) = &state.api_key {
            if header("ocp-apim-subscription-key") != Some(k.as_str()) {
                return Ok(json_response(
                    401,
                    &json!({"error": {"code": "401", "message": "Access denied due to invalid subscription key or wrong API endpoint. Make sure to provide a valid key for an active subscription and use a correct regional API endpoint for your resource."}}),
                ));
            }
        }
        if !query.split('&').any(|p| p.starts_with("api-version=")) {
            return Ok(json_response(
                404,
                &json!({"error": {"code": "404", "message": "Resource not found"}}),
            ));
        }
        return Ok(if path.ends_with("text:analyze") {
            azure_analyze(&parsed).await
        } else if path.ends_with("text:shieldPrompt") {
            azure_shields(&parsed).await
        } else {
            json_response(
                404,
                &json!({"error": {"code": "404", "message": "Resource not found"}}),
            )
        });
    }
    if path.starts_with("/v1/projects/") {
        if !bearer_ok() {
            return Ok(json_response(
                401,
                &json!({"error": {"code": 401, "message": "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.", "status": "UNAUTHENTICATED"}}),
            ));
        }
        return Ok(model_armor(&path, &parsed).await);
    }
    if path == "/v2/guard" {
        if !bearer_ok() {
            return Ok(json_response(
                401,
                &json!({"error": "Unauthorized", "message": "Invalid API key"}),
            ));
        }
        return Ok(lakera(&parsed).await);
    }
    Ok(presidio(&parsed).await)
}

fn aws_validation(message: &str) -> Response<Body> {
    let mut r = json_response(400, &json!({"message": message}));
    if let Ok(v) = hyper::header::HeaderValue::from_str("ValidationException") {
        r.headers_mut().insert("x-amzn-errortype", v);
    }
    r
}

/// `ApplyGuardrail`: `source` and `content` (text blocks) are required.
async fn bedrock(b: &Value) -> Response<Body> {
    if !matches!(b["source"].as_str(), Some("INPUT" | "OUTPUT")) {
        return aws_validation("1 validation error detected: Value at 'source' failed to satisfy constraint: Member must satisfy enum value set: [INPUT, OUTPUT]");
    }
    let Some(content) = b["content"].as_array().filter(|c| !c.is_empty()) else {
        return aws_validation("1 validation error detected: Value at 'content' failed to satisfy constraint: Member must not be null");
    };
    let mut texts = Vec::new();
    for c in content {
        match c["text"]["text"].as_str() {
            Some(t) => texts.push(t.to_string()),
            None => return aws_validation("The content block must have a text member with text."),
        }
    }
    if let Some(r) = fault(&texts).await {
        return r;
    }
    let mut pii = Vec::new();
    let mut filters = Vec::new();
    let mut outputs = Vec::new();
    for t in &texts {
        let mut masked = t.clone();
        for &(s, e) in emails(t).iter().rev() {
            pii.push(json!({"match": &t[s..e], "type": "EMAIL", "action": "ANONYMIZED", "detected": true}));
            masked.replace_range(s..e, "{EMAIL}");
        }
        if t.contains("vendor:block") {
            filters.push(json!({"type": "VIOLENCE", "confidence": "HIGH", "filterStrength": "HIGH", "action": "BLOCKED", "detected": true}));
        }
        outputs.push(json!({"text": masked}));
    }
    let chars: usize = texts.iter().map(|t| t.chars().count()).sum();
    let intervened = !pii.is_empty() || !filters.is_empty();
    let mut assessment = json!({});
    if !filters.is_empty() {
        assessment["contentPolicy"] = json!({"filters": filters});
    }
    if !pii.is_empty() {
        assessment["sensitiveInformationPolicy"] = json!({"piiEntities": pii, "regexes": []});
    }
    let outputs = if !intervened {
        Vec::new()
    } else if !filters.is_empty() {
        vec![json!({"text": "Sorry, the model cannot answer this question."})]
    } else {
        outputs
    };
    json_response(
        200,
        &json!({
            "usage": {"topicPolicyUnits": 1, "contentPolicyUnits": 1, "wordPolicyUnits": 1, "sensitiveInformationPolicyUnits": 1, "sensitiveInformationPolicyFreeUnits": 0, "contextualGroundingPolicyUnits": 0},
            "action": if intervened { "GUARDRAIL_INTERVENED" } else { "NONE" },
            "actionReason": if intervened { "Guardrail blocked." } else { "No action." },
            "outputs": outputs,
            "assessments": [assessment],
            "guardrailCoverage": {"textCharacters": {"guarded": chars, "total": chars}},
        }),
    )
}

fn azure_bad(message: &str) -> Response<Body> {
    json_response(
        400,
        &json!({"error": {"code": "InvalidRequestBody", "message": message}}),
    )
}

/// `text:analyze`: `text` (at most 10,000 characters).
async fn azure_analyze(b: &Value) -> Response<Body> {
    let Some(text) = b["text"].as_str() else {
        return azure_bad("The request body is invalid: text is required.");
    };
    if text.chars().count() > 10_000 {
        return azure_bad("The text is too long: at most 10000 characters are allowed.");
    }
    if let Some(r) = fault(&[text.to_string()]).await {
        return r;
    }
    let violence = if text.contains("vendor:block") { 6 } else { 0 };
    json_response(
        200,
        &json!({
            "blocklistsMatch": [],
            "categoriesAnalysis": [
                {"category": "Hate", "severity": 0},
                {"category": "SelfHarm", "severity": 0},
                {"category": "Sexual", "severity": 0},
                {"category": "Violence", "severity": violence},
            ],
        }),
    )
}

/// `text:shieldPrompt`: `userPrompt` and/or `documents`.
async fn azure_shields(b: &Value) -> Response<Body> {
    let user = b["userPrompt"].as_str();
    let docs: Option<Vec<String>> = b["documents"].as_array().map(|d| {
        d.iter()
            .filter_map(|x| x.as_str().map(String::from))
            .collect()
    });
    if user.is_none() && docs.is_none() {
        return azure_bad("The request body is invalid: userPrompt or documents is required.");
    }
    let total: usize = user.map_or(0, |u| u.chars().count())
        + docs
            .iter()
            .flatten()
            .map(|d| d.chars().count())
            .sum::<usize>();
    if total > 10_000 {
        return azure_bad("The text is too long: at most 10000 characters are allowed.");
    }
    let mut all: Vec<String> = docs.clone().unwrap_or_default();
    all.extend(user.map(String::from));
    if let Some(r) = fault(&all).await {
        return r;
    }
    let mut out = json!({
        "userPromptAnalysis": {"attackDetected": user.is_some_and(|u| u.contains("vendor:attack"))},
    });
    out["documentsAnalysis"] = json!(docs
        .unwrap_or_default()
        .iter()
        .map(|d| json!({"attackDetected": d.contains("vendor:attack")}))
        .collect::<Vec<_>>());
    json_response(200, &out)
}

fn google_bad(message: &str) -> Response<Body> {
    json_response(
        400,
        &json!({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}),
    )
}

/// `:sanitizeUserPrompt` (`userPromptData.text`) and
/// `:sanitizeModelResponse` (`modelResponseData.text`).
async fn model_armor(path: &str, b: &Value) -> Response<Body> {
    let text = if path.ends_with(":sanitizeUserPrompt") {
        b["userPromptData"]["text"].as_str()
    } else if path.ends_with(":sanitizeModelResponse") {
        b["modelResponseData"]["text"].as_str()
    } else {
        return json_response(
            404,
            &json!({"error": {"code": 404, "message": "Method not found.", "status": "NOT_FOUND"}}),
        );
    };
    let Some(text) = text else {
        return google_bad("Invalid value: the data item's text is required.");
    };
    if let Some(r) = fault(&[text.to_string()]).await {
        return r;
    }
    let state = |m: bool| if m { "MATCH_FOUND" } else { "NO_MATCH_FOUND" };
    let found = emails(text);
    let findings: Vec<Value> = found
        .iter()
        .map(|&(s, e)| {
            json!({"infoType": "EMAIL_ADDRESS", "likelihood": "VERY_LIKELY", "location": {
                "byteRange": {"start": s.to_string(), "end": e.to_string()},
                "codepointRange": {"start": chars_at(text, s).to_string(), "end": chars_at(text, e).to_string()},
            }})
        })
        .collect();
    let dangerous = text.contains("vendor:block");
    let attack = text.contains("vendor:attack");
    let any = dangerous || attack || !found.is_empty();
    json_response(
        200,
        &json!({"sanitizationResult": {
            "filterMatchState": state(any),
            "invocationResult": "SUCCESS",
            "filterResults": {
                "rai": {"raiFilterResult": {"executionState": "EXECUTION_SUCCESS", "matchState": state(dangerous), "raiFilterTypeResults": {
                    "dangerous": {"confidenceLevel": if dangerous { "HIGH" } else { "LOW_AND_ABOVE" }, "matchState": state(dangerous)},
                    "harassment": {"matchState": "NO_MATCH_FOUND"},
                    "hate_speech": {"matchState": "NO_MATCH_FOUND"},
                    "sexually_explicit": {"matchState": "NO_MATCH_FOUND"},
                }}},
                "pi_and_jailbreak": {"piAndJailbreakFilterResult": {"executionState": "EXECUTION_SUCCESS", "matchState": state(attack)}},
                "sdp": {"sdpFilterResult": {"inspectResult": {"executionState": "EXECUTION_SUCCESS", "matchState": state(!found.is_empty()), "findings": findings}}},
                "malicious_uris": {"maliciousUriFilterResult": {"executionState": "EXECUTION_SUCCESS", "matchState": "NO_MATCH_FOUND"}},
                "csam": {"csamFilterFilterResult": {"executionState": "EXECUTION_SUCCESS", "matchState": "NO_MATCH_FOUND"}},
            },
        }}),
    )
}

/// `/v2/guard`: `messages` (role and content) required.
async fn lakera(b: &Value) -> Response<Body> {
    let Some(msgs) = b["messages"].as_array().filter(|m| !m.is_empty()) else {
        return json_response(
            400,
            &json!({"error": "Bad Request", "message": "messages: field required"}),
        );
    };
    let mut texts = Vec::new();
    for m in msgs {
        match (m["role"].as_str(), m["content"].as_str()) {
            (Some("system" | "user" | "assistant"), Some(c)) => texts.push(c.to_string()),
            _ => {
                return json_response(
                    400,
                    &json!({"error": "Bad Request", "message": "messages: each message needs a role (system, user, assistant) and content"}),
                )
            }
        }
    }
    if let Some(r) = fault(&texts).await {
        return r;
    }
    let project = b["project_id"].as_str().unwrap_or("project-default");
    let mut payload = Vec::new();
    let (mut attack, mut violence, mut pii) = (false, false, false);
    for (i, t) in texts.iter().enumerate() {
        for (s, e) in emails(t) {
            pii = true;
            payload.push(json!({"start": chars_at(t, s), "end": chars_at(t, e), "text": &t[s..e], "detector_type": "pii/email", "labels": [], "message_id": i}));
        }
        attack |= t.contains("vendor:attack");
        violence |= t.contains("vendor:block");
    }
    let detector = |kind: &str, on: bool| json!({"project_id": project, "policy_id": "policy-mock", "detector_id": format!("detector-{kind}"), "detector_type": kind, "detected": on, "message_id": 0});
    let mut out = json!({
        "flagged": attack || violence || pii,
        "metadata": {"request_uuid": "00000000-0000-4000-8000-000000000000"},
    });
    if b["breakdown"] == json!(true) {
        out["breakdown"] = json!([
            detector("prompt_attack", attack),
            detector("moderated_content/violence", violence),
            detector("pii/email", pii),
        ]);
    }
    if b["payload"] == json!(true) {
        out["payload"] = json!(payload);
    }
    json_response(200, &out)
}

/// Presidio's analyzer: `text` and `language` required; entities with
/// character offsets.
async fn presidio(b: &Value) -> Response<Body> {
    let (Some(text), Some(lang)) = (b["text"].as_str(), b["language"].as_str()) else {
        return json_response(400, &json!({"error": "No text provided"}));
    };
    if lang != "en" {
        return json_response(
            500,
            &json!({"error": format!("No matching recognizers were found to serve the request for language {lang}")}),
        );
    }
    if let Some(r) = fault(&[text.to_string()]).await {
        return r;
    }
    let wanted = |e: &str| {
        b["entities"]
            .as_array()
            .is_none_or(|l| l.iter().any(|x| x.as_str() == Some(e)))
    };
    let mut out = Vec::new();
    if wanted("EMAIL_ADDRESS") {
        for (s, e) in emails(text) {
            out.push(json!({"entity_type": "EMAIL_ADDRESS", "start": chars_at(text, s), "end": chars_at(text, e), "score": 1.0, "analysis_explanation": null, "recognition_metadata": {"recognizer_name": "EmailRecognizer", "recognizer_identifier": "EmailRecognizer_1"}}));
        }
    }
    json_response(200, &json!(out))
}
