//! What a translated response object says of the request that made it: the
//! request's own settings (tools, tool_choice, temperature, top_p,
//! max_output_tokens, instructions, metadata, text format…) and, where it
//! sent none, the defaults the Open Responses specification names, so that
//! every object validates against its `ResponseResource` (#46).
//!
//! Two settings say what the gateway did rather than what was asked:
//! `store` is `false` (a translated response is kept nowhere: `store` is
//! dropped, named in `x-portcullis-dropped`) and `background` is `false`.
//! A `json_schema` text format is echoed with `"schema": null`, the one
//! value the published schema allows there.

use crate::wire::borrowed::{self, Obj};
use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::borrow::Cow;

/// The settings' JSON members, `"instructions":…,"tools":[…],…` (no
/// braces), written once per request; `None`: the defaults.
#[derive(Clone, Debug, Default)]
pub struct Echo(Option<Box<str>>);

/// What a request that set nothing gets (a test pins it to what
/// [`Echo::of`] writes for `{}`).
const DEFAULTS: &str = r#""previous_response_id":null,"instructions":null,"tools":[],"tool_choice":"auto","truncation":"disabled","parallel_tool_calls":true,"text":{"format":{"type":"text"}},"top_p":1.0,"presence_penalty":0.0,"frequency_penalty":0.0,"top_logprobs":0,"temperature":1.0,"reasoning":null,"max_output_tokens":null,"max_tool_calls":null,"store":false,"background":false,"service_tier":"default","metadata":{},"safety_identifier":null,"prompt_cache_key":null"#;

impl Echo {
    /// The settings of a Responses request's body (a body that does not
    /// read gets the defaults).
    pub fn of(body: &[u8]) -> Echo {
        let doc = Obj::parse_bytes(body).unwrap_or_default();
        let settings = Settings::of(&doc);
        let text = serde_json::to_string(&settings).unwrap_or_default();
        // `{…}` to its members.
        let members = text
            .strip_prefix('{')
            .and_then(|t| t.strip_suffix('}'))
            .unwrap_or(DEFAULTS);
        Echo(Some(members.into()))
    }

    /// The members, to splice into an object being written.
    pub fn members(&self) -> &str {
        self.0.as_deref().unwrap_or(DEFAULTS)
    }

    /// The members as a tree (the stream's snapshots are trees).
    pub fn map(&self) -> Map<String, Value> {
        serde_json::from_str(&format!("{{{}}}", self.members())).unwrap_or_default()
    }
}

/// A number the client sent, or the default.
#[derive(Serialize)]
#[serde(untagged)]
enum Number<'a> {
    Given(&'a RawValue),
    Default(f64),
}

fn number<'a>(doc: &Obj<'a>, name: &str, default: f64) -> Number<'a> {
    doc.get(name)
        .filter(|v| borrowed::is_number(v))
        .map_or(Number::Default(default), Number::Given)
}

/// A string the client sent when it is one of `allowed`.
fn one_of(doc: &Obj<'_>, name: &str, allowed: &[&'static str]) -> Option<&'static str> {
    let given = doc.str(name)?;
    allowed.iter().copied().find(|a| *a == given)
}

#[derive(Serialize)]
struct Settings<'a> {
    previous_response_id: Option<Cow<'a, str>>,
    instructions: Option<Cow<'a, str>>,
    tools: Vec<Tool<'a>>,
    tool_choice: ToolChoice<'a>,
    truncation: &'static str,
    parallel_tool_calls: bool,
    text: Text<'a>,
    top_p: Number<'a>,
    presence_penalty: Number<'a>,
    frequency_penalty: Number<'a>,
    top_logprobs: u64,
    temperature: Number<'a>,
    reasoning: Option<Reasoning>,
    max_output_tokens: Option<u64>,
    max_tool_calls: Option<u64>,
    store: bool,
    background: bool,
    service_tier: Cow<'a, str>,
    metadata: Metadata<'a>,
    safety_identifier: Option<Cow<'a, str>>,
    prompt_cache_key: Option<Cow<'a, str>>,
}

#[derive(Serialize)]
struct Tool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: Cow<'a, str>,
    description: Option<Cow<'a, str>>,
    parameters: Option<&'a RawValue>,
    strict: Option<bool>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum ToolChoice<'a> {
    Mode(&'static str),
    Function {
        #[serde(rename = "type")]
        kind: &'static str,
        name: Cow<'a, str>,
    },
}

#[derive(Serialize)]
struct Text<'a> {
    format: Format<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    verbosity: Option<&'static str>,
}

#[derive(Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Format<'a> {
    Text,
    JsonObject,
    JsonSchema {
        name: Cow<'a, str>,
        description: Option<Cow<'a, str>>,
        schema: (),
        strict: bool,
    },
}

#[derive(Serialize)]
struct Reasoning {
    effort: Option<&'static str>,
    summary: Option<&'static str>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Metadata<'a> {
    Given(&'a RawValue),
    Empty(crate::wire::chat::Empty),
}

fn boolean(doc: &Obj<'_>, name: &str) -> Option<bool> {
    doc.get(name).and_then(|v| match v.get() {
        "true" => Some(true),
        "false" => Some(false),
        _ => None,
    })
}

impl<'a> Settings<'a> {
    fn of(doc: &Obj<'a>) -> Self {
        let tools = doc
            .arr("tools")
            .unwrap_or_default()
            .into_iter()
            .filter_map(Obj::of)
            .filter(|t| t.str("type").as_deref() == Some("function"))
            .map(|t| Tool {
                kind: "function",
                name: t.str("name").unwrap_or_default(),
                description: t.str("description"),
                parameters: t.get("parameters").filter(|p| p.get().starts_with('{')),
                strict: boolean(&t, "strict"),
            })
            .collect();
        let tool_choice = match doc.get("tool_choice") {
            Some(c) => match borrowed::str_of(c).as_deref() {
                Some("none") => ToolChoice::Mode("none"),
                Some("required") => ToolChoice::Mode("required"),
                Some(_) => ToolChoice::Mode("auto"),
                None => match Obj::of(c).filter(|o| o.str("type").as_deref() == Some("function")) {
                    Some(o) => ToolChoice::Function {
                        kind: "function",
                        name: o.str("name").unwrap_or_default(),
                    },
                    None => ToolChoice::Mode("auto"),
                },
            },
            None => ToolChoice::Mode("auto"),
        };
        let text = doc.obj("text").unwrap_or_default();
        let format = text.obj("format").unwrap_or_default();
        let format = match format.str("type").as_deref() {
            Some("json_object") => Format::JsonObject,
            Some("json_schema") => Format::JsonSchema {
                name: format.str("name").unwrap_or(Cow::Borrowed("response")),
                description: format.str("description"),
                schema: (),
                strict: boolean(&format, "strict").unwrap_or(false),
            },
            _ => Format::Text,
        };
        let reasoning = doc.obj("reasoning").map(|r| Reasoning {
            effort: one_of(&r, "effort", &["none", "low", "medium", "high", "xhigh"]),
            summary: one_of(&r, "summary", &["concise", "detailed", "auto"]),
        });
        Settings {
            previous_response_id: doc.str("previous_response_id"),
            instructions: doc.str("instructions"),
            tools,
            tool_choice,
            truncation: one_of(doc, "truncation", &["auto", "disabled"]).unwrap_or("disabled"),
            parallel_tool_calls: boolean(doc, "parallel_tool_calls").unwrap_or(true),
            text: Text {
                format,
                verbosity: one_of(&text, "verbosity", &["low", "medium", "high"]),
            },
            top_p: number(doc, "top_p", 1.0),
            presence_penalty: number(doc, "presence_penalty", 0.0),
            frequency_penalty: number(doc, "frequency_penalty", 0.0),
            top_logprobs: doc.u64("top_logprobs").unwrap_or(0),
            temperature: number(doc, "temperature", 1.0),
            reasoning,
            max_output_tokens: doc.u64("max_output_tokens"),
            max_tool_calls: doc.u64("max_tool_calls"),
            store: false,
            background: false,
            service_tier: Cow::Borrowed("default"),
            metadata: doc
                .get("metadata")
                .filter(|m| m.get().starts_with('{'))
                .map_or(
                    Metadata::Empty(crate::wire::chat::Empty {}),
                    Metadata::Given,
                ),
            safety_identifier: doc.str("safety_identifier"),
            prompt_cache_key: doc.str("prompt_cache_key"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn a_request_that_set_nothing_gets_the_specifications_defaults() {
        assert_eq!(Echo::of(b"{}").members(), DEFAULTS);
        assert_eq!(Echo::of(b"not json").members(), DEFAULTS);
        let v: Value = serde_json::from_str(&format!("{{{}}}", Echo::default().members())).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"previous_response_id": null, "instructions": null, "tools": [],
                "tool_choice": "auto", "truncation": "disabled", "parallel_tool_calls": true,
                "text": {"format": {"type": "text"}}, "top_p": 1.0, "presence_penalty": 0.0,
                "frequency_penalty": 0.0, "top_logprobs": 0, "temperature": 1.0, "reasoning": null,
                "max_output_tokens": null, "max_tool_calls": null, "store": false,
                "background": false, "service_tier": "default", "metadata": {},
                "safety_identifier": null, "prompt_cache_key": null})
        );
    }

    #[test]
    fn a_requests_own_settings_are_echoed() {
        let body = serde_json::json!({"model": "m", "input": "hi", "instructions": "Be brief.",
            "tools": [{"type": "function", "name": "get_weather", "parameters": {"type": "object"}}],
            "tool_choice": {"type": "function", "name": "get_weather"}, "temperature": 0.25,
            "top_p": 0.5, "max_output_tokens": 77, "metadata": {"k": "v"}, "store": true,
            "parallel_tool_calls": false, "truncation": "auto",
            "text": {"format": {"type": "json_schema", "name": "a", "schema": {"type": "object"}, "strict": true}},
            "reasoning": {"effort": "low"}, "safety_identifier": "u1", "prompt_cache_key": "k1"});
        let map = Echo::of(body.to_string().as_bytes()).map();
        let v = Value::Object(map);
        assert_eq!(v["instructions"], "Be brief.");
        assert_eq!(
            v["tools"],
            serde_json::json!([{"type": "function", "name": "get_weather", "description": null,
                "parameters": {"type": "object"}, "strict": null}])
        );
        assert_eq!(
            v["tool_choice"],
            serde_json::json!({"type": "function", "name": "get_weather"})
        );
        assert_eq!(
            (v["temperature"].as_f64(), v["top_p"].as_f64()),
            (Some(0.25), Some(0.5))
        );
        assert_eq!(v["max_output_tokens"], 77);
        assert_eq!(v["metadata"], serde_json::json!({"k": "v"}));
        assert_eq!(v["parallel_tool_calls"], false);
        assert_eq!(v["truncation"], "auto");
        assert_eq!(
            v["text"],
            serde_json::json!({"format": {"type": "json_schema", "name": "a", "description": null, "schema": null, "strict": true}})
        );
        assert_eq!(
            v["reasoning"],
            serde_json::json!({"effort": "low", "summary": null})
        );
        assert_eq!(
            (&v["safety_identifier"], &v["prompt_cache_key"]),
            (&serde_json::json!("u1"), &serde_json::json!("k1"))
        );
        // Kept nowhere: a translated response says so.
        assert_eq!(v["store"], false);
    }
}
