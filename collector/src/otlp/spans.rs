//! A request record as OpenTelemetry spans in the GenAI semantic
//! conventions: the gateway's span (`{operation} {model}`, kind CLIENT, a
//! child of the client's span when it sent a `traceparent`) and one child
//! span per provider attempt, with the `traceparent` ids the provider saw.

use crate::otlp_proto::{any_value, span, AnyValue, KeyValue, Span, Status};
use crate::proto::{Attempt, RequestRecord};

pub(crate) const KIND_CLIENT: i32 = 3;
const STATUS_ERROR: i32 = 2;

pub(crate) fn kv(key: &str, value: any_value::Value) -> KeyValue {
    KeyValue {
        key: key.to_string(),
        value: Some(AnyValue { value: Some(value) }),
    }
}

pub(crate) fn text(key: &str, v: &str) -> KeyValue {
    kv(key, any_value::Value::StringValue(v.to_string()))
}

fn int(key: &str, v: u64) -> KeyValue {
    kv(
        key,
        any_value::Value::IntValue(i64::try_from(v).unwrap_or(i64::MAX)),
    )
}

/// `gen_ai.operation.name` of an inbound API.
pub fn operation(api: &str) -> &'static str {
    match api {
        "embeddings" => "embeddings",
        "count_tokens" => "count_tokens",
        _ => "chat",
    }
}

/// `gen_ai.provider.name` of a provider format; a request the gateway
/// answered itself (a cache hit, a refusal) has none: `portcullis`.
pub fn provider_name(format: &str) -> &str {
    match format {
        "" => "portcullis",
        "azure_openai" => "azure.ai.openai",
        "gemini" => "gcp.gemini",
        "vertex" => "gcp.vertex_ai",
        "bedrock" => "aws.bedrock",
        other => other,
    }
}

/// The model a request was made to: the one resolved, else the one asked.
pub fn request_model(r: &RequestRecord) -> &str {
    if r.model.is_empty() {
        &r.requested_model
    } else {
        &r.model
    }
}

/// `error.type`: the gateway's error class, else the status; `None` for a
/// success.
pub fn error_type(r: &RequestRecord) -> Option<String> {
    if !r.error.is_empty() {
        Some(r.error.clone())
    } else if r.status >= 400 || r.status == 0 {
        Some(r.status.to_string())
    } else {
        None
    }
}

fn nanos(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

/// Whether a record is exported as spans: it has a trace, sampled.
pub fn traced(r: &RequestRecord) -> bool {
    r.trace_id.len() == 16 && r.span_id.len() == 8 && r.trace_flags & 1 == 1
}

/// The spans of one record (none without a sampled trace). `content`:
/// the prompt and completion go as the conventions' events when the
/// record carries them.
pub fn spans_of(r: &RequestRecord, content: bool, out: &mut Vec<Span>) {
    if !traced(r) {
        return;
    }
    let end_ms = r.time_ms.saturating_add(r.latency_ms);
    let (op, name, mut a) = if r.api == "mcp" {
        mcp_span(r)
    } else {
        let op = operation(&r.api);
        let model = request_model(r);
        let name = if model.is_empty() {
            op.to_string()
        } else {
            format!("{op} {model}")
        };
        let a = vec![
            text("gen_ai.operation.name", op),
            text("gen_ai.provider.name", provider_name(&r.provider_format)),
            text("gen_ai.request.model", model),
        ];
        (op, name, a)
    };
    if !r.response_model.is_empty() {
        a.push(text("gen_ai.response.model", &r.response_model));
    }
    if r.max_tokens > 0 {
        a.push(int("gen_ai.request.max_tokens", r.max_tokens));
    }
    if let Some(t) = r.temperature {
        a.push(kv(
            "gen_ai.request.temperature",
            any_value::Value::DoubleValue(t),
        ));
    }
    if r.prompt_tokens > 0 || r.completion_tokens > 0 {
        a.push(int("gen_ai.usage.input_tokens", r.prompt_tokens));
        a.push(int("gen_ai.usage.output_tokens", r.completion_tokens));
    }
    if r.cached_tokens > 0 {
        a.push(int("gen_ai.usage.cache_read.input_tokens", r.cached_tokens));
    }
    if r.reasoning_tokens > 0 {
        a.push(int(
            "gen_ai.usage.reasoning.output_tokens",
            r.reasoning_tokens,
        ));
    }
    if !r.finish_reasons.is_empty() {
        let values = r
            .finish_reasons
            .iter()
            .map(|f| AnyValue {
                value: Some(any_value::Value::StringValue(f.clone())),
            })
            .collect();
        a.push(kv(
            "gen_ai.response.finish_reasons",
            any_value::Value::ArrayValue(crate::otlp_proto::ArrayValue { values }),
        ));
    }
    if !r.response_id.is_empty() {
        a.push(text("gen_ai.response.id", &r.response_id));
    }
    if !r.server_address.is_empty() {
        a.push(text("server.address", &r.server_address));
    }
    let error = error_type(r);
    if let Some(e) = &error {
        a.push(text("error.type", e));
    }
    a.push(int("http.response.status_code", u64::from(r.status)));
    a.push(text("portcullis.request_id", &r.request_id));
    for (k, v) in [
        ("portcullis.client", &r.client),
        ("portcullis.team", &r.team),
        ("portcullis.requested_model", &r.requested_model),
        ("portcullis.provider", &r.provider),
        ("portcullis.cache", &r.cache),
        ("portcullis.experiment", &r.experiment),
        ("portcullis.arm", &r.arm),
        ("portcullis.limited_by", &r.limited_by),
        ("portcullis.guardrails", &r.guardrails),
        ("portcullis.api", &r.api),
    ] {
        if !v.is_empty() {
            a.push(text(k, v));
        }
    }
    let tried = r.attempts.iter().filter(|t| !t.span_id.is_empty()).count();
    if tried > 1 {
        a.push(kv("portcullis.fallback", any_value::Value::BoolValue(true)));
    }
    a.push(int("portcullis.attempts", tried as u64));
    a.push(kv(
        "portcullis.cost_usd",
        any_value::Value::DoubleValue(r.cost_micros as f64 / 1e6),
    ));
    if r.stream {
        a.push(kv(
            "gen_ai.request.stream",
            any_value::Value::BoolValue(true),
        ));
    }
    if r.ttft_ms > 0 {
        a.push(kv(
            "gen_ai.response.time_to_first_chunk",
            any_value::Value::DoubleValue(r.ttft_ms as f64 / 1e3),
        ));
    }
    let mut events = Vec::new();
    for skipped in r.attempts.iter().filter(|t| t.span_id.is_empty()) {
        events.push(span::Event {
            time_unix_nano: nanos(r.time_ms),
            name: "portcullis.provider.skipped".into(),
            attributes: vec![
                text("portcullis.provider", &skipped.provider),
                text("portcullis.cause", &skipped.cause),
            ],
        });
    }
    if content && !r.prompt.is_empty() {
        events.push(span::Event {
            time_unix_nano: nanos(r.time_ms),
            name: "gen_ai.content.prompt".into(),
            attributes: vec![text("gen_ai.prompt", &r.prompt)],
        });
    }
    if content && !r.completion.is_empty() {
        events.push(span::Event {
            time_unix_nano: nanos(end_ms),
            name: "gen_ai.content.completion".into(),
            attributes: vec![text("gen_ai.completion", &r.completion)],
        });
    }
    out.push(Span {
        trace_id: r.trace_id.clone(),
        span_id: r.span_id.clone(),
        trace_state: r.tracestate.clone(),
        parent_span_id: r.parent_span_id.clone(),
        name: name.clone(),
        kind: KIND_CLIENT,
        start_time_unix_nano: nanos(r.time_ms),
        end_time_unix_nano: nanos(end_ms),
        attributes: a,
        events,
        status: error.map(|e| Status {
            message: e,
            code: STATUS_ERROR,
        }),
        flags: r.trace_flags,
    });
    let answering = r.attempts.iter().rposition(|t| !t.span_id.is_empty());
    for (i, t) in r.attempts.iter().enumerate() {
        if t.span_id.is_empty() {
            continue;
        }
        let last = Some(i) == answering;
        out.push(attempt_span(r, t, &name, op, last));
    }
}

/// An MCP request's span (#47), in the GenAI and MCP conventions: a tool
/// call is `execute_tool {tool}` (`gen_ai.tool.name`, the qualified
/// `server__tool`), any other message its method; the JSON-RPC method and
/// error, the server, the sizes.
fn mcp_span(r: &RequestRecord) -> (&'static str, String, Vec<KeyValue>) {
    let call = r.mcp_method == "tools/call";
    let op = if call { "execute_tool" } else { "mcp" };
    let name = if call && !r.model.is_empty() {
        format!("execute_tool {}", r.model)
    } else if r.mcp_method.is_empty() {
        "mcp".to_string()
    } else {
        r.mcp_method.clone()
    };
    let mut a = vec![text("mcp.method.name", &r.mcp_method)];
    if call {
        a.push(text("gen_ai.operation.name", op));
        a.push(text("gen_ai.tool.name", &r.model));
    }
    if !r.provider.is_empty() {
        a.push(text("portcullis.mcp.server", &r.provider));
    }
    if r.rpc_error != 0 {
        a.push(kv(
            "rpc.jsonrpc.error_code",
            any_value::Value::IntValue(r.rpc_error),
        ));
    }
    a.push(int("portcullis.request_bytes", r.request_bytes));
    a.push(int("portcullis.response_bytes", r.response_bytes));
    (op, name, a)
}

/// One provider attempt: a child of the gateway's span.
fn attempt_span(r: &RequestRecord, t: &Attempt, name: &str, op: &str, answered: bool) -> Span {
    let mut a = vec![
        text("gen_ai.operation.name", op),
        text("portcullis.provider", &t.provider),
        int("http.response.status_code", u64::from(t.status)),
    ];
    if answered {
        // Only the answering provider's format and host are in the record.
        a.push(text(
            "gen_ai.provider.name",
            provider_name(&r.provider_format),
        ));
        if !r.server_address.is_empty() {
            a.push(text("server.address", &r.server_address));
        }
    }
    let failed = !t.cause.is_empty();
    if failed {
        a.push(text("error.type", &t.cause));
    }
    Span {
        trace_id: r.trace_id.clone(),
        span_id: t.span_id.clone(),
        trace_state: r.tracestate.clone(),
        parent_span_id: r.span_id.clone(),
        name: name.to_string(),
        kind: KIND_CLIENT,
        start_time_unix_nano: nanos(t.start_ms),
        end_time_unix_nano: nanos(t.end_ms.max(t.start_ms)),
        attributes: a,
        events: Vec::new(),
        status: failed.then(|| Status {
            message: t.cause.clone(),
            code: STATUS_ERROR,
        }),
        flags: r.trace_flags,
    }
}

/// How many spans a record makes (its share of the export queue).
pub fn span_count(r: &RequestRecord) -> usize {
    if traced(r) {
        1 + r.attempts.iter().filter(|t| !t.span_id.is_empty()).count()
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr<'a>(s: &'a Span, k: &str) -> Option<&'a any_value::Value> {
        s.attributes
            .iter()
            .find(|a| a.key == k)
            .and_then(|a| a.value.as_ref()?.value.as_ref())
    }

    #[test]
    fn a_tool_call_is_an_execute_tool_span_with_the_servers_call_as_its_child() {
        let r = RequestRecord {
            request_id: "m".into(),
            time_ms: 1000,
            latency_ms: 40,
            api: "mcp".into(),
            mcp_method: "tools/call".into(),
            model: "alpha__echo".into(),
            provider: "alpha".into(),
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            trace_flags: 1,
            status: 200,
            request_bytes: 90,
            response_bytes: 120,
            attempts: vec![Attempt {
                provider: "alpha".into(),
                status: 200,
                span_id: vec![4; 8],
                start_ms: 1002,
                end_ms: 1039,
                ..Attempt::default()
            }],
            ..RequestRecord::default()
        };
        let mut out = Vec::new();
        spans_of(&r, false, &mut out);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].name, "execute_tool alpha__echo");
        let s = |v: &str| Some(any_value::Value::StringValue(v.into()));
        assert_eq!(
            attr(&out[0], "gen_ai.operation.name").cloned(),
            s("execute_tool")
        );
        assert_eq!(attr(&out[0], "gen_ai.tool.name").cloned(), s("alpha__echo"));
        assert_eq!(attr(&out[0], "mcp.method.name").cloned(), s("tools/call"));
        assert_eq!(attr(&out[0], "gen_ai.request.model"), None);
        assert_eq!(out[1].parent_span_id, vec![2; 8]);
        assert_eq!(out[1].span_id, vec![4; 8]);
        // Another method: its name, and its JSON-RPC error.
        let list = RequestRecord {
            mcp_method: "tools/list".into(),
            model: String::new(),
            rpc_error: -32602,
            attempts: Vec::new(),
            ..r
        };
        let mut out = Vec::new();
        spans_of(&list, false, &mut out);
        assert_eq!(out[0].name, "tools/list");
        assert_eq!(
            attr(&out[0], "rpc.jsonrpc.error_code").cloned(),
            Some(any_value::Value::IntValue(-32602))
        );
    }

    #[test]
    fn a_fallback_is_the_gateways_span_with_one_child_per_attempt() {
        let r = RequestRecord {
            request_id: "r".into(),
            time_ms: 1000,
            latency_ms: 500,
            model: "gpt-4o-mini".into(),
            api: "chat_completions".into(),
            provider_format: "anthropic".into(),
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            parent_span_id: vec![3; 8],
            trace_flags: 1,
            status: 200,
            attempts: vec![
                Attempt {
                    provider: "primary".into(),
                    status: 503,
                    cause: "http_5xx".into(),
                    span_id: vec![4; 8],
                    start_ms: 1001,
                    end_ms: 1100,
                },
                Attempt {
                    provider: "closed".into(),
                    cause: "circuit_open".into(),
                    ..Attempt::default()
                },
                Attempt {
                    provider: "backup".into(),
                    status: 200,
                    span_id: vec![5; 8],
                    start_ms: 1100,
                    end_ms: 1500,
                    ..Attempt::default()
                },
            ],
            ..RequestRecord::default()
        };
        let mut out = Vec::new();
        spans_of(&r, false, &mut out);
        assert_eq!(out.len(), 3);
        let (gw, first, second) = (&out[0], &out[1], &out[2]);
        assert_eq!(gw.name, "chat gpt-4o-mini");
        assert_eq!(gw.parent_span_id, vec![3; 8]);
        assert_eq!(gw.events.len(), 1, "the skipped provider is an event");
        assert_eq!(first.parent_span_id, gw.span_id);
        assert_eq!(second.parent_span_id, gw.span_id);
        assert!(first.status.is_some() && second.status.is_none());
        assert_eq!(
            attr(second, "gen_ai.provider.name"),
            Some(&any_value::Value::StringValue("anthropic".into()))
        );
        assert_eq!(attr(first, "gen_ai.provider.name"), None);
        assert_eq!(span_count(&r), 3);
        // Prompt and completion only with `content`, as the conventions' events.
        let talk = RequestRecord {
            prompt: "hello".into(),
            completion: "hi".into(),
            ..r.clone()
        };
        let names = |content: bool| {
            let mut out = Vec::new();
            spans_of(&talk, content, &mut out);
            out[0]
                .events
                .iter()
                .map(|e| e.name.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(names(false), ["portcullis.provider.skipped"]);
        assert_eq!(
            names(true),
            [
                "portcullis.provider.skipped",
                "gen_ai.content.prompt",
                "gen_ai.content.completion"
            ]
        );
        // Not sampled: no spans.
        let mut quiet = Vec::new();
        spans_of(
            &RequestRecord {
                trace_flags: 0,
                ..r
            },
            false,
            &mut quiet,
        );
        assert!(quiet.is_empty());
    }
}
