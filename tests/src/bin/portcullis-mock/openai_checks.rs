//! What OpenAI's chat completions endpoint refuses, checked by the mock's
//! OpenAI and Azure modes (the table in `tests/MOCK.md`), each refusal in
//! OpenAI's error shape with its status, message and code.

use serde_json::{json, Value};

/// The request fields chat completions accepts (anything else is
/// "Unrecognized request argument").
const FIELDS: &[&str] = &[
    "model",
    "messages",
    "audio",
    "frequency_penalty",
    "function_call",
    "functions",
    "logit_bias",
    "logprobs",
    "max_completion_tokens",
    "max_tokens",
    "metadata",
    "modalities",
    "n",
    "parallel_tool_calls",
    "prediction",
    "presence_penalty",
    "prompt_cache_key",
    "prompt_cache_retention",
    "reasoning_effort",
    "response_format",
    "safety_identifier",
    "seed",
    "service_tier",
    "stop",
    "store",
    "stream",
    "stream_options",
    "temperature",
    "tool_choice",
    "tools",
    "top_logprobs",
    "top_p",
    "user",
    "verbosity",
    "web_search_options",
];

const ROLES: &[&str] = &[
    "system",
    "developer",
    "user",
    "assistant",
    "tool",
    "function",
];

/// A refusal: status and OpenAI's error body.
pub struct Refusal(pub u16, pub Value);

fn bad(message: String, param: Option<&str>, code: Option<&str>) -> Refusal {
    Refusal(
        400,
        json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": code}}),
    )
}

/// `parsed` is `Value::Null` when the body was not JSON.
pub fn check(parsed: &Value) -> Result<(), Refusal> {
    let Some(req) = parsed.as_object() else {
        return Err(bad(
            "We could not parse the JSON body of your request. (HINT: This likely means you aren't using your HTTP library correctly. The OpenAI API expects a JSON payload, but what was sent was not valid JSON.)".into(),
            None,
            None,
        ));
    };
    if let Some(unknown) = req.keys().find(|k| !FIELDS.contains(&k.as_str())) {
        return Err(bad(
            format!("Unrecognized request argument supplied: {unknown}"),
            None,
            None,
        ));
    }
    if !req.get("model").is_some_and(Value::is_string) {
        return Err(bad("you must provide a model parameter".into(), None, None));
    }
    let Some(messages) = req.get("messages") else {
        return Err(bad(
            "Missing required parameter: 'messages'.".into(),
            Some("messages"),
            Some("missing_required_parameter"),
        ));
    };
    let messages = messages.as_array().ok_or_else(|| {
        bad(
            "Invalid type for 'messages': expected an array.".into(),
            Some("messages"),
            Some("invalid_type"),
        )
    })?;
    if messages.is_empty() {
        return Err(bad(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.".into(),
            Some("messages"),
            Some("empty_array"),
        ));
    }
    if req.contains_key("stream_options") && req.get("stream") != Some(&Value::Bool(true)) {
        return Err(bad(
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.".into(),
            Some("stream_options"),
            None,
        ));
    }
    tool_turns(messages)
}

/// Roles, and every assistant `tool_calls` answered by `tool` messages
/// (and every `tool` message answering one).
fn tool_turns(messages: &[Value]) -> Result<(), Refusal> {
    let mut open: Vec<String> = Vec::new();
    let mut answerable: Vec<String> = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("");
        if !ROLES.contains(&role) {
            return Err(bad(
                format!("Invalid value: '{role}'. Supported values are: 'system', 'assistant', 'user', 'function', 'tool', and 'developer'."),
                Some(&format!("messages[{i}].role")),
                Some("invalid_value"),
            ));
        }
        if role == "tool" {
            let Some(id) = m.get("tool_call_id").and_then(Value::as_str) else {
                return Err(bad(
                    format!("Missing required parameter: 'messages[{i}].tool_call_id'."),
                    Some(&format!("messages[{i}].tool_call_id")),
                    Some("missing_required_parameter"),
                ));
            };
            if !answerable.iter().any(|a| a == id) {
                return Err(bad(
                    "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.".into(),
                    Some(&format!("messages.[{i}].role")),
                    None,
                ));
            }
            open.retain(|o| o != id);
            continue;
        }
        if !open.is_empty() {
            return Err(bad(
                format!("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}", open.join(", ")),
                Some(&format!("messages.[{i}].role")),
                None,
            ));
        }
        answerable.clear();
        if let Some(calls) = m.get("tool_calls").and_then(Value::as_array) {
            for c in calls {
                let id = c
                    .get("id")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_string();
                open.push(id.clone());
                answerable.push(id);
            }
        }
    }
    if !open.is_empty() {
        return Err(bad(
            format!("An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}", open.join(", ")),
            Some("messages"),
            None,
        ));
    }
    Ok(())
}
