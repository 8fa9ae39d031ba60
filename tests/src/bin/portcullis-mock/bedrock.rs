//! The mock's AWS Bedrock mode: `POST /model/<modelId>/converse` and
//! `/converse-stream`. It checks what Bedrock's runtime checks (the table
//! in `tests/MOCK.md`): a SigV4 `authorization` whose signature it
//! recomputes from the same secret (its own canonical request: the path's
//! segments encoded once more, the signed headers, the body's SHA-256), the
//! credential's key id, date, region and service, `x-amz-date` within five
//! minutes, `x-amz-content-sha256` equal to the body's hash, the session
//! token when it was started with one; then Converse's rules (known
//! fields, turns that start with `user` and alternate, content blocks with
//! one member, no blank text, tool blocks only with `toolConfig` and
//! results answering the turn before, image formats). It answers with
//! real-shaped answers (`output.message`, `stopReason`, `usage`), streams
//! in AWS's binary event-stream framing (each frame's prelude and message
//! CRC-32), and errors as `{"message"}` with `x-amzn-ErrorType`.
//!
//! The signature check here is written apart from the filter's signer
//! (`portcullis_core::credentials::sigv4`): a shared mistake would pass both, so the
//! filter's is also tested against AWS's published vectors.

use super::{json_response, Body, State, Step};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::{Request, Response};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use std::io;
use std::sync::Arc;

/// The credentials the mock accepts (`--aws-access-key-id`,
/// `--aws-secret-access-key`, `--aws-session-token`, `--aws-region`).
#[derive(Debug, Clone)]
pub struct Aws {
    pub access_key_id: String,
    pub secret: String,
    pub session_token: Option<String>,
    pub region: String,
}

fn aws_error(status: u16, kind: &str, message: &str) -> Response<Body> {
    let mut r = json_response(status, &json!({"message": message}));
    if let Ok(v) = hyper::header::HeaderValue::from_str(kind) {
        r.headers_mut().insert("x-amzn-errortype", v);
    }
    r
}

fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn hmac(key: &[u8], msg: &[u8]) -> Vec<u8> {
    let mut k = if key.len() > 64 {
        Sha256::digest(key).to_vec()
    } else {
        key.to_vec()
    };
    k.resize(64, 0);
    let ipad: Vec<u8> = k.iter().map(|b| b ^ 0x36).collect();
    let opad: Vec<u8> = k.iter().map(|b| b ^ 0x5c).collect();
    let inner = Sha256::new()
        .chain_update(&ipad)
        .chain_update(msg)
        .finalize();
    Sha256::new()
        .chain_update(&opad)
        .chain_update(inner)
        .finalize()
        .to_vec()
}

/// A path segment as SigV4 encodes it (the path as received, encoded once
/// more).
fn encode_segment(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Seconds since the epoch of `YYYYMMDDTHHMMSSZ`.
fn parse_amz_date(d: &str) -> Option<i64> {
    if d.len() != 16 || !d.ends_with('Z') || d.as_bytes().get(8) != Some(&b'T') {
        return None;
    }
    let n = |a: usize, b: usize| d.get(a..b)?.parse::<i64>().ok();
    let (y, m, day) = (n(0, 4)?, n(4, 6)?, n(6, 8)?);
    let (hh, mm, ss) = (n(9, 11)?, n(11, 13)?, n(13, 15)?);
    // Days from civil (proleptic Gregorian).
    let y2 = if m <= 2 { y - 1 } else { y };
    let era = y2.div_euclid(400);
    let yoe = y2 - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

fn refuse(status: u16, kind: &str, message: &str) -> Box<Response<Body>> {
    Box::new(aws_error(status, kind, message))
}

/// The signature check; `Err` is the answer AWS would give.
pub(super) fn verify(
    aws: &Aws,
    path: &str,
    query: &str,
    headers: &hyper::HeaderMap,
    body: &[u8],
) -> Result<(), Box<Response<Body>>> {
    let header = |n: &str| headers.get(n).and_then(|v| v.to_str().ok());
    let Some(auth) = header("authorization") else {
        return Err(refuse(
            403,
            "MissingAuthenticationTokenException",
            "Missing Authentication Token",
        ));
    };
    let incomplete = || {
        refuse(
            403,
            "IncompleteSignatureException",
            "Authorization header requires 'Credential', 'Signature' and 'SignedHeaders' parameters.",
        )
    };
    let rest = auth
        .strip_prefix("AWS4-HMAC-SHA256 ")
        .ok_or_else(incomplete)?;
    let mut credential = None;
    let mut signed = None;
    let mut signature = None;
    for part in rest.split(',').map(str::trim) {
        if let Some(v) = part.strip_prefix("Credential=") {
            credential = Some(v);
        } else if let Some(v) = part.strip_prefix("SignedHeaders=") {
            signed = Some(v);
        } else if let Some(v) = part.strip_prefix("Signature=") {
            signature = Some(v);
        }
    }
    let (Some(credential), Some(signed), Some(signature)) = (credential, signed, signature) else {
        return Err(incomplete());
    };
    let scope: Vec<&str> = credential.split('/').collect();
    let [key_id, date, region, service, terminator] = scope.as_slice() else {
        return Err(incomplete());
    };
    if *key_id != aws.access_key_id {
        return Err(refuse(
            403,
            "UnrecognizedClientException",
            "The security token included in the request is invalid.",
        ));
    }
    let amz_date = header("x-amz-date").unwrap_or("");
    let Some(at) = parse_amz_date(amz_date) else {
        return Err(refuse(
            403,
            "IncompleteSignatureException",
            "Authorization header requires existence of either a 'X-Amz-Date' or a 'Date' header.",
        ));
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    if (now - at).abs() > 300 {
        return Err(refuse(
            403,
            "InvalidSignatureException",
            &format!(
                "Signature expired: {amz_date} is now earlier or later than 5 minutes from now."
            ),
        ));
    }
    if !amz_date.starts_with(date)
        || *region != aws.region
        || *service != "bedrock"
        || *terminator != "aws4_request"
    {
        return Err(refuse(
            403,
            "InvalidSignatureException",
            &format!("Credential should be scoped to a valid region and service: {credential}"),
        ));
    }
    let names: Vec<&str> = signed.split(';').collect();
    if !names.contains(&"host") {
        return Err(refuse(
            403,
            "InvalidSignatureException",
            "'Host' must be a signed header.",
        ));
    }
    if let Some(token) = &aws.session_token {
        if header("x-amz-security-token") != Some(token.as_str())
            || !names.contains(&"x-amz-security-token")
        {
            return Err(refuse(
                403,
                "UnrecognizedClientException",
                "The security token included in the request is invalid.",
            ));
        }
    }
    let payload = sha256_hex(body);
    if let Some(claimed) = header("x-amz-content-sha256") {
        if claimed != payload {
            return Err(refuse(
                400,
                "ValidationException",
                "The provided 'x-amz-content-sha256' header does not match what was computed.",
            ));
        }
    }
    let canonical_path: Vec<String> = path.split('/').map(encode_segment).collect();
    let mut query_pairs: Vec<&str> = query.split('&').filter(|q| !q.is_empty()).collect();
    query_pairs.sort_unstable();
    let mut canonical = format!(
        "POST\n{}\n{}\n",
        canonical_path.join("/"),
        query_pairs.join("&")
    );
    for n in &names {
        let v = headers
            .get_all(*n)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .map(str::trim)
            .collect::<Vec<_>>()
            .join(",");
        canonical.push_str(&format!("{n}:{v}\n"));
    }
    canonical.push_str(&format!("\n{signed}\n{payload}"));
    let to_sign = format!(
        "AWS4-HMAC-SHA256\n{amz_date}\n{date}/{region}/{service}/aws4_request\n{}",
        sha256_hex(canonical.as_bytes())
    );
    let mut key = hmac(format!("AWS4{}", aws.secret).as_bytes(), date.as_bytes());
    for part in [*region, *service, "aws4_request"] {
        key = hmac(&key, part.as_bytes());
    }
    let expected: String = hmac(&key, to_sign.as_bytes())
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect();
    if expected != signature {
        return Err(refuse(
            403,
            "InvalidSignatureException",
            &format!("The request signature we calculated does not match the signature you provided. Check your AWS Secret Access Key and signing method. Consult the service documentation for details.\n\nThe Canonical String for this request should have been\n'{canonical}'"),
        ));
    }
    Ok(())
}

const FIELDS: &[&str] = &[
    "messages",
    "system",
    "inferenceConfig",
    "toolConfig",
    "guardrailConfig",
    "additionalModelRequestFields",
    "promptVariables",
    "additionalModelResponseFieldPaths",
    "requestMetadata",
    "performanceConfig",
];

const BLOCKS: &[&str] = &[
    "text",
    "image",
    "document",
    "video",
    "toolUse",
    "toolResult",
    "guardContent",
    "cachePoint",
    "reasoningContent",
];

fn validation(message: String) -> Result<(), String> {
    Err(message)
}

/// Converse's rules; `Err` is the ValidationException's message.
fn check(req: &Value) -> Result<(), String> {
    let Some(obj) = req.as_object() else {
        return validation(
            "Malformed input request, please reformat your input and try again.".into(),
        );
    };
    if let Some(k) = obj.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return validation(format!("Malformed input request: extraneous key [{k}] is not permitted, please reformat your input and try again."));
    }
    if let Some(c) = obj.get("inferenceConfig") {
        let c = c.as_object().ok_or("inferenceConfig must be an object")?;
        if let Some(k) = c
            .keys()
            .find(|k| !["maxTokens", "temperature", "topP", "stopSequences"].contains(&k.as_str()))
        {
            return validation(format!("Malformed input request: extraneous key [{k}] is not permitted, please reformat your input and try again."));
        }
        if c.get("maxTokens")
            .is_some_and(|m| m.as_u64().is_none_or(|m| m < 1))
        {
            return validation("1 validation error detected: Value at 'inferenceConfig.maxTokens' failed to satisfy constraint: Member must have value greater than or equal to 1".into());
        }
    }
    if let Some(system) = obj.get("system") {
        let ok = system.as_array().is_some_and(|s| {
            s.iter().all(|b| {
                b.get("text")
                    .and_then(Value::as_str)
                    .is_some_and(|t| !t.trim().is_empty())
            })
        });
        if !ok {
            return validation("The text field in the SystemContentBlock object is blank. Add text to the text field, and try again.".into());
        }
    }
    let tools = obj.get("toolConfig");
    if let Some(t) = tools {
        let list = t
            .get("tools")
            .and_then(Value::as_array)
            .filter(|l| !l.is_empty());
        let Some(list) = list else {
            return validation("1 validation error detected: Value at 'toolConfig.tools' failed to satisfy constraint: Member must have length greater than or equal to 1".into());
        };
        for (i, spec) in list.iter().enumerate() {
            let s = spec.get("toolSpec");
            let named = s
                .and_then(|s| s.get("name"))
                .and_then(Value::as_str)
                .is_some_and(|n| !n.is_empty());
            let schema = s
                .and_then(|s| s.pointer("/inputSchema/json"))
                .is_some_and(Value::is_object);
            if !named || !schema {
                return validation(format!("The toolConfig.tools.{i}.toolSpec needs a name and an inputSchema.json object."));
            }
        }
        if let Some(choice) = t.get("toolChoice") {
            let one = choice.as_object().is_some_and(|c| {
                c.len() == 1 && ["auto", "any", "tool"].iter().any(|k| c.contains_key(*k))
            });
            if !one {
                return validation(
                    "toolConfig.toolChoice must have exactly one of auto, any, tool.".into(),
                );
            }
        }
    }
    let messages = obj
        .get("messages")
        .and_then(Value::as_array)
        .filter(|m| !m.is_empty())
        .ok_or("A conversation must start with a user message. Try again with a conversation that starts with a user message.")?;
    let mut previous_role = "";
    let mut previous_uses: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !matches!(role, "user" | "assistant") {
            return validation(format!("1 validation error detected: Value '{role}' at 'messages.{}.member.role' failed to satisfy constraint: Member must satisfy enum value set: [user, assistant]", i + 1));
        }
        if i == 0 && role != "user" {
            return validation("A conversation must start with a user message. Try again with a conversation that starts with a user message.".into());
        }
        if role == previous_role {
            return validation("A conversation must alternate between user and assistant roles. Make sure the conversation alternates between user and assistant roles and try again.".into());
        }
        let content = m
            .get("content")
            .and_then(Value::as_array)
            .filter(|c| !c.is_empty())
            .ok_or(format!("The content field in the Message object at messages.{i} is empty. Add a ContentBlock object to the content field and try again."))?;
        let mut uses = Vec::new();
        let mut results = Vec::new();
        for (j, b) in content.iter().enumerate() {
            let keys: Vec<&String> = b
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            if keys.len() != 1 || !BLOCKS.contains(&keys[0].as_str()) {
                return validation(format!(
                    "The content block at messages.{i}.content.{j} must have exactly one member."
                ));
            }
            match keys[0].as_str() {
                "text" if b["text"].as_str().is_none_or(|t| t.trim().is_empty()) => {
                    return validation(format!("The text field in the ContentBlock object at messages.{i}.content.{j} is blank. Add text to the text field, and try again."));
                }
                "image" => {
                    let f = b
                        .pointer("/image/format")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if !["png", "jpeg", "gif", "webp"].contains(&f)
                        || !b
                            .pointer("/image/source/bytes")
                            .is_some_and(Value::is_string)
                    {
                        return validation(format!("The image at messages.{i}.content.{j} needs a format (png, jpeg, gif, webp) and source.bytes."));
                    }
                }
                "toolUse" => {
                    let id = b
                        .pointer("/toolUse/toolUseId")
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if id.is_empty()
                        || b.pointer("/toolUse/name")
                            .and_then(Value::as_str)
                            .is_none_or(str::is_empty)
                        || !b.pointer("/toolUse/input").is_some_and(Value::is_object)
                    {
                        return validation(format!("The toolUse at messages.{i}.content.{j} needs toolUseId, name and an input object."));
                    }
                    uses.push(id.to_string());
                }
                "toolResult" => {
                    results.push(
                        b.pointer("/toolResult/toolUseId")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_string(),
                    );
                }
                _ => {}
            }
        }
        if (!uses.is_empty() || !results.is_empty()) && tools.is_none() {
            return validation("The toolConfig field must be defined when using toolUse and toolResult content blocks.".into());
        }
        if results.len() > previous_uses.len() {
            return validation(format!("The number of toolResult blocks at messages.{i}.content exceeds the number of toolUse blocks of previous turn."));
        }
        if let Some(r) = results.iter().find(|r| !previous_uses.contains(r)) {
            return validation(format!("The toolUseId {r} in the toolResult blocks at messages.{i}.content does not match a toolUse block of the previous turn."));
        }
        if role == "user" && !previous_uses.is_empty() && results.len() != previous_uses.len() {
            return validation(format!(
                "Expected toolResult blocks at messages.{i}.content for the following Ids: {}",
                previous_uses.join(", ")
            ));
        }
        previous_uses = uses;
        previous_role = role;
    }
    Ok(())
}

/// One event-stream frame with string headers (the mock's own encoder).
pub fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Bytes {
    let mut h = Vec::new();
    for (k, v) in headers {
        h.push(k.len() as u8);
        h.extend_from_slice(k.as_bytes());
        h.push(7);
        h.extend_from_slice(&(v.len() as u16).to_be_bytes());
        h.extend_from_slice(v.as_bytes());
    }
    let total = (16 + h.len() + payload.len()) as u32;
    let mut out = Vec::with_capacity(total as usize);
    out.extend_from_slice(&total.to_be_bytes());
    out.extend_from_slice(&(h.len() as u32).to_be_bytes());
    let prelude = crc32fast::hash(&out);
    out.extend_from_slice(&prelude.to_be_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(payload);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_be_bytes());
    Bytes::from(out)
}

fn event(kind: &str, payload: Value) -> Bytes {
    frame(
        &[
            (":event-type", kind),
            (":content-type", "application/json"),
            (":message-type", "event"),
        ],
        payload.to_string().as_bytes(),
    )
}

pub async fn converse(
    state: Arc<State>,
    req: Request<Incoming>,
) -> Result<Response<Body>, io::Error> {
    let (path, query, headers, body, parsed) = super::read_logged(&state, req).await?;
    let step = super::next_step(&state);
    if let Some(ms) = step.delay_ms {
        tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
    }
    let Some(rest) = path.strip_prefix("/model/") else {
        return Ok(aws_error(
            404,
            "UnknownOperationException",
            "mock: not a model path",
        ));
    };
    let (model, stream) = match rest.rsplit_once('/') {
        Some((m, "converse")) => (m, false),
        Some((m, "converse-stream")) => (m, true),
        Some((m, "invoke")) => (m, false),
        _ => {
            return Ok(aws_error(
                404,
                "UnknownOperationException",
                "mock: not converse",
            ))
        }
    };
    if let Some(aws) = &state.aws {
        if let Err(refusal) = verify(aws, &path, &query, &headers, &body) {
            return Ok(*refusal);
        }
    }
    if path.ends_with("/invoke") {
        return Ok(match invoke_embeddings(&parsed, &decode_model(model)) {
            Ok(v) => json_response(200, &v),
            Err(why) => aws_error(400, "ValidationException", &why),
        });
    }
    if let Err(why) = check(&parsed) {
        return Ok(aws_error(400, "ValidationException", &why));
    }
    match step.status.unwrap_or(200) {
        200 => {}
        429 => {
            return Ok(aws_error(
                429,
                "ThrottlingException",
                "mock: Too many requests, please wait before trying again.",
            ))
        }
        503 => {
            return Ok(aws_error(
                503,
                "ServiceUnavailableException",
                "mock: scripted overload",
            ))
        }
        s if s >= 500 => {
            return Ok(aws_error(
                s,
                "InternalServerException",
                "mock: scripted failure",
            ))
        }
        s => {
            return Ok(aws_error(
                s,
                "ValidationException",
                "mock: scripted client error",
            ))
        }
    }
    answer(&state, &parsed, &step, &decode_model(model), stream)
}

/// InvokeModel for the embedding families: Titan (`inputText`, one text;
/// `dimensions` 256, 512 or 1024) and Cohere (`texts`, 1 to 96;
/// `input_type` required; `output_dimension` 256, 512, 1024 or 1536), each
/// checked for unknown fields and answered with deterministic vectors in
/// its own shape (Titan with its token count).
fn invoke_embeddings(req: &Value, model: &str) -> Result<Value, String> {
    let obj = req
        .as_object()
        .ok_or("Malformed input request, please reformat your input and try again.")?;
    let extraneous = |allowed: &[&str]| {
        obj.keys()
            .find(|k| !allowed.contains(&k.as_str()))
            .map(|k| format!("Malformed input request: extraneous key [{k}] is not permitted, please reformat your input and try again."))
    };
    let dims_of = |key: &str, allowed: &[u64], default: usize| {
        match obj.get(key) {
        None => Ok(default),
        Some(d) => d
            .as_u64()
            .filter(|d| allowed.contains(d))
            .map(|d| d as usize)
            .ok_or(format!("Malformed input request: #/{key}: {d} is not a valid enum value, please reformat your input and try again.")),
    }
    };
    if model.contains("amazon.titan-embed") {
        if let Some(e) = extraneous(&["inputText", "dimensions", "normalize", "embeddingTypes"]) {
            return Err(e);
        }
        let text = obj
            .get("inputText")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
            .ok_or("Malformed input request: #: required key [inputText] not found, please reformat your input and try again.")?;
        let dims = dims_of("dimensions", &[256, 512, 1024], 1024)?;
        let tokens = text.split_whitespace().count();
        return Ok(
            json!({"embedding": super::embeddings::vector(text, dims), "inputTextTokenCount": tokens}),
        );
    }
    if model.contains("cohere.embed") {
        if let Some(e) = extraneous(&[
            "texts",
            "images",
            "input_type",
            "truncate",
            "embedding_types",
            "output_dimension",
            "max_tokens",
        ]) {
            return Err(e);
        }
        let texts = obj
            .get("texts")
            .and_then(Value::as_array)
            .filter(|t| !t.is_empty() && t.len() <= 96)
            .ok_or("Malformed input request: #/texts: expected 1 to 96 texts, please reformat your input and try again.")?;
        let kinds = [
            "search_document",
            "search_query",
            "classification",
            "clustering",
        ];
        if !obj
            .get("input_type")
            .and_then(Value::as_str)
            .is_some_and(|t| kinds.contains(&t))
        {
            return Err("Malformed input request: #: required key [input_type] not found, please reformat your input and try again.".into());
        }
        let dims = dims_of("output_dimension", &[256, 512, 1024, 1536], 1536)?;
        let vectors: Vec<Value> = texts
            .iter()
            .map(|t| json!(super::embeddings::vector(t.as_str().unwrap_or(""), dims)))
            .collect();
        return Ok(
            json!({"id": "mock-embed", "embeddings": {"float": vectors}, "texts": texts, "response_type": "embeddings_by_type"}),
        );
    }
    Err(format!("mock: {model} is not an embedding model"))
}

/// A model id from the path (`%3A` back to `:`).
fn decode_model(m: &str) -> String {
    m.replace("%3A", ":").replace("%3a", ":")
}

fn answer(
    state: &State,
    req: &Value,
    step: &Step,
    model: &str,
    stream: bool,
) -> Result<Response<Body>, io::Error> {
    let text = step.content.clone().unwrap_or_else(|| {
        format!(
            "Hello from {} ({model})! This is a mock message.",
            state.name
        )
    });
    let tool = step
        .tool_call
        .clone()
        .filter(|_| req.get("toolConfig").is_some());
    let input = step.usage.map_or(10, |u| u.prompt_tokens);
    let output = step
        .usage
        .map_or(text.split_whitespace().count() as u64, |u| {
            u.completion_tokens
        });
    let mut usage =
        json!({"inputTokens": input, "outputTokens": output, "totalTokens": input + output});
    if let Some(c) = step.cache_read {
        usage["cacheReadInputTokens"] = json!(c);
        usage["cacheWriteInputTokens"] = json!(0);
        usage["totalTokens"] = json!(input + output + c);
    }
    let hits = state.hits.load(std::sync::atomic::Ordering::Relaxed);
    let tool_id = format!("tooluse_mock{hits}");
    let stop = if tool.is_some() {
        "tool_use"
    } else {
        "end_turn"
    };
    if !stream {
        let mut content = vec![json!({"text": text})];
        if let Some(t) = &tool {
            content
                .push(json!({"toolUse": {"toolUseId": tool_id, "name": t.name, "input": t.input}}));
        }
        return Ok(json_response(
            200,
            &json!({"output": {"message": {"role": "assistant", "content": content}},
                "stopReason": stop, "usage": usage, "metrics": {"latencyMs": 12}}),
        ));
    }
    let mut events = vec![event(
        "messageStart",
        json!({"role": "assistant", "p": "abcd"}),
    )];
    for w in text.split_inclusive(' ') {
        events.push(event(
            "contentBlockDelta",
            json!({"contentBlockIndex": 0, "delta": {"text": w}, "p": "ab"}),
        ));
    }
    events.push(event("contentBlockStop", json!({"contentBlockIndex": 0})));
    if step.stream_error {
        events.push(frame(
            &[
                (":exception-type", "modelStreamErrorException"),
                (":content-type", "application/json"),
                (":message-type", "exception"),
            ],
            br#"{"message":"mock: the model stream failed mid-answer"}"#,
        ));
        return super::event_stream(events, step, "application/vnd.amazon.eventstream");
    }
    if let Some(t) = &tool {
        events.push(event("contentBlockStart", json!({"contentBlockIndex": 1, "start": {"toolUse": {"toolUseId": tool_id, "name": t.name}}})));
        let args = t.input.to_string();
        let (a, b) = args.split_at(args.len() / 2);
        for piece in [a, b] {
            events.push(event(
                "contentBlockDelta",
                json!({"contentBlockIndex": 1, "delta": {"toolUse": {"input": piece}}}),
            ));
        }
        events.push(event("contentBlockStop", json!({"contentBlockIndex": 1})));
    }
    events.push(event("messageStop", json!({"stopReason": stop})));
    events.push(event(
        "metadata",
        json!({"usage": usage, "metrics": {"latencyMs": 12}}),
    ));
    super::event_stream(events, step, "application/vnd.amazon.eventstream")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The mock's own HMAC chain against AWS's published signing key and
    /// get-vanilla signature.
    #[test]
    fn the_mock_signs_as_aws_publishes() {
        let mut key = hmac(b"AWS4wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", b"20150830");
        for part in ["us-east-1", "service", "aws4_request"] {
            key = hmac(&key, part.as_bytes());
        }
        let hex: String = key.iter().map(|x| format!("{x:02x}")).collect();
        assert_eq!(
            hex,
            "938127b5336810ddb6a5d6af445fcac9e371f9ed418ed386b022aed82901be75"
        );
        assert_eq!(parse_amz_date("20150830T123600Z"), Some(1_440_938_160));
        assert_eq!(encode_segment("a%3Ab"), "a%253Ab");
    }
}
