//! OpenAI's chat completions as a wire schema: the shapes of the gateway's
//! pivot, read and written here and nowhere else (a request's messages and
//! tools as the translations read them, a whole answer as they read it and
//! as they write it, a stream's chunk). The inbound API
//! ([`crate::api::chat_completions`]) and every provider format that
//! translates to or from the pivot use these.

use crate::wire::borrowed::{self, AsString, Count, Obj, Str};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use std::borrow::Cow;

/// A tool call in an assistant message, as the translations write it: its
/// `id` and `name` as they came (or an id the gateway made: `Id`), its
/// input as the `arguments` text.
#[derive(Serialize)]
pub struct ToolCall<'a, Id = Option<&'a RawValue>> {
    id: Id,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

/// A call's function: its name as it came, its input as the `arguments`
/// text (none: `{}`).
#[derive(Serialize)]
pub struct CallFunction<'a> {
    name: Option<&'a RawValue>,
    arguments: Arguments<'a>,
}

impl<'a> CallFunction<'a> {
    pub fn new(name: Option<&'a RawValue>, input: Option<&'a RawValue>) -> Self {
        CallFunction {
            name,
            arguments: input.map_or(Arguments::None("{}"), |i| Arguments::Given(AsString(i))),
        }
    }
}

#[derive(Serialize)]
#[serde(untagged)]
enum Arguments<'a> {
    Given(AsString<'a>),
    None(&'static str),
}

impl<'a> ToolCall<'a> {
    /// A call of `name` with `input` (a JSON value; none: `{}`).
    pub fn new(
        id: Option<&'a RawValue>,
        name: Option<&'a RawValue>,
        input: Option<&'a RawValue>,
    ) -> Self {
        ToolCall::with_id(id, name, input)
    }
}

impl<'a, Id> ToolCall<'a, Id> {
    /// A call whose id is `id` (one the gateway made, when the provider
    /// gives none).
    pub fn with_id(id: Id, name: Option<&'a RawValue>, input: Option<&'a RawValue>) -> Self {
        ToolCall {
            id,
            kind: "function",
            function: CallFunction::new(name, input),
        }
    }
}

/// A whole answer as every translation back to the pivot writes it: one
/// choice, the assistant's text (`null` only when the answer is tool calls
/// alone) and tool calls, the finish reason, the usage. The id, model, call
/// and usage types are the format's: they are written as they are.
pub struct Written<'a, Id, Model, Call, Usage> {
    pub id: Id,
    pub created: u64,
    pub model: Model,
    pub text: Cow<'a, str>,
    pub tool_calls: Vec<Call>,
    pub finish_reason: &'static str,
    pub usage: Usage,
}

#[derive(Serialize)]
struct WrittenCompletion<'a, Id, Model, Call, Usage> {
    id: Id,
    object: &'static str,
    created: u64,
    model: Model,
    choices: [WrittenChoice<'a, Call>; 1],
    usage: Usage,
}

#[derive(Serialize)]
struct WrittenChoice<'a, Call> {
    index: u32,
    message: WrittenMessage<'a, Call>,
    finish_reason: &'static str,
    logprobs: (),
}

#[derive(Serialize)]
struct WrittenMessage<'a, Call> {
    role: &'static str,
    content: Option<Cow<'a, str>>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    tool_calls: Vec<Call>,
}

impl<Id: Serialize, Model: Serialize, Call: Serialize, Usage: Serialize>
    Written<'_, Id, Model, Call, Usage>
{
    /// The completion's bytes (`capacity`: a guess of their length).
    pub fn to_bytes(self, capacity: usize) -> Option<Vec<u8>> {
        let content = (!self.text.is_empty() || self.tool_calls.is_empty()).then_some(self.text);
        let out = WrittenCompletion {
            id: self.id,
            object: "chat.completion",
            created: self.created,
            model: self.model,
            choices: [WrittenChoice {
                index: 0,
                message: WrittenMessage {
                    role: "assistant",
                    content,
                    tool_calls: self.tool_calls,
                },
                finish_reason: self.finish_reason,
                logprobs: (),
            }],
            usage: self.usage,
        };
        let mut bytes = Vec::with_capacity(capacity);
        serde_json::to_writer(&mut bytes, &out).ok()?;
        Some(bytes)
    }
}

/// OpenAI's usage object as the translations write it: `prompt_tokens`
/// includes cached reads (and, from Anthropic's counts, cache writes);
/// reasoning is part of `completion_tokens`. Each format fills the details
/// it has; the others are left out.
#[derive(Serialize)]
pub struct WrittenUsage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub total_tokens: u64,
    pub prompt_tokens_details: WrittenPromptDetails,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completion_tokens_details: Option<WrittenCompletionDetails>,
}

#[derive(Serialize)]
pub struct WrittenPromptDetails {
    pub cached_tokens: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache_creation_tokens: Option<u64>,
}

#[derive(Serialize)]
pub struct WrittenCompletionDetails {
    pub reasoning_tokens: u64,
}

/// A tool's JSON schema as given, or, when none was, a function of no
/// arguments (`{"type": "object", "properties": {}}`).
#[derive(Serialize)]
#[serde(untagged)]
pub enum Schema<'a> {
    Given(&'a RawValue),
    Empty {
        #[serde(rename = "type")]
        kind: &'static str,
        properties: Empty,
    },
}

#[derive(Serialize)]
pub struct Empty {}

impl<'a> Schema<'a> {
    pub fn or_empty(given: Option<&'a RawValue>) -> Self {
        given.map_or(
            Schema::Empty {
                kind: "object",
                properties: Empty {},
            },
            Schema::Given,
        )
    }
}

/// A whole chat completion: the members the translations back read, in one
/// pass (lenient where a tree's accessors are: a member of another type
/// reads as absent).
#[derive(Deserialize)]
pub struct Completion<'a> {
    #[serde(borrow, default)]
    pub id: Str<'a>,
    #[serde(borrow, default)]
    pub model: Option<&'a RawValue>,
    #[serde(default)]
    pub created: Count,
    #[serde(borrow)]
    pub choices: Vec<Choice<'a>>,
    #[serde(default)]
    pub usage: Option<Usage>,
}

#[derive(Deserialize)]
pub struct Choice<'a> {
    #[serde(borrow)]
    pub message: AnswerMessage<'a>,
    #[serde(borrow, default)]
    pub finish_reason: Str<'a>,
}

#[derive(Deserialize)]
pub struct AnswerMessage<'a> {
    #[serde(borrow, default)]
    pub content: Str<'a>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<Call<'a>>>,
}

#[derive(Deserialize)]
pub struct Call<'a> {
    #[serde(borrow, default)]
    pub id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub function: Option<CalledFunction<'a>>,
}

#[derive(Deserialize, Default)]
pub struct CalledFunction<'a> {
    #[serde(borrow, default)]
    pub name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub arguments: Str<'a>,
}

#[derive(Deserialize, Default)]
pub struct Usage {
    #[serde(default)]
    pub prompt_tokens: Count,
    #[serde(default)]
    pub completion_tokens: Count,
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    pub completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize, Default)]
pub struct PromptDetails {
    #[serde(default)]
    pub cached_tokens: Count,
}

#[derive(Deserialize, Default)]
pub struct CompletionDetails {
    #[serde(default)]
    pub reasoning_tokens: Count,
}

impl<'a> Completion<'a> {
    /// A chat completion's body (UTF-8 validated once, not string by
    /// string); `None` when it does not read as one.
    pub fn read(body: &'a [u8]) -> Option<Self> {
        serde_json::from_str(std::str::from_utf8(body).ok()?).ok()
    }
}

/// The text of a chat message's `content` (a string, or its text parts
/// joined by newlines), read in place.
pub fn content_text(content: Option<&RawValue>) -> Cow<'_, str> {
    let Some(c) = content else {
        return Cow::Borrowed("");
    };
    if let Some(s) = borrowed::str_of(c) {
        return s;
    }
    let texts: Vec<Cow<str>> = borrowed::arr_of(c)
        .unwrap_or_default()
        .into_iter()
        .filter_map(Obj::of)
        .filter(|p| p.str("type").as_deref() == Some("text"))
        .filter_map(|p| p.str("text"))
        .collect();
    match texts.len() {
        0 => Cow::Borrowed(""),
        1 => texts.into_iter().next().unwrap_or_default(),
        _ => Cow::Owned(texts.join("\n")),
    }
}

/// One chat-completion chunk event: `head` is the chunk's JSON up to its
/// `delta` (id, created, model), `delta` JSON, `finish` a finish reason.
pub fn chunk_event(head: &str, delta: &str, finish: Option<&str>) -> Vec<u8> {
    let mut out = String::with_capacity(head.len() + delta.len() + 48);
    out.push_str(head);
    out.push_str(delta);
    match finish {
        Some(f) => {
            out.push_str(r#","finish_reason":""#);
            out.push_str(f);
            out.push('"');
        }
        None => out.push_str(r#","finish_reason":null"#),
    }
    out.push_str(",\"logprobs\":null}]}\n\n");
    out.into_bytes()
}

/// A chat tool (`{"type": "function", "function": {...}}`): its function,
/// read in place, and the function's name; a 400 for a translated provider
/// when it is not one.
pub fn function_tool(t: &RawValue) -> Result<(Obj<'_>, Cow<'_, str>), crate::error::GatewayError> {
    let bad = |m: &str| {
        crate::error::GatewayError::bad_request("invalid_request_for_provider", m.to_string())
    };
    let t = Obj::of(t).unwrap_or_default();
    let f = t
        .obj("function")
        .filter(|_| t.str("type").as_deref() == Some("function"))
        .ok_or_else(|| bad("Each tool must be {\"type\": \"function\", \"function\": {...}}."))?;
    let name = f
        .str("name")
        .ok_or_else(|| bad("A tool function needs a `name`."))?;
    Ok((f, name))
}

/// A chat message as the translations to other formats read it: the
/// members they use, in one pass.
#[derive(Deserialize)]
pub(crate) struct InMessage<'a> {
    #[serde(borrow, default)]
    pub role: Str<'a>,
    #[serde(borrow, default)]
    pub content: Option<&'a RawValue>,
    #[serde(borrow, default)]
    pub tool_calls: Option<Vec<InCall<'a>>>,
    #[serde(borrow, default)]
    pub tool_call_id: Str<'a>,
}

/// An assistant message's tool call, as the translations read it.
#[derive(Deserialize)]
pub(crate) struct InCall<'a> {
    #[serde(borrow, default)]
    pub id: Str<'a>,
    #[serde(borrow, default)]
    pub function: Option<InFunction<'a>>,
}

#[derive(Deserialize, Default)]
pub(crate) struct InFunction<'a> {
    #[serde(borrow, default)]
    pub name: Str<'a>,
    #[serde(borrow, default)]
    pub arguments: Str<'a>,
}

/// A part of a user message's content, as the translations read it.
pub enum UserPart<'a> {
    Text(Cow<'a, str>),
    /// An `image_url` part's URL.
    Image(Cow<'a, str>),
}

/// A user message's `content` (a string: one text part; or a list of
/// `text` and `image_url` parts; absent or null: none), each part mapped
/// by `each`. `provider` names the model's provider in the refusal of a
/// part of another type.
pub fn user_content<'a, T>(
    content: Option<&'a RawValue>,
    provider: &str,
    mut each: impl FnMut(UserPart<'a>) -> Result<T, crate::error::GatewayError>,
) -> Result<Vec<T>, crate::error::GatewayError> {
    let bad =
        |m: String| crate::error::GatewayError::bad_request("invalid_request_for_provider", m);
    let Some(c) = content.filter(|c| !borrowed::is_null(c)) else {
        return Ok(Vec::new());
    };
    if let Some(text) = borrowed::str_of(c) {
        return Ok(vec![each(UserPart::Text(text))?]);
    }
    let parts = borrowed::arr_of(c)
        .ok_or_else(|| bad("A message's `content` must be a string or a list of parts.".into()))?;
    parts
        .into_iter()
        .map(|p| {
            let p = Obj::of(p).unwrap_or_default();
            match p.str("type").as_deref() {
                Some("text") => each(UserPart::Text(p.str("text").unwrap_or_default())),
                Some("image_url") => {
                    let url = p
                        .obj("image_url")
                        .and_then(|u| u.str("url"))
                        .ok_or_else(|| bad("An `image_url` part needs `image_url.url`.".into()))?;
                    each(UserPart::Image(url))
                }
                other => Err(bad(format!(
                    "Content part type `{}` is not supported by this model's provider ({provider}): use text or image_url.",
                    other.unwrap_or("?")
                ))),
            }
        })
        .collect()
}

/// An inline image's URL, `data:<media type>;base64,<data>`: its media type
/// and data, borrowed when the URL is (`Err`: not such a URL, given back).
pub fn data_url(url: Cow<'_, str>) -> Result<(Cow<'_, str>, Cow<'_, str>), Cow<'_, str>> {
    fn split(u: &str) -> Option<(&str, &str)> {
        u.strip_prefix("data:")?.split_once(";base64,")
    }
    match url {
        Cow::Borrowed(u) => match split(u) {
            Some((media, data)) => Ok((Cow::Borrowed(media), Cow::Borrowed(data))),
            None => Err(Cow::Borrowed(u)),
        },
        Cow::Owned(u) => match split(&u) {
            Some((media, data)) => {
                Ok((Cow::Owned(media.to_string()), Cow::Owned(data.to_string())))
            }
            None => Err(Cow::Owned(u)),
        },
    }
}

#[derive(Serialize)]
struct ErrorEvent<'a> {
    error: ErrorEventBody<'a>,
}

#[derive(Serialize)]
struct ErrorEventBody<'a> {
    message: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
    code: &'a str,
    param: (),
}

/// The OpenAI error event that ends a translated stream the provider broke
/// off or failed (`code`: the provider's class, or `provider_stream_error`).
pub fn error_event(message: &str, code: &str) -> Vec<u8> {
    let body = ErrorEvent {
        error: ErrorEventBody {
            message,
            kind: "api_error",
            code,
            param: (),
        },
    };
    let json = serde_json::to_string(&body).unwrap_or_default();
    format!("data: {json}\n\n").into_bytes()
}

/// The end of a translated stream that finished: the usage chunk when the
/// gateway asked for one (`usage`: the usage object's JSON; `id` and
/// `model`: JSON values, as in every chunk), then `[DONE]`.
pub fn stream_end(id: &str, created: u64, model: &str, usage: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(usage) = usage {
        out.extend(
            format!(
                r#"data: {{"id":{id},"object":"chat.completion.chunk","created":{created},"model":{model},"choices":[],"usage":{usage}}}"#
            )
            .into_bytes(),
        );
        out.extend_from_slice(b"\n\n");
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}
