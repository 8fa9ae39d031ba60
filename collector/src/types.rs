//! The types every database module shares: the error, the result, one
//! request as the recent-requests API shows it. A leaf: it uses no other
//! module of the collector, so `db`, `sqlite`, `pg` and `store` depend on
//! it and never on each other in a circle.

use std::fmt;

#[derive(Debug)]
pub struct DbError(pub String);

impl fmt::Display for DbError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

impl From<rusqlite::Error> for DbError {
    fn from(e: rusqlite::Error) -> Self {
        DbError(format!("sqlite: {e}"))
    }
}

impl From<postgres::Error> for DbError {
    fn from(e: postgres::Error) -> Self {
        DbError(format!("postgres: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, DbError>;

/// One request as the recent-requests API shows it.
pub struct Recent {
    pub request_id: String,
    pub time_ms: i64,
    pub client: String,
    pub requested_model: String,
    pub model: String,
    pub provider: String,
    pub experiment: String,
    pub arm: String,
    pub cache: String,
    pub attempts: String,
    pub status: i64,
    pub error: String,
    pub latency_ms: i64,
    pub ttfb_ms: i64,
    pub stream: bool,
    pub prompt_tokens: i64,
    pub completion_tokens: i64,
    pub cached_tokens: i64,
    pub reasoning_tokens: i64,
    pub cost_micros: i64,
    pub limited_by: String,
    pub guardrails: String,
    pub team: String,
    pub usage_estimated: bool,
    pub price_source: String,
    pub budget_routed: bool,
    pub ttft_ms: i64,
    /// 16 bytes, or none.
    pub trace_id: Vec<u8>,
    pub api: String,
    /// An MCP request's JSON-RPC method and error, its body's and its
    /// answer's sizes.
    pub mcp_method: String,
    pub rpc_error: i64,
    pub request_bytes: i64,
    pub response_bytes: i64,
}

impl Recent {
    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({
            "request_id": self.request_id,
            "time_ms": self.time_ms,
            "client": self.client,
            "requested_model": self.requested_model,
            "model": self.model,
            "provider": self.provider,
            "experiment": self.experiment,
            "arm": self.arm,
            "cache": self.cache,
            "attempts": serde_json::from_str::<serde_json::Value>(&self.attempts).unwrap_or_default(),
            "status": self.status,
            "error": self.error,
            "latency_ms": self.latency_ms,
            "ttfb_ms": self.ttfb_ms,
            "stream": self.stream,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cached_tokens": self.cached_tokens,
            "reasoning_tokens": self.reasoning_tokens,
            "cost_usd": self.cost_micros as f64 / 1e6,
            "limited_by": self.limited_by,
            "team": self.team,
            "usage_estimated": self.usage_estimated,
            "price_source": self.price_source,
            "budget_routed": self.budget_routed,
            "ttft_ms": self.ttft_ms,
            "trace_id": portcullis_core::wire::text::hex(&self.trace_id),
            "api": self.api,
            "mcp_method": self.mcp_method,
            "rpc_error": self.rpc_error,
            "request_bytes": self.request_bytes,
            "response_bytes": self.response_bytes,
            "guardrails": serde_json::from_str::<serde_json::Value>(&self.guardrails).unwrap_or_default(),
        })
    }
}

/// The columns of [`Recent`], in its order (both databases).
pub const RECENT_COLUMNS: &str = "request_id, time_ms, client, requested_model, model, provider, experiment, arm, cache, attempts,
     status, error, latency_ms, ttfb_ms, stream, prompt_tokens, completion_tokens, cached_tokens,
     reasoning_tokens, cost_micros, limited_by, guardrails, team, usage_estimated, price_source, budget_routed,
     ttft_ms, trace_id, api, mcp_method, rpc_error, request_bytes, response_bytes";
