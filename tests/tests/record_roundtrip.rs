//! The filter's hand-written protobuf encoder and the collector's prost
//! types agree on every field of the one .proto.
use portcullis_collector::proto;
use portcullis_core::telemetry::record::{encode_batch, Attempt, Record};
use prost::Message;

fn full() -> Record {
    Record {
        request_id: "req-1".into(),
        time_ms: 1_764_000_000_123,
        client: "demo".into(),
        requested_model: "auto".into(),
        model: "gpt-4o-mini".into(),
        provider: "backup".into(),
        experiment: "ab".into(),
        arm: "treatment".into(),
        cache: "miss".into(),
        attempts: vec![
            Attempt {
                provider: "primary".into(),
                status: 503,
                cause: "http_5xx".into(),
                span_id: vec![1, 2, 3, 4, 5, 6, 7, 8],
                start_ms: 1_764_000_000_130,
                end_ms: 1_764_000_000_200,
            },
            Attempt {
                provider: "backup".into(),
                status: 200,
                cause: String::new(),
                span_id: vec![9; 8],
                start_ms: 1_764_000_000_201,
                end_ms: 1_764_000_001_357,
            },
        ],
        status: 200,
        error: String::new(),
        latency_ms: 1234,
        ttfb_ms: 56,
        stream: true,
        prompt_tokens: 10,
        completion_tokens: 20,
        cached_tokens: 3,
        reasoning_tokens: 4,
        cost_micros: -7,
        prompt: "héllo".into(),
        completion: "wörld".into(),
        limited_by: "global".into(),
        guardrails: r#"[{"stage":"input","check":"pii","action":"redact","hits":1}]"#.into(),
        team: "research".into(),
        usage_estimated: true,
        price_source: "default".into(),
        budget_routed: true,
        trace_id: (1..=16).collect(),
        span_id: vec![0xAB; 8],
        parent_span_id: vec![0xCD; 8],
        trace_flags: 1,
        tracestate: "vendor=x".into(),
        ttft_ms: 300,
        api: "chat_completions",
        provider_format: "anthropic",
        server_address: "api.anthropic.com".into(),
        max_tokens: 64,
        // Present even when 0 (`optional`).
        temperature: Some(0.0),
        response_id: "msg_1".into(),
        response_model: "claude-x".into(),
        finish_reasons: vec!["stop".into(), String::new()],
        mcp_method: "tools/call".into(),
        // Negative: a 10-byte varint.
        rpc_error: -32602,
        request_bytes: 120,
        response_bytes: 4096,
    }
}

#[test]
fn every_field_round_trips_through_prost() {
    let r = full();
    let batch = encode_batch(&[
        r.encode(),
        Record {
            request_id: "req-2".into(),
            ..Record::default()
        }
        .encode(),
    ]);
    let decoded = proto::RecordBatch::decode(batch.as_slice()).unwrap();
    assert_eq!(decoded.records.len(), 2);
    let d = &decoded.records[0];
    let expected = proto::RequestRecord {
        request_id: r.request_id.clone(),
        time_ms: r.time_ms,
        client: r.client.clone(),
        requested_model: r.requested_model.clone(),
        model: r.model.clone(),
        provider: r.provider.clone(),
        experiment: r.experiment.clone(),
        arm: r.arm.clone(),
        cache: r.cache.clone(),
        attempts: r
            .attempts
            .iter()
            .map(|a| proto::Attempt {
                provider: a.provider.clone(),
                status: a.status,
                cause: a.cause.clone(),
                span_id: a.span_id.clone(),
                start_ms: a.start_ms,
                end_ms: a.end_ms,
            })
            .collect(),
        status: r.status,
        error: r.error.clone(),
        latency_ms: r.latency_ms,
        ttfb_ms: r.ttfb_ms,
        stream: r.stream,
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.completion_tokens,
        cached_tokens: r.cached_tokens,
        reasoning_tokens: r.reasoning_tokens,
        cost_micros: r.cost_micros,
        prompt: r.prompt.clone(),
        completion: r.completion.clone(),
        limited_by: r.limited_by.clone(),
        guardrails: r.guardrails.clone(),
        team: r.team.clone(),
        usage_estimated: r.usage_estimated,
        price_source: r.price_source.clone(),
        budget_routed: r.budget_routed,
        trace_id: r.trace_id.clone(),
        span_id: r.span_id.clone(),
        parent_span_id: r.parent_span_id.clone(),
        trace_flags: r.trace_flags,
        tracestate: r.tracestate.clone(),
        ttft_ms: r.ttft_ms,
        api: r.api.to_string(),
        provider_format: r.provider_format.to_string(),
        server_address: r.server_address.clone(),
        max_tokens: r.max_tokens,
        temperature: r.temperature,
        response_id: r.response_id.clone(),
        response_model: r.response_model.clone(),
        finish_reasons: r.finish_reasons.clone(),
        mcp_method: r.mcp_method.clone(),
        rpc_error: r.rpc_error,
        request_bytes: r.request_bytes,
        response_bytes: r.response_bytes,
    };
    assert_eq!(d, &expected);
    // And prost's own encoding is byte-identical to ours.
    assert_eq!(expected.encode_to_vec(), r.encode());
    assert_eq!(decoded.records[1].request_id, "req-2");
}
