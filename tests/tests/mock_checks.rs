//! The mock refuses what the real providers refuse: one case per row of
//! `tests/MOCK.md`, each sending the bad request and expecting the
//! provider's own status and error shape. A good request of each mode is
//! accepted, so the checks do not refuse everything.

use portcullis_tests::{get, post, repo_root, Mock, Resp};
use serde_json::{json, Value};
use std::collections::BTreeSet;

const KEY: &str = "sk-provider";

struct Case {
    mode: Mode,
    headers: Vec<(&'static str, String)>,
    body: String,
    status: u16,
    /// In the error's `type` or `code` (OpenAI) / `error.type` (Anthropic).
    kind: Option<&'static str>,
    /// In the error's message.
    says: &'static str,
}

#[derive(Clone, Copy)]
enum Mode {
    OpenAi,
    Azure,
    AzureNoVersion,
    Anthropic,
    Embeddings,
    CountTokens,
    Responses,
    Gemini,
    GeminiStream,
    Bedrock,
    BedrockInvoke,
    Mcp,
    /// The images, audio, moderations and rerank endpoints (OpenAI's
    /// shape), at this path.
    Media(&'static str),
    /// Anthropic's Message Batches (its key and version headers).
    MessageBatches,
    /// The Realtime API's upgrade (a `GET`), at this path and query.
    Realtime(&'static str),
}

/// A multipart body with these text fields and, if given, a file part.
fn form(
    fields: &[(&str, &str)],
    file: Option<(&str, &str)>,
) -> (Vec<(&'static str, String)>, String) {
    let b = "mockcheckboundary";
    let mut body = String::new();
    for (k, v) in fields {
        body.push_str(&format!(
            "--{b}\r\nContent-Disposition: form-data; name=\"{k}\"\r\n\r\n{v}\r\n"
        ));
    }
    if let Some((name, content)) = file {
        body.push_str(&format!("--{b}\r\nContent-Disposition: form-data; name=\"{name}\"; filename=\"f.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n{content}\r\n"));
    }
    body.push_str(&format!("--{b}--\r\n"));
    (
        vec![("content-type", format!("multipart/form-data; boundary={b}"))],
        body,
    )
}

/// A refusal of a media endpoint.
fn media(path: &'static str, body: Value, kind: &'static str, says: &'static str) -> Case {
    Case {
        mode: Mode::Media(path),
        ..openai(body, 400, Some(kind), says)
    }
}

fn media_form(
    path: &'static str,
    (headers, body): (Vec<(&'static str, String)>, String),
    kind: Option<&'static str>,
    says: &'static str,
) -> Case {
    Case {
        mode: Mode::Media(path),
        headers,
        body,
        status: 400,
        kind,
        says,
    }
}

/// A refusal of Anthropic's Message Batches.
fn message_batches(body: Value, says: &'static str) -> Case {
    Case {
        mode: Mode::MessageBatches,
        headers: Vec::new(),
        body: body.to_string(),
        status: 400,
        kind: Some("invalid_request_error"),
        says,
    }
}

/// A refusal of a Realtime upgrade (`extra` headers over the upgrade's).
fn realtime(
    path: &'static str,
    extra: &[(&'static str, &str)],
    status: u16,
    kind: Option<&'static str>,
    says: &'static str,
) -> Case {
    Case {
        mode: Mode::Realtime(path),
        headers: extra.iter().map(|(k, v)| (*k, v.to_string())).collect(),
        body: String::new(),
        status,
        kind,
        says,
    }
}

fn media_cases() -> Vec<(&'static str, Case)> {
    let realtime_cases = vec![
        (
            "realtime-wrong-key",
            realtime(
                "/v1/realtime?model=gpt-realtime",
                &[("authorization", "Bearer sk-other")],
                401,
                Some("invalid_api_key"),
                "wrong provider key",
            ),
        ),
        (
            "realtime-no-model",
            realtime("/v1/realtime", &[], 400, Some("missing_model"), "'model'"),
        ),
        (
            "realtime-not-an-upgrade",
            realtime(
                "/v1/realtime?model=gpt-realtime",
                &[("upgrade", "")],
                400,
                Some("invalid_request_error"),
                "WebSocket upgrade",
            ),
        ),
        (
            "realtime-azure-no-version",
            realtime(
                "/openai/realtime?deployment=d",
                &[("api-key", KEY)],
                404,
                None,
                "api-version is required",
            ),
        ),
    ];
    let params = json!({"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]});
    let mut cases = vec![
        (
            "message-batches-no-requests",
            message_batches(json!({}), "requests: Field required"),
        ),
        (
            "message-batches-duplicate-id",
            message_batches(
                json!({"requests": [{"custom_id": "a", "params": params}, {"custom_id": "a", "params": params}]}),
                "Duplicate custom_id",
            ),
        ),
        (
            "message-batches-bad-params",
            message_batches(
                json!({"requests": [{"custom_id": "a", "params": {"model": "m", "messages": [{"role": "user", "content": "hi"}]}}]}),
                "max_tokens",
            ),
        ),
        (
            "images-no-prompt",
            media(
                "/v1/images/generations",
                json!({"model": "dall-e-3"}),
                "missing_required_parameter",
                "'prompt'",
            ),
        ),
        (
            "images-bad-n",
            media(
                "/v1/images/generations",
                json!({"model": "dall-e-2", "prompt": "x", "n": 11}),
                "integer_below_min_value",
                "Invalid 'n'",
            ),
        ),
        (
            "images-bad-size",
            media(
                "/v1/images/generations",
                json!({"model": "dall-e-2", "prompt": "x", "size": "999x999"}),
                "invalid_value",
                "Supported values",
            ),
        ),
        (
            "images-edit-json",
            media(
                "/v1/images/edits",
                json!({"model": "gpt-image-1", "prompt": "x"}),
                "invalid_request_error",
                "expected multipart/form-data",
            ),
        ),
        (
            "images-edit-no-image",
            media_form(
                "/v1/images/edits",
                form(&[("model", "gpt-image-1"), ("prompt", "x")], None),
                Some("missing_required_parameter"),
                "'image'",
            ),
        ),
        (
            "speech-no-voice",
            media(
                "/v1/audio/speech",
                json!({"model": "tts-1", "input": "hi"}),
                "missing_required_parameter",
                "'voice'",
            ),
        ),
        (
            "speech-too-long",
            media(
                "/v1/audio/speech",
                json!({"model": "tts-1", "voice": "alloy", "input": "x".repeat(4097)}),
                "string_too_long",
                "at most 4096 characters",
            ),
        ),
        (
            "transcription-json",
            media(
                "/v1/audio/transcriptions",
                json!({"model": "whisper-1"}),
                "invalid_request_error",
                "expected multipart/form-data",
            ),
        ),
        (
            "transcription-no-file",
            media_form(
                "/v1/audio/transcriptions",
                form(&[("model", "whisper-1")], None),
                Some("missing_required_parameter"),
                "'file'",
            ),
        ),
        (
            "transcription-not-audio",
            media_form(
                "/v1/audio/transcriptions",
                form(&[("model", "whisper-1")], Some(("file", "not audio"))),
                Some("invalid_value"),
                "Invalid file format",
            ),
        ),
        (
            "moderations-no-input",
            media(
                "/v1/moderations",
                json!({"model": "omni-moderation-latest"}),
                "missing_required_parameter",
                "'input'",
            ),
        ),
        (
            "rerank-no-documents",
            media(
                "/v1/rerank",
                json!({"model": "rerank-v3.5", "query": "q"}),
                "missing_required_parameter",
                "'documents'",
            ),
        ),
        (
            "files-no-purpose",
            media_form(
                "/v1/files",
                form(&[], Some(("file", "x"))),
                Some("missing_required_parameter"),
                "'purpose'",
            ),
        ),
        (
            "files-bad-purpose",
            media_form(
                "/v1/files",
                form(&[("purpose", "storage")], Some(("file", "x"))),
                Some("invalid_value"),
                "'purpose'",
            ),
        ),
        (
            "files-batch-not-jsonl",
            media_form(
                "/v1/files",
                form(&[("purpose", "batch")], Some(("file", "x"))),
                Some("invalid_file_format"),
                "Must be .jsonl",
            ),
        ),
        (
            "batches-unknown-file",
            Case {
                status: 404,
                ..media(
                    "/v1/batches",
                    json!({"input_file_id": "file-none", "endpoint": "/v1/chat/completions", "completion_window": "24h"}),
                    "invalid_request_error",
                    "No such File object",
                )
            },
        ),
        (
            "batches-no-window",
            media(
                "/v1/batches",
                json!({"input_file_id": "file-none", "endpoint": "/v1/chat/completions"}),
                "missing_required_parameter",
                "'completion_window'",
            ),
        ),
    ];
    cases.extend(realtime_cases);
    cases
}

/// The Bedrock mode's credentials (the mock is started with them).
const AWS_KEY_ID: &str = "AKIDMOCKEXAMPLE";
const AWS_SECRET: &str = "mock/secret+KEY";
const BEDROCK_PATH: &str = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse";
const INVOKE_PATH: &str = "/model/cohere.embed-v4%3A0/invoke";

/// SigV4 headers for a Converse request to the mock at `host`.
fn signed(
    host: &str,
    body: &str,
    secret: &str,
    region: &str,
    now_s: u64,
) -> Vec<(&'static str, String)> {
    signed_at(BEDROCK_PATH, host, body, secret, region, now_s)
}

/// SigV4 headers for a request to `path` on the mock at `host`.
fn signed_at(
    path: &str,
    host: &str,
    body: &str,
    secret: &str,
    region: &str,
    now_s: u64,
) -> Vec<(&'static str, String)> {
    use portcullis_core::credentials::sigv4;
    let keys = sigv4::Keys {
        access_key_id: AWS_KEY_ID.into(),
        secret_access_key: secret.into(),
        session_token: None,
    };
    let req = sigv4::Request {
        method: "POST",
        path,
        query: "",
        host,
        body: body.as_bytes(),
    };
    let scope = sigv4::Scope {
        region,
        service: "bedrock",
    };
    sigv4::sign(&keys, &scope, &req, now_s)
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A Converse request signed as it is sent (`sign` from the body).
fn bedrock(host: &str, body: Value, status: u16, kind: &'static str, says: &'static str) -> Case {
    let body = body.to_string();
    Case {
        mode: Mode::Bedrock,
        headers: signed(host, &body, AWS_SECRET, "us-east-1", now_s()),
        body,
        status,
        kind: Some(kind),
        says,
    }
}

fn converse(messages: Value) -> Value {
    json!({"messages": messages})
}

fn said(text: &str) -> Value {
    json!({"role": "user", "content": [{"text": text}]})
}

fn gemini(body: Value, status: u16, kind: Option<&'static str>, says: &'static str) -> Case {
    Case {
        mode: Mode::Gemini,
        headers: Vec::new(),
        body: body.to_string(),
        status,
        kind,
        says,
    }
}

fn contents(turns: Value) -> Value {
    json!({"contents": turns})
}

fn user(text: &str) -> Value {
    json!({"role": "user", "content": text})
}

fn openai(body: Value, status: u16, kind: Option<&'static str>, says: &'static str) -> Case {
    Case {
        mode: Mode::OpenAi,
        headers: Vec::new(),
        body: body.to_string(),
        status,
        kind,
        says,
    }
}

fn anthropic(body: Value, status: u16, kind: Option<&'static str>, says: &'static str) -> Case {
    Case {
        mode: Mode::Anthropic,
        headers: Vec::new(),
        body: body.to_string(),
        status,
        kind,
        says,
    }
}

fn claude(messages: Value) -> Value {
    json!({"model": "claude", "max_tokens": 10, "messages": messages})
}

fn tool_use(id: Option<&str>, name: Option<&str>) -> Value {
    let mut b = json!({"type": "tool_use", "input": {"q": 1}});
    if let Some(id) = id {
        b["id"] = json!(id);
    }
    if let Some(name) = name {
        b["name"] = json!(name);
    }
    json!({"role": "assistant", "content": [b]})
}

fn cases(host: &str) -> Vec<(&'static str, Case)> {
    let chat = |extra: Value| {
        let mut b = json!({"model": "gpt-4o", "messages": [user("hi")]});
        if let (Some(o), Some(e)) = (b.as_object_mut(), extra.as_object()) {
            o.extend(e.clone());
        }
        b
    };
    let call = json!({"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]});
    let invalid = Some("invalid_request_error");
    let hi = converse(json!([said("hi")]));
    let use_turn = json!({"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}]});
    let tools = json!({"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}}}}]});
    vec![
        (
            "bedrock-unsigned",
            Case {
                headers: vec![("authorization", String::new())],
                ..bedrock(
                    host,
                    hi.clone(),
                    403,
                    "MissingAuthenticationTokenException",
                    "Missing Authentication Token",
                )
            },
        ),
        (
            "bedrock-wrong-secret",
            Case {
                headers: signed(
                    host,
                    &hi.to_string(),
                    "another secret",
                    "us-east-1",
                    now_s(),
                ),
                ..bedrock(
                    host,
                    hi.clone(),
                    403,
                    "InvalidSignatureException",
                    "does not match the signature you provided",
                )
            },
        ),
        (
            "bedrock-tampered-body",
            Case {
                body: converse(json!([said("hi there")])).to_string(),
                headers: {
                    // Signed over another body, its hash header left out.
                    let mut h = signed(host, &hi.to_string(), AWS_SECRET, "us-east-1", now_s());
                    h.push(("x-amz-content-sha256", String::new()));
                    h
                },
                ..bedrock(
                    host,
                    hi.clone(),
                    403,
                    "InvalidSignatureException",
                    "does not match the signature you provided",
                )
            },
        ),
        (
            "bedrock-content-hash-mismatch",
            Case {
                body: converse(json!([said("hi there")])).to_string(),
                ..bedrock(
                    host,
                    hi.clone(),
                    400,
                    "ValidationException",
                    "x-amz-content-sha256",
                )
            },
        ),
        (
            "bedrock-wrong-region",
            Case {
                headers: signed(host, &hi.to_string(), AWS_SECRET, "eu-west-1", now_s()),
                ..bedrock(
                    host,
                    hi.clone(),
                    403,
                    "InvalidSignatureException",
                    "scoped to a valid region",
                )
            },
        ),
        (
            "bedrock-stale-date",
            Case {
                headers: signed(
                    host,
                    &hi.to_string(),
                    AWS_SECRET,
                    "us-east-1",
                    now_s() - 900,
                ),
                ..bedrock(
                    host,
                    hi.clone(),
                    403,
                    "InvalidSignatureException",
                    "Signature expired",
                )
            },
        ),
        (
            "bedrock-unknown-field",
            bedrock(
                host,
                json!({"messages": [said("hi")], "max_tokens": 5}),
                400,
                "ValidationException",
                "extraneous key [max_tokens]",
            ),
        ),
        (
            "bedrock-first-turn-assistant",
            bedrock(
                host,
                converse(json!([{"role": "assistant", "content": [{"text": "x"}]}])),
                400,
                "ValidationException",
                "must start with a user message",
            ),
        ),
        (
            "bedrock-not-alternating",
            bedrock(
                host,
                converse(json!([said("a"), said("b")])),
                400,
                "ValidationException",
                "must alternate between user and assistant",
            ),
        ),
        (
            "bedrock-blank-text",
            bedrock(
                host,
                converse(json!([said(" ")])),
                400,
                "ValidationException",
                "is blank",
            ),
        ),
        (
            "bedrock-two-member-block",
            bedrock(
                host,
                converse(json!([{"role": "user", "content": [{"text": "a", "image": {}}]}])),
                400,
                "ValidationException",
                "exactly one member",
            ),
        ),
        (
            "bedrock-tools-undeclared",
            bedrock(
                host,
                converse(
                    json!([said("a"), use_turn.clone(), {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"text": "r"}]}}]}]),
                ),
                400,
                "ValidationException",
                "toolConfig field must be defined",
            ),
        ),
        (
            "bedrock-result-unmatched",
            bedrock(
                host,
                json!({"toolConfig": tools.clone(), "messages": [said("a"), use_turn.clone(), {"role": "user", "content": [{"toolResult": {"toolUseId": "t9", "content": [{"text": "r"}]}}]}]}),
                400,
                "ValidationException",
                "does not match a toolUse",
            ),
        ),
        (
            "bedrock-use-unanswered",
            bedrock(
                host,
                json!({"toolConfig": tools.clone(), "messages": [said("a"), use_turn.clone(), said("next")]}),
                400,
                "ValidationException",
                "Expected toolResult blocks",
            ),
        ),
        (
            "bedrock-image-format",
            bedrock(
                host,
                converse(
                    json!([{"role": "user", "content": [{"image": {"format": "bmp", "source": {"bytes": "AA=="}}}]}]),
                ),
                400,
                "ValidationException",
                "needs a format",
            ),
        ),
        (
            "bedrock-cohere-no-input-type",
            Case {
                mode: Mode::BedrockInvoke,
                headers: signed_at(
                    INVOKE_PATH,
                    host,
                    r#"{"texts":["a"]}"#,
                    AWS_SECRET,
                    "us-east-1",
                    now_s(),
                ),
                body: r#"{"texts":["a"]}"#.into(),
                ..bedrock(
                    host,
                    hi.clone(),
                    400,
                    "ValidationException",
                    "required key [input_type]",
                )
            },
        ),
        (
            "bedrock-cohere-bad-dimension",
            Case {
                mode: Mode::BedrockInvoke,
                headers: signed_at(
                    INVOKE_PATH,
                    host,
                    r#"{"texts":["a"],"input_type":"search_query","output_dimension":4}"#,
                    AWS_SECRET,
                    "us-east-1",
                    now_s(),
                ),
                body: r#"{"texts":["a"],"input_type":"search_query","output_dimension":4}"#.into(),
                ..bedrock(
                    host,
                    hi.clone(),
                    400,
                    "ValidationException",
                    "output_dimension: 4 is not a valid enum value",
                )
            },
        ),
        (
            "bedrock-max-tokens-zero",
            bedrock(
                host,
                json!({"messages": [said("a")], "inferenceConfig": {"maxTokens": 0}}),
                400,
                "ValidationException",
                "greater than or equal to 1",
            ),
        ),
        (
            "openai-wrong-key",
            Case {
                headers: vec![("authorization", "Bearer sk-other".into())],
                ..openai(
                    chat(json!({})),
                    401,
                    Some("invalid_api_key"),
                    "wrong provider key",
                )
            },
        ),
        (
            "openai-not-json",
            Case {
                body: "{not json".into(),
                ..openai(json!({}), 400, invalid, "could not parse the JSON body")
            },
        ),
        (
            "openai-unknown-field",
            openai(
                chat(json!({"temprature": 1})),
                400,
                invalid,
                "Unrecognized request argument supplied: temprature",
            ),
        ),
        (
            "openai-no-model",
            openai(
                json!({"messages": [user("hi")]}),
                400,
                invalid,
                "you must provide a model parameter",
            ),
        ),
        (
            "openai-no-messages",
            openai(
                json!({"model": "gpt-4o"}),
                400,
                Some("missing_required_parameter"),
                "'messages'",
            ),
        ),
        (
            "openai-empty-messages",
            openai(
                chat(json!({"messages": []})),
                400,
                Some("empty_array"),
                "empty array",
            ),
        ),
        (
            "openai-bad-role",
            openai(
                chat(json!({"messages": [{"role": "robot", "content": "x"}]})),
                400,
                Some("invalid_value"),
                "'robot'",
            ),
        ),
        (
            "openai-stream-options-without-stream",
            openai(
                chat(json!({"stream_options": {"include_usage": true}})),
                400,
                invalid,
                "only allowed when 'stream' is enabled",
            ),
        ),
        (
            "openai-tool-without-call-id",
            openai(
                chat(
                    json!({"messages": [user("hi"), call.clone(), {"role": "tool", "content": "r"}]}),
                ),
                400,
                Some("missing_required_parameter"),
                "tool_call_id",
            ),
        ),
        (
            "openai-tool-result-without-call",
            openai(
                chat(
                    json!({"messages": [user("hi"), {"role": "tool", "tool_call_id": "call_9", "content": "r"}]}),
                ),
                400,
                invalid,
                "must be a response to a preceeding message with 'tool_calls'",
            ),
        ),
        (
            "openai-tool-calls-unanswered",
            openai(
                chat(json!({"messages": [user("hi"), call.clone(), user("and?")]})),
                400,
                invalid,
                "did not have response messages: call_1",
            ),
        ),
        (
            "anthropic-count-tokens-max-tokens",
            Case {
                mode: Mode::CountTokens,
                ..anthropic(
                    claude(json!([user("hi")])),
                    400,
                    invalid,
                    "max_tokens: Extra inputs are not permitted",
                )
            },
        ),
        (
            "responses-no-input",
            Case {
                mode: Mode::Responses,
                ..openai(json!({"model": "m"}), 400, Some("invalid_value"), "'input'")
            },
        ),
        (
            "responses-unknown-field",
            Case {
                mode: Mode::Responses,
                ..openai(
                    json!({"model": "m", "input": "x", "messages": []}),
                    400,
                    Some("unknown_parameter"),
                    "'messages'",
                )
            },
        ),
        (
            "responses-unknown-previous",
            Case {
                mode: Mode::Responses,
                ..openai(
                    json!({"model": "m", "input": "x", "previous_response_id": "resp_none"}),
                    404,
                    Some("previous_response_not_found"),
                    "resp_none",
                )
            },
        ),
        (
            "embeddings-wrong-key",
            Case {
                mode: Mode::Embeddings,
                headers: vec![("authorization", "Bearer sk-other".into())],
                ..openai(
                    json!({"model": "e", "input": "x"}),
                    401,
                    Some("invalid_api_key"),
                    "wrong provider key",
                )
            },
        ),
        (
            "embeddings-no-input",
            Case {
                mode: Mode::Embeddings,
                ..openai(
                    json!({"model": "e"}),
                    400,
                    Some("missing_required_parameter"),
                    "'input'",
                )
            },
        ),
        (
            "embeddings-empty-input",
            Case {
                mode: Mode::Embeddings,
                ..openai(
                    json!({"model": "e", "input": ""}),
                    400,
                    invalid,
                    "'$.input' is invalid",
                )
            },
        ),
        (
            "embeddings-bad-encoding",
            Case {
                mode: Mode::Embeddings,
                ..openai(
                    json!({"model": "e", "input": "x", "encoding_format": "int8"}),
                    400,
                    Some("invalid_value"),
                    "encoding_format",
                )
            },
        ),
        (
            "embeddings-unknown-field",
            Case {
                mode: Mode::Embeddings,
                ..openai(
                    json!({"model": "e", "input": "x", "messages": []}),
                    400,
                    invalid,
                    "Unrecognized request argument supplied: messages",
                )
            },
        ),
        (
            "azure-no-api-version",
            Case {
                mode: Mode::AzureNoVersion,
                ..openai(chat(json!({})), 404, None, "api-version")
            },
        ),
        (
            "azure-wrong-key",
            Case {
                mode: Mode::Azure,
                headers: vec![("api-key", "sk-other".into())],
                ..openai(
                    chat(json!({})),
                    401,
                    Some("invalid_api_key"),
                    "wrong provider key",
                )
            },
        ),
        (
            "azure-unknown-field",
            Case {
                mode: Mode::Azure,
                ..openai(
                    chat(json!({"foo": 1})),
                    400,
                    invalid,
                    "Unrecognized request argument supplied: foo",
                )
            },
        ),
        (
            "anthropic-wrong-key",
            Case {
                headers: vec![("x-api-key", "sk-other".into())],
                ..anthropic(
                    claude(json!([user("hi")])),
                    401,
                    Some("authentication_error"),
                    "x-api-key",
                )
            },
        ),
        (
            "anthropic-no-version",
            Case {
                headers: vec![("anthropic-version", String::new())],
                ..anthropic(
                    claude(json!([user("hi")])),
                    400,
                    invalid,
                    "anthropic-version",
                )
            },
        ),
        (
            "anthropic-unknown-version",
            Case {
                headers: vec![("anthropic-version", "2099-01-01".into())],
                ..anthropic(claude(json!([user("hi")])), 400, invalid, "invalid version")
            },
        ),
        (
            "anthropic-not-json",
            Case {
                body: "{not json".into(),
                ..anthropic(json!({}), 400, invalid, "error parsing the body")
            },
        ),
        (
            "anthropic-unknown-field",
            anthropic(
                json!({"model": "claude", "max_tokens": 10, "messages": [user("hi")], "n": 2}),
                400,
                invalid,
                "n: Extra inputs are not permitted",
            ),
        ),
        (
            "anthropic-no-max-tokens",
            anthropic(
                json!({"model": "claude", "messages": [user("hi")]}),
                400,
                invalid,
                "max_tokens: Field required",
            ),
        ),
        (
            "anthropic-max-tokens-zero",
            anthropic(
                json!({"model": "claude", "max_tokens": 0, "messages": [user("hi")]}),
                400,
                invalid,
                "greater than or equal to 1",
            ),
        ),
        (
            "anthropic-bad-role",
            anthropic(
                claude(json!([{"role": "system", "content": "be nice"}, user("hi")])),
                400,
                invalid,
                "'user' or 'assistant'",
            ),
        ),
        (
            "anthropic-empty-text",
            anthropic(
                claude(json!([{"role": "user", "content": [{"type": "text", "text": ""}]}])),
                400,
                invalid,
                "must be non-empty",
            ),
        ),
        (
            "anthropic-empty-string-content",
            anthropic(
                claude(json!([{"role": "user", "content": ""}])),
                400,
                invalid,
                "must be non-empty",
            ),
        ),
        (
            "anthropic-tool-use-without-id",
            anthropic(
                claude(json!([user("hi"), tool_use(None, Some("f"))])),
                400,
                invalid,
                "id: Field required",
            ),
        ),
        (
            "anthropic-tool-use-without-name",
            anthropic(
                claude(json!([user("hi"), tool_use(Some("toolu_1"), None)])),
                400,
                invalid,
                "name: Field required",
            ),
        ),
        (
            "anthropic-tool-use-unanswered",
            anthropic(
                claude(json!([
                    user("hi"),
                    tool_use(Some("toolu_1"), Some("f")),
                    user("and?")
                ])),
                400,
                invalid,
                "without `tool_result` blocks immediately after: toolu_1",
            ),
        ),
        (
            "anthropic-tool-result-orphan",
            anthropic(
                claude(
                    json!([user("hi"), {"role": "assistant", "content": "ok"}, {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "r"}]}]),
                ),
                400,
                invalid,
                "unexpected `tool_use_id`",
            ),
        ),
        (
            "gemini-no-key",
            Case {
                headers: vec![("x-goog-api-key", String::new())],
                ..gemini(
                    contents(json!([{"role": "user", "parts": [{"text": "hi"}]}])),
                    403,
                    Some("PERMISSION_DENIED"),
                    "unregistered callers",
                )
            },
        ),
        (
            "gemini-wrong-key",
            Case {
                headers: vec![("x-goog-api-key", "sk-other".into())],
                ..gemini(
                    contents(json!([{"role": "user", "parts": [{"text": "hi"}]}])),
                    400,
                    Some("INVALID_ARGUMENT"),
                    "API key not valid",
                )
            },
        ),
        (
            "gemini-unknown-field",
            gemini(
                json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "messages": []}),
                400,
                Some("INVALID_ARGUMENT"),
                "Unknown name \"messages\"",
            ),
        ),
        (
            "gemini-unknown-config",
            gemini(
                json!({"contents": [{"role": "user", "parts": [{"text": "hi"}]}], "generationConfig": {"max_tokens": 5}}),
                400,
                Some("INVALID_ARGUMENT"),
                "Unknown name \"max_tokens\"",
            ),
        ),
        (
            "gemini-no-contents",
            gemini(
                json!({"generationConfig": {"maxOutputTokens": 5}}),
                400,
                Some("INVALID_ARGUMENT"),
                "contents is not specified",
            ),
        ),
        (
            "gemini-bad-role",
            gemini(
                contents(json!([{"role": "assistant", "parts": [{"text": "hi"}]}])),
                400,
                Some("INVALID_ARGUMENT"),
                "valid role",
            ),
        ),
        (
            "gemini-empty-parts",
            gemini(
                contents(json!([{"role": "user", "parts": []}])),
                400,
                Some("INVALID_ARGUMENT"),
                "must not be empty",
            ),
        ),
        (
            "gemini-part-two-kinds",
            gemini(
                contents(
                    json!([{"role": "user", "parts": [{"text": "hi", "inlineData": {"mimeType": "image/png", "data": "AA=="}}]}]),
                ),
                400,
                Some("INVALID_ARGUMENT"),
                "oneof field 'data'",
            ),
        ),
        (
            "gemini-function-response-without-name",
            gemini(
                contents(json!([{"role": "user", "parts": [{"text": "hi"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "bW9jay1zaWc+1/=="}]},
                    {"role": "user", "parts": [{"functionResponse": {"response": {"content": "r"}}}]}])),
                400,
                Some("INVALID_ARGUMENT"),
                "Name cannot be empty",
            ),
        ),
        (
            "gemini-responses-unmatched",
            gemini(
                contents(json!([{"role": "user", "parts": [{"text": "hi"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "bW9jay1zaWc+1/=="}, {"functionCall": {"name": "g", "args": {}}}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"content": "r"}}}]}])),
                400,
                Some("INVALID_ARGUMENT"),
                "number of function response parts",
            ),
        ),
        (
            "gemini-call-without-signature",
            gemini(
                contents(json!([{"role": "user", "parts": [{"text": "hi"}]},
                    {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}}]},
                    {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"content": "r"}}}]}])),
                400,
                Some("INVALID_ARGUMENT"),
                "missing a thought_signature",
            ),
        ),
        (
            "gemini-stream-without-sse",
            Case {
                mode: Mode::GeminiStream,
                ..gemini(
                    contents(json!([{"role": "user", "parts": [{"text": "hi"}]}])),
                    400,
                    Some("INVALID_ARGUMENT"),
                    "alt=sse",
                )
            },
        ),
        // MCP mode: JSON-RPC errors (`kind`: the error's code).
        (
            "mcp-wrong-key",
            mcp(
                vec![("authorization", "Bearer sk-other".into())],
                ping(),
                401,
                "credential",
            ),
        ),
        (
            "mcp-not-acceptable",
            mcp(
                vec![("accept", "application/json".into())],
                ping(),
                406,
                "Not Acceptable",
            ),
        ),
        (
            "mcp-not-json",
            mcp(Vec::new(), "{".into(), 400, "Parse error"),
        ),
        (
            "mcp-no-session",
            mcp(Vec::new(), ping(), 400, "No valid session ID"),
        ),
        (
            "mcp-unknown-session",
            mcp(
                vec![("mcp-session-id", "not-a-session".into())],
                ping(),
                404,
                "Session not found",
            ),
        ),
        (
            "mcp-batch",
            mcp(Vec::new(), format!("[{}]", ping()), 400, "not a batch"),
        ),
        (
            "mcp-no-jsonrpc",
            mcp(
                Vec::new(),
                json!({"id": 1, "method": "ping"}).to_string(),
                400,
                "Invalid Request",
            ),
        ),
        (
            "mcp-unsupported-version",
            mcp(
                vec![("mcp-protocol-version", "1999-01-01".into())],
                ping(),
                400,
                "Unsupported protocol version",
            ),
        ),
    ]
}

fn ping() -> String {
    json!({"jsonrpc": "2.0", "id": 1, "method": "ping"}).to_string()
}

/// An MCP-mode case: a JSON-RPC error's message says `says`.
fn mcp(
    headers: Vec<(&'static str, String)>,
    body: String,
    status: u16,
    says: &'static str,
) -> Case {
    Case {
        mode: Mode::Mcp,
        headers,
        body,
        status,
        kind: None,
        says,
    }
}

fn send(mock: &Mock, mode: Mode, extra: &[(&'static str, String)], body: &str) -> Resp {
    let (path, mut headers): (&str, Vec<(&str, String)>) = match mode {
        Mode::OpenAi => (
            "/v1/chat/completions",
            vec![("authorization", format!("Bearer {KEY}"))],
        ),
        Mode::Responses => (
            "/v1/responses",
            vec![("authorization", format!("Bearer {KEY}"))],
        ),
        Mode::CountTokens => (
            "/v1/messages/count_tokens",
            vec![
                ("x-api-key", KEY.into()),
                ("anthropic-version", "2023-06-01".into()),
            ],
        ),
        Mode::Embeddings => (
            "/v1/embeddings",
            vec![("authorization", format!("Bearer {KEY}"))],
        ),
        Mode::Azure => (
            "/openai/deployments/d/chat/completions?api-version=2024-10-21",
            vec![("api-key", KEY.into())],
        ),
        Mode::AzureNoVersion => (
            "/openai/deployments/d/chat/completions",
            vec![("api-key", KEY.into())],
        ),
        Mode::Gemini => (
            "/v1beta/models/gemini-x:generateContent",
            vec![("x-goog-api-key", KEY.into())],
        ),
        Mode::GeminiStream => (
            "/v1beta/models/gemini-x:streamGenerateContent",
            vec![("x-goog-api-key", KEY.into())],
        ),
        Mode::Bedrock => (BEDROCK_PATH, Vec::new()),
        Mode::Mcp => (
            "/mcp",
            vec![
                ("authorization", format!("Bearer {KEY}")),
                ("accept", "application/json, text/event-stream".into()),
            ],
        ),
        Mode::BedrockInvoke => (INVOKE_PATH, Vec::new()),
        Mode::Media(path) => (path, vec![("authorization", format!("Bearer {KEY}"))]),
        Mode::Realtime(path) => {
            let mut h: Vec<(&str, String)> = vec![
                ("authorization", format!("Bearer {KEY}")),
                ("upgrade", "websocket".into()),
                ("connection", "Upgrade".into()),
                ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==".into()),
                ("sec-websocket-version", "13".into()),
            ];
            for (k, v) in extra {
                h.retain(|(x, _)| x != k);
                if !v.is_empty() {
                    h.push((k, v.clone()));
                }
            }
            let h: Vec<(&str, &str)> = h.iter().map(|(k, v)| (*k, v.as_str())).collect();
            return get(&mock.url(path), &h);
        }
        Mode::MessageBatches => (
            "/v1/messages/batches",
            vec![
                ("x-api-key", KEY.into()),
                ("anthropic-version", "2023-06-01".into()),
            ],
        ),
        Mode::Anthropic => (
            "/v1/messages",
            vec![
                ("x-api-key", KEY.into()),
                ("anthropic-version", "2023-06-01".into()),
            ],
        ),
    };
    headers.push(("content-type", "application/json".into()));
    for (k, v) in extra {
        headers.retain(|(h, _)| h != k);
        // An empty value stands for "header left out".
        if !v.is_empty() {
            headers.push((k, v.clone()));
        }
    }
    let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
    post(&mock.url(path), &h, body)
}

/// A DELETE with a bearer key, by a raw exchange: the body.
fn to_delete(url: &str, auth: &str) -> String {
    use std::io::{Read, Write};
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_at(rest.find('/').unwrap());
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "DELETE {path} HTTP/1.1\r\nhost: {addr}\r\nauthorization: {auth}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn rows_of_the_table() -> BTreeSet<String> {
    let doc = std::fs::read_to_string(repo_root().join("tests/MOCK.md")).unwrap();
    doc.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_mock_refuses_each_bad_request_of_its_table_as_the_real_api_does() {
    let mock = Mock::start_with_args(
        env!("CARGO_BIN_EXE_portcullis-mock"),
        "strict",
        Some(KEY),
        &[
            "--aws-access-key-id",
            AWS_KEY_ID,
            "--aws-secret-access-key",
            AWS_SECRET,
            "--aws-region",
            "us-east-1",
        ],
    );
    let host = format!("127.0.0.1:{}", mock.port);
    let mut cases = cases(&host);
    cases.extend(media_cases());
    let names: BTreeSet<String> = cases.iter().map(|(n, _)| n.to_string()).collect();
    assert_eq!(
        names,
        rows_of_the_table(),
        "tests/MOCK.md and the cases disagree"
    );
    let mut wrong = Vec::new();
    for (name, c) in &cases {
        let r = send(&mock, c.mode, &c.headers, &c.body);
        let v = r.json();
        let (kind, message) = match c.mode {
            Mode::Anthropic | Mode::CountTokens | Mode::MessageBatches => {
                assert_eq!(
                    v["type"], "error",
                    "{name}: Anthropic's error shape: {}",
                    r.body
                );
                (
                    vec![v["error"]["type"].clone()],
                    v["error"]["message"].as_str().unwrap_or("").to_string(),
                )
            }
            Mode::Gemini | Mode::GeminiStream => {
                assert_eq!(
                    v["error"]["code"].as_u64(),
                    Some(u64::from(r.status)),
                    "{name}: Google's error shape: {}",
                    r.body
                );
                (
                    vec![v["error"]["status"].clone()],
                    v["error"]["message"].as_str().unwrap_or("").to_string(),
                )
            }
            Mode::Bedrock | Mode::BedrockInvoke => (
                vec![r
                    .headers
                    .iter()
                    .find(|(k, _)| k == "x-amzn-errortype")
                    .map_or(Value::Null, |(_, v)| json!(v))],
                v["message"].as_str().unwrap_or("").to_string(),
            ),
            _ => (
                vec![v["error"]["type"].clone(), v["error"]["code"].clone()],
                v["error"]["message"].as_str().unwrap_or("").to_string(),
            ),
        };
        let kind_ok = c.kind.is_none_or(|k| kind.iter().any(|x| x == k));
        if r.status != c.status || !kind_ok || !message.contains(c.says) {
            wrong.push(format!("{name}: got {} {}", r.status, r.body));
        }
    }
    assert!(
        wrong.is_empty(),
        "refusals not as the real API's:\n{}",
        wrong.join("\n")
    );
    // Good requests of each mode pass the same checks.
    for (path, good) in [
        (
            "/v1/images/generations",
            json!({"model": "dall-e-3", "prompt": "x", "size": "1024x1792", "quality": "hd"}),
        ),
        (
            "/v1/audio/speech",
            json!({"model": "tts-1", "voice": "alloy", "input": "hi"}),
        ),
        (
            "/v1/moderations",
            json!({"model": "omni-moderation-latest", "input": ["a", "b"]}),
        ),
        (
            "/v1/rerank",
            json!({"model": "r", "query": "q", "documents": ["q", {"text": "x"}]}),
        ),
    ] {
        let r = send(&mock, Mode::Media(path), &[], &good.to_string());
        assert_eq!(r.status, 200, "{path}: {}", r.body);
    }
    let wav = "RIFF\u{24}\0\0\0WAVEfmt \u{10}\0\0\0\u{1}\0\u{1}\0\u{40}\u{1f}\0\0\u{40}\u{1f}\0\0\u{1}\0\u{8}\0data\0\0\0\0";
    let (h, b) = form(&[("model", "whisper-1")], Some(("file", wav)));
    let r = send(&mock, Mode::Media("/v1/audio/transcriptions"), &h, &b);
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["usage"]["type"], "duration");
    let good_chat = json!({"model": "gpt-4o", "messages": [user("hi"), {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}, {"role": "tool", "tool_call_id": "call_1", "content": "r"}], "stream": true, "stream_options": {"include_usage": true}}).to_string();
    assert_eq!(send(&mock, Mode::OpenAi, &[], &good_chat).status, 200);
    assert_eq!(send(&mock, Mode::Azure, &[], &good_chat).status, 200);
    let good_claude = claude(json!([user("hi"), tool_use(Some("toolu_1"), Some("f")), {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "r"}]}])).to_string();
    let r = send(&mock, Mode::Anthropic, &[], &good_claude);
    assert_eq!(r.status, 200, "{}", r.body);
    let use_turn = json!({"role": "assistant", "content": [{"toolUse": {"toolUseId": "t1", "name": "f", "input": {}}}]});
    let good_bedrock = json!({
        "toolConfig": {"tools": [{"toolSpec": {"name": "f", "inputSchema": {"json": {"type": "object"}}}}], "toolChoice": {"auto": {}}},
        "system": [{"text": "Be brief."}],
        "inferenceConfig": {"maxTokens": 5, "temperature": 0.1},
        "messages": [said("a"), use_turn, {"role": "user", "content": [{"toolResult": {"toolUseId": "t1", "content": [{"json": {"x": 1}}]}}, {"text": "and?"}]}]
    })
    .to_string();
    let r = send(
        &mock,
        Mode::Bedrock,
        &signed(&host, &good_bedrock, AWS_SECRET, "us-east-1", now_s()),
        &good_bedrock,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["output"]["message"]["role"], "assistant");
    let good = json!({"model": "e", "input": ["a b", [1, 2, 3]], "encoding_format": "base64", "dimensions": 4});
    let r = send(&mock, Mode::Embeddings, &[], &good.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    let v = r.json();
    assert_eq!(
        (
            v["data"][1]["index"].as_u64(),
            v["usage"]["prompt_tokens"].as_u64()
        ),
        (Some(1), Some(5))
    );
    // The Responses API keeps what it answered: read, listed, deleted.
    let r = send(
        &mock,
        Mode::Responses,
        &[],
        &json!({"model": "m", "input": "hi"}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let id = r.json()["id"].as_str().unwrap().to_string();
    let auth = format!("Bearer {KEY}");
    let h = [("authorization", auth.as_str())];
    assert_eq!(
        get(&mock.url(&format!("/v1/responses/{id}")), &h).json()["id"],
        id.as_str()
    );
    let items = get(&mock.url(&format!("/v1/responses/{id}/input_items")), &h).json();
    assert_eq!(items["data"][0]["content"][0]["text"], "hi");
    let del = to_delete(&mock.url(&format!("/v1/responses/{id}")), &auth);
    assert!(del.contains("\"deleted\":true"), "{del}");
    assert_eq!(
        get(&mock.url(&format!("/v1/responses/{id}")), &h).status,
        404
    );
    // Gemini: a whole answer and a stream, a call and its response.
    let good_gemini = contents(
        json!([{"role": "user", "parts": [{"text": "hi"}, {"inlineData": {"mimeType": "image/png", "data": "AA=="}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "f", "args": {}}, "thoughtSignature": "bW9jay1zaWc+1/=="}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "f", "response": {"content": "r"}}}]}]),
    );
    let r = send(&mock, Mode::Gemini, &[], &good_gemini.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["candidates"][0]["finishReason"], "STOP");
    let r = post(
        &mock.url("/v1beta/models/gemini-x:streamGenerateContent?alt=sse"),
        &[
            ("x-goog-api-key", KEY),
            ("content-type", "application/json"),
        ],
        &good_gemini.to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(
        r.body.starts_with("data: {") && r.body.contains("\"finishReason\":\"STOP\""),
        "{}",
        r.body
    );
    // 4 f32 in base64: 16 bytes, 24 characters.
    assert_eq!(v["data"][0]["embedding"].as_str().map(str::len), Some(24));
}
