//! OpenAI's chat completions, `POST /v1/chat/completions`: the gateway's
//! pivot API. Its body is read by [`crate::request`] (`model`, a non-empty
//! `messages`, `stream`, `stream_options`, the token bounds); its answers,
//! streams (SSE chunks, usage in the last one when asked) and errors are
//! OpenAI's, and every provider format translates to and from it.

pub const PATH: &str = "/v1/chat/completions";

use crate::borrowed::AsString;
use serde::Serialize;
use serde_json::value::RawValue;

/// A tool call in an assistant message, as the translations write it: its
/// `id` and `name` as they came, its input as the `arguments` text.
#[derive(Serialize)]
pub struct ToolCall<'a> {
    id: Option<&'a RawValue>,
    #[serde(rename = "type")]
    kind: &'static str,
    function: CallFunction<'a>,
}

#[derive(Serialize)]
struct CallFunction<'a> {
    name: Option<&'a RawValue>,
    arguments: Arguments<'a>,
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
        ToolCall {
            id,
            kind: "function",
            function: CallFunction {
                name,
                arguments: input.map_or(Arguments::None("{}"), |i| Arguments::Given(AsString(i))),
            },
        }
    }
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
