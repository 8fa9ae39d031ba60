//! Google's Gemini API as a provider format: `models/{id}:generateContent`,
//! `models/{id}:streamGenerateContent?alt=sse`, the key in
//! `x-goog-api-key`. Chat completions are translated both ways (the
//! request, a whole answer, a stream event by event, errors); Messages and
//! Responses reach it through the pivot; embeddings go to
//! `models/{id}:batchEmbedContents` ([`embeddings`]) and token counts to
//! `models/{id}:countTokens` ([`count`]).
//!
//! Like every translation, this one reads bodies in place and writes typed
//! structs ([`crate::wire::borrowed`]): no JSON tree.

use crate::api::Api;
use crate::config::{Provider, Schema};
use crate::error::GatewayError;
use crate::request::ChatRequest;
use crate::wire::borrowed::{self, Count, Obj, Str};
use crate::wire::chat::{
    data_url, user_content, ToolCall, UserPart, Written, WrittenCompletionDetails,
    WrittenPromptDetails, WrittenUsage,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

pub mod count;
pub mod embeddings;
mod stream;
pub use stream::Stream;

/// Google's Gemini API (generativelanguage.googleapis.com, `/v1beta`).
pub struct Gemini;

impl super::Format for Gemini {
    fn path(&self, p: &Provider, api: Api, model_id: &str, stream: bool) -> String {
        let model = super::path_segment(model_id);
        if api == Api::Embeddings {
            format!("{}/models/{model}:batchEmbedContents", super::base(p))
        } else if api == Api::CountTokens {
            format!("{}/models/{model}:countTokens", super::base(p))
        } else if stream {
            format!(
                "{}/models/{model}:streamGenerateContent?alt=sse",
                super::base(p)
            )
        } else {
            format!("{}/models/{model}:generateContent", super::base(p))
        }
    }

    fn translate_request(
        &self,
        p: &Provider,
        chat: &ChatRequest,
        model_id: &str,
    ) -> Result<super::Prepared, GatewayError> {
        if chat.api == Api::Embeddings {
            return Ok(super::Prepared {
                body: Some(embeddings::request(chat.body(), model_id)?),
                dropped: Vec::new(),
            });
        }
        if chat.api == Api::CountTokens {
            return Ok(super::Prepared {
                body: Some(count::request(chat.body(), model_id)?),
                dropped: Vec::new(),
            });
        }
        let drop_unsupported = matches!(
            p.schema,
            Schema::Gemini {
                drop_unsupported: true
            }
        );
        let (body, dropped) = request(chat.body(), drop_unsupported)?;
        Ok(super::Prepared {
            body: Some(body),
            dropped,
        })
    }

    fn credential(&self, key: &str) -> (&'static str, String) {
        ("x-goog-api-key", key.to_string())
    }

    fn answer(&self, body: &[u8], created: u64) -> Option<Vec<u8>> {
        answer(body, created)
    }

    fn error(&self, body: &[u8], status: u16) -> Vec<u8> {
        error(body, status)
    }

    fn stream(&self, created: u64, emit_usage: bool) -> Option<super::FormatStream> {
        Some(super::FormatStream::Gemini(Stream::new(
            created, emit_usage,
        )))
    }
}

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

/// Fields of a chat request the translation reads; `user` and
/// `parallel_tool_calls` have no Gemini equivalent and change nothing in the
/// answer, so they are read and left.
const READ: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "response_format",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "n",
];

/// Fields the provider cannot honour: the names, in order.
fn unsupported(doc: &Obj) -> Vec<String> {
    doc.members()
        .filter(|(k, v)| match *k {
            "n" => !(borrowed::u64_of(v) == Some(1) || borrowed::is_null(v)),
            "logprobs" => !(borrowed::is_false(v) || borrowed::is_null(v)),
            k => !READ.contains(&k),
        })
        .map(|(k, _)| k.to_string())
        .collect()
}

/// A `generateContent` request, as Gemini reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct GenerateContent<'a> {
    contents: Vec<Content<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    system_instruction: Option<System<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<[Tools<'a>; 1]>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    generation_config: Option<GenerationConfig<'a>>,
}

#[derive(Serialize)]
struct System<'a> {
    parts: [Part<'a>; 1],
}

#[derive(Serialize)]
struct Content<'a> {
    role: &'static str,
    parts: Vec<Piece<'a>>,
}

/// A part with the thought signature Gemini gave it, sent back as it came
/// (thinking models refuse a function call of theirs without it).
#[derive(Serialize)]
struct Piece<'a> {
    #[serde(flatten)]
    part: Part<'a>,
    #[serde(rename = "thoughtSignature", skip_serializing_if = "Option::is_none")]
    signature: Option<&'a str>,
}

impl<'a> From<Part<'a>> for Piece<'a> {
    fn from(part: Part<'a>) -> Self {
        Piece {
            part,
            signature: None,
        }
    }
}

/// Between a tool call's id and the thought signature it carries: Gemini
/// gives calls no id, so the gateway makes one, and the signature rides in
/// it through the client and back.
const SIGNATURE: &str = "~ts~";

/// A part of a turn: exactly one of its members.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Part<'a> {
    Text(Cow<'a, str>),
    InlineData {
        #[serde(rename = "mimeType")]
        mime_type: Cow<'a, str>,
        data: Cow<'a, str>,
    },
    FunctionCall {
        name: Cow<'a, str>,
        args: Box<RawValue>,
    },
    FunctionResponse {
        name: Cow<'a, str>,
        response: Response<'a>,
    },
}

/// A tool's result: its text when it is a JSON object, else wrapped as
/// `{"content": text}` (Gemini takes an object).
#[derive(Serialize)]
#[serde(untagged)]
enum Response<'a> {
    Object(Box<RawValue>),
    Text { content: Cow<'a, str> },
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Tools<'a> {
    function_declarations: Vec<Declaration<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Declaration<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a RawValue>,
    /// The client's JSON Schema as it is (Gemini's `parameters` takes an
    /// OpenAPI subset; this member takes JSON Schema).
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters_json_schema: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    function_calling_config: CallingConfig<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CallingConfig<'a> {
    mode: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    allowed_function_names: Option<[Cow<'a, str>; 1]>,
}

#[derive(Serialize, Default)]
#[serde(rename_all = "camelCase")]
struct GenerationConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_output_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_sequences: Option<Stop<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    seed: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    presence_penalty: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    frequency_penalty: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_mime_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_json_schema: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Stop<'a> {
    One([Cow<'a, str>; 1]),
    Many(&'a RawValue),
}

use crate::wire::chat::InMessage as Message;

/// The `generateContent` request for a chat request's body, and the fields
/// dropped (only with `drop_unsupported`; otherwise they are a 400 naming
/// them).
pub fn request(
    body: &[u8],
    drop_unsupported: bool,
) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let doc = Obj::parse_bytes(body)
        .ok_or_else(|| GatewayError::internal("translate: a chat request that does not read"))?;
    let dropped = unsupported(&doc);
    if !dropped.is_empty() && !drop_unsupported {
        return Err(bad(format!(
            "This model's provider (Gemini) does not support: {}. Remove them, or ask the operator to set `drop_unsupported` on the provider.",
            dropped.join(", ")
        )));
    }
    let list = doc
        .get("messages")
        .filter(|l| l.get().starts_with('['))
        .ok_or_else(|| bad("`messages` must be an array."))?;
    let list: Vec<Message> = serde_json::from_str(list.get()).map_err(|e| {
        bad(format!(
            "`messages` must be a list of message objects ({e})."
        ))
    })?;
    let (system, contents) = contents(&list)?;
    if contents.is_empty() {
        return Err(bad(
            "This model's provider (Gemini) needs at least one user or assistant message besides the system ones.",
        ));
    }
    let tools = doc
        .arr("tools")
        .filter(|t| !t.is_empty())
        .map(|ts| {
            ts.into_iter()
                .map(declaration)
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?
        .map(|function_declarations| {
            [Tools {
                function_declarations,
            }]
        });
    let tool_config = doc.get("tool_choice").map(tool_config).transpose()?;
    let out = GenerateContent {
        contents,
        system_instruction: (!system.is_empty()).then(|| System {
            parts: [Part::Text(Cow::Owned(system.join("\n\n")))],
        }),
        tools,
        tool_config,
        generation_config: generation_config(&doc)?,
    };
    let mut bytes = Vec::with_capacity(body.len().saturating_add(64));
    serde_json::to_writer(&mut bytes, &out)
        .map_err(|e| GatewayError::internal(format!("translate: {e}")))?;
    Ok((
        bytes,
        if drop_unsupported {
            dropped
        } else {
            Vec::new()
        },
    ))
}

fn generation_config<'a>(doc: &Obj<'a>) -> Result<Option<GenerationConfig<'a>>, GatewayError> {
    let number = |k: &str| doc.get(k).filter(|v| borrowed::is_number(v));
    let (response_mime_type, response_json_schema) = match doc.obj("response_format") {
        None => (None, None),
        Some(f) => match f.str("type").as_deref() {
            None | Some("text") => (None, None),
            Some("json_object") => (Some("application/json"), None),
            Some("json_schema") => (
                Some("application/json"),
                f.obj("json_schema").and_then(|s| s.get("schema")),
            ),
            Some(other) => {
                return Err(bad(format!(
                    "`response_format` type `{other}` is not text, json_object or json_schema."
                )))
            }
        },
    };
    let config = GenerationConfig {
        max_output_tokens: doc
            .get("max_completion_tokens")
            .or_else(|| doc.get("max_tokens"))
            .and_then(borrowed::u64_of),
        temperature: number("temperature"),
        top_p: number("top_p"),
        stop_sequences: match doc.get("stop") {
            Some(v) if borrowed::is_string(v) => borrowed::str_of(v).map(|s| Stop::One([s])),
            Some(v) if borrowed::arr_of(v).is_some_and(|a| !a.is_empty()) => Some(Stop::Many(v)),
            _ => None,
        },
        seed: number("seed"),
        presence_penalty: number("presence_penalty"),
        frequency_penalty: number("frequency_penalty"),
        response_mime_type,
        response_json_schema,
    };
    let empty = config.max_output_tokens.is_none()
        && config.temperature.is_none()
        && config.top_p.is_none()
        && config.stop_sequences.is_none()
        && config.seed.is_none()
        && config.presence_penalty.is_none()
        && config.frequency_penalty.is_none()
        && config.response_mime_type.is_none();
    Ok((!empty).then_some(config))
}

/// The system texts and the turns: user and tool messages are `user`
/// turns, assistant messages `model` turns; consecutive turns of one role
/// become one (a tool call's results share one turn, as Gemini expects).
fn contents<'a>(
    list: &'a [Message<'a>],
) -> Result<(Vec<Cow<'a, str>>, Vec<Content<'a>>), GatewayError> {
    let mut system = Vec::new();
    let mut out: Vec<Content> = Vec::new();
    for (i, m) in list.iter().enumerate() {
        match m.role.0.as_deref().unwrap_or("") {
            "system" | "developer" => system.push(text_of(m.content)),
            "user" => push(
                &mut out,
                "user",
                user_parts(i, m.content)?
                    .into_iter()
                    .map(Piece::from)
                    .collect(),
            ),
            "assistant" => {
                let mut parts = Vec::new();
                let text = text_of(m.content);
                if !text.is_empty() {
                    parts.push(Piece::from(Part::Text(text)));
                }
                for call in m.tool_calls.iter().flatten() {
                    let f = call.function.as_ref();
                    let name = f.and_then(|f| f.name.0.clone()).unwrap_or_default();
                    let args = f
                        .and_then(|f| f.arguments.0.as_deref())
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .unwrap_or("{}");
                    let args = borrowed::raw_from_text(args)
                        .filter(|r| r.get().starts_with('{'))
                        .ok_or_else(|| {
                            bad("An assistant tool call's `arguments` is not a JSON object.")
                        })?;
                    let signature = call
                        .id
                        .0
                        .as_deref()
                        .and_then(|id| id.split_once(SIGNATURE))
                        .map(|(_, s)| s);
                    parts.push(Piece {
                        part: Part::FunctionCall { name, args },
                        signature,
                    });
                }
                push(&mut out, "model", parts);
            }
            "tool" => {
                let id = m
                    .tool_call_id
                    .0
                    .as_deref()
                    .ok_or_else(|| bad("A `tool` message needs `tool_call_id`."))?;
                let name = called(list, i, id).ok_or_else(|| {
                    bad(format!(
                        "messages.{i}: `tool_call_id` `{id}` answers no earlier tool call (Gemini needs the function's name)."
                    ))
                })?;
                let text = text_of(m.content);
                let response = match borrowed::raw_from_text(text.trim())
                    .filter(|r| r.get().starts_with('{'))
                {
                    Some(object) => Response::Object(object),
                    None => Response::Text { content: text },
                };
                push(
                    &mut out,
                    "user",
                    vec![Piece::from(Part::FunctionResponse { name, response })],
                );
            }
            other => return Err(bad(format!("Message role `{other}` is not supported."))),
        }
    }
    Ok((system, out))
}

/// The name of the function an earlier assistant message called with `id`.
fn called<'a>(list: &'a [Message<'a>], before: usize, id: &str) -> Option<Cow<'a, str>> {
    list.iter()
        .take(before)
        .rev()
        .flat_map(|m| m.tool_calls.iter().flatten())
        .find(|c| c.id.is(id))
        .and_then(|c| c.function.as_ref())
        .and_then(|f| f.name.0.clone())
}

fn push<'a>(out: &mut Vec<Content<'a>>, role: &'static str, parts: Vec<Piece<'a>>) {
    if parts.is_empty() {
        return;
    }
    match out.last_mut().filter(|c| c.role == role) {
        Some(last) => last.parts.extend(parts),
        None => out.push(Content { role, parts }),
    }
}

use crate::wire::chat::content_text as text_of;

/// A user message's content as parts: text, and images inline.
fn user_parts(i: usize, content: Option<&RawValue>) -> Result<Vec<Part<'_>>, GatewayError> {
    user_content(content, "Gemini", |part| match part {
        UserPart::Text(text) => Ok(Part::Text(text)),
        UserPart::Image(url) => inline_image(i, url),
    })
}

/// An image as inline data: Gemini fetches no URL the client names, so
/// only `data:<media type>;base64,<data>` URLs translate.
fn inline_image(i: usize, url: Cow<'_, str>) -> Result<Part<'_>, GatewayError> {
    let refuse = || {
        bad(format!(
            "messages.{i}: this model's provider (Gemini) takes images inline only: send a `data:<media type>;base64,...` URL."
        ))
    };
    let (mime_type, data) = data_url(url).map_err(|_| refuse())?;
    Ok(Part::InlineData { mime_type, data })
}

fn declaration(t: &RawValue) -> Result<Declaration<'_>, GatewayError> {
    let (f, name) = crate::wire::chat::function_tool(t)?;
    Ok(Declaration {
        name,
        description: f.get("description").filter(|d| !borrowed::is_null(d)),
        parameters_json_schema: f.get("parameters").filter(|p| !borrowed::is_null(p)),
    })
}

fn tool_config(c: &RawValue) -> Result<ToolConfig<'_>, GatewayError> {
    let config = |mode, allowed_function_names| ToolConfig {
        function_calling_config: CallingConfig {
            mode,
            allowed_function_names,
        },
    };
    if let Some(s) = borrowed::str_of(c) {
        return match s.as_ref() {
            "auto" => Ok(config("AUTO", None)),
            "none" => Ok(config("NONE", None)),
            "required" => Ok(config("ANY", None)),
            other => Err(bad(format!(
                "`tool_choice` `{other}` is not auto, none or required."
            ))),
        };
    }
    Obj::of(c)
        .and_then(|o| o.obj("function"))
        .and_then(|f| f.str("name"))
        .map(|n| config("ANY", Some([n])))
        .ok_or_else(|| bad("`tool_choice` must be auto, none, required or name a function."))
}

/// Gemini's `finishReason` as chat's `finish_reason`.
pub fn finish_reason(reason: &str, called: bool) -> &'static str {
    match reason {
        "MAX_TOKENS" => "length",
        "SAFETY" | "RECITATION" | "BLOCKLIST" | "PROHIBITED_CONTENT" | "SPII" | "IMAGE_SAFETY" => {
            "content_filter"
        }
        _ if called => "tool_calls",
        _ => "stop",
    }
}

/// A `generateContent` answer (or one event of a stream): the members the
/// translation reads, in one pass.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Answer<'a> {
    #[serde(borrow, default)]
    pub candidates: Vec<Candidate<'a>>,
    #[serde(default)]
    pub usage_metadata: Option<UsageMetadata>,
    #[serde(borrow, default)]
    pub model_version: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub response_id: Str<'a>,
    #[serde(borrow, default)]
    pub prompt_feedback: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub error: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Candidate<'a> {
    #[serde(borrow, default)]
    pub content: Option<AnswerContent<'a>>,
    #[serde(borrow, default)]
    pub finish_reason: Str<'a>,
}

#[derive(Deserialize, Default)]
pub(crate) struct AnswerContent<'a> {
    #[serde(borrow, default)]
    pub parts: Vec<AnswerPart<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct AnswerPart<'a> {
    #[serde(borrow, default)]
    pub text: Str<'a>,
    /// A thought summary, not the answer.
    #[serde(default)]
    pub thought: Option<bool>,
    #[serde(borrow, default)]
    pub function_call: Option<FunctionCall<'a>>,
    #[serde(borrow, default)]
    pub thought_signature: Str<'a>,
}

#[derive(Deserialize, Default)]
pub(crate) struct FunctionCall<'a> {
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub args: Option<&'a RawValue>,
}

#[derive(Deserialize, Default, Clone, Copy, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct UsageMetadata {
    #[serde(default)]
    prompt_token_count: Count,
    #[serde(default)]
    candidates_token_count: Count,
    #[serde(default)]
    cached_content_token_count: Count,
    #[serde(default)]
    thoughts_token_count: Count,
}

/// OpenAI's usage from Gemini's: the thoughts are completion tokens (as
/// OpenAI counts reasoning), cached content is the cached part of the
/// prompt.
impl UsageMetadata {
    pub(crate) fn chat(self) -> WrittenUsage {
        let n = |c: Count| c.0.unwrap_or(0);
        let prompt = n(self.prompt_token_count);
        let thoughts = n(self.thoughts_token_count);
        let completion = n(self.candidates_token_count).saturating_add(thoughts);
        WrittenUsage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt.saturating_add(completion),
            prompt_tokens_details: WrittenPromptDetails {
                cached_tokens: n(self.cached_content_token_count),
                cache_creation_tokens: None,
            },
            completion_tokens_details: Some(WrittenCompletionDetails {
                reasoning_tokens: thoughts,
            }),
        }
    }
}

/// A call's id: Gemini gives none, so the answer's id and the call's place,
/// and the call's thought signature when it has one.
pub(crate) fn call_id(response_id: Option<&str>, index: usize, signature: Option<&str>) -> String {
    let id = response_id.unwrap_or("gemini");
    match signature {
        Some(s) => format!("call_{id}_{index}{SIGNATURE}{s}"),
        None => format!("call_{id}_{index}"),
    }
}

/// A whole `generateContent` answer as a chat completion; `None` when it
/// does not read as one.
pub fn answer(body: &[u8], created: u64) -> Option<Vec<u8>> {
    let v: Answer = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    let response_id = v.response_id.0.as_deref();
    let mut text = Cow::Borrowed("");
    let mut calls = Vec::new();
    let candidate = v.candidates.into_iter().next().unwrap_or_default();
    for p in candidate.content.unwrap_or_default().parts {
        if let Some(call) = p.function_call {
            calls.push(ToolCall::with_id(
                call_id(response_id, calls.len(), p.thought_signature.0.as_deref()),
                call.name,
                call.args,
            ));
        } else if p.thought != Some(true) {
            if let Some(t) = p.text.0 {
                if text.is_empty() {
                    text = t;
                } else {
                    text.to_mut().push_str(&t);
                }
            }
        }
    }
    // No candidate: the prompt was blocked (`promptFeedback.blockReason`).
    let reason = match candidate.finish_reason.0.as_deref() {
        Some(r) => finish_reason(r, !calls.is_empty()),
        None if v.prompt_feedback.is_some() => "content_filter",
        None => finish_reason("STOP", !calls.is_empty()),
    };
    Written {
        id: format!("chatcmpl-{}", response_id.unwrap_or("gemini")),
        created,
        model: v.model_version,
        text,
        tool_calls: calls,
        finish_reason: reason,
        usage: v.usage_metadata.unwrap_or_default().chat(),
    }
    .to_bytes(body.len().saturating_add(128))
}

/// Google's error: `{"error": {"code", "message", "status"}}` (also sent
/// as a one-element list).
#[derive(Deserialize, Default)]
pub(crate) struct GoogleError<'a> {
    #[serde(borrow, default)]
    pub message: Str<'a>,
    #[serde(borrow, default)]
    pub status: Str<'a>,
}

#[derive(Deserialize)]
struct ErrorBody<'a> {
    #[serde(borrow)]
    error: GoogleError<'a>,
}

/// The error a Gemini error body carries, whole or as a one-element list.
pub(crate) fn google_error(body: &str) -> Option<GoogleError<'_>> {
    // Only an object is read as one (serde reads a struct from a list too).
    if body.trim_start().starts_with('{') {
        return serde_json::from_str::<ErrorBody>(body)
            .ok()
            .map(|b| b.error);
    }
    serde_json::from_str::<Vec<ErrorBody>>(body)
        .ok()?
        .into_iter()
        .next()
        .map(|b| b.error)
}

#[derive(Serialize)]
struct OpenAiError<'a> {
    error: OpenAiErrorBody<'a>,
}

#[derive(Serialize)]
struct OpenAiErrorBody<'a> {
    message: Cow<'a, str>,
    #[serde(rename = "type")]
    kind: &'static str,
    code: Cow<'a, str>,
    param: (),
}

/// A Gemini error body in OpenAI's shape (same status).
pub fn error(body: &[u8], status: u16) -> Vec<u8> {
    let text = std::str::from_utf8(body).unwrap_or("");
    let e = google_error(text).unwrap_or_default();
    let out = OpenAiError {
        error: OpenAiErrorBody {
            message: e
                .message
                .0
                .unwrap_or_else(|| Cow::Owned(format!("The provider answered {status}."))),
            kind: match status {
                400..=499 if status != 429 => "invalid_request_error",
                _ => "api_error",
            },
            code: e.status.0.unwrap_or(Cow::Borrowed("api_error")),
            param: (),
        },
    };
    serde_json::to_vec(&out).unwrap_or_default()
}

#[cfg(test)]
mod tests;
