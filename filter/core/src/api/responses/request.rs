//! A Responses request as a chat completion (the pivot), read in place
//! ([`crate::wire::borrowed`], items read in one pass) and written from typed
//! structs: no JSON tree between (#24).

use super::bad;
use crate::error::GatewayError;
use crate::wire::borrowed::{self, Obj};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// Fields the translation reads.
const READ: &[&str] = &[
    "model",
    "input",
    "instructions",
    "max_output_tokens",
    "temperature",
    "top_p",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "stream",
    "text",
    "user",
];
/// Fields dropped (named in `x-portcullis-dropped`): no chat equivalent,
/// nothing lost for the answer's content.
const DROPPED: &[&str] = &[
    "store",
    "metadata",
    "include",
    "truncation",
    "reasoning",
    "prompt_cache_key",
    "safety_identifier",
    "service_tier",
    "top_logprobs",
    "stream_options",
];
/// Stateful features a translated provider cannot honour.
const REFUSED: &[&str] = &[
    "previous_response_id",
    "background",
    "conversation",
    "prompt",
];

/// The chat completion request written for a Responses request.
#[derive(Serialize)]
struct ChatRequest<'a> {
    model: &'a str,
    messages: Vec<Message<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_tokens: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    top_p: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parallel_tool_calls: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    user: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<Vec<Tool<'a>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<Choice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    response_format: Option<Format<'a>>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    stream: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    stream_options: Option<IncludeUsage>,
}

#[derive(Serialize)]
struct IncludeUsage {
    include_usage: bool,
}

/// A chat message of any role.
#[derive(Serialize)]
struct Message<'a> {
    role: Cow<'a, str>,
    content: Content<'a>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call<'a>>,
    /// A `tool` message's call id (`null` when the item had none).
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_call_id: Option<Option<&'a RawValue>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Content<'a> {
    Text(Cow<'a, str>),
    Parts(Vec<Part<'a>>),
    None(()),
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Part<'a> {
    Text { text: Given<'a> },
    ImageUrl { image_url: ImageUrl<'a> },
}

/// A value as the client sent it, or `""` when it sent none.
#[derive(Serialize)]
#[serde(untagged)]
enum Given<'a> {
    Raw(&'a RawValue),
    Empty(&'static str),
}

#[derive(Serialize)]
struct ImageUrl<'a> {
    url: Cow<'a, str>,
}

/// A `function_call` item as an assistant's tool call: its `arguments`
/// text as the client sent it (`"{}"` when it sent none).
#[derive(Serialize)]
struct Call<'a> {
    id: Option<&'a RawValue>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: Option<&'a RawValue>,
    arguments: Given<'a>,
}

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    function: Function<'a>,
}

/// A function tool's members that are present and not `null`.
#[derive(Serialize)]
struct Function<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parameters: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Choice<'a> {
    /// `auto`, `none`, `required` (a string passes as it is).
    Mode(&'a RawValue),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        function: Named<'a>,
    },
}

#[derive(Serialize)]
struct Named<'a> {
    name: Option<&'a RawValue>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Format<'a> {
    JsonObject,
    JsonSchema { json_schema: JsonSchema<'a> },
}

/// A `json_schema` format's members that are present and not `null`.
#[derive(Serialize)]
struct JsonSchema<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    schema: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    strict: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    description: Option<&'a RawValue>,
}

/// A member, unless absent or `null`.
fn given<'a>(doc: &Obj<'a>, name: &str) -> Option<&'a RawValue> {
    doc.get(name).filter(|v| !borrowed::is_null(v))
}

/// A Responses request as a chat completion for `model_id`, and the
/// fields dropped.
pub fn to_chat(body: &[u8], model_id: &str) -> Result<(Vec<u8>, Vec<String>), GatewayError> {
    let doc = Obj::parse_bytes(body).ok_or_else(|| {
        GatewayError::internal("translate: a Responses request that does not read")
    })?;
    let mut dropped = Vec::new();
    for (k, v) in doc.members() {
        if REFUSED.contains(&k) && !borrowed::is_null(v) && !borrowed::is_false(v) {
            return Err(bad(format!(
                "`{k}` needs a provider that keeps responses (an OpenAI Responses API); this model's provider is reached by translation: send the whole conversation in `input` instead."
            )));
        }
        if DROPPED.contains(&k) {
            dropped.push(k.to_string());
        } else if !READ.contains(&k) && !REFUSED.contains(&k) {
            return Err(bad(format!("`{k}` cannot be served by this model's provider (it is reached by translation): remove it.")));
        }
    }
    let mut messages = Vec::new();
    if let Some(i) = doc.str("instructions").filter(|i| !i.is_empty()) {
        messages.push(text_message(Cow::Borrowed("system"), i));
    }
    match doc.get("input") {
        Some(s) if borrowed::is_string(s) => messages.push(text_message(
            Cow::Borrowed("user"),
            borrowed::str_of(s).unwrap_or_default(),
        )),
        Some(items) if items.get().starts_with('[') => {
            let items: Vec<Item> = serde_json::from_str(items.get()).map_err(|e| {
                bad(format!(
                    "`input` must be a string or a list of items ({e})."
                ))
            })?;
            for (i, item) in items.into_iter().enumerate() {
                input_item(i, item, &mut messages)?;
            }
        }
        _ => return Err(bad("`input` must be a string or a list of items.")),
    }
    let tools = doc
        .arr("tools")
        .filter(|t| !t.is_empty())
        .map(|ts| ts.into_iter().map(tool).collect::<Result<Vec<_>, _>>())
        .transpose()?;
    let tool_choice = given(&doc, "tool_choice").map(tool_choice).transpose()?;
    let response_format = match doc.obj("text").and_then(|t| t.get("format")) {
        Some(f) => response_format(f)?,
        None => None,
    };
    let stream = doc.get("stream").is_some_and(borrowed::is_true);
    let out = ChatRequest {
        model: model_id,
        messages,
        max_tokens: given(&doc, "max_output_tokens"),
        temperature: given(&doc, "temperature"),
        top_p: given(&doc, "top_p"),
        parallel_tool_calls: given(&doc, "parallel_tool_calls"),
        user: given(&doc, "user"),
        tools,
        tool_choice,
        response_format,
        stream,
        stream_options: stream.then_some(IncludeUsage {
            include_usage: true,
        }),
    };
    let mut bytes = Vec::with_capacity(body.len().saturating_add(64));
    serde_json::to_writer(&mut bytes, &out)
        .map_err(|e| GatewayError::internal(format!("translate: {e}")))?;
    Ok((bytes, dropped))
}

fn text_message<'a>(role: Cow<'a, str>, text: Cow<'a, str>) -> Message<'a> {
    Message {
        role,
        content: Content::Text(text),
        tool_calls: Vec::new(),
        tool_call_id: None,
    }
}

/// An input item: the members any item type has that the translation
/// reads, in one pass.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<&'a RawValue>,
    #[serde(borrow, default)]
    role: Option<&'a RawValue>,
    #[serde(borrow, default)]
    content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    call_id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    output: Option<&'a RawValue>,
}

/// One input item as chat messages (function calls join the assistant
/// message before them).
fn input_item<'a>(
    i: usize,
    item: Item<'a>,
    out: &mut Vec<Message<'a>>,
) -> Result<(), GatewayError> {
    let kind = optional_string(item.kind, || format!("input.{i}.type"))?;
    match kind.as_deref().unwrap_or("message") {
        "message" => {
            let role = optional_string(item.role, || format!("input.{i}.role"))?
                .unwrap_or(Cow::Borrowed("user"));
            if !matches!(role.as_ref(), "user" | "assistant" | "system" | "developer") {
                return Err(bad(format!(
                    "input.{i}.role `{role}` is not user, assistant, system or developer."
                )));
            }
            let content = content(i, &role, item.content)?;
            out.push(Message {
                role,
                content,
                tool_calls: Vec::new(),
                tool_call_id: None,
            });
        }
        "function_call" => {
            for (name, v) in [
                ("call_id", item.call_id),
                ("name", item.name),
                ("arguments", item.arguments),
            ] {
                required_string(v, || format!("input.{i}.{name}"))?;
            }
            let call = Call {
                id: item.call_id,
                kind: "function",
                function: CallFunction {
                    name: item.name,
                    arguments: item.arguments.map_or(Given::Empty("{}"), Given::Raw),
                },
            };
            match out.last_mut().filter(|m| m.role == "assistant") {
                Some(m) => m.tool_calls.push(call),
                None => out.push(Message {
                    role: Cow::Borrowed("assistant"),
                    content: Content::None(()),
                    tool_calls: vec![call],
                    tool_call_id: None,
                }),
            }
        }
        "function_call_output" => {
            required_string(item.call_id, || format!("input.{i}.call_id"))?;
            let output = match item.output {
                Some(s) if borrowed::is_string(s) => borrowed::str_of(s).unwrap_or_default(),
                Some(parts) if parts.get().starts_with('[') => Cow::Owned(
                    borrowed::arr_of(parts)
                        .unwrap_or_default()
                        .into_iter()
                        .filter_map(Obj::of)
                        .filter_map(|p| p.str("text"))
                        .collect::<Vec<_>>()
                        .join("\n"),
                ),
                _ => {
                    return Err(bad(format!(
                        "input.{i}.output must be a string or a list of parts."
                    )))
                }
            };
            out.push(Message {
                role: Cow::Borrowed("tool"),
                content: Content::Text(output),
                tool_calls: Vec::new(),
                tool_call_id: Some(item.call_id),
            });
        }
        // One model's reasoning is not sent to another.
        "reasoning" => {}
        other => {
            return Err(bad(format!(
                "input.{i}: item type `{other}` cannot be served by this model's provider (it is reached by translation)."
            )))
        }
    }
    Ok(())
}

/// A member that must be a string when present (`None`: absent or null);
/// otherwise a 400 naming its path.
fn optional_string<'a>(
    v: Option<&'a RawValue>,
    path: impl FnOnce() -> String,
) -> Result<Option<Cow<'a, str>>, GatewayError> {
    match v.filter(|v| !borrowed::is_null(v)) {
        None => Ok(None),
        Some(v) => borrowed::str_of(v)
            .map(Some)
            .ok_or_else(|| bad(format!("{} must be a string.", path()))),
    }
}

/// A member that must be a string, as sent (its JSON text); otherwise a
/// 400 naming its path, as OpenAI refuses it (never an empty stand-in).
fn required_string(
    v: Option<&RawValue>,
    path: impl FnOnce() -> String,
) -> Result<&RawValue, GatewayError> {
    match v {
        Some(v) if borrowed::is_string(v) => Ok(v),
        Some(v) if !borrowed::is_null(v) => Err(bad(format!("{} must be a string.", path()))),
        _ => Err(bad(format!("{} is required (a string).", path()))),
    }
}

/// A message item's content as chat content.
fn content<'a>(i: usize, role: &str, c: Option<&'a RawValue>) -> Result<Content<'a>, GatewayError> {
    let parts = match c {
        Some(s) if borrowed::is_string(s) => {
            return Ok(Content::Text(borrowed::str_of(s).unwrap_or_default()))
        }
        Some(p) if p.get().starts_with('[') => borrowed::arr_of(p).unwrap_or_default(),
        _ => {
            return Err(bad(format!(
                "input.{i}.content must be a string or a list of parts."
            )))
        }
    };
    let mut out = Vec::new();
    for (j, p) in parts.into_iter().enumerate() {
        let p =
            Obj::of(p).ok_or_else(|| bad(format!("input.{i}.content.{j} must be an object.")))?;
        let kind = optional_string(p.get("type"), || format!("input.{i}.content.{j}.type"))?;
        match kind.as_deref() {
            Some("input_text" | "output_text" | "text") => out.push(Part::Text {
                text: Given::Raw(required_string(p.get("text"), || {
                    format!("input.{i}.content.{j}.text")
                })?),
            }),
            Some("input_image") => match p.get("image_url") {
                Some(url) if !borrowed::is_null(url) => {
                    let url = borrowed::str_of(url).ok_or_else(|| {
                        bad(format!(
                            "input.{i}.content.{j}.image_url must be a string (a URL)."
                        ))
                    })?;
                    out.push(Part::ImageUrl {
                        image_url: ImageUrl { url },
                    })
                }
                _ => {
                    return Err(bad(format!(
                        "input.{i}: an image by `file_id` needs a provider that keeps files."
                    )))
                }
            },
            other => {
                return Err(bad(format!(
                    "input.{i}: content part `{}` cannot be served by this model's provider (it is reached by translation).",
                    other.unwrap_or("?")
                )))
            }
        }
    }
    // An assistant's content (and a system's) is plain text in chat.
    if role != "user" {
        let text: String = out
            .iter()
            .filter_map(|p| match p {
                Part::Text {
                    text: Given::Raw(t),
                } => borrowed::str_of(t),
                _ => None,
            })
            .collect();
        return Ok(Content::Text(Cow::Owned(text)));
    }
    Ok(Content::Parts(out))
}

fn tool(t: &RawValue) -> Result<Tool<'_>, GatewayError> {
    let t = Obj::of(t).unwrap_or_default();
    let kind = t.str("type").unwrap_or_default();
    if kind != "function" {
        return Err(bad(format!(
            "Tool type `{kind}` is built into OpenAI's Responses API; this model's provider (reached by translation) cannot run it."
        )));
    }
    Ok(Tool {
        kind: "function",
        function: Function {
            name: given(&t, "name"),
            description: given(&t, "description"),
            parameters: given(&t, "parameters"),
            strict: given(&t, "strict"),
        },
    })
}

fn tool_choice(c: &RawValue) -> Result<Choice<'_>, GatewayError> {
    if borrowed::is_string(c) {
        return Ok(Choice::Mode(c));
    }
    match Obj::of(c).filter(|o| o.str("type").as_deref() == Some("function")) {
        Some(o) => Ok(Choice::Function {
            kind: "function",
            function: Named {
                name: o.get("name"),
            },
        }),
        None => Err(bad(
            "`tool_choice` must be auto, none, required or a function.",
        )),
    }
}

/// `text.format` as chat's `response_format` (`None`: plain text).
fn response_format(f: &RawValue) -> Result<Option<Format<'_>>, GatewayError> {
    let f = Obj::of(f).unwrap_or_default();
    match f.str("type").as_deref() {
        None | Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Format::JsonObject)),
        Some("json_schema") => Ok(Some(Format::JsonSchema {
            json_schema: JsonSchema {
                name: given(&f, "name"),
                schema: given(&f, "schema"),
                strict: given(&f, "strict"),
                description: given(&f, "description"),
            },
        })),
        Some(other) => Err(bad(format!(
            "`text.format` type `{other}` is not text, json_object or json_schema."
        ))),
    }
}
