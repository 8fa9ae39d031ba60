//! Whole bodies through the pivot: a Messages request as a chat completion,
//! and a whole chat completion as a Messages answer. Both read the body in
//! place ([`crate::wire::borrowed`], typed structs read in one pass) and write
//! typed structs straight to bytes, with no JSON tree between (#24).

use super::{bad, stop_reason};
use crate::error::GatewayError;
use crate::wire::anthropic::{tool_use_block, AnthropicUsage, Block, MessageAnswer};
use crate::wire::borrowed::{self, Count, Obj, Str};
use crate::wire::chat::{Completion, Schema, ToolCall};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Fields of a Messages request the translation reads; the ones it drops
/// (no chat-completions equivalent) are listed in `x-portcullis-dropped`.
const READ: &[&str] = &[
    "model",
    "messages",
    "max_tokens",
    "system",
    "metadata",
    "stop_sequences",
    "stream",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
];
const DROPPED: &[&str] = &["top_k", "thinking", "service_tier", "context_management"];

/// A chat completion request, as the pivot's providers read it.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<ChatMessage<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<IncludeUsage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<FunctionTool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<ChatChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct IncludeUsage {
    include_usage: bool,
}

#[derive(Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
enum ChatMessage<'a> {
    System {
        content: Cow<'a, str>,
    },
    User {
        content: UserContent<'a>,
    },
    Assistant {
        content: Option<Cow<'a, str>>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall<'a>>,
    },
    Tool {
        tool_call_id: Cow<'a, str>,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
#[serde(untagged)]
enum UserContent<'a> {
    Text(Text<'a>),
    Parts(Vec<Part<'a>>),
}

/// A text block's `text` as the client sent it (`""` when it sent none).
#[derive(Serialize)]
#[serde(untagged)]
enum Text<'a> {
    Given(&'a RawValue),
    Empty(&'static str),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    Text { text: Text<'a> },
    ImageUrl { image_url: ImageUrl<'a> },
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: Cow<'a, str>,
}

#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

#[derive(Serialize)]
struct Function<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a RawValue>,
    parameters: Schema<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ChatChoice<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        function: Named<'a>,
    },
}

#[derive(Serialize)]
struct Named<'a> {
    name: Cow<'a, str>,
}

/// A Messages request as a chat completion for `model_id`, and the fields
/// dropped. A stream asks for the usage chunk (the Messages stream ends
/// with the usage).
pub fn to_chat(body: &[u8], model_id: &str) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let doc = Obj::parse_bytes(body).ok_or_else(|| {
        GatewayError::internal("translate: a Messages request that does not read")
    })?;
    let mut dropped = Vec::new();
    for (k, _) in doc.members() {
        if DROPPED.contains(&k) {
            dropped.push(k.to_string());
        } else if !READ.contains(&k) {
            return Err(bad(format!(
                "`{k}` cannot be served by this model's provider (an OpenAI-compatible API): remove it."
            )));
        }
    }
    let mut messages = Vec::new();
    if let Some(system) = doc.get("system") {
        let text = blocks_text(system)?;
        if !text.is_empty() {
            messages.push(ChatMessage::System { content: text });
        }
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
    for (i, m) in list.into_iter().enumerate() {
        message(i, m, &mut messages)?;
    }
    let stream = doc.get("stream").is_some_and(borrowed::is_true);
    let tools = doc
        .arr("tools")
        .filter(|t| !t.is_empty())
        .map(|ts| ts.into_iter().map(tool).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    let (tool_choice, parallel) = match doc.get("tool_choice") {
        Some(c) => {
            let (c, parallel) = tool_choice(c)?;
            (Some(c), parallel)
        }
        None => (None, true),
    };
    let out = ChatRequest {
        model: model_id,
        messages,
        max_tokens: doc.get("max_tokens"),
        temperature: doc.get("temperature"),
        top_p: doc.get("top_p"),
        stop: doc
            .get("stop_sequences")
            .filter(|s| borrowed::arr_of(s).is_some_and(|a| !a.is_empty())),
        stream,
        stream_options: stream.then_some(IncludeUsage {
            include_usage: true,
        }),
        parallel_tool_calls: (!parallel && tools.is_some()).then_some(false),
        tools,
        tool_choice,
        user: doc.obj("metadata").and_then(|m| m.str("user_id")),
    };
    let mut bytes = Vec::with_capacity(body.len().saturating_add(64));
    serde_json::to_writer(&mut bytes, &out)
        .map_err(|e| GatewayError::internal(format!("translate: {e}")))?;
    Ok((bytes, dropped))
}

/// `system` (a string or text blocks) as one text.
fn blocks_text(v: &RawValue) -> Result<Cow<'_, str>, GatewayError> {
    if let Some(s) = borrowed::str_of(v) {
        return Ok(s);
    }
    let blocks = borrowed::arr_of(v)
        .ok_or_else(|| bad("`system` must be a string or a list of text blocks."))?;
    let texts: Vec<Cow<str>> = blocks
        .into_iter()
        .filter_map(Obj::of)
        .filter(|b| b.str("type").as_deref() == Some("text"))
        .filter_map(|b| b.str("text"))
        .collect();
    Ok(match texts.len() {
        1 => texts.into_iter().next().unwrap_or_default(),
        _ => Cow::Owned(texts.join("\n\n")),
    })
}

/// A Messages message: the members the translation reads, in one pass.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Str<'a>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
}

/// A content block: the members any block type has that the translation
/// reads, in one pass.
#[derive(Deserialize, Default)]
struct InBlock<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Str<'a>,
    #[serde(borrow, default)]
    text: Option<&'a RawValue>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_use_id: Str<'a>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    source: Option<&'a RawValue>,
}

/// One Messages message as chat messages: a user turn's `tool_result`
/// blocks become `tool` messages first (they answer the assistant's calls
/// just before), then its other blocks one user message.
fn message<'a>(
    i: usize,
    m: Message<'a>,
    out: &mut Vec<ChatMessage<'a>>,
) -> Result<(), GatewayError> {
    let blocks: Vec<InBlock> = match m.content {
        Some(c) if borrowed::is_string(c) => vec![InBlock {
            kind: Str(Some(Cow::Borrowed("text"))),
            text: Some(c),
            ..InBlock::default()
        }],
        Some(c) if c.get().starts_with('[') => {
            serde_json::from_str(c.get()).map_err(|_| unsupported_block(i, None))?
        }
        _ => {
            return Err(bad(format!(
                "messages.{i}.content must be a string or a list of blocks."
            )))
        }
    };
    let role = m.role.0.unwrap_or_default();
    match role.as_ref() {
        "user" => {
            let mut parts = Vec::new();
            for b in blocks {
                match b.kind.0.as_deref() {
                    Some("tool_result") => out.push(tool_result(b)?),
                    Some("text") => parts.push(Part::Text {
                        text: b.text.map_or(Text::Empty(""), Text::Given),
                    }),
                    Some("image") => parts.push(image(b.source)?),
                    other => return Err(unsupported_block(i, other)),
                }
            }
            if !parts.is_empty() {
                let content = match parts.len() {
                    1 => match parts.pop() {
                        Some(Part::Text { text }) => UserContent::Text(text),
                        Some(p) => UserContent::Parts(vec![p]),
                        None => UserContent::Parts(Vec::new()),
                    },
                    _ => UserContent::Parts(parts),
                };
                out.push(ChatMessage::User { content });
            }
        }
        "assistant" => {
            let mut text = Cow::Borrowed("");
            let mut calls = Vec::new();
            for b in blocks {
                match b.kind.0.as_deref() {
                    Some("text") => {
                        let t = b.text.and_then(borrowed::str_of).unwrap_or_default();
                        if text.is_empty() {
                            text = t;
                        } else {
                            text.to_mut().push_str(&t);
                        }
                    }
                    Some("tool_use") => calls.push(ToolCall::new(b.id, b.name, b.input)),
                    // The model's own reasoning is not sent to another model.
                    Some("thinking" | "redacted_thinking") => {}
                    other => return Err(unsupported_block(i, other)),
                }
            }
            out.push(ChatMessage::Assistant {
                content: (!text.is_empty() || calls.is_empty()).then_some(text),
                tool_calls: calls,
            });
        }
        other => {
            return Err(bad(format!(
                "messages.{i}.role must be user or assistant, not `{other}`."
            )))
        }
    }
    Ok(())
}

fn unsupported_block(i: usize, kind: Option<&str>) -> GatewayError {
    bad(format!(
        "messages.{i}: content block type `{}` cannot be served by this model's provider (an OpenAI-compatible API).",
        kind.unwrap_or("?")
    ))
}

fn tool_result(b: InBlock<'_>) -> Result<ChatMessage<'_>, GatewayError> {
    let id = b
        .tool_use_id
        .0
        .ok_or_else(|| bad("A `tool_result` block needs `tool_use_id`."))?;
    let content = match b.content.filter(|c| !borrowed::is_null(c)) {
        None => Cow::Borrowed(""),
        Some(c) if borrowed::is_string(c) => borrowed::str_of(c).unwrap_or_default(),
        Some(c) if c.get().starts_with('[') => blocks_text(c)?,
        Some(_) => {
            return Err(bad(
                "A `tool_result`'s content must be a string or text blocks.",
            ))
        }
    };
    Ok(ChatMessage::Tool {
        tool_call_id: id,
        content,
    })
}

fn image(source: Option<&RawValue>) -> Result<Part<'_>, GatewayError> {
    let src = source.ok_or_else(|| bad("An image block needs `source`."))?;
    let src = Obj::of(src).unwrap_or_default();
    let url = match src.str("type").as_deref() {
        Some("base64") => Cow::Owned(format!(
            "data:{};base64,{}",
            src.str("media_type").as_deref().unwrap_or("image/png"),
            src.str("data").as_deref().unwrap_or("")
        )),
        Some("url") => src.str("url").unwrap_or_default(),
        _ => return Err(bad("An image's source must be base64 or url.")),
    };
    Ok(Part::ImageUrl {
        image_url: ImageUrl { url },
    })
}

fn tool(t: &RawValue) -> Result<FunctionTool<'_>, GatewayError> {
    let t = Obj::of(t).unwrap_or_default();
    let name = t
        .str("name")
        .ok_or_else(|| bad("Each tool needs a `name`."))?;
    if t.str("type").is_some_and(|k| k != "custom") {
        return Err(bad(format!(
            "Tool `{name}` is a server tool, which this model's provider (an OpenAI-compatible API) cannot run."
        )));
    }
    Ok(FunctionTool {
        kind: "function",
        function: Function {
            name,
            description: t.get("description"),
            parameters: Schema::or_empty(t.get("input_schema")),
        },
    })
}

/// Anthropic's `tool_choice` as chat's, and whether parallel calls stay on.
fn tool_choice(c: &RawValue) -> Result<(ChatChoice<'_>, bool), GatewayError> {
    let c = Obj::of(c).unwrap_or_default();
    let parallel = !c
        .get("disable_parallel_tool_use")
        .is_some_and(borrowed::is_true);
    let choice = match c.str("type").as_deref() {
        Some("auto") => ChatChoice::Mode("auto"),
        Some("any") => ChatChoice::Mode("required"),
        Some("none") => ChatChoice::Mode("none"),
        Some("tool") => {
            let name = c
                .str("name")
                .ok_or_else(|| bad("`tool_choice` of type tool needs `name`."))?;
            ChatChoice::Function {
                kind: "function",
                function: Named { name },
            }
        }
        _ => return Err(bad("`tool_choice.type` must be auto, any, tool or none.")),
    };
    Ok((choice, parallel))
}

/// A whole chat completion as a Messages answer; `None` when it does not
/// read as one (not JSON, no choice with a message).
pub fn answer_from_chat(body: &[u8]) -> Option<Vec<u8>> {
    let v = Completion::read(body)?;
    let choice = v.choices.into_iter().next()?;
    let mut content = Vec::new();
    if let Some(text) = choice.message.content.0.filter(|t| !t.is_empty()) {
        content.push(Block::Text { text });
    }
    for c in choice.message.tool_calls.unwrap_or_default() {
        let f = c.function.unwrap_or_default();
        content.extend(tool_use_block(
            c.id.and_then(borrowed::str_of).unwrap_or_default(),
            f.name.and_then(borrowed::str_of).unwrap_or_default(),
            f.arguments.0,
            true,
        ));
    }
    let u = v.usage.unwrap_or_default();
    let n = |c: Count| c.0.unwrap_or(0);
    let cached = u.prompt_tokens_details.map_or(0, |d| n(d.cached_tokens));
    let out = MessageAnswer {
        id: super::message_id(v.id.0.as_deref()),
        kind: "message",
        role: "assistant",
        model: v.model,
        content,
        stop_reason: stop_reason(choice.finish_reason.0.as_deref().unwrap_or("stop")),
        stop_sequence: (),
        usage: AnthropicUsage::new(n(u.prompt_tokens), n(u.completion_tokens), cached),
    };
    let mut bytes = Vec::with_capacity(body.len().saturating_add(64));
    serde_json::to_writer(&mut bytes, &out).ok()?;
    Some(bytes)
}
