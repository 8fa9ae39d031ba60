//! The mock's Gemini mode: `POST <prefix>/models/<model>:generateContent`
//! and `:streamGenerateContent?alt=sse` check what Google's Gemini API
//! checks (the table in `tests/MOCK.md`: the key in `x-goog-api-key`, known
//! fields, non-empty `contents`, the roles `user` and `model`, parts with
//! exactly one kind of data, function responses with a name and one per
//! call of the turn before, and, as the Gemini 3 models do, the thought
//! signature it gave the first call of each of its turns sent back on that
//! call) and answer with real-shaped answers, SSE
//! streams (each event a partial answer, the last with `finishReason` and
//! the usage), usage (`usageMetadata`) and errors
//! (`{"error":{"code","message","status"}}`). `:batchEmbedContents`
//! checks its requests (each naming the path's model, text parts) and
//! answers each with a deterministic vector.

use super::{json_response, Body, State, Step};
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;

fn error(code: u16, status: &str, message: &str) -> Response<Body> {
    json_response(
        code,
        &json!({"error": {"code": code, "message": message, "status": status}}),
    )
}

const FIELDS: &[&str] = &[
    "contents",
    "systemInstruction",
    "tools",
    "toolConfig",
    "generationConfig",
    "safetySettings",
    "cachedContent",
    "labels",
];

const CONFIG_FIELDS: &[&str] = &[
    "maxOutputTokens",
    "temperature",
    "topP",
    "topK",
    "stopSequences",
    "candidateCount",
    "seed",
    "presencePenalty",
    "frequencyPenalty",
    "responseMimeType",
    "responseSchema",
    "responseJsonSchema",
    "thinkingConfig",
    "responseLogprobs",
    "logprobs",
];

/// The data members a part may carry (exactly one).
const PART_DATA: &[&str] = &[
    "text",
    "inlineData",
    "fileData",
    "functionCall",
    "functionResponse",
    "executableCode",
    "codeExecutionResult",
];

/// How the thought signatures the mock gives its calls begin (base64-like
/// text, as Gemini's are).
const SIGNATURE: &str = "bW9jay1zaWc";

fn unknown(at: &str, name: &str) -> String {
    format!("Invalid JSON payload received. Unknown name \"{name}\" at '{at}': Cannot find field.")
}

/// What the real endpoint would refuse, in its words.
fn check(req: &Value) -> Result<(), String> {
    let Some(fields) = req.as_object() else {
        return Err("Invalid JSON payload received.".into());
    };
    if let Some(extra) = fields.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(unknown("", extra));
    }
    if let Some(c) = req.get("generationConfig").and_then(Value::as_object) {
        if let Some(extra) = c.keys().find(|k| !CONFIG_FIELDS.contains(&k.as_str())) {
            return Err(unknown("generation_config", extra));
        }
    }
    let contents = req
        .get("contents")
        .and_then(Value::as_array)
        .filter(|c| !c.is_empty())
        .ok_or("* GenerateContentRequest.contents: contents is not specified")?;
    if let Some(parts) = req
        .pointer("/systemInstruction/parts")
        .and_then(Value::as_array)
    {
        if parts
            .iter()
            .any(|p| !p.get("text").is_some_and(Value::is_string))
        {
            return Err(
                "* GenerateContentRequest.system_instruction: only text parts are supported".into(),
            );
        }
    }
    for (i, d) in req
        .pointer("/tools/0/functionDeclarations")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        if d.get("name")
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(format!("* GenerateContentRequest.tools[0].function_declarations[{i}].name: Name cannot be empty."));
        }
        if d.get("parameters").is_some() && d.get("parametersJsonSchema").is_some() {
            return Err(format!("* GenerateContentRequest.tools[0].function_declarations[{i}]: parameters and parameters_json_schema are mutually exclusive."));
        }
    }
    let mut calls_before = 0usize;
    for (i, c) in contents.iter().enumerate() {
        let role = c.get("role").and_then(Value::as_str).unwrap_or("user");
        if role != "user" && role != "model" {
            return Err("Please use a valid role: user, model.".into());
        }
        let parts = c
            .get("parts")
            .and_then(Value::as_array)
            .filter(|p| !p.is_empty())
            .ok_or_else(|| format!("* GenerateContentRequest.contents[{i}].parts: contents.parts must not be empty."))?;
        let mut calls = 0usize;
        let mut responses = 0usize;
        if role == "model" {
            if let Some(first) = parts.iter().find(|p| p.get("functionCall").is_some()) {
                let signed = first
                    .get("thoughtSignature")
                    .and_then(Value::as_str)
                    .is_some_and(|s| s.starts_with(SIGNATURE));
                if !signed {
                    return Err(format!("Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:{}` , position {}.", first.pointer("/functionCall/name").and_then(Value::as_str).unwrap_or(""), i + 1));
                }
            }
        }
        for (j, p) in parts.iter().enumerate() {
            let data: Vec<&str> = PART_DATA
                .iter()
                .copied()
                .filter(|k| p.get(*k).is_some())
                .collect();
            if data.len() != 1 {
                return Err(format!("* GenerateContentRequest.contents[{i}].parts[{j}].data: required oneof field 'data' must have one initialized field"));
            }
            match data.first().copied() {
                Some("functionCall") => calls += 1,
                Some("functionResponse") => {
                    if p.pointer("/functionResponse/name")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty)
                    {
                        return Err(format!("* GenerateContentRequest.contents[{i}].parts[{j}].function_response.name: Name cannot be empty."));
                    }
                    responses += 1;
                }
                Some("inlineData")
                    if !p
                        .pointer("/inlineData/mimeType")
                        .is_some_and(Value::is_string) =>
                {
                    return Err(format!("* GenerateContentRequest.contents[{i}].parts[{j}].inline_data.mime_type: mime_type is required."));
                }
                _ => {}
            }
        }
        if responses > 0 && responses != calls_before {
            return Err("Please ensure that the number of function response parts is equal to the number of function call parts of the function call turn.".into());
        }
        calls_before = calls;
    }
    Ok(())
}

pub async fn generate(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let key = req
        .headers()
        .get("x-goog-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let bearer = req
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or("").to_string();
    let (logged_path, headers) = super::request_facts(&req);
    let (parsed, step) = super::receive(&state, &logged_path, headers, req.into_body()).await?;
    let Some((model, method)) = path
        .rsplit_once("/models/")
        .and_then(|(_, rest)| rest.split_once(':'))
    else {
        return Ok(error(404, "NOT_FOUND", "mock: no model in the path"));
    };
    let stream = match method {
        "generateContent" | "batchEmbedContents" | "countTokens" => false,
        "streamGenerateContent" if query.split('&').any(|q| q == "alt=sse") => true,
        "streamGenerateContent" => {
            return Ok(error(
                400,
                "INVALID_ARGUMENT",
                "mock: streams only as SSE (`alt=sse`)",
            ))
        }
        other => return Ok(error(404, "NOT_FOUND", &format!("mock: no method {other}"))),
    };
    // Gemini on Vertex AI: an OAuth access token, no API key.
    if path.contains("/publishers/google/models/") {
        if !super::live_token(&state, bearer.as_deref()) {
            return Ok(error(401, "UNAUTHENTICATED", "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential."));
        }
    } else {
        match (&state.api_key, key.as_deref()) {
        (Some(_), None) => {
            return Ok(error(403, "PERMISSION_DENIED", "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API."))
        }
        (Some(expected), Some(k)) if k != expected => {
            return Ok(error(400, "INVALID_ARGUMENT", "API key not valid. Please pass a valid API key."))
        }
        _ => {}
    }
    }
    if method == "countTokens" {
        return Ok(match count(&parsed, model) {
            Ok(v) => json_response(200, &v),
            Err(why) => error(400, "INVALID_ARGUMENT", &why),
        });
    }
    if method == "batchEmbedContents" {
        return Ok(match embed(&parsed, model) {
            Ok(v) => json_response(200, &v),
            Err(why) => error(400, "INVALID_ARGUMENT", &why),
        });
    }
    if let Err(why) = check(&parsed) {
        return Ok(error(400, "INVALID_ARGUMENT", &why));
    }
    match step.status.unwrap_or(200) {
        200 => {}
        429 => return Ok(error(429, "RESOURCE_EXHAUSTED", "mock: scripted quota")),
        503 => return Ok(error(503, "UNAVAILABLE", "mock: scripted overload")),
        s if s >= 500 => return Ok(error(s, "INTERNAL", "mock: scripted failure")),
        s => return Ok(error(s, "INVALID_ARGUMENT", "mock: scripted client error")),
    }
    answer(&state, &parsed, &step, model, stream)
}

fn answer(
    state: &State,
    req: &Value,
    step: &Step,
    model: &str,
    stream: bool,
) -> Result<Response<Body>, io::Error> {
    let text = step
        .content
        .clone()
        .unwrap_or_else(|| format!("Hello from {}! This is a mock message.", state.name));
    let tool = step
        .tool_call
        .clone()
        .filter(|_| req.get("tools").is_some_and(Value::is_array));
    let prompt = step.usage.map_or(10, |u| u.prompt_tokens);
    let output = step
        .usage
        .map_or(text.split_whitespace().count() as u64, |u| {
            u.completion_tokens
        });
    let mut usage = json!({"promptTokenCount": prompt, "candidatesTokenCount": output, "totalTokenCount": prompt + output});
    if let Some(c) = step.cache_read {
        usage["cachedContentTokenCount"] = json!(c);
    }
    let id = format!("mock-{}", state.hits.load(Ordering::Relaxed));
    let call = tool.as_ref().map(|t| {
        json!({"functionCall": {"name": t.name, "args": t.input},
            "thoughtSignature": format!("{SIGNATURE}+{}/==", state.hits.load(Ordering::Relaxed))})
    });
    if !stream {
        let mut parts = vec![json!({"text": text})];
        parts.extend(call);
        return Ok(json_response(
            200,
            &json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
                "usageMetadata": usage, "modelVersion": model, "responseId": id}),
        ));
    }
    let ev = |v: Value| bytes::Bytes::from(format!("data: {v}\r\n\r\n"));
    let words: Vec<&str> = text.split_inclusive(' ').collect();
    let mut events = Vec::new();
    for w in &words {
        events.push(ev(json!({"candidates": [{"content": {"role": "model", "parts": [{"text": w}]}, "index": 0}],
            "usageMetadata": {"promptTokenCount": prompt, "totalTokenCount": prompt}, "modelVersion": model, "responseId": id})));
    }
    if step.stream_error {
        events.push(ev(json!({"error": {"code": 503, "message": "mock: overloaded mid-stream", "status": "UNAVAILABLE"}})));
    } else {
        let parts: Vec<Value> = call.into_iter().collect();
        let mut last = json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": "STOP", "index": 0}],
            "usageMetadata": usage, "modelVersion": model, "responseId": id});
        if parts_empty(&last) {
            // Gemini's last event may carry no part; keep one empty text.
            last["candidates"][0]["content"]["parts"] = json!([{"text": ""}]);
        }
        events.push(ev(last));
    }
    super::event_stream(events, step, "text/event-stream")
}

/// `countTokens`: `contents` alone, or a `generateContentRequest` naming
/// the path's model and passing `generateContent`'s checks; the count is
/// one token a word of every text part, the system instruction's included.
fn count(req: &Value, model: &str) -> Result<Value, String> {
    let obj = req.as_object().ok_or("Invalid JSON payload received.")?;
    if let Some(k) = obj
        .keys()
        .find(|k| !["contents", "generateContentRequest"].contains(&k.as_str()))
    {
        return Err(unknown("", k));
    }
    let inner = match (obj.get("contents"), obj.get("generateContentRequest")) {
        (Some(c), None) => json!({"contents": c}),
        (None, Some(g)) => {
            let mut g = g.clone();
            let named = g
                .as_object_mut()
                .and_then(|o| o.remove("model"))
                .and_then(|m| m.as_str().map(str::to_string));
            if named.as_deref() != Some(&format!("models/{model}")) {
                return Err(format!(
                    "* CountTokensRequest.generate_content_request.model: the model must be models/{model}"
                ));
            }
            g
        }
        _ => return Err("* CountTokensRequest: exactly one of contents and generate_content_request is required".into()),
    };
    check(&inner)?;
    let words = |v: &Value| -> usize {
        v.as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .map(|t| t.split_whitespace().count())
            .sum()
    };
    let mut n: usize = inner["contents"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| words(&c["parts"]))
        .sum();
    n += words(&inner["systemInstruction"]["parts"]);
    Ok(json!({"totalTokens": n, "promptTokensDetails": [{"modality": "TEXT", "tokenCount": n}]}))
}

fn parts_empty(v: &Value) -> bool {
    v.pointer("/candidates/0/content/parts")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
}

/// `batchEmbedContents`: only `requests`, each with only Gemini's fields,
/// its `model` the one in the path (`models/<model>`), one or more text
/// parts, `outputDimensionality` above 0 when given; each answered with a
/// deterministic vector (8 values unless asked).
fn embed(req: &Value, model: &str) -> Result<Value, String> {
    let obj = req.as_object().ok_or("mock: the body is not an object")?;
    if let Some(k) = obj.keys().find(|k| *k != "requests") {
        return Err(unknown("", k));
    }
    let items = obj
        .get("requests")
        .and_then(Value::as_array)
        .filter(|a| !a.is_empty())
        .ok_or("* BatchEmbedContentsRequest.requests: contents is not specified")?;
    let want = format!("models/{model}");
    let mut out = Vec::new();
    for (i, r) in items.iter().enumerate() {
        let r = r.as_object().ok_or("mock: a request is not an object")?;
        const ONE: &[&str] = &[
            "model",
            "content",
            "taskType",
            "title",
            "outputDimensionality",
        ];
        if let Some(k) = r.keys().find(|k| !ONE.contains(&k.as_str())) {
            return Err(unknown(&format!("requests[{i}]"), k));
        }
        if r.get("model").and_then(Value::as_str) != Some(want.as_str()) {
            return Err(format!(
                "Model {} in requests[{i}] differs from the model in the URL ({want})",
                r.get("model").unwrap_or(&Value::Null)
            ));
        }
        let parts = r
            .get("content")
            .and_then(|c| c.get("parts"))
            .and_then(Value::as_array)
            .filter(|p| !p.is_empty())
            .ok_or(format!("* BatchEmbedContentsRequest.requests[{i}].content.parts: contents.parts must not be empty."))?;
        let text: String = parts
            .iter()
            .map(|p| {
                p.get("text")
                    .and_then(Value::as_str)
                    .ok_or(format!("mock: requests[{i}]: only text parts are embedded"))
            })
            .collect::<Result<Vec<_>, _>>()?
            .concat();
        let dims = match r.get("outputDimensionality") {
            None => 8,
            Some(d) => match d.as_u64().filter(|d| (1..=3072).contains(d)) {
                Some(d) => d as usize,
                None => {
                    return Err(format!(
                        "requests[{i}].outputDimensionality must be between 1 and 3072"
                    ))
                }
            },
        };
        out.push(json!({"values": super::embeddings::vector(&text, dims)}));
    }
    Ok(json!({"embeddings": out}))
}
