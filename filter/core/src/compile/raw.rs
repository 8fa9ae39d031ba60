//! The plugin config as written: serde structs, their defaults, and the
//! checks of one section's values. Their fields are the only list of the
//! keys each section accepts (see `known_keys`).

use super::{Budget, BudgetLow, Limits, MaxTokensMode, Scope, Scopes};
use crate::health::breaker::BreakerConfig;
use crate::limits::period::Period;
use crate::limits::ratelimit::Micros;
use serde::Deserialize;

pub(super) const DEFAULT_TIMEOUT_MS: u64 = 60_000;
/// Five minutes: Envoy's own stream idle timeout (a stream waiting for a
/// callout is idle), so a longer bound would not be reached by default.
pub(super) const DEFAULT_STREAM_TIMEOUT_MS: u64 = 300_000;
/// 32 MiB: what Anthropic accepts, and room for an agent's conversation
/// with screenshots (#29).
pub(super) const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;
pub(super) const DEFAULT_MAX_ATTEMPTS: u32 = 3;
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    /// The providers, each an Envoy cluster speaking one API (`schema`), with the models it serves.
    #[serde(default)]
    pub(super) providers: Vec<RawProvider>,
    /// How a request's model becomes a provider: the chain order, attempts, strategies and conditional routes.
    #[serde(default)]
    pub(super) routing: RawRouting,
    /// The client keys (only their SHA-256 is stored), their allowed models and limits.
    #[serde(default)]
    pub(super) clients: Vec<RawClient>,
    /// The gateway's limits: the default limits of every key, the body limit, global (fleet) limits, end users.
    #[serde(default)]
    pub(super) limits: RawLimits,
    /// Circuit breaker defaults for every provider (a provider's own `breaker` overrides them).
    #[serde(default)]
    pub(super) breaker: RawBreaker,
    /// The prompt cache: answers kept in Envoy's shared data, and each worker's copies of hot ones.
    #[serde(default)]
    pub(super) cache: RawCache,
    /// Prices per model name (USD per million tokens), over the built-in table; a provider model's own `price` wins.
    #[serde(default)]
    pub(super) prices: std::collections::BTreeMap<String, RawPrice>,
    /// Sticky A/B experiments: a key is assigned an arm (a model) by hash, the same on every worker and reload.
    #[serde(default)]
    pub(super) experiments: Vec<RawExperiment>,
    /// The request log: records batched to the collector over gRPC (none: no records).
    #[serde(default)]
    pub(super) log: Option<RawLog>,
    /// Checks of prompts (`input`) and answers (`output`): PII, patterns, sizes, models, JSON schemas, external guards.
    #[serde(default)]
    pub(super) guardrails: Option<RawGuardrails>,
    /// Teams: limits and budgets shared by their keys (`clients[].team`).
    #[serde(default)]
    pub(super) teams: Vec<RawTeam>,
    /// Trace context: a client's W3C `traceparent` is always continued (a child span per attempt goes upstream); this section also starts traces for requests that come without one.
    #[serde(default)]
    pub(super) tracing: Option<RawTracing>,
    /// The MCP gateway: MCP servers behind `{path}/{server}` on the gateway's listener, called under the same keys, teams, limits, budgets, guardrails and request log as LLM calls.
    #[serde(default)]
    pub(super) mcp: Option<RawMcp>,
    /// Test hooks, refused unless the VM's environment has
    /// `PORTCULLIS_TESTING=1` (never in production).
    #[serde(default)]
    pub(super) testing: Option<RawTesting>,
}

/// `tracing`: traces the gateway starts itself.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTracing {
    /// The share of requests without a `traceparent` that start a trace (sampled), from 0 to 1 (default 1).
    #[serde(default = "default_sample_rate")]
    pub(super) sample_rate: f64,
}

fn default_sample_rate() -> f64 {
    1.0
}

/// A team: a name its keys give as `clients[].team`, and limits its keys
/// share (a request must pass the key's and the team's).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTeam {
    /// The team's name (`clients[].team`).
    pub(super) name: String,
    /// The team's limits and budgets, shared by its keys.
    #[serde(default)]
    pub(super) limits: Option<RawClientLimits>,
    /// The MCP servers and tools the team's keys may use (each key's own list applies too) and the team's tool-call limits, shared by its keys.
    #[serde(default)]
    pub(super) mcp: Option<RawMcpAccess>,
    /// Per guardrail check (by name), this team's action instead of the check's: `deny`, `redact`, `log` (monitor a vendor before enforcing it) or `off` (the check does not apply to the team's keys).
    #[serde(default)]
    pub(super) guardrails: Option<std::collections::BTreeMap<String, String>>,
}

/// `testing`: hooks for the real-Envoy tests.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTesting {
    /// Added to the host's clock (budget periods rolling over without
    /// waiting for them).
    #[serde(default)]
    pub(super) clock_offset_ms: i64,
}

/// `on_budget_low`: below this much left of a budget, this model.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudgetLow {
    /// When the remaining budget falls below this many USD...
    pub(super) below_usd: f64,
    /// ...requests go to this model (or alias) instead; the answer says so in `x-portcullis-budget-routed`.
    pub(super) use_model: String,
}

/// One budget: USD per period (`day`, `week`, `month`, `total`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBudget {
    /// The spend allowed per period, in USD (priced from the answers' usage).
    pub(super) usd: f64,
    /// The period: `day`, `week`, `month` or `total`.
    pub(super) period: String,
}

/// `guardrails`: checks on prompts (`input`) and answers (`output`).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGuardrails {
    /// The status of a denied request or answer (400-599; default 400).
    #[serde(default)]
    pub(super) deny_status: Option<u16>,
    /// Streams: the text held back so that a match split across chunks is still found (default 256).
    #[serde(default)]
    pub(super) lookbehind_bytes: Option<usize>,
    /// Records carry the text a check matched (default false).
    #[serde(default)]
    pub(super) include_content: bool,
    /// How long a vendor check's verdict on one message is kept, in seconds, so the next turns of a conversation send the vendor only their new messages (default 600; 0: every message is sent every time).
    #[serde(default)]
    pub(super) vendor_verdict_ttl_s: Option<u64>,
    /// Checks of the prompt, before anything is sent.
    #[serde(default)]
    pub(super) input: Vec<RawCheck>,
    /// Checks of the answer (whole answers held, streams as they pass).
    #[serde(default)]
    pub(super) output: Vec<RawCheck>,
}

/// One check: a name, exactly one kind (`regex`, `pii`, the word/token
/// bounds, `allow_models`/`deny_models`, `json_schema`, `external`,
/// `vendor`), an action, and where it applies.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCheck {
    /// The check's name: in the error, headers, records and metrics.
    pub(super) name: String,
    /// `deny` (default), `redact` (pii and regex checks) or `log`.
    #[serde(default)]
    pub(super) action: Option<String>,
    /// The clients it applies to (none: every client).
    #[serde(default)]
    pub(super) clients: Option<Vec<String>>,
    /// The models or aliases it applies to, as resolved (none: every model).
    #[serde(default)]
    pub(super) models: Option<Vec<String>>,
    /// A pattern (Rust `regex` syntax, linear time) the text must not match.
    #[serde(default)]
    pub(super) regex: Option<String>,
    /// Kinds of personal data found by the built-in detectors: `email`, `phone`, `card`, `iban`, `api_key`.
    #[serde(default)]
    pub(super) pii: Option<Vec<String>>,
    /// The fewest words a prompt must have.
    #[serde(default)]
    pub(super) min_words: Option<u64>,
    /// The most words a prompt may have.
    #[serde(default)]
    pub(super) max_words: Option<u64>,
    /// The most tokens (estimated) a prompt may have.
    #[serde(default)]
    pub(super) max_tokens: Option<u64>,
    /// Only these models may be asked for (resolved names).
    #[serde(default)]
    pub(super) allow_models: Option<Vec<String>>,
    /// These models may not be asked for (resolved names).
    #[serde(default)]
    pub(super) deny_models: Option<Vec<String>>,
    /// Output: the answer must be JSON valid against this schema.
    #[serde(default)]
    pub(super) json_schema: Option<serde_yaml::Value>,
    /// An external guard service asked over HTTP.
    #[serde(default)]
    pub(super) external: Option<RawExternal>,
    /// A content-safety vendor's API (docs/vendor-guardrails.md).
    #[serde(default)]
    pub(super) vendor: Option<RawVendor>,
}

/// A content-safety vendor asked over its own API: which vendor, its Envoy
/// cluster and what the vendor needs. The credential comes from the
/// environment (`api_key_env`, or for Bedrock the AWS variables), never
/// from this config.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawVendor {
    /// `bedrock_guardrails`, `azure_content_safety`, `azure_prompt_shields`, `model_armor`, `openai_moderation`, `lakera_guard` or `presidio`.
    pub(super) kind: String,
    /// The Envoy cluster that reaches the vendor (TLS and its host are the cluster's).
    pub(super) cluster: String,
    /// The `:authority` sent (default: Bedrock's, Model Armor's, OpenAI's and Lakera's public hosts; Azure and Presidio: the cluster's name, so name your resource's host).
    #[serde(default)]
    pub(super) authority: Option<String>,
    /// How long the vendor may take, in ms (default 500).
    #[serde(default)]
    pub(super) timeout_ms: Option<u64>,
    /// When the vendor fails, is late or answers what does not read: `allow` (default) or `deny`.
    #[serde(default = "default_failure_mode")]
    pub(super) failure_mode: String,
    /// The environment variable holding the vendor's key (Azure, Model Armor's access token, OpenAI, Lakera; optional for Presidio).
    #[serde(default)]
    pub(super) api_key_env: Option<String>,
    /// Bedrock: the guardrail's id.
    #[serde(default)]
    pub(super) guardrail_id: Option<String>,
    /// Bedrock: the guardrail's version (a number or `DRAFT`).
    #[serde(default)]
    pub(super) guardrail_version: Option<String>,
    /// Bedrock: the AWS region.
    #[serde(default)]
    pub(super) region: Option<String>,
    /// Bedrock: prefix of the `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and `AWS_SESSION_TOKEN` variables (default none).
    #[serde(default)]
    pub(super) aws_env_prefix: Option<String>,
    /// Azure: the API version (default `2024-09-01`).
    #[serde(default)]
    pub(super) api_version: Option<String>,
    /// Azure content safety: severity (0-7) per category (`Hate`, `SelfHarm`, `Sexual`, `Violence`) at which it is flagged (default 4); OpenAI moderation: score (0-1) per category at which it is flagged (default: the vendor's `flagged`).
    #[serde(default)]
    pub(super) thresholds: Option<std::collections::BTreeMap<String, f64>>,
    /// Model Armor: the Google Cloud project.
    #[serde(default)]
    pub(super) project: Option<String>,
    /// Model Armor: the template's location (e.g. `us-central1`).
    #[serde(default)]
    pub(super) location: Option<String>,
    /// Model Armor: the template's id.
    #[serde(default)]
    pub(super) template: Option<String>,
    /// OpenAI moderation: the model (default `omni-moderation-latest`).
    #[serde(default)]
    pub(super) model: Option<String>,
    /// Lakera Guard: the project whose policy applies (default: the account's default policy).
    #[serde(default)]
    pub(super) project_id: Option<String>,
    /// Presidio: the language of the texts (default `en`).
    #[serde(default)]
    pub(super) language: Option<String>,
    /// Presidio: the entities to find (default: every entity the analyzer knows).
    #[serde(default)]
    pub(super) entities: Option<Vec<String>>,
    /// Presidio: the lowest score an entity is counted at (default: the analyzer's).
    #[serde(default)]
    pub(super) score_threshold: Option<f64>,
}

/// An external guard service (see `guard::external` for its contract).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExternal {
    /// The Envoy cluster of the guard service.
    pub(super) cluster: String,
    /// The path it is called at (default `/v1/guard`).
    #[serde(default = "default_guard_path")]
    pub(super) path: String,
    /// The `:authority` sent (default: the cluster's name).
    #[serde(default)]
    pub(super) authority: Option<String>,
    /// How long the guard may take, in ms (default 200).
    #[serde(default = "default_guard_timeout")]
    pub(super) timeout_ms: u64,
    /// When the guard fails or times out: `allow` (default) or `deny`.
    #[serde(default = "default_failure_mode")]
    pub(super) failure_mode: String,
}

fn default_guard_path() -> String {
    "/v1/guard".into()
}
fn default_guard_timeout() -> u64 {
    200
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    /// The Envoy cluster of the collector (gRPC).
    pub(super) collector_cluster: String,
    /// Records per batch sent (default 500).
    #[serde(default = "default_log_batch")]
    pub(super) batch_size: usize,
    /// How often a worker sends what it holds, in ms (default 250); also the filter's tick.
    #[serde(default = "default_log_flush")]
    pub(super) flush_interval_ms: u64,
    /// Records a worker holds while the collector is away; past this the oldest are dropped and counted (default 10000).
    #[serde(default = "default_log_buffer")]
    pub(super) buffer_records: usize,
    /// Bytes of records a worker holds at most (default 8 MiB).
    #[serde(default = "default_log_buffer_bytes")]
    pub(super) buffer_bytes: usize,
    /// How long a batch may take to be acknowledged, in ms (default 5000).
    #[serde(default = "default_log_timeout")]
    pub(super) timeout_ms: u64,
    /// Records carry the prompt and the completion text (default false).
    #[serde(default)]
    pub(super) include_content: bool,
}

fn default_log_batch() -> usize {
    500
}
fn default_log_flush() -> u64 {
    250
}
fn default_log_buffer() -> usize {
    10_000
}
fn default_log_buffer_bytes() -> usize {
    8 << 20
}
fn default_log_timeout() -> u64 {
    5000
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPrice {
    /// USD per million input tokens (default 0: a model priced by the unit).
    #[serde(default)]
    pub(super) input: f64,
    /// USD per million output tokens (default 0).
    #[serde(default)]
    pub(super) output: f64,
    /// USD per million cached input tokens (default: `input`).
    #[serde(default)]
    pub(super) cached_input: Option<f64>,
    /// Prompt tokens written to a provider's cache (Anthropic; default:
    /// the input price).
    #[serde(default)]
    pub(super) cache_write: Option<f64>,
    /// Reasoning tokens (part of the output; default: the output price).
    #[serde(default)]
    pub(super) reasoning: Option<f64>,
    /// USD per million audio input tokens (the Realtime API's; default:
    /// `input`).
    #[serde(default)]
    pub(super) input_audio: Option<f64>,
    /// USD per million audio output tokens (default: `output`).
    #[serde(default)]
    pub(super) output_audio: Option<f64>,
    /// USD per image (`/v1/images/*`): one number, or by quality and size
    /// (`{"1024x1024": 0.04, "hd 1024x1792": 0.12, "*": 0.04}`; the
    /// request's quality and size, else its size, else its quality, else `*`).
    #[serde(default)]
    pub(super) per_image: Option<RawImagePrice>,
    /// USD per minute of audio transcribed or translated, as the answer's
    /// `usage.seconds` counts it.
    #[serde(default)]
    pub(super) per_audio_minute: Option<f64>,
    /// USD per million characters of speech input (`/v1/audio/speech`).
    #[serde(default)]
    pub(super) per_million_characters: Option<f64>,
    /// USD per thousand searches (`/v1/rerank`: one per 100 documents).
    #[serde(default)]
    pub(super) per_thousand_searches: Option<f64>,
}

/// A per-image price: one for every image, or by quality and size.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub(super) enum RawImagePrice {
    One(f64),
    By(std::collections::BTreeMap<String, f64>),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExperiment {
    /// The experiment's name: in headers (`x-portcullis-experiment`), records and metrics.
    pub(super) name: String,
    /// Mixed into the hash that assigns a key its arm (default: the name); a new salt reshuffles.
    #[serde(default)]
    pub(super) salt: Option<String>,
    /// The models or aliases (or `auto`) whose requests the experiment takes.
    #[serde(default)]
    pub(super) applies_to: Vec<String>,
    /// The arms: each a model and its weight.
    #[serde(default)]
    pub(super) arms: Vec<RawArm>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawArm {
    /// The arm's name.
    pub(super) name: String,
    /// The arm's share of keys (default 1).
    #[serde(default = "default_weight")]
    pub(super) weight: u32,
    /// The model (or alias) the arm's requests go to.
    pub(super) model: String,
}

/// Per-client limits; every field optional so a client can override some.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClientLimits {
    /// Requests a minute (a token bucket).
    pub(super) requests_per_minute: Option<u64>,
    /// Tokens a minute, reserved by estimate at admission and settled with the answer's usage.
    pub(super) tokens_per_minute: Option<u64>,
    /// Requests in flight at once.
    pub(super) max_concurrent: Option<u32>,
    /// Shorthand for `budgets: [{usd: N, period: day}]`.
    pub(super) budget_usd_per_day: Option<f64>,
    /// USD budgets per period; with `budget_usd_per_day`, they replace the
    /// defaults' budgets as a whole.
    pub(super) budgets: Option<Vec<RawBudget>>,
    /// The output tokens reserved for a request that names no cap (default 1024).
    pub(super) default_max_tokens: Option<u64>,
    /// A request without a completion cap, or with one larger than the
    /// limits have room for: `estimate` (reserve `default_max_tokens`, send
    /// the request as it is), `clamp` (set the cap to what fits),
    /// `refuse` (a request must name its cap).
    pub(super) max_tokens_mode: Option<String>,
    /// Route to a cheaper model instead of refusing when the level's
    /// tightest budget has less than `below_usd` left.
    pub(super) on_budget_low: Option<RawBudgetLow>,
    /// Limits of each end user of a key (named by the request's `user`, or
    /// the header `limits.user_header`): requests, tokens, concurrency and
    /// budgets per user.
    pub(super) per_user: Option<Box<RawClientLimits>>,
    /// The largest request body, in bytes: `limits.max_body_bytes` for
    /// every client (32 MiB unless set), a client's own to override it.
    pub(super) max_body_bytes: Option<usize>,
    /// Where each limit is counted: `local`, `global` or `both`, for all
    /// of them or per limit.
    pub(super) scope: Option<RawScope>,
}

/// `scope: global`, or `scope: {requests_per_minute: global, ...}`.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub(super) enum RawScope {
    All(String),
    Each(std::collections::BTreeMap<String, String>),
}

/// `limits.global`: the rate limit service that counts `global` limits.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawGlobal {
    /// The Envoy cluster of the rate limit service (gRPC).
    pub(super) cluster: String,
    /// How long a limit check may take before `failure_mode` applies, in ms (default 50).
    #[serde(default = "default_global_timeout")]
    pub(super) timeout_ms: u64,
    /// When the service does not answer: `local_share` (the default: each
    /// replica counts its share of every global limit itself), `allow` or
    /// `deny`.
    #[serde(default = "default_global_failure_mode")]
    pub(super) failure_mode: String,
    /// Gateway replicas that share the global limits: a replica's share of
    /// a limit while the service is away is the limit divided by this.
    #[serde(default = "default_replicas")]
    pub(super) replicas: u32,
}

/// About eight times the limiter's p99 answer under `make bench-global`'s
/// saturating load on two cores (6.1 ms, #34).
fn default_global_timeout() -> u64 {
    50
}
fn default_failure_mode() -> String {
    "allow".into()
}
fn default_global_failure_mode() -> String {
    "local_share".into()
}
fn default_replicas() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCache {
    /// Answers are cached and served from the cache (default false).
    #[serde(default)]
    pub(super) enabled: bool,
    /// The whole table's size in shared data, in bytes (default 16 MiB).
    #[serde(default = "default_cache_bytes")]
    pub(super) max_bytes: usize,
    /// The largest answer kept, in bytes (default 64 KiB).
    #[serde(default = "default_cache_entry_bytes")]
    pub(super) max_entry_bytes: usize,
    /// Entries per set of the set-associative table (default 4).
    #[serde(default = "default_cache_ways")]
    pub(super) ways: u32,
    /// How long an entry is served, in seconds (default 3600).
    #[serde(default = "default_cache_ttl_s")]
    pub(super) ttl_s: u64,
    /// Prompts that differ only in case and whitespace share an entry (default false).
    #[serde(default)]
    pub(super) normalize: bool,
    /// `shared` (default): one entry for every key; `client`: each key its own.
    #[serde(default = "default_cache_scope")]
    pub(super) scope: String,
    /// Default: an eighth of `max_bytes`, at most 1 MiB.
    #[serde(default)]
    pub(super) worker_bytes: Option<usize>,
    /// How long a worker trusts its copy of an entry, in ms (default 1000).
    #[serde(default = "default_cache_worker_ttl_ms")]
    pub(super) worker_ttl_ms: u64,
    /// The fleet's tier (none: this Envoy's alone): entries every replica reads on a miss here and writes with its fresh answers, kept in Redis by `portcullis-limiter`.
    #[serde(default)]
    pub(super) shared: Option<RawSharedCache>,
    /// Near-duplicate prompts answered from the fleet's tier (needs `shared`): a prompt's embedding compared with stored prompts' (opt-in, per model).
    #[serde(default)]
    pub(super) semantic: Option<RawSemanticCache>,
}

/// `cache.semantic`: a request of a listed model that misses both exact
/// tiers is embedded (by a request to the gateway itself, under the
/// client's key: limited, priced and logged like any) and answered with a
/// stored answer whose prompt's embedding is at least `threshold` similar,
/// in the same space: the same route, scope, system prompt, settings and
/// numbers. Only single-turn text chat completions without tools are
/// eligible unless `multi_turn` says conversations are too.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSemanticCache {
    /// The model that embeds prompts: a model of this config that serves embeddings.
    pub(super) embedding_model: String,
    /// The least cosine similarity served, from 0.5 to 1 (default 0.95).
    #[serde(default = "default_semantic_threshold")]
    pub(super) threshold: f64,
    /// The models, as clients ask for them, whose requests may be answered by a near-duplicate's answer (none unless listed).
    pub(super) models: Vec<String>,
    /// Conversations (assistant turns, several user messages) are eligible too (default false: an agent's next answer depends on more than its words).
    #[serde(default)]
    pub(super) multi_turn: bool,
    /// The Envoy cluster of the gateway's own listener, which the embedding request goes to (default `portcullis_self`).
    #[serde(default = "default_self_cluster")]
    pub(super) cluster: String,
    /// How long the embedding may take, in ms (default 2000); beyond, the request goes to its provider.
    #[serde(default = "default_semantic_timeout")]
    pub(super) timeout_ms: u64,
    /// Whose near-duplicates a request may be answered with: `client` (default: its own key's), `team` (its team's keys; a key without a team, its own), or `shared` (every key's, as `cache.scope` says). Near-identical prompts can differ in exactly the detail that matters (a name, an account number): `shared` hands one tenant's answer to another.
    #[serde(default = "default_semantic_scope")]
    pub(super) scope: String,
}

fn default_semantic_scope() -> String {
    "client".into()
}

fn default_semantic_threshold() -> f64 {
    0.95
}
fn default_self_cluster() -> String {
    "portcullis_self".into()
}
fn default_semantic_timeout() -> u64 {
    2000
}

/// `cache.shared`: the tier of the prompt cache every gateway replica
/// shares. A lookup there is one gRPC call on a miss in this Envoy's
/// table; fresh answers go there in batches at the tick. A slow or absent
/// service is a miss (counted), never an error.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSharedCache {
    /// The Envoy cluster of `portcullis-limiter` (gRPC; the one `limits.global` names serves both).
    pub(super) cluster: String,
    /// How long a lookup may take before it is a miss, in ms (default 50).
    #[serde(default = "default_global_timeout")]
    pub(super) timeout_ms: u64,
    /// Bytes of fresh answers a worker holds for its next store call at most (default 4 MiB); beyond, they are not shared (counted).
    #[serde(default = "default_shared_queue_bytes")]
    pub(super) queue_bytes: usize,
}

fn default_shared_queue_bytes() -> usize {
    4 << 20
}

impl Default for RawCache {
    fn default() -> Self {
        Self {
            enabled: false,
            max_bytes: default_cache_bytes(),
            max_entry_bytes: default_cache_entry_bytes(),
            ways: default_cache_ways(),
            ttl_s: default_cache_ttl_s(),
            normalize: false,
            scope: default_cache_scope(),
            worker_bytes: None,
            worker_ttl_ms: default_cache_worker_ttl_ms(),
            shared: None,
            semantic: None,
        }
    }
}

fn default_cache_bytes() -> usize {
    16 << 20
}
fn default_cache_entry_bytes() -> usize {
    64 << 10
}
fn default_cache_worker_ttl_ms() -> u64 {
    1000
}
fn default_cache_ways() -> u32 {
    4
}
fn default_cache_ttl_s() -> u64 {
    3600
}
fn default_cache_scope() -> String {
    "shared".into()
}

/// Breaker thresholds; every field optional so a provider can override some.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBreaker {
    /// Failures in a row that open the breaker (default 5).
    pub(super) consecutive_failures: Option<u32>,
    /// The share of failed requests, of at least `min_requests` within `window_ms`, that opens the breaker (none: ratio not used).
    pub(super) failure_ratio: Option<f64>,
    /// Requests within `window_ms` before `failure_ratio` applies (default 20).
    pub(super) min_requests: Option<u32>,
    /// The window `failure_ratio` counts over, in ms (default 10000).
    pub(super) window_ms: Option<u64>,
    /// How long an open breaker skips the provider before probing it, in ms (default 10000).
    pub(super) cooldown_ms: Option<u64>,
    /// Requests let through to a half-open provider; their success closes the breaker (default 1).
    pub(super) half_open_probes: Option<u32>,
}

impl RawBreaker {
    pub(super) fn over(&self, base: &BreakerConfig) -> BreakerConfig {
        BreakerConfig {
            consecutive_failures: self
                .consecutive_failures
                .unwrap_or(base.consecutive_failures),
            failure_ratio: self.failure_ratio.or(base.failure_ratio),
            min_requests: self.min_requests.unwrap_or(base.min_requests),
            window_ms: self.window_ms.unwrap_or(base.window_ms),
            cooldown_ms: self.cooldown_ms.unwrap_or(base.cooldown_ms),
            half_open_probes: self.half_open_probes.unwrap_or(base.half_open_probes),
            probe_timeout_ms: base.probe_timeout_ms,
        }
    }
}

pub(super) fn check_breaker(at: &str, b: &BreakerConfig, problems: &mut Vec<String>) {
    if b.consecutive_failures == 0 {
        problems.push(format!("{at}: `consecutive_failures` must be at least 1"));
    }
    if b.failure_ratio.is_some_and(|r| !(r > 0.0 && r <= 1.0)) {
        problems.push(format!("{at}: `failure_ratio` must be in (0, 1]"));
    }
    if b.min_requests == 0 {
        problems.push(format!("{at}: `min_requests` must be at least 1"));
    }
    if b.window_ms == 0 || b.cooldown_ms == 0 {
        problems.push(format!(
            "{at}: `window_ms` and `cooldown_ms` must be greater than 0"
        ));
    }
    if b.half_open_probes == 0 {
        problems.push(format!("{at}: `half_open_probes` must be at least 1"));
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawProvider {
    /// The provider's name (letters, digits, `_`, `-`): in metrics, headers, records and the routing chain.
    pub(super) name: String,
    /// The Envoy cluster the provider's requests go to (its address, TLS and circuit breakers are Envoy's).
    pub(super) cluster: String,
    /// An OpenAI-compatible service's preset (`groq`, `mistral`, ...):
    /// fills `host`, `base_path`, `api_key_env` and `drop_fields` where
    /// they are left out (`crate::compile::presets`).
    #[serde(default)]
    pub(super) preset: Option<String>,
    /// The `:authority` sent; required unless a preset gives it.
    #[serde(default)]
    pub(super) host: String,
    /// The path before the API's endpoint; default `/v1` (or the preset's).
    #[serde(default)]
    pub(super) base_path: Option<String>,
    /// The environment variable of Envoy's VM holding the provider's key (listed in `host_env_keys`); never the key itself. None: no credential sent.
    #[serde(default)]
    pub(super) api_key_env: Option<String>,
    /// Top-level request fields removed before sending (schema `openai`):
    /// fields an OpenAI-compatible service refuses. Default: the preset's,
    /// else none.
    #[serde(default)]
    pub(super) drop_fields: Option<Vec<String>>,
    /// An answer sent whole: the longest it may take. A stream: the longest
    /// until its answer starts (then only idle timeouts apply).
    #[serde(default = "default_timeout_ms")]
    pub(super) timeout_ms: u64,
    /// The longest a streamed answer that comes by a fallback may take: a
    /// fallback's answer arrives whole (a callout), so it is bounded.
    #[serde(default = "default_stream_timeout_ms")]
    pub(super) stream_timeout_ms: u64,
    /// The models this provider serves.
    #[serde(default)]
    pub(super) models: Vec<RawModel>,
    /// This provider's circuit breaker, over the top-level `breaker`.
    #[serde(default)]
    pub(super) breaker: Option<RawBreaker>,
    /// `openai` (default), `azure_openai`, `anthropic`, `gemini` or
    /// `bedrock`.
    #[serde(default)]
    pub(super) schema: Option<String>,
    /// Azure: the `api-version` query parameter.
    #[serde(default)]
    pub(super) api_version: Option<String>,
    /// Anthropic: the `anthropic-version` header.
    #[serde(default)]
    pub(super) anthropic_version: Option<String>,
    /// Anthropic: `max_tokens` for requests that name none.
    #[serde(default)]
    pub(super) default_max_tokens: Option<u64>,
    /// Anthropic, Gemini and Bedrock: drop the fields it cannot honour
    /// instead of a 400.
    #[serde(default)]
    pub(super) drop_unsupported: bool,
    /// Bedrock: the AWS region (required); the default `host` is
    /// `bedrock-runtime.<region>.amazonaws.com`.
    #[serde(default)]
    pub(super) region: Option<String>,
    /// Vertex: the Google Cloud project (required).
    #[serde(default)]
    pub(super) project: Option<String>,
    /// Vertex: whose models, `google` (Gemini, the default) or `anthropic`
    /// (Claude).
    #[serde(default)]
    pub(super) publisher: Option<String>,
    /// Vertex: the Envoy cluster of the token source (default
    /// `gcp_metadata`, the metadata server).
    #[serde(default)]
    pub(super) token_cluster: Option<String>,
    /// Vertex: the token source's `:authority` (default
    /// `metadata.google.internal`).
    #[serde(default)]
    pub(super) token_host: Option<String>,
    /// Vertex: the token source's path (default the metadata server's
    /// `/computeMetadata/v1/instance/service-accounts/default/token`).
    #[serde(default)]
    pub(super) token_path: Option<String>,
    /// Bedrock: the prefix of the environment variables holding its
    /// credentials (`<prefix>AWS_ACCESS_KEY_ID`, `<prefix>AWS_SECRET_ACCESS_KEY`,
    /// `<prefix>AWS_SESSION_TOKEN`); default none (AWS's own names).
    #[serde(default)]
    pub(super) aws_env_prefix: Option<String>,
    /// Tries of the same provider before falling over (Envoy's retries).
    #[serde(default)]
    pub(super) retries: Option<RawRetries>,
    /// Adaptive concurrency (AIMD).
    #[serde(default)]
    pub(super) concurrency: Option<RawConcurrency>,
    /// The provider's Envoy cluster (named `cluster`), made for it by the
    /// control plane over CDS: leave it out when the Envoy bootstrap or a
    /// cluster file (`envoy/clusters/`) defines `cluster` itself.
    #[serde(default)]
    pub(super) upstream: Option<RawUpstream>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawUpstream {
    /// Where to connect: a DNS name or an IP address (default `host`).
    #[serde(default)]
    pub(super) address: Option<String>,
    /// The port (default 443).
    #[serde(default)]
    pub(super) port: Option<u16>,
    /// TLS (default true): SNI `host`, the system CA bundle
    /// (`/etc/ssl/certs/ca-certificates.crt`), the certificate's name
    /// checked against `host`.
    #[serde(default)]
    pub(super) tls: Option<bool>,
}

impl RawUpstream {
    pub(super) fn compile(
        &self,
        at: &str,
        host: &str,
        problems: &mut Vec<String>,
    ) -> super::Upstream {
        let address = self.address.clone().unwrap_or_else(|| host.to_string());
        if address.is_empty() || address.contains(|c: char| c.is_whitespace() || c == '/') {
            problems.push(format!(
                "{at}.upstream: `address` (or `host`) must be a DNS name or an IP address"
            ));
        }
        let port = self.port.unwrap_or(443);
        if port == 0 {
            problems.push(format!("{at}.upstream.port: 1 to 65535"));
        }
        let tls = self.tls.unwrap_or(true);
        if tls && host.is_empty() {
            problems.push(format!(
                "{at}.upstream: TLS needs `host` (its SNI and name)"
            ));
        }
        super::Upstream { address, port, tls }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConcurrency {
    /// Requests in flight allowed to the provider at first.
    pub(super) initial: u32,
    /// The fewest in flight a 429 or 503 can bring it to (default 1).
    #[serde(default)]
    pub(super) min: Option<u32>,
    /// The most in flight it grows to (default 4 x `initial`).
    #[serde(default)]
    pub(super) max: Option<u32>,
    /// Successes in a row that add one to the limit (default 20).
    #[serde(default)]
    pub(super) increase_after: Option<u32>,
}

impl RawConcurrency {
    pub(super) fn compile(
        &self,
        at: &str,
        problems: &mut Vec<String>,
    ) -> crate::health::aimd::AimdConfig {
        let c = crate::health::aimd::AimdConfig {
            initial: self.initial,
            min: self.min.unwrap_or(1),
            max: self.max.unwrap_or_else(|| self.initial.saturating_mul(4)),
            increase_after: self.increase_after.unwrap_or(20),
        };
        if c.min == 0 || c.initial < c.min || c.initial > c.max || c.increase_after == 0 {
            problems.push(format!(
                "{at}.concurrency: need 1 <= min <= initial <= max and increase_after >= 1"
            ));
        }
        c
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetries {
    /// Tries of the same provider after the first (at most 10), by Envoy's retries.
    pub(super) attempts: u32,
    /// Failure classes retried: rate_limited, overloaded, transient,
    /// connect, timeout (default: all of them).
    #[serde(default)]
    pub(super) on: Option<Vec<String>>,
}

impl RawRetries {
    pub(super) fn compile(&self, at: &str, problems: &mut Vec<String>) -> super::Retries {
        if self.attempts > 10 {
            problems.push(format!("{at}.retries.attempts: at most 10"));
        }
        let all = [
            "rate_limited",
            "overloaded",
            "transient",
            "connect",
            "timeout",
        ];
        let on: Vec<String> = self
            .on
            .clone()
            .unwrap_or_else(|| all.iter().map(|s| s.to_string()).collect());
        for c in on.iter().filter(|c| !all.contains(&c.as_str())) {
            problems.push(format!(
                "{at}.retries.on: `{c}` is not a retryable class (expected {})",
                all.join(", ")
            ));
        }
        let has = |c: &str| on.iter().any(|x| x == c);
        let mut retry_on = Vec::new();
        if has("overloaded") || has("transient") || has("timeout") {
            retry_on.push("5xx");
        }
        if has("connect") {
            retry_on.extend(["connect-failure", "reset", "refused-stream"]);
        }
        if has("rate_limited") {
            retry_on.push("retriable-status-codes");
        }
        super::Retries {
            attempts: self.attempts,
            retry_on: retry_on.join(","),
            status_codes: if has("rate_limited") {
                "429".into()
            } else {
                String::new()
            },
        }
    }
}

impl RawProvider {
    /// Fill what the provider's preset gives and the config left out.
    pub(super) fn apply_preset(&mut self, at: &str, problems: &mut Vec<String>) {
        let Some(name) = self.preset.as_deref() else {
            return;
        };
        let Some(p) = crate::compile::presets::find(name) else {
            problems.push(format!(
                "{at}: preset `{name}` is not one of {}",
                crate::compile::presets::names()
            ));
            return;
        };
        if self.schema.as_deref().is_some_and(|s| s != "openai") {
            problems.push(format!(
                "{at}: a preset is an OpenAI-compatible service: `schema` must be `openai` or left out"
            ));
        }
        if self.host.is_empty() {
            self.host = p.host.into();
        }
        if self.base_path.is_none() {
            self.base_path = Some(p.base_path.into());
        }
        if self.api_key_env.is_none() {
            self.api_key_env = p.api_key_env.map(Into::into);
        }
        if self.drop_fields.is_none() {
            self.drop_fields = Some(p.drop_fields.iter().map(|f| (*f).into()).collect());
        }
    }

    /// Fill Bedrock's defaults: the regional runtime host, paths from the
    /// root.
    pub(super) fn apply_bedrock(&mut self, at: &str, problems: &mut Vec<String>) {
        if self.schema.as_deref() == Some("vertex") {
            self.apply_vertex(at, problems);
            return;
        }
        if self.schema.as_deref() != Some("vertex") {
            for (k, on) in [
                ("project", self.project.is_some()),
                ("publisher", self.publisher.is_some()),
                ("token_cluster", self.token_cluster.is_some()),
                ("token_host", self.token_host.is_some()),
                ("token_path", self.token_path.is_some()),
            ] {
                if on {
                    problems.push(format!("{at}: `{k}` applies to schema `vertex` only"));
                }
            }
        }
        if self.schema.as_deref() != Some("bedrock") {
            for (k, on) in [
                ("region", self.region.is_some()),
                ("aws_env_prefix", self.aws_env_prefix.is_some()),
            ] {
                if on {
                    problems.push(format!("{at}: `{k}` applies to schema `bedrock` only"));
                }
            }
            return;
        }
        let region = self.region.as_deref().unwrap_or("");
        if region.is_empty()
            || !region
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            problems.push(format!(
                "{at}: schema `bedrock` needs `region` (an AWS region such as us-east-1; got `{region}`)"
            ));
        }
        if self.api_key_env.is_some() {
            problems.push(format!(
                "{at}: schema `bedrock` signs with AWS credentials, not a key: use `aws_env_prefix` (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in Envoy's environment) instead of `api_key_env`"
            ));
        }
        if let Some(prefix) = self
            .aws_env_prefix
            .as_deref()
            .filter(|p| !super::valid_env_name(&format!("{p}AWS_ACCESS_KEY_ID")))
        {
            problems.push(format!(
                "{at}: `aws_env_prefix` `{prefix}` does not make environment variable names"
            ));
        }
        if self.host.is_empty() && !region.is_empty() {
            self.host = format!("bedrock-runtime.{region}.amazonaws.com");
        }
        if self.base_path.is_none() {
            self.base_path = Some(String::new());
        }
    }

    /// Vertex's checks and defaults: the project and region it needs, the
    /// regional host, paths from the root, no key variable (the token comes
    /// from the token source).
    fn apply_vertex(&mut self, at: &str, problems: &mut Vec<String>) {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        };
        let region = self.region.clone().unwrap_or_default();
        if !name_ok(&region) {
            problems.push(format!(
                "{at}: schema `vertex` needs `region` (a Google Cloud location such as us-east5 or global; got `{region}`)"
            ));
        }
        let project = self.project.clone().unwrap_or_default();
        if !name_ok(&project) {
            problems.push(format!(
                "{at}: schema `vertex` needs `project` (a Google Cloud project id; got `{project}`)"
            ));
        }
        if !matches!(
            self.publisher.as_deref(),
            None | Some("google" | "anthropic")
        ) {
            problems.push(format!(
                "{at}: `publisher` must be google or anthropic (got `{}`)",
                self.publisher.as_deref().unwrap_or_default()
            ));
        }
        if self.api_key_env.is_some() || self.aws_env_prefix.is_some() {
            problems.push(format!(
                "{at}: schema `vertex` takes an access token from its token source (`token_cluster`), not `api_key_env` or `aws_env_prefix`"
            ));
        }
        if self
            .token_path
            .as_deref()
            .is_some_and(|p| !p.starts_with('/'))
        {
            problems.push(format!("{at}: `token_path` must start with `/`"));
        }
        if self.host.is_empty() && !region.is_empty() {
            self.host = if region == "global" {
                "aiplatform.googleapis.com".into()
            } else {
                format!("{region}-aiplatform.googleapis.com")
            };
        }
        if self.base_path.is_none() {
            self.base_path = Some(String::new());
        }
    }

    pub(super) fn schema(&self, at: &str, problems: &mut Vec<String>) -> super::Schema {
        use super::Schema;
        let schema = self.schema.as_deref().unwrap_or("openai");
        let misplaced = |key: &str, on: &str, problems: &mut Vec<String>| {
            problems.push(format!("{at}: `{key}` applies to schema `{on}` only"));
        };
        if schema != "azure_openai" && self.api_version.is_some() {
            misplaced("api_version", "azure_openai", problems);
        }
        if schema != "anthropic" {
            for (k, on) in [
                ("anthropic_version", self.anthropic_version.is_some()),
                (
                    "default_max_tokens",
                    self.default_max_tokens.is_some() && schema != "vertex",
                ),
            ] {
                if on {
                    misplaced(k, "anthropic", problems);
                }
            }
        }
        if schema != "openai" && self.drop_fields.as_ref().is_some_and(|f| !f.is_empty()) {
            misplaced("drop_fields", "openai", problems);
        }
        if !matches!(schema, "anthropic" | "gemini" | "bedrock" | "vertex") && self.drop_unsupported
        {
            problems.push(format!(
                "{at}: `drop_unsupported` applies to schemas `anthropic`, `gemini`, `bedrock` and `vertex` only"
            ));
        }
        match schema {
            "openai" => Schema::OpenAi,
            "azure_openai" => Schema::AzureOpenAi {
                api_version: self
                    .api_version
                    .clone()
                    .unwrap_or_else(|| DEFAULT_AZURE_API_VERSION.into()),
            },
            "anthropic" => {
                if self.default_max_tokens == Some(0) {
                    problems.push(format!("{at}: `default_max_tokens` must be at least 1"));
                }
                Schema::Anthropic {
                    version: self
                        .anthropic_version
                        .clone()
                        .unwrap_or_else(|| DEFAULT_ANTHROPIC_VERSION.into()),
                    options: crate::wire::anthropic::Options {
                        default_max_tokens: self.default_max_tokens.unwrap_or(4096),
                        drop_unsupported: self.drop_unsupported,
                    },
                }
            }
            "gemini" => Schema::Gemini {
                drop_unsupported: self.drop_unsupported,
            },
            "vertex" => Schema::Vertex {
                project: self.project.clone().unwrap_or_default(),
                region: self.region.clone().unwrap_or_default(),
                publisher: match self.publisher.as_deref() {
                    Some("anthropic") => super::Publisher::Anthropic,
                    _ => super::Publisher::Google,
                },
                token: super::TokenSource {
                    cluster: self
                        .token_cluster
                        .clone()
                        .unwrap_or_else(|| "gcp_metadata".into()),
                    host: self
                        .token_host
                        .clone()
                        .unwrap_or_else(|| crate::providers::vertex::METADATA_HOST.into()),
                    path: self
                        .token_path
                        .clone()
                        .unwrap_or_else(|| crate::providers::vertex::METADATA_PATH.into()),
                    timeout_ms: 5_000,
                },
                options: crate::wire::anthropic::Options {
                    default_max_tokens: self.default_max_tokens.unwrap_or(4096),
                    drop_unsupported: self.drop_unsupported,
                },
            },
            "bedrock" => Schema::Bedrock {
                region: self.region.clone().unwrap_or_default(),
                env_prefix: self.aws_env_prefix.clone().unwrap_or_default(),
                drop_unsupported: self.drop_unsupported,
            },
            other => {
                problems.push(format!(
                    "{at}: schema `{other}` is not one of openai, azure_openai, anthropic, gemini, bedrock, vertex"
                ));
                Schema::OpenAi
            }
        }
    }
}

pub(super) const DEFAULT_AZURE_API_VERSION: &str = "2024-10-21";
pub(super) const DEFAULT_ANTHROPIC_VERSION: &str = "2023-06-01";

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawModel {
    /// The model's name as clients ask for it.
    pub(super) name: String,
    /// The provider's own model id (default: the name).
    #[serde(default)]
    pub(super) id: Option<String>,
    /// The model's share when `auto` picks among the first provider's models (0: never picked by `auto`).
    #[serde(default = "default_weight")]
    pub(super) weight: u32,
    /// Other names clients may ask for this model by.
    #[serde(default)]
    pub(super) aliases: Vec<String>,
    /// This provider's price for the model (else the `prices` table's).
    #[serde(default)]
    pub(super) price: Option<RawPrice>,
    /// Tokens of context this provider serves the model with (a
    /// `context_length` failure moves only to a larger one).
    #[serde(default)]
    pub(super) context_window: Option<u64>,
    /// The inbound APIs this provider serves the model on (`chat_completions`,
    /// `messages`, `responses`, `embeddings`, `count_tokens`,
    /// `images_generations`, `images_edits`, `audio_speech`,
    /// `audio_transcriptions`, `audio_translations`, `moderations`,
    /// `rerank`); default: every
    /// API its format serves. A listed API the format cannot serve is a
    /// config error.
    #[serde(default)]
    pub(super) apis: Option<Vec<String>>,
    /// The largest request body for this model, in bytes (the smallest a
    /// provider of the model sets; it can lower the key's or the gateway's
    /// limit, never raise it).
    #[serde(default)]
    pub(super) max_body_bytes: Option<usize>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRouting {
    /// The providers' order for fallback (default: the order of `providers`).
    #[serde(default)]
    pub(super) chain: Option<Vec<String>>,
    /// Providers tried per request at most (default 3).
    #[serde(default)]
    pub(super) max_attempts: Option<u32>,
    /// The strategy of every model without its own: weighted (default),
    /// cheapest, fastest, least_busy.
    #[serde(default)]
    pub(super) strategy: Option<String>,
    /// Strategies per model, alias or `auto`.
    #[serde(default)]
    pub(super) strategies: std::collections::BTreeMap<String, String>,
    /// `cheapest`: the share of a request's tokens expected as output.
    #[serde(default)]
    pub(super) output_share: Option<f64>,
    /// The `fastest` strategy's settings.
    #[serde(default)]
    pub(super) fastest: Option<RawFastest>,
    /// Conditional routes, first match wins.
    #[serde(default)]
    pub(super) routes: Vec<RawRule>,
    /// Error classes that move a request to the next candidate.
    #[serde(default)]
    pub(super) fallback_on: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawFastest {
    /// Latency assumed before a provider is measured, by provider name.
    #[serde(default)]
    pub(super) initial_ms: std::collections::BTreeMap<String, u64>,
    /// The share of requests that try another candidate first, so every provider stays measured (default 0.05).
    #[serde(default)]
    pub(super) explore: Option<f64>,
    /// The weight of a new latency in each provider's moving average (default 0.3).
    #[serde(default)]
    pub(super) alpha: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    /// What a request must match (every given field): `clients`, `headers`, `metadata`, `users`, `models`.
    #[serde(rename = "match", default)]
    pub(super) when: RawMatch,
    /// A model or alias.
    #[serde(default)]
    pub(super) to: Option<String>,
    /// The strategy for matching requests (weighted, cheapest, fastest, least_busy).
    #[serde(default)]
    pub(super) strategy: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMatch {
    /// Client names (any of them).
    #[serde(default)]
    pub(super) clients: Option<Vec<String>>,
    /// Request headers and their exact values (all of them).
    #[serde(default)]
    pub(super) headers: std::collections::BTreeMap<String, String>,
    /// Values of the request's `metadata` object (all of them).
    #[serde(default)]
    pub(super) metadata: std::collections::BTreeMap<String, String>,
    /// End users (the `user` field or `limits.user_header`), any of them.
    #[serde(default)]
    pub(super) users: Option<Vec<String>>,
    /// Models or aliases asked for (`auto` included), any of them.
    #[serde(default)]
    pub(super) models: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    /// The client's name: in metrics, records, limits and routing rules.
    pub(super) name: String,
    /// The SHA-256 of the client's key, hex (`printf %s "$KEY" | sha256sum`); the key itself is never stored.
    pub(super) key_sha256: String,
    /// The models and aliases the key may ask for (none: every model).
    #[serde(default)]
    pub(super) models: Option<Vec<String>>,
    /// The key's own limits, over `limits`' defaults.
    #[serde(default)]
    pub(super) limits: Option<RawClientLimits>,
    /// May pin a provider for one request (`x-portcullis-pin-provider`).
    #[serde(default)]
    pub(super) allow_overrides: bool,
    /// The team whose limits the key shares (`teams[].name`).
    #[serde(default)]
    pub(super) team: Option<String>,
    /// Keys replaced by `key_sha256` that still work until a time: a rotation's grace period.
    #[serde(default)]
    pub(super) previous_keys: Vec<RawPreviousKey>,
    /// The MCP servers and tools the key may use and its tool-call limits (none: every tool, no tool-call limits).
    #[serde(default)]
    pub(super) mcp: Option<RawMcpAccess>,
}

/// A rotated-out key and the end of its grace period.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPreviousKey {
    /// The SHA-256 of the old key, hex.
    pub(super) sha256: String,
    /// Unix time (seconds) from which the old key is refused.
    pub(super) until: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    /// Limits counted across a fleet of Envoys by the rate limit service (`limiter/`).
    #[serde(default)]
    pub(super) global: Option<RawGlobal>,
    /// Where budget periods start: `UTC` (default) or `+HH:MM`/`-HH:MM`.
    #[serde(default)]
    pub(super) budget_utc_offset: Option<String>,
    /// The request header naming the end user (before the body's `user`).
    #[serde(default)]
    pub(super) user_header: Option<String>,
    /// End users tracked per key at most (the rest share one overflow
    /// level); default 10000.
    #[serde(default)]
    pub(super) max_users_per_key: Option<u32>,
    #[serde(flatten)]
    pub(super) defaults: RawClientLimits,
}

pub(super) const DEFAULT_MAX_TOKENS: u64 = 1024;

impl RawClientLimits {
    /// Fields only a key has (not a team, not a user).
    pub(super) fn key_only(&self) -> bool {
        self.max_body_bytes.is_some() || self.default_max_tokens.is_some()
    }

    /// This level's own budgets (`None`: it sets none, so the defaults'
    /// apply). Unknown periods are left out (`check_limits` reports them).
    fn budgets(&self) -> Option<Vec<Budget>> {
        if self.budget_usd_per_day.is_none() && self.budgets.is_none() {
            return None;
        }
        let day = self.budget_usd_per_day.map(|usd| RawBudget {
            usd,
            period: "day".into(),
        });
        let mut out: Vec<Budget> = day
            .iter()
            .chain(self.budgets.iter().flatten())
            .filter_map(|b| {
                Some(Budget {
                    micros: (b.usd * 1e6).round() as Micros,
                    period: Period::parse(&b.period)?,
                })
            })
            .collect();
        out.sort_by_key(|b| b.period);
        Some(out)
    }

    pub(super) fn over(&self, base: &Limits) -> Limits {
        Limits {
            requests_per_minute: self.requests_per_minute.or(base.requests_per_minute),
            tokens_per_minute: self.tokens_per_minute.or(base.tokens_per_minute),
            max_concurrent: self.max_concurrent.or(base.max_concurrent),
            max_body_bytes: self.max_body_bytes.unwrap_or(base.max_body_bytes),
            budgets: self.budgets().unwrap_or_else(|| base.budgets.clone()),
            default_max_tokens: self.default_max_tokens.unwrap_or(base.default_max_tokens),
            per_user: self
                .per_user
                .as_ref()
                .map(|u| Box::new(u.over(&Limits::default())))
                .or_else(|| base.per_user.clone()),
            on_budget_low: self
                .on_budget_low
                .as_ref()
                .map(|b| BudgetLow {
                    below_micros: (b.below_usd * 1e6).round() as Micros,
                    model: b.use_model.clone(),
                })
                .or_else(|| base.on_budget_low.clone()),
            max_tokens_mode: self
                .max_tokens_mode
                .as_deref()
                .and_then(MaxTokensMode::parse)
                .unwrap_or(base.max_tokens_mode),
            scope: self
                .scope
                .as_ref()
                .map_or(base.scope, |s| s.over(base.scope)),
        }
    }
}

impl RawScope {
    fn over(&self, base: Scopes) -> Scopes {
        match self {
            RawScope::All(s) => {
                let s = Scope::parse(s).unwrap_or_default();
                Scopes {
                    requests_per_minute: s,
                    tokens_per_minute: s,
                    budgets: s,
                }
            }
            RawScope::Each(m) => {
                let get = |k: &str, b: Scope| m.get(k).and_then(|s| Scope::parse(s)).unwrap_or(b);
                Scopes {
                    requests_per_minute: get("requests_per_minute", base.requests_per_minute),
                    tokens_per_minute: get("tokens_per_minute", base.tokens_per_minute),
                    budgets: get("budgets", get("budget_usd_per_day", base.budgets)),
                }
            }
        }
    }

    fn check(&self, at: &str, problems: &mut Vec<String>) {
        let bad = |v: &str| Scope::parse(v).is_none();
        match self {
            RawScope::All(v) if bad(v) => problems.push(format!(
                "{at}.scope: `{v}` is not a scope (expected local, global or both)"
            )),
            RawScope::All(_) => {}
            RawScope::Each(m) => {
                for (k, v) in m {
                    if !SCOPED.contains(&k.as_str()) {
                        problems.push(format!(
                            "{at}.scope: `{k}` cannot be scoped (expected one of: {})",
                            SCOPED.join(", ")
                        ));
                    } else if bad(v) {
                        problems.push(format!(
                            "{at}.scope.{k}: `{v}` is not a scope (expected local, global or both)"
                        ));
                    }
                }
            }
        }
    }
}

/// The limits a rate limit service can count (`max_concurrent` needs a
/// release the protocol does not have: it stays local).
const SCOPED: [&str; 4] = [
    "requests_per_minute",
    "tokens_per_minute",
    "budgets",
    "budget_usd_per_day",
];

pub(super) fn check_limits(at: &str, l: &RawClientLimits, problems: &mut Vec<String>) {
    if l.requests_per_minute == Some(0)
        || l.tokens_per_minute == Some(0)
        || l.max_concurrent == Some(0)
        || l.max_body_bytes == Some(0)
    {
        problems.push(format!(
            "{at}: a limit of 0 would refuse everything; leave it out for no limit"
        ));
    }
    if l.budget_usd_per_day
        .is_some_and(|b| !(b >= 0.0 && b.is_finite()))
    {
        problems.push(format!(
            "{at}: `budget_usd_per_day` must be a non-negative number"
        ));
    }
    let mut periods = Vec::new();
    if l.budget_usd_per_day.is_some() {
        periods.push(Period::Day);
    }
    for (i, b) in l.budgets.iter().flatten().enumerate() {
        if !(b.usd >= 0.0 && b.usd.is_finite()) {
            problems.push(format!(
                "{at}.budgets[{i}]: `usd` must be a non-negative number"
            ));
        }
        match Period::parse(&b.period) {
            None => problems.push(format!(
                "{at}.budgets[{i}]: `{}` is not a period (expected day, week, month or total)",
                b.period
            )),
            Some(p) if periods.contains(&p) => problems.push(format!(
                "{at}.budgets[{i}]: a second budget per {} (`budget_usd_per_day` is one per day); keep one",
                p.name()
            )),
            Some(p) => periods.push(p),
        }
    }
    if let Some(m) = l
        .max_tokens_mode
        .as_deref()
        .filter(|m| MaxTokensMode::parse(m).is_none())
    {
        problems.push(format!(
            "{at}.max_tokens_mode: `{m}` is not a mode (expected estimate, clamp or refuse)"
        ));
    }
    if let Some(u) = &l.per_user {
        let at = format!("{at}.per_user");
        check_limits(&at, u, problems);
        if u.per_user.is_some()
            || u.key_only()
            || u.on_budget_low.is_some()
            || u.max_tokens_mode.is_some()
        {
            problems.push(format!(
                "{at}: a user's limits are requests_per_minute, tokens_per_minute, max_concurrent, budgets and scope"
            ));
        }
    }
    if let Some(b) = &l.on_budget_low {
        if !(b.below_usd > 0.0 && b.below_usd.is_finite()) {
            problems.push(format!(
                "{at}.on_budget_low.below_usd must be a positive number"
            ));
        }
    }
    if l.default_max_tokens == Some(0) {
        problems.push(format!("{at}: `default_max_tokens` must be at least 1"));
    }
    if let Some(s) = &l.scope {
        s.check(at, problems);
    }
}

fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}
fn default_stream_timeout_ms() -> u64 {
    DEFAULT_STREAM_TIMEOUT_MS
}
fn default_weight() -> u32 {
    1
}

/// `mcp`: the MCP servers behind the gateway.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcp {
    /// The endpoint's path: each server is at `{path}/{server}` (default `/mcp`).
    #[serde(default = "default_mcp_path")]
    pub(super) path: String,
    /// The MCP servers (streamable HTTP), each an Envoy cluster.
    #[serde(default)]
    pub(super) servers: Vec<RawMcpServer>,
    /// MCP clients that log in with OAuth 2.1: Envoy's `jwt_authn` verifies their tokens (envoy/snippets/mcp-oauth.yaml), the gateway maps the claims to a client and a team and serves the Protected Resource Metadata.
    #[serde(default)]
    pub(super) oauth: Option<RawMcpOauth>,
}

/// `mcp.oauth`: callers with a verified JWT instead of a key.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpOauth {
    /// The client (`clients[].name`) whose limits, budgets and MCP access logged-in callers get.
    pub(super) client: String,
    /// The claim naming the caller's team (`teams[].name`; a list or a space-separated string: the first that is a team), over the client's own team (default `groups`).
    #[serde(default = "default_team_claim")]
    pub(super) team_claim: String,
    /// The claim naming the end user, in records (default `sub`).
    #[serde(default = "default_user_claim")]
    pub(super) user_claim: String,
    /// The header Envoy's `jwt_authn` writes the verified payload to (`forward_payload_header`; default `x-portcullis-jwt-payload`).
    #[serde(default = "default_payload_header")]
    pub(super) payload_header: String,
    /// The MCP endpoint's canonical URI, as clients reach it (e.g. `https://gateway.example.com/mcp`): the metadata's `resource`, and the audience tokens should carry.
    pub(super) resource: String,
    /// Where clients log in: the authorization servers' issuer URLs.
    pub(super) authorization_servers: Vec<String>,
    /// Scopes advertised in the metadata (`scopes_supported`; default none).
    #[serde(default)]
    pub(super) scopes: Vec<String>,
}

fn default_team_claim() -> String {
    "groups".into()
}

fn default_user_claim() -> String {
    "sub".into()
}

fn default_payload_header() -> String {
    "x-portcullis-jwt-payload".into()
}

fn default_mcp_path() -> String {
    "/mcp".into()
}

/// One MCP server.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpServer {
    /// The server's name: its path (`/mcp/{name}`) and the prefix of its tools in policies (`{name}__{tool}`); letters, digits, `-` and `_`, no `__`.
    pub(super) name: String,
    /// The Envoy cluster the server is reached through.
    pub(super) cluster: String,
    /// The server's MCP endpoint path on that cluster (default `/mcp`).
    #[serde(default = "default_mcp_path")]
    pub(super) path: String,
    /// The credential the gateway sends the server in place of the caller's key (none: no credential; the caller's key never goes upstream).
    #[serde(default)]
    pub(super) credential: Option<RawMcpCredential>,
    /// USD counted in the caller's budgets (its key's and team's) for each `tools/call` (default 0).
    #[serde(default)]
    pub(super) price_per_call_usd: f64,
    /// A call's bound in ms, the answer's end included (default 300000: long tools stream progress).
    #[serde(default)]
    pub(super) timeout_ms: Option<u64>,
}

/// A server's credential: a header whose value comes from the VM's environment.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpCredential {
    /// The header's name (e.g. `authorization`, `x-api-key`).
    pub(super) header: String,
    /// The environment variable holding the value, read when the config is applied (add it to `vm_config.environment_variables.host_env_keys`).
    pub(super) env: String,
    /// Written before the value (e.g. `"Bearer "`; default none).
    #[serde(default)]
    pub(super) prefix: String,
}

/// A key's or a team's MCP access.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMcpAccess {
    /// The servers it may reach, by name (none: every server).
    #[serde(default)]
    pub(super) servers: Option<Vec<String>>,
    /// The tools it may call and see in `tools/list`: patterns over `{server}__{tool}`, `*` for any run of characters (`alpha__*`, `*__search`); none: every tool of the servers it may reach.
    #[serde(default)]
    pub(super) tools: Option<Vec<String>>,
    /// `tools/call` requests per minute at most.
    #[serde(default)]
    pub(super) calls_per_minute: Option<u64>,
    /// `tools/call` requests in flight at once at most.
    #[serde(default)]
    pub(super) max_concurrent_calls: Option<u64>,
}
