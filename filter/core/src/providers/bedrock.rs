//! AWS Bedrock's Converse API as a provider format:
//! `/model/{modelId}/converse` and `/model/{modelId}/converse-stream`,
//! every request signed with SigV4 ([`crate::credentials::sigv4`]) over its final body
//! by the host, with credentials from the VM's environment. Chat
//! completions are translated both ways (the request, a whole answer, a
//! stream from AWS's binary event stream ([`stream`]), errors); Messages
//! and Responses reach it through the pivot; embeddings go to InvokeModel
//! for Titan and Cohere models ([`embeddings`]).
//!
//! Like every translation, this one reads bodies in place and writes typed
//! structs ([`crate::wire::borrowed`]): no JSON tree.

use crate::api::Api;
use crate::config::{Provider, Schema};
use crate::error::GatewayError;
use crate::request::ChatRequest;
use crate::wire::borrowed::{self, Count, Obj, Str};
use crate::wire::chat::{data_url, user_content, UserPart, Written};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

pub mod embeddings;
mod stream;
pub use stream::Stream;

/// The service name Bedrock's runtime signs with.
pub const SIGNING_SERVICE: &str = "bedrock";

/// AWS Bedrock's runtime (Converse).
pub struct Bedrock;

impl super::Format for Bedrock {
    fn path(&self, p: &Provider, api: Api, model_id: &str, stream: bool) -> String {
        let model = super::path_segment(model_id);
        let method = match (api, stream) {
            (Api::Embeddings, _) => "invoke",
            (_, true) => "converse-stream",
            (_, false) => "converse",
        };
        [super::base(p), "/model/", &model, "/", method].concat()
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
        let drop_unsupported = matches!(
            p.schema,
            Schema::Bedrock {
                drop_unsupported: true,
                ..
            }
        );
        let (body, dropped) = request(chat.body(), drop_unsupported)?;
        Ok(super::Prepared {
            body: Some(body),
            dropped,
        })
    }

    /// Bedrock takes no key header: the host signs each request.
    fn credential(&self, _key: &str) -> (&'static str, String) {
        ("authorization", String::new())
    }

    fn answer(&self, body: &[u8], created: u64) -> Option<Vec<u8>> {
        answer(body, created, "")
    }

    fn error(&self, body: &[u8], status: u16) -> Vec<u8> {
        error(body, status)
    }

    fn stream(&self, created: u64, emit_usage: bool) -> Option<super::FormatStream> {
        Some(super::FormatStream::Bedrock(Stream::new(
            created, emit_usage, "",
        )))
    }
}

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

/// Fields of a chat request the translation reads: Anthropic's list (the
/// same chat fields have a Converse equivalent); `response_format` is
/// judged by its type below.
use super::anthropic::READ;

/// Fields the provider cannot honour: the names, in order.
fn unsupported(doc: &Obj) -> Vec<String> {
    doc.members()
        .filter(|(k, v)| match *k {
            "n" => !(borrowed::u64_of(v) == Some(1) || borrowed::is_null(v)),
            "logprobs" => !(borrowed::is_false(v) || borrowed::is_null(v)),
            // Converse has no structured output; plain text is its answer.
            "response_format" => Obj::of(v)
                .and_then(|f| f.str("type"))
                .is_some_and(|t| t != "text"),
            k => !READ.contains(&k),
        })
        .map(|(k, _)| k.to_string())
        .collect()
}

/// A Converse request, as Bedrock reads it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Converse<'a> {
    messages: Vec<Turn<'a>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    system: Vec<Text<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    inference_config: Option<InferenceConfig<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_config: Option<ToolConfig<'a>>,
}

#[derive(Serialize)]
struct Text<'a> {
    text: Cow<'a, str>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

/// A content block: exactly one of its members.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum Block<'a> {
    Text(Cow<'a, str>),
    Image {
        format: &'static str,
        source: ImageSource<'a>,
    },
    ToolUse {
        #[serde(rename = "toolUseId")]
        tool_use_id: Cow<'a, str>,
        name: Cow<'a, str>,
        input: Box<RawValue>,
    },
    ToolResult {
        #[serde(rename = "toolUseId")]
        tool_use_id: Cow<'a, str>,
        content: [ResultContent<'a>; 1],
    },
}

#[derive(Serialize)]
struct ImageSource<'a> {
    bytes: Cow<'a, str>,
}

/// A tool's result: JSON when its text is a JSON object, else text.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum ResultContent<'a> {
    Json(Box<RawValue>),
    Text(Cow<'a, str>),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct InferenceConfig<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_sequences: Option<Stop<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Stop<'a> {
    One([Cow<'a, str>; 1]),
    Many(&'a RawValue),
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolConfig<'a> {
    tools: Vec<ToolSpec<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ToolChoice<'a>>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ToolSpec<'a> {
    tool_spec: Spec<'a>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Spec<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a RawValue>,
    input_schema: InputSchema<'a>,
}

#[derive(Serialize)]
struct InputSchema<'a> {
    json: &'a RawValue,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
enum ToolChoice<'a> {
    Auto {},
    Any {},
    Tool { name: Cow<'a, str> },
}

use crate::wire::chat::InMessage as Message;

/// An empty JSON schema for a function that declares no parameters.
const NO_PARAMETERS: &str = r#"{"type":"object","properties":{}}"#;

/// The Converse request for a chat request's body, and the fields dropped
/// (only with `drop_unsupported`; otherwise they are a 400 naming them).
pub fn request(
    body: &[u8],
    drop_unsupported: bool,
) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let doc = Obj::parse_bytes(body)
        .ok_or_else(|| GatewayError::internal("translate: a chat request that does not read"))?;
    let dropped = unsupported(&doc);
    if !dropped.is_empty() && !drop_unsupported {
        return Err(bad(format!(
            "This model's provider (AWS Bedrock) does not support: {}. Remove them, or ask the operator to set `drop_unsupported` on the provider.",
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
    let (system, messages, tool_blocks) = turns(&list)?;
    if messages.is_empty() {
        return Err(bad(
            "This model's provider (AWS Bedrock) needs at least one user or assistant message besides the system ones.",
        ));
    }
    let no_parameters = borrowed::raw_from_text(NO_PARAMETERS);
    let choice = doc.get("tool_choice").map(tool_choice).transpose()?;
    let tools = doc
        .arr("tools")
        .filter(|t| !t.is_empty())
        .map(|ts| {
            ts.into_iter()
                .map(|t| spec(t, no_parameters.as_deref()))
                .collect::<Result<Vec<_>, _>>()
        })
        .transpose()?;
    // `tool_choice: none` has no Converse equivalent: the tools are left
    // out, unless the conversation holds tool blocks (Converse needs them
    // declared then) and the model may call one.
    let tool_config = match (tools, choice) {
        (Some(tools), Some(None)) if tool_blocks => Some(ToolConfig {
            tools,
            tool_choice: None,
        }),
        (Some(_), Some(None)) => None,
        (Some(tools), choice) => Some(ToolConfig {
            tools,
            tool_choice: choice.flatten(),
        }),
        (None, _) => None,
    };
    if tool_blocks && tool_config.is_none() {
        return Err(bad(
            "The conversation has tool calls or results: AWS Bedrock needs the request's `tools` declared with them.",
        ));
    }
    let out = Converse {
        messages,
        system: system.into_iter().map(|text| Text { text }).collect(),
        inference_config: inference_config(&doc),
        tool_config,
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

fn inference_config<'a>(doc: &Obj<'a>) -> Option<InferenceConfig<'a>> {
    let number = |k: &str| doc.get(k).filter(|v| borrowed::is_number(v));
    let config = InferenceConfig {
        max_tokens: doc
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
    };
    let empty = config.max_tokens.is_none()
        && config.temperature.is_none()
        && config.top_p.is_none()
        && config.stop_sequences.is_none();
    (!empty).then_some(config)
}

type Turns<'a> = (Vec<Cow<'a, str>>, Vec<Turn<'a>>, bool);

/// The system texts, the turns (user and tool messages are `user` turns,
/// assistant messages `assistant` turns; consecutive turns of one role
/// become one, as Converse needs them to alternate), and whether any turn
/// holds a tool block.
fn turns<'a>(list: &'a [Message<'a>]) -> Result<Turns<'a>, GatewayError> {
    let mut system = Vec::new();
    let mut out: Vec<Turn> = Vec::new();
    let mut tool_blocks = false;
    for (i, m) in list.iter().enumerate() {
        match m.role.0.as_deref().unwrap_or("") {
            "system" | "developer" => {
                let text = text_of(m.content);
                if !text.is_empty() {
                    system.push(text);
                }
            }
            "user" => push(&mut out, "user", user_blocks(i, m.content)?),
            "assistant" => {
                let mut blocks = Vec::new();
                let text = text_of(m.content);
                if !text.trim().is_empty() {
                    blocks.push(Block::Text(text));
                }
                for call in m.tool_calls.iter().flatten() {
                    let f = call.function.as_ref();
                    let args = f
                        .and_then(|f| f.arguments.0.as_deref())
                        .map(str::trim)
                        .filter(|a| !a.is_empty())
                        .unwrap_or("{}");
                    let input = borrowed::raw_from_text(args)
                        .filter(|r| r.get().starts_with('{'))
                        .ok_or_else(|| {
                            bad("An assistant tool call's `arguments` is not a JSON object.")
                        })?;
                    blocks.push(Block::ToolUse {
                        tool_use_id: call.id.0.clone().unwrap_or_default(),
                        name: f.and_then(|f| f.name.0.clone()).unwrap_or_default(),
                        input,
                    });
                    tool_blocks = true;
                }
                push(&mut out, "assistant", blocks);
            }
            "tool" => {
                let id = m
                    .tool_call_id
                    .0
                    .clone()
                    .ok_or_else(|| bad("A `tool` message needs `tool_call_id`."))?;
                let text = text_of(m.content);
                let content = match borrowed::raw_from_text(text.trim())
                    .filter(|r| r.get().starts_with('{'))
                {
                    Some(object) => ResultContent::Json(object),
                    None if text.trim().is_empty() => {
                        ResultContent::Json(borrowed::raw_from_text("{}").unwrap_or_default())
                    }
                    None => ResultContent::Text(text),
                };
                push(
                    &mut out,
                    "user",
                    vec![Block::ToolResult {
                        tool_use_id: id,
                        content: [content],
                    }],
                );
                tool_blocks = true;
            }
            other => return Err(bad(format!("Message role `{other}` is not supported."))),
        }
    }
    Ok((system, out, tool_blocks))
}

fn push<'a>(out: &mut Vec<Turn<'a>>, role: &'static str, blocks: Vec<Block<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match out.last_mut().filter(|t| t.role == role) {
        Some(last) => last.content.extend(blocks),
        None => out.push(Turn {
            role,
            content: blocks,
        }),
    }
}

use crate::wire::chat::content_text as text_of;

/// A user message's content as blocks: text, and images inline.
fn user_blocks(i: usize, content: Option<&RawValue>) -> Result<Vec<Block<'_>>, GatewayError> {
    user_content(content, "AWS Bedrock", |part| match part {
        UserPart::Text(text) => Ok(Block::Text(text)),
        UserPart::Image(url) => image(i, url),
    })
}

/// An image as bytes: Converse fetches no URL, so only
/// `data:image/<png|jpeg|gif|webp>;base64,<data>` URLs translate.
fn image(i: usize, url: Cow<'_, str>) -> Result<Block<'_>, GatewayError> {
    let refuse = || {
        bad(format!(
            "messages.{i}: this model's provider (AWS Bedrock) takes images inline only, as PNG, JPEG, GIF or WebP: send a `data:image/png;base64,...` URL."
        ))
    };
    let (mime, bytes) = data_url(url).map_err(|_| refuse())?;
    let format = match mime.to_ascii_lowercase().as_str() {
        "image/png" => "png",
        "image/jpeg" | "image/jpg" => "jpeg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        _ => return Err(refuse()),
    };
    Ok(Block::Image {
        format,
        source: ImageSource { bytes },
    })
}

fn spec<'a>(
    t: &'a RawValue,
    no_parameters: Option<&'a RawValue>,
) -> Result<ToolSpec<'a>, GatewayError> {
    let (f, name) = crate::wire::chat::function_tool(t)?;
    let json = f
        .get("parameters")
        .filter(|p| !borrowed::is_null(p))
        .or(no_parameters)
        .ok_or_else(|| GatewayError::internal("translate: the empty schema"))?;
    Ok(ToolSpec {
        tool_spec: Spec {
            name,
            description: f.get("description").filter(|d| !borrowed::is_null(d)),
            input_schema: InputSchema { json },
        },
    })
}

/// The tool choice; `Ok(None)` for `none` (no Converse equivalent).
fn tool_choice(c: &RawValue) -> Result<Option<ToolChoice<'_>>, GatewayError> {
    if let Some(s) = borrowed::str_of(c) {
        return match s.as_ref() {
            "auto" => Ok(Some(ToolChoice::Auto {})),
            "none" => Ok(None),
            "required" => Ok(Some(ToolChoice::Any {})),
            other => Err(bad(format!(
                "`tool_choice` `{other}` is not auto, none or required."
            ))),
        };
    }
    Obj::of(c)
        .and_then(|o| o.obj("function"))
        .and_then(|f| f.str("name"))
        .map(|name| Some(ToolChoice::Tool { name }))
        .ok_or_else(|| bad("`tool_choice` must be auto, none, required or name a function."))
}

/// Converse's `stopReason` as chat's `finish_reason`.
pub fn finish_reason(reason: &str) -> &'static str {
    match reason {
        "tool_use" => "tool_calls",
        "max_tokens" | "model_context_window_exceeded" => "length",
        "guardrail_intervened" | "content_filtered" => "content_filter",
        _ => "stop",
    }
}

/// Converse's usage (whole answers and the stream's `metadata` event).
#[derive(Deserialize, Default, Clone, Copy, Debug)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Usage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    cache_write_input_tokens: Count,
}

impl Usage {
    /// OpenAI's usage: the prompt counts cache reads and writes, as
    /// Anthropic's translation does (Converse's `inputTokens` excludes
    /// them).
    pub(crate) fn chat(self) -> crate::wire::chat::WrittenUsage {
        let n = |c: Count| c.0.unwrap_or(0);
        crate::wire::anthropic::chat_usage(
            n(self.input_tokens),
            n(self.cache_read_input_tokens),
            n(self.cache_write_input_tokens),
            n(self.output_tokens),
        )
    }
}

/// A whole Converse answer: the members the translation reads.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Answer<'a> {
    #[serde(borrow, default)]
    output: Option<Output<'a>>,
    #[serde(borrow, default)]
    stop_reason: Str<'a>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize, Default)]
struct Output<'a> {
    #[serde(borrow, default)]
    message: Option<AnswerMessage<'a>>,
}

#[derive(Deserialize, Default)]
struct AnswerMessage<'a> {
    #[serde(borrow, default)]
    content: Vec<AnswerBlock<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct AnswerBlock<'a> {
    #[serde(borrow, default)]
    text: Str<'a>,
    #[serde(borrow, default)]
    tool_use: Option<ToolUse<'a>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ToolUse<'a> {
    #[serde(borrow, default)]
    pub tool_use_id: Str<'a>,
    #[serde(borrow, default)]
    pub name: Str<'a>,
    #[serde(borrow, default)]
    pub input: Option<&'a RawValue>,
}

#[derive(Serialize)]
pub(crate) struct Call<'a> {
    pub id: Cow<'a, str>,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub function: Function<'a>,
}

#[derive(Serialize)]
pub(crate) struct Function<'a> {
    pub name: Cow<'a, str>,
    /// The input's JSON as a string.
    pub arguments: Cow<'a, str>,
}

/// Converse answers carry no id: one from the answer's bytes and time.
pub(crate) fn answer_id(seed: &[u8], created: u64) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ created;
    for b in seed.iter().take(512) {
        h = (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3);
    }
    format!("chatcmpl-bedrock-{h:016x}")
}

/// A whole Converse answer as a chat completion naming `model`; `None`
/// when it does not read as one.
pub fn answer(body: &[u8], created: u64, model: &str) -> Option<Vec<u8>> {
    let v: Answer = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    let mut text = Cow::Borrowed("");
    let mut calls = Vec::new();
    let message = v.output.unwrap_or_default().message?;
    for b in message.content {
        if let Some(t) = b.tool_use {
            calls.push(Call {
                id: t.tool_use_id.0.unwrap_or_default(),
                kind: "function",
                function: Function {
                    name: t.name.0.unwrap_or_default(),
                    arguments: Cow::Borrowed(t.input.map_or("{}", RawValue::get)),
                },
            });
        } else if let Some(t) = b.text.0 {
            if text.is_empty() {
                text = t;
            } else {
                text.to_mut().push_str(&t);
            }
        }
    }
    Written {
        id: answer_id(body, created),
        created,
        model,
        text,
        tool_calls: calls,
        finish_reason: finish_reason(v.stop_reason.0.as_deref().unwrap_or("end_turn")),
        usage: v.usage.unwrap_or_default().chat(),
    }
    .to_bytes(body.len().saturating_add(128))
}

/// AWS's error body: `{"message": ...}` (`Message` in some services).
#[derive(Deserialize, Default)]
struct AwsError<'a> {
    #[serde(borrow, default)]
    message: Str<'a>,
    #[serde(borrow, default, rename = "Message")]
    message_upper: Str<'a>,
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
    code: &'static str,
    param: (),
}

/// The error's class by status, as AWS names it.
fn error_code(status: u16) -> &'static str {
    match status {
        400 => "ValidationException",
        403 => "AccessDeniedException",
        404 => "ResourceNotFoundException",
        408 => "ModelTimeoutException",
        424 => "ModelErrorException",
        429 => "ThrottlingException",
        503 => "ServiceUnavailableException",
        _ => "InternalServerException",
    }
}

/// A Bedrock error body in OpenAI's shape (same status).
pub fn error(body: &[u8], status: u16) -> Vec<u8> {
    let text = std::str::from_utf8(body).unwrap_or("");
    let e: AwsError = serde_json::from_str(text).unwrap_or_default();
    let out = OpenAiError {
        error: OpenAiErrorBody {
            message: e
                .message
                .0
                .or(e.message_upper.0)
                .unwrap_or_else(|| Cow::Owned(format!("The provider answered {status}."))),
            kind: match status {
                400..=499 if status != 429 => "invalid_request_error",
                _ => "api_error",
            },
            code: error_code(status),
            param: (),
        },
    };
    serde_json::to_vec(&out).unwrap_or_default()
}

#[cfg(test)]
mod tests;
