//! Whole bodies: a chat request as a Messages request, and a whole Messages
//! answer as a chat completion. Both read the body in place
//! ([`crate::wire::borrowed`]) and write typed structs straight to bytes: no JSON
//! tree is built, copied or dropped on the way (#24).

use crate::error::GatewayError;
use crate::wire::borrowed::{self, Count, Obj, Str};
use crate::wire::chat::{
    data_url, user_content, Schema, ToolCall, UserPart, Written, WrittenPromptDetails, WrittenUsage,
};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::Value;
use std::borrow::Cow;

/// What the translation to Anthropic's Messages needs of the provider's
/// config (Anthropic, and Claude on Vertex).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `max_tokens` when the client sent none (Anthropic requires it).
    pub default_max_tokens: u64,
    /// Drop fields Anthropic cannot honour instead of refusing the request.
    pub drop_unsupported: bool,
}

/// Fields of a chat request the translation reads (anything else is
/// unsupported).
pub(crate) const READ: [&str; 14] = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "stream",
    "stream_options",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "user",
    "n",
];

fn bad(message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request("invalid_request_for_provider", message)
}

/// Fields the provider cannot honour, with their values left as the
/// client sent them: the names, in order.
fn unsupported(doc: &Obj) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in doc.members() {
        let harmless = match k {
            "n" => borrowed::u64_of(v) == Some(1) || borrowed::is_null(v),
            "logprobs" => borrowed::is_false(v) || borrowed::is_null(v),
            "response_format" => Obj::of(v).and_then(|f| f.str("type")).as_deref() == Some("text"),
            k => READ.contains(&k),
        };
        if !harmless {
            out.push(k.to_string());
        }
    }
    out
}

/// A Messages request, as Anthropic reads it.
#[derive(Serialize)]
struct MessagesRequest<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    system: Option<Cow<'a, str>>,
    messages: Vec<Turn<'a>>,
    max_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    stop_sequences: Option<Stop<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<Tool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Choice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Stop<'a> {
    One([Cow<'a, str>; 1]),
    /// The client's non-empty array, as it sent it.
    Many(&'a RawValue),
}

#[derive(Serialize)]
struct Metadata<'a> {
    user_id: Cow<'a, str>,
}

#[derive(Serialize)]
struct Turn<'a> {
    role: &'static str,
    content: Vec<Block<'a>>,
}

/// A content block of a Messages turn or answer.
#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Block<'a> {
    Text {
        text: Cow<'a, str>,
    },
    Image {
        source: Source<'a>,
    },
    ToolUse {
        id: Cow<'a, str>,
        name: Cow<'a, str>,
        input: Box<RawValue>,
    },
    ToolResult {
        tool_use_id: Cow<'a, str>,
        content: Cow<'a, str>,
    },
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum Source<'a> {
    Base64 {
        media_type: Cow<'a, str>,
        data: Cow<'a, str>,
    },
    Url {
        url: Cow<'a, str>,
    },
}

#[derive(Serialize)]
struct Tool<'a> {
    name: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a RawValue>,
    input_schema: Schema<'a>,
}

#[derive(Serialize)]
struct Choice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    disable_parallel_tool_use: bool,
}

/// The Messages request for a chat request's body, and the fields dropped
/// (only with `drop_unsupported`; otherwise they are a 400 naming them).
pub fn request(
    body: &[u8],
    model_id: &str,
    opts: &Options,
) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let doc = Obj::parse_bytes(body)
        .ok_or_else(|| GatewayError::internal("translate: a chat request that does not read"))?;
    let dropped = unsupported(&doc);
    if !dropped.is_empty() && !opts.drop_unsupported {
        return Err(bad(format!(
            "This model's provider (Anthropic) does not support: {}. Remove them, or ask the operator to set `drop_unsupported` on the provider.",
            dropped.join(", ")
        )));
    }
    let (system, messages) = messages(doc.get("messages"))?;
    let max_tokens = doc
        .get("max_completion_tokens")
        .or_else(|| doc.get("max_tokens"))
        .and_then(borrowed::u64_of)
        .unwrap_or(opts.default_max_tokens);
    let number = |k: &str| doc.get(k).filter(|v| borrowed::is_number(v));
    let stop_sequences = match doc.get("stop") {
        Some(v) if borrowed::is_string(v) => borrowed::str_of(v).map(|s| Stop::One([s])),
        Some(v) if borrowed::arr_of(v).is_some_and(|a| !a.is_empty()) => Some(Stop::Many(v)),
        _ => None,
    };
    let tools = doc
        .arr("tools")
        .map(|ts| ts.into_iter().map(tool).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    let serial = doc
        .get("parallel_tool_calls")
        .is_some_and(borrowed::is_false);
    let tool_choice = match doc.get("tool_choice") {
        Some(c) => Some(tool_choice(c, serial)?),
        None if serial => Some(Choice {
            kind: "auto",
            name: None,
            disable_parallel_tool_use: true,
        }),
        None => None,
    };
    let out = MessagesRequest {
        model: model_id,
        system: match system.len() {
            0 => None,
            1 => system.into_iter().next(),
            _ => Some(Cow::Owned(system.join("\n\n"))),
        },
        messages,
        max_tokens,
        temperature: number("temperature"),
        top_p: number("top_p"),
        stop_sequences,
        stream: doc.get("stream").is_some_and(borrowed::is_true),
        tools,
        tool_choice,
        metadata: doc.str("user").map(|user_id| Metadata { user_id }),
    };
    let mut bytes = Vec::with_capacity(body.len().saturating_add(64));
    serde_json::to_writer(&mut bytes, &out)
        .map_err(|e| GatewayError::internal(format!("translate: {e}")))?;
    Ok((
        bytes,
        if opts.drop_unsupported {
            dropped
        } else {
            Vec::new()
        },
    ))
}

fn tool(t: &RawValue) -> Result<Tool<'_>, GatewayError> {
    let (f, name) = crate::wire::chat::function_tool(t)?;
    Ok(Tool {
        name,
        description: f.get("description"),
        input_schema: Schema::or_empty(f.get("parameters")),
    })
}

fn tool_choice(c: &RawValue, serial: bool) -> Result<Choice<'_>, GatewayError> {
    let choice = |kind, name| Choice {
        kind,
        name,
        disable_parallel_tool_use: serial,
    };
    if let Some(s) = borrowed::str_of(c) {
        return match s.as_ref() {
            "auto" => Ok(choice("auto", None)),
            "none" => Ok(choice("none", None)),
            "required" => Ok(choice("any", None)),
            other => Err(bad(format!(
                "`tool_choice` `{other}` is not auto, none or required."
            ))),
        };
    }
    match Obj::of(c) {
        Some(o) => o
            .obj("function")
            .and_then(|f| f.str("name"))
            .map(|n| choice("tool", Some(n)))
            .ok_or_else(|| bad("`tool_choice` must name a function.")),
        None => Err(bad("`tool_choice` must be a string or an object.")),
    }
}

use crate::wire::chat::content_text as text_of;

/// A user message's content as Anthropic blocks.
fn user_blocks(content: Option<&RawValue>) -> Result<Vec<Block<'_>>, GatewayError> {
    user_content(content, "Anthropic", |part| {
        Ok(match part {
            UserPart::Text(text) => Block::Text { text },
            UserPart::Image(url) => image(url),
        })
    })
}

/// An image by URL, or inline (`data:<media type>;base64,<data>`).
fn image(url: Cow<'_, str>) -> Block<'_> {
    let source = match data_url(url) {
        Ok((media_type, data)) => Source::Base64 { media_type, data },
        Err(url) => Source::Url { url },
    };
    Block::Image { source }
}

/// A chat message: the members the translation reads, in one pass.
#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    role: Str<'a>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_calls: Option<&'a RawValue>,
    #[serde(borrow, default)]
    tool_call_id: Str<'a>,
}

/// `system` texts and the Messages list.
fn messages(v: Option<&RawValue>) -> Result<(Vec<Cow<'_, str>>, Vec<Turn<'_>>), GatewayError> {
    let list = v
        .filter(|v| v.get().starts_with('['))
        .ok_or_else(|| bad("`messages` must be an array."))?;
    let list: Vec<Message> = serde_json::from_str(list.get()).map_err(|e| {
        bad(format!(
            "`messages` must be a list of message objects ({e})."
        ))
    })?;
    let mut system = Vec::new();
    let mut out: Vec<Turn> = Vec::new();
    for m in list {
        let role = m.role.0.unwrap_or_default();
        match role.as_ref() {
            "system" | "developer" => system.push(text_of(m.content)),
            "user" => push(&mut out, "user", user_blocks(m.content)?),
            "assistant" => {
                let mut blocks = Vec::new();
                let text = text_of(m.content);
                if !text.is_empty() {
                    blocks.push(Block::Text { text });
                }
                for call in m.tool_calls.and_then(borrowed::arr_of).unwrap_or_default() {
                    blocks.push(tool_use(call).ok_or_else(|| {
                        bad("An assistant tool call's `arguments` is not a JSON object.")
                    })?);
                }
                push(&mut out, "assistant", blocks);
            }
            "tool" => {
                let id = m
                    .tool_call_id
                    .0
                    .ok_or_else(|| bad("A `tool` message needs `tool_call_id`."))?;
                let block = Block::ToolResult {
                    tool_use_id: id,
                    content: text_of(m.content),
                };
                push(&mut out, "user", vec![block]);
            }
            other => return Err(bad(format!("Message role `{other}` is not supported."))),
        }
    }
    Ok((system, out))
}

/// Append blocks as a turn; consecutive turns of one role become one (the
/// tool results that follow a tool call share one user turn).
fn push<'a>(out: &mut Vec<Turn<'a>>, role: &'static str, blocks: Vec<Block<'a>>) {
    if blocks.is_empty() {
        return;
    }
    match out.last_mut().filter(|l| l.role == role) {
        Some(last) => last.content.extend(blocks),
        None => out.push(Turn {
            role,
            content: blocks,
        }),
    }
}

/// An assistant tool call as a `tool_use` block; `None` when its
/// `arguments` are not a JSON object.
fn tool_use(call: &RawValue) -> Option<Block<'_>> {
    let call = Obj::of(call).unwrap_or_default();
    let f = call.obj("function").unwrap_or_default();
    tool_use_block(
        call.str("id").unwrap_or_default(),
        f.str("name").unwrap_or_default(),
        f.str("arguments"),
        false,
    )
}

/// A chat tool call as a `tool_use` block, its `arguments` text parsed as
/// the `input`, which must be a JSON object: `None` when it is not one,
/// unless `lenient` (an answer: an empty `input` then).
pub(crate) fn tool_use_block<'a>(
    id: Cow<'a, str>,
    name: Cow<'a, str>,
    arguments: Option<Cow<'_, str>>,
    lenient: bool,
) -> Option<Block<'a>> {
    let args = arguments.unwrap_or(Cow::Borrowed("{}"));
    let args = if args.trim().is_empty() {
        "{}"
    } else {
        args.trim()
    };
    let input = match borrowed::raw_from_text(args).filter(|r| r.get().starts_with('{')) {
        Some(input) => input,
        None if lenient => borrowed::raw_from_text("{}")?,
        None => return None,
    };
    Some(Block::ToolUse { id, name, input })
}

/// Anthropic's `stop_reason` as OpenAI's `finish_reason`.
pub fn finish_reason(stop: &str) -> &'static str {
    match stop {
        "max_tokens" => "length",
        "tool_use" => "tool_calls",
        "refusal" => "content_filter",
        _ => "stop",
    }
}

/// OpenAI's usage from Anthropic's four counts (`prompt_tokens` includes
/// cache reads and writes; the details split them).
pub fn chat_usage(input: u64, read: u64, write: u64, output: u64) -> WrittenUsage {
    let prompt = input.saturating_add(read).saturating_add(write);
    WrittenUsage {
        prompt_tokens: prompt,
        completion_tokens: output,
        total_tokens: prompt.saturating_add(output),
        prompt_tokens_details: WrittenPromptDetails {
            cached_tokens: read,
            cache_creation_tokens: Some(write),
        },
        completion_tokens_details: None,
    }
}

/// OpenAI's usage object from Anthropic's usage (a tree: the stream keeps
/// its counts as one).
pub fn usage(u: &Value) -> Value {
    let n = |k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    let usage = chat_usage(
        n("input_tokens"),
        n("cache_read_input_tokens"),
        n("cache_creation_input_tokens"),
        n("output_tokens"),
    );
    serde_json::to_value(usage).unwrap_or(Value::Null)
}

/// A whole Messages answer, as Anthropic writes it (the inbound Messages
/// API's answers translated from the pivot).
#[derive(Serialize)]
pub(crate) struct MessageAnswer<'a> {
    pub id: String,
    #[serde(rename = "type")]
    pub kind: &'static str,
    pub role: &'static str,
    pub model: Option<&'a RawValue>,
    pub content: Vec<Block<'a>>,
    pub stop_reason: &'static str,
    pub stop_sequence: (),
    pub usage: AnthropicUsage,
}

/// Anthropic's usage from chat's: input tokens without the cached ones,
/// which are cache reads.
#[derive(Serialize)]
pub(crate) struct AnthropicUsage {
    input_tokens: u64,
    output_tokens: u64,
    cache_read_input_tokens: u64,
    cache_creation_input_tokens: u64,
}

impl AnthropicUsage {
    pub(crate) fn new(prompt: u64, completion: u64, cached: u64) -> Self {
        AnthropicUsage {
            input_tokens: prompt.saturating_sub(cached),
            output_tokens: completion,
            cache_read_input_tokens: cached,
            cache_creation_input_tokens: 0,
        }
    }
}

/// A Messages answer: the members the translation reads, in one pass.
#[derive(Deserialize)]
struct Answer<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow)]
    content: Vec<AnswerBlock<'a>>,
    #[serde(borrow, default)]
    stop_reason: Str<'a>,
    #[serde(default)]
    usage: Option<AnswerUsage>,
}

#[derive(Deserialize)]
struct AnswerBlock<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Str<'a>,
    #[serde(borrow, default)]
    text: Str<'a>,
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    input: Option<&'a RawValue>,
}

#[derive(Deserialize, Default)]
struct AnswerUsage {
    #[serde(default)]
    input_tokens: Count,
    #[serde(default)]
    cache_read_input_tokens: Count,
    #[serde(default)]
    cache_creation_input_tokens: Count,
    #[serde(default)]
    output_tokens: Count,
}

/// A whole Messages answer as a chat completion; `None` when it does not
/// read as one (not JSON, no `content` list, a block or the usage not an
/// object).
pub fn answer(body: &[u8], created: u64) -> Option<Vec<u8>> {
    // Validated as UTF-8 once, not string by string.
    let v: Answer = serde_json::from_str(std::str::from_utf8(body).ok()?).ok()?;
    let mut text = Cow::Borrowed("");
    let mut calls = Vec::new();
    for b in v.content {
        match b.kind.0.as_deref() {
            Some("text") => {
                let t = b.text.0.unwrap_or_default();
                if text.is_empty() {
                    text = t;
                } else {
                    text.to_mut().push_str(&t);
                }
            }
            Some("tool_use") => calls.push(ToolCall::new(b.id, b.name, b.input)),
            _ => {}
        }
    }
    let u = v.usage.unwrap_or_default();
    let n = |c: Count| c.0.unwrap_or(0);
    Written {
        id: v.id,
        created,
        model: v.model,
        text,
        tool_calls: calls,
        finish_reason: finish_reason(v.stop_reason.0.as_deref().unwrap_or("end_turn")),
        usage: chat_usage(
            n(u.input_tokens),
            n(u.cache_read_input_tokens),
            n(u.cache_creation_input_tokens),
            n(u.output_tokens),
        ),
    }
    .to_bytes(body.len().saturating_add(64))
}
