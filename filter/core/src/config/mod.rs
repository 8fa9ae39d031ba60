//! The compiled plugin config: the structures the request path reads
//! ([`Gateway`] and what it holds). Parsing and compiling them from the
//! YAML is [`crate::compile`], which sits above the provider formats and
//! the price table; this module imports neither.
//!
//! May use: `api`, `cache`, `guard`, `health`, `limits`, `mcp`, `shared`, `wire`.

use crate::cache::CacheConfig;
use crate::health::breaker::BreakerConfig;
use crate::limits::ratelimit::{Micros, Price};
use hashbrown::HashMap;

/// The name a client sends to let the gateway pick a model.
pub const AUTO_MODEL: &str = "auto";

/// Where and how request records go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    /// Envoy cluster (HTTP/2) of the collector.
    pub cluster: String,
    pub batch_size: usize,
    pub flush_interval_ms: u64,
    pub buffer_records: usize,
    pub buffer_bytes: usize,
    pub timeout_ms: u64,
    /// Keep prompt and completion text in records.
    pub include_content: bool,
}

/// A provider as the request path uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub name: String,
    pub cluster: String,
    pub host: String,
    pub base_path: String,
    pub api_key_env: Option<String>,
    /// Top-level request fields removed before sending (`drop_fields`, or
    /// the preset's): fields an OpenAI-compatible service refuses.
    pub drop_fields: Vec<String>,
    /// An answer sent whole: the longest it may take; a stream through
    /// Envoy's router: the longest until its answer starts.
    pub timeout_ms: u64,
    /// A streamed answer by fallback callout (which arrives whole): the
    /// longest it may take.
    pub stream_timeout_ms: u64,
    pub breaker: BreakerConfig,
    /// The provider's API.
    pub schema: Schema,
    /// Envoy's retries of the first attempt, when configured.
    pub retries: Option<Retries>,
    /// Adaptive concurrency, when configured.
    pub concurrency: Option<crate::health::aimd::AimdConfig>,
    /// The Envoy cluster the control plane makes for it (CDS), when asked.
    pub upstream: Option<Upstream>,
}

/// A provider's Envoy cluster, as the control plane serves it over CDS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    /// A DNS name or an IP address.
    pub address: String,
    pub port: u16,
    /// TLS with SNI and the name checked: the provider's `host`.
    pub tls: bool,
}

/// A provider's retries before falling over, done by Envoy's router.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retries {
    pub attempts: u32,
    /// `x-envoy-retry-on`.
    pub retry_on: String,
    /// `x-envoy-retriable-status-codes` (429 for rate_limited).
    pub status_codes: String,
}

/// A provider's API (`schema` in the config).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Schema {
    /// OpenAI's chat completions, and every server compatible with it.
    #[default]
    OpenAi,
    /// Azure OpenAI: deployments by model id, `api-version`, `api-key`.
    AzureOpenAi { api_version: String },
    /// Anthropic's Messages API.
    Anthropic {
        version: String,
        options: crate::wire::anthropic::Options,
    },
    /// Google's Gemini API (`generateContent`, `x-goog-api-key`).
    Gemini {
        /// Drop fields Gemini cannot honour instead of refusing the
        /// request.
        drop_unsupported: bool,
    },
    /// Google Cloud's Vertex AI: a publisher's models, an OAuth access
    /// token from a token source.
    Vertex {
        project: String,
        /// The location (`us-east5`, `europe-west1`, `global`).
        region: String,
        publisher: Publisher,
        token: TokenSource,
        /// Claude on Vertex: as Anthropic's options; Gemini on Vertex:
        /// `drop_unsupported` only.
        options: crate::wire::anthropic::Options,
    },
    /// AWS Bedrock's Converse API, each request signed with SigV4.
    Bedrock {
        /// The AWS region signed for.
        region: String,
        /// The prefix of the credentials' environment variables.
        env_prefix: String,
        /// Drop fields Converse cannot honour instead of refusing the
        /// request.
        drop_unsupported: bool,
    },
}

/// Whose models a Vertex provider serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Publisher {
    /// Gemini (`publishers/google`).
    #[default]
    Google,
    /// Claude (`publishers/anthropic`).
    Anthropic,
}

/// Where a Vertex provider's OAuth access token comes from: a GET to this
/// Envoy cluster (the GCE/GKE metadata server's shape: `Metadata-Flavor:
/// Google`, `{"access_token", "expires_in"}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenSource {
    pub cluster: String,
    pub host: String,
    pub path: String,
    pub timeout_ms: u64,
}

impl Schema {
    /// Its name in the config (`schema:`).
    pub fn name(&self) -> &'static str {
        match self {
            Schema::OpenAi => "openai",
            Schema::AzureOpenAi { .. } => "azure_openai",
            Schema::Anthropic { .. } => "anthropic",
            Schema::Gemini { .. } => "gemini",
            Schema::Bedrock { .. } => "bedrock",
            Schema::Vertex { .. } => "vertex",
        }
    }
}

/// One provider serving a model, under that provider's own model id.
#[derive(Debug, Clone, PartialEq)]
pub struct Serving {
    pub provider: usize,
    pub provider_model_id: String,
    /// This provider's price for the model, when it has its own.
    pub price: Option<Price>,
    pub context_window: Option<u64>,
    /// The inbound APIs this provider serves the model on (`apis`); `None`:
    /// every API its format serves.
    pub apis: Option<Vec<crate::api::Api>>,
}

/// A model by its public (canonical) name, with the providers serving it in
/// chain order.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    pub name: String,
    pub aliases: Vec<String>,
    pub serving: Vec<Serving>,
    /// The model's own body limit (`providers[].models[].max_body_bytes`,
    /// the smallest of its providers'), checked once the model is known.
    pub max_body_bytes: Option<usize>,
}

/// Limits of one client key (`None`: no limit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub max_concurrent: Option<u32>,
    /// The largest request body, in bytes (the client's, else the
    /// gateway's).
    pub max_body_bytes: usize,
    /// USD budgets, at most one per period, in period order.
    pub budgets: Vec<Budget>,
    /// Completion tokens reserved when a request names no max (and the
    /// cap a `clamp` sets then).
    pub default_max_tokens: u64,
    /// What a request without a cap, or with one past the room left, gets.
    pub max_tokens_mode: MaxTokensMode,
    /// A cheaper model when a budget runs low (`on_budget_low`).
    pub on_budget_low: Option<BudgetLow>,
    /// Each end user's limits inside a key (`per_user`).
    pub per_user: Option<Box<Limits>>,
    pub scope: Scopes,
}

/// `max_tokens_mode`: how a level treats a request's completion cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MaxTokensMode {
    /// Reserve the request's cap, or `default_max_tokens` without one, and
    /// send the request as it is (a provider may answer past the
    /// reservation; the difference is settled after).
    #[default]
    Estimate,
    /// Set the request's cap to what the level's token limit and budgets
    /// have room for (`default_max_tokens` at most when it named none).
    Clamp,
    /// A request must name its cap.
    Refuse,
}

impl MaxTokensMode {
    pub fn parse(s: &str) -> Option<MaxTokensMode> {
        match s {
            "estimate" => Some(MaxTokensMode::Estimate),
            "clamp" => Some(MaxTokensMode::Clamp),
            "refuse" => Some(MaxTokensMode::Refuse),
            _ => None,
        }
    }
}

/// `on_budget_low`: below `below_micros` left of the level's tightest
/// budget, requests go to `model` (a public model name) instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BudgetLow {
    pub below_micros: Micros,
    pub model: String,
}

/// A budget: micro-USD per period.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub micros: Micros,
    pub period: crate::limits::period::Period,
}

/// Where a limit is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    /// In this Envoy's shared data (exact across its workers).
    #[default]
    Local,
    /// By the rate limit service of `limits.global` (across the fleet).
    Global,
    /// Both: the local count first (cheap), then the global one.
    Both,
}

impl Scope {
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "local" => Some(Scope::Local),
            "global" => Some(Scope::Global),
            "both" => Some(Scope::Both),
            _ => None,
        }
    }
    pub fn local(self) -> bool {
        self != Scope::Global
    }
    pub fn global(self) -> bool {
        self != Scope::Local
    }
}

/// The scope of each limit that can be global.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Scopes {
    pub requests_per_minute: Scope,
    pub tokens_per_minute: Scope,
    /// Every budget of the level (`scope.budgets`, or the older
    /// `scope.budget_usd_per_day`).
    pub budgets: Scope,
}

/// `limits.global`: the rate limit service (Envoy's protocol) that counts
/// the limits scoped `global` for every Envoy of the fleet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GlobalLimits {
    /// Envoy cluster (HTTP/2) of the service.
    pub cluster: String,
    pub timeout_ms: u64,
    /// What a request whose call failed gets.
    pub failure: GlobalFailure,
    /// Gateway replicas sharing the limits (`limits.global.replicas`).
    pub replicas: u32,
}

/// `limits.global.failure_mode`: when the service does not answer (in
/// time, or at all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GlobalFailure {
    /// Admit (the limit is off while the service is away).
    Allow,
    /// Refuse with 503 (nobody passes while the service is away).
    Deny,
    /// Count the request locally against this replica's share of each
    /// limit (the limit divided by `replicas`, at least 1): the fleet
    /// admits about the limit, and nobody is refused who is within it.
    LocalShare,
}

impl GlobalFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            GlobalFailure::Allow => "allow",
            GlobalFailure::Deny => "deny",
            GlobalFailure::LocalShare => "local_share",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub name: String,
    /// Canonical model indexes this client may use; `None` means all.
    pub allowed: Option<Vec<usize>>,
    pub limits: Limits,
    /// May pin a provider for one request.
    pub allow_overrides: bool,
    /// The team whose limits the key shares (an index of `Gateway::teams`).
    pub team: Option<usize>,
    /// Its level's shared-data key ([`crate::shared::keys::counters`]), built once
    /// with the config rather than on each request's three steps.
    pub counters_key: String,
}

/// A rotated-out key that still works until `until_ms` (Unix ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreviousKey {
    /// The client's current key (`Gateway::clients`).
    pub current: [u8; 32],
    pub until_ms: u64,
}

/// A team: limits and budgets its keys share.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Team {
    pub name: String,
    pub limits: Limits,
    /// Its level's shared-data key, as a client's.
    pub counters_key: String,
}

/// One level of limits a request must pass: its key's, then its team's.
#[derive(Debug, Clone, Copy)]
pub struct Level<'a> {
    pub owner: crate::shared::keys::Owner<'a>,
    pub limits: &'a Limits,
    /// The key of its counters when the config holds it (a key's, a
    /// team's); an end user's is built when asked.
    counters_key: Option<&'a str>,
}

impl<'a> Level<'a> {
    /// A level whose counters' key is built when asked.
    pub fn new(owner: crate::shared::keys::Owner<'a>, limits: &'a Limits) -> Level<'a> {
        Level {
            owner,
            limits,
            counters_key: None,
        }
    }

    /// A client key's own level.
    pub fn of_client(c: &'a Client) -> Level<'a> {
        Level {
            owner: crate::shared::keys::Owner::Key(&c.name),
            limits: &c.limits,
            counters_key: Some(&c.counters_key),
        }
    }

    /// A team's level.
    pub fn of_team(t: &'a Team) -> Level<'a> {
        Level {
            owner: crate::shared::keys::Owner::Team(&t.name),
            limits: &t.limits,
            counters_key: Some(&t.counters_key),
        }
    }

    /// The shared-data key of its counters ([`crate::shared::keys::counters`]).
    pub fn counters_key(&self) -> std::borrow::Cow<'a, str> {
        match self.counters_key {
            Some(k) => std::borrow::Cow::Borrowed(k),
            None => std::borrow::Cow::Owned(crate::shared::keys::counters(self.owner)),
        }
    }
}

impl Gateway {
    /// The levels of a client's requests: the key's limits, then its team's.
    pub fn levels<'a>(&'a self, c: &'a Client) -> impl Iterator<Item = Level<'a>> + Clone {
        let key = Level::of_client(c);
        let team = c.team.and_then(|t| self.teams.get(t)).map(Level::of_team);
        std::iter::once(key).chain(team)
    }

    /// The levels of a request: its key's, its team's, and its end user's
    /// (`user`: [`crate::shared::keys::user_owner`]) when the key has `per_user`
    /// limits.
    pub fn levels_of<'a>(
        &'a self,
        c: &'a Client,
        user: Option<&'a str>,
    ) -> impl Iterator<Item = Level<'a>> + Clone {
        let user = user
            .zip(c.limits.per_user.as_deref())
            .map(|(u, limits)| Level::new(crate::shared::keys::Owner::User(u), limits));
        self.levels(c).chain(user)
    }
}

/// Which requests an experiment covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applies {
    All,
    /// Requests for these model indexes, and `auto` when `auto` is set.
    Models {
        models: Vec<usize>,
        auto: bool,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arm {
    pub name: String,
    pub weight: u32,
    pub model: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Experiment {
    pub name: String,
    pub salt: String,
    pub applies: Applies,
    pub arms: Vec<Arm>,
}

impl Client {
    pub fn may_use(&self, model: usize) -> bool {
        self.allowed.as_ref().is_none_or(|a| a.contains(&model))
    }
}

/// The compiled config: everything the request path needs, with names
/// resolved to indexes.
#[derive(Debug, Clone)]
pub struct Gateway {
    /// Providers in chain order.
    pub providers: Vec<Provider>,
    pub models: Vec<Model>,
    /// Public name or alias -> model index.
    pub names: HashMap<String, usize>,
    /// `auto` candidates: (model index, weight) within the first provider.
    pub auto: Vec<(usize, u32)>,
    /// SHA-256 of the client key -> client.
    pub clients: HashMap<[u8; 32], Client>,
    /// SHA-256 of a rotated-out key -> its client's current key and the
    /// end of its grace period (`clients[].previous_keys`).
    pub previous_keys: HashMap<[u8; 32], PreviousKey>,
    pub max_body_bytes: usize,
    /// Providers tried per request at most (open breakers skipped for free).
    pub max_attempts: u32,
    /// The prompt cache, when enabled.
    pub cache: Option<CacheConfig>,
    /// Price per model index.
    pub prices: Vec<Option<Price>>,
    pub experiments: Vec<Experiment>,
    /// The request log, when a collector is configured.
    pub log: Option<LogConfig>,
    /// The rate limit service for `global` limits, when configured.
    pub global_limits: Option<GlobalLimits>,
    /// Checks on prompts and answers, when configured.
    pub guardrails: Option<crate::guard::Guardrails>,
    /// Routing strategies and conditional routes.
    pub policy: Policy,
    /// Teams, by index (`Client::team`).
    pub teams: Vec<Team>,
    /// Where budget periods start, in ms east of UTC
    /// (`limits.budget_utc_offset`).
    pub budget_offset_ms: i64,
    /// The header naming a request's end user (`limits.user_header`).
    pub user_header: Option<String>,
    /// End users tracked per key (`limits.max_users_per_key`).
    pub max_users_per_key: u32,
    /// The share of requests without a client trace that start one
    /// (`tracing.sample_rate`; 0 without a `tracing` section).
    pub trace_sample_rate: f64,
    /// `testing.clock_offset_ms`: added to the host's clock (the host
    /// refuses it unless its environment allows test hooks).
    pub clock_offset_ms: i64,
    /// The MCP gateway (`mcp`), when configured.
    pub mcp: Option<crate::mcp::McpGateway>,
}

/// How each model's traffic is spread, and the conditional routes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Policy {
    pub default: crate::health::strategy::Strategy,
    /// By requested name (model, alias, `auto`).
    pub by_name: HashMap<String, crate::health::strategy::Strategy>,
    pub output_share: f64,
    pub fastest: crate::health::strategy::Fastest,
    pub rules: Vec<crate::health::strategy::Rule>,
    /// Request headers the rules read.
    pub rule_headers: Vec<String>,
    /// Some strategy needs latencies / requests in flight.
    pub uses_latency: bool,
    pub uses_busy: bool,
    /// Error classes that move a request to the next candidate.
    pub fallback_on: Vec<crate::health::attempt::Class>,
}

/// Largest plugin config compiled unless the VM's environment says
/// otherwise (`PORTCULLIS_MAX_CONFIG_BYTES`): a larger one is refused before
/// it is even read into the VM, so a huge config cannot take its memory.
pub const DEFAULT_MAX_CONFIG_BYTES: usize = 4 << 20;

/// The refusal of a config of `size` bytes over `limit`, if it is.
pub fn too_large(size: usize, limit: usize) -> Option<String> {
    (size > limit).then(|| {
        format!(
            "plugin config rejected: it is {size} bytes, over the limit of {limit} bytes (raise PORTCULLIS_MAX_CONFIG_BYTES in the VM's environment, vm_config.environment_variables, to allow it)"
        )
    })
}

/// The config size limit from the VM environment's value, if it reads.
pub fn max_config_bytes(env: Option<&str>) -> usize {
    env.and_then(|v| v.trim().parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(DEFAULT_MAX_CONFIG_BYTES)
}

impl Gateway {
    /// The stamp of a client as this config has it: its name, team, the
    /// models it may use (by name) and its limits; any change of them
    /// changes it (`crate::shared::keys::client_stamp_key` says where it is kept).
    pub fn client_stamp(&self, c: &Client) -> Vec<u8> {
        let mut h = blake3::Hasher::new();
        h.update(c.name.as_bytes());
        h.update(&[0]);
        if let Some(t) = c.team.and_then(|t| self.teams.get(t)) {
            h.update(t.name.as_bytes());
            h.update(format!("{:?}", t.limits).as_bytes());
        }
        h.update(&[0]);
        match &c.allowed {
            None => {
                h.update(b"*");
            }
            Some(models) => {
                let mut names: Vec<&str> = models
                    .iter()
                    .filter_map(|i| self.models.get(*i).map(|m| m.name.as_str()))
                    .collect();
                names.sort_unstable();
                for n in names {
                    h.update(n.as_bytes());
                    h.update(&[0]);
                }
            }
        }
        h.update(format!("{:?}{}", c.limits, c.allow_overrides).as_bytes());
        h.finalize()
            .as_bytes()
            .get(..8)
            .unwrap_or_default()
            .to_vec()
    }
}
