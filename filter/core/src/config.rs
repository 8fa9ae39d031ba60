//! The plugin config (the control plane): parse, validate everything at once,
//! compile into the structures the request path uses.
//!
//! `compile` either returns a complete [`Gateway`] or one error listing every
//! problem it found; the host swaps a new config in only on success.

use crate::breaker::BreakerConfig;
use crate::cache::CacheConfig;
use crate::ratelimit::{Micros, Price};
use hashbrown::HashMap;
use serde::Deserialize;
use serde_yaml::Value;
use std::fmt::Write as _;

/// The name a client sends to let the gateway pick a model.
pub const AUTO_MODEL: &str = "auto";

const DEFAULT_TIMEOUT_MS: u64 = 60_000;
const DEFAULT_MAX_BODY_BYTES: usize = 1 << 20;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    providers: Vec<RawProvider>,
    #[serde(default)]
    routing: RawRouting,
    #[serde(default)]
    clients: Vec<RawClient>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    breaker: RawBreaker,
    #[serde(default)]
    cache: RawCache,
    #[serde(default)]
    prices: std::collections::BTreeMap<String, RawPrice>,
    #[serde(default)]
    experiments: Vec<RawExperiment>,
    #[serde(default)]
    log: Option<RawLog>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLog {
    collector_cluster: String,
    #[serde(default = "default_log_batch")]
    batch_size: usize,
    #[serde(default = "default_log_flush")]
    flush_interval_ms: u64,
    #[serde(default = "default_log_buffer")]
    buffer_records: usize,
    #[serde(default = "default_log_buffer_bytes")]
    buffer_bytes: usize,
    #[serde(default = "default_log_timeout")]
    timeout_ms: u64,
    #[serde(default)]
    include_content: bool,
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

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    input: f64,
    output: f64,
    #[serde(default)]
    cached_input: Option<f64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawExperiment {
    name: String,
    #[serde(default)]
    salt: Option<String>,
    #[serde(default)]
    applies_to: Vec<String>,
    #[serde(default)]
    arms: Vec<RawArm>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawArm {
    name: String,
    #[serde(default = "default_weight")]
    weight: u32,
    model: String,
}

/// Per-client limits; every field optional so a client can override some.
#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClientLimits {
    requests_per_minute: Option<u64>,
    tokens_per_minute: Option<u64>,
    max_concurrent: Option<u32>,
    budget_usd_per_day: Option<f64>,
    default_max_tokens: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCache {
    #[serde(default)]
    enabled: bool,
    #[serde(default = "default_cache_bytes")]
    max_bytes: usize,
    #[serde(default = "default_cache_entry_bytes")]
    max_entry_bytes: usize,
    #[serde(default = "default_cache_ways")]
    ways: u32,
    #[serde(default = "default_cache_ttl_s")]
    ttl_s: u64,
    #[serde(default)]
    normalize: bool,
    #[serde(default = "default_cache_scope")]
    scope: String,
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
        }
    }
}

fn default_cache_bytes() -> usize {
    16 << 20
}
fn default_cache_entry_bytes() -> usize {
    64 << 10
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
struct RawBreaker {
    consecutive_failures: Option<u32>,
    failure_ratio: Option<f64>,
    min_requests: Option<u32>,
    window_ms: Option<u64>,
    cooldown_ms: Option<u64>,
    half_open_probes: Option<u32>,
}

impl RawBreaker {
    fn over(&self, base: &BreakerConfig) -> BreakerConfig {
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

fn check_breaker(at: &str, b: &BreakerConfig, problems: &mut Vec<String>) {
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
struct RawProvider {
    name: String,
    cluster: String,
    host: String,
    #[serde(default = "default_base_path")]
    base_path: String,
    #[serde(default)]
    api_key_env: Option<String>,
    #[serde(default = "default_timeout_ms")]
    timeout_ms: u64,
    #[serde(default)]
    models: Vec<RawModel>,
    #[serde(default)]
    breaker: Option<RawBreaker>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawModel {
    name: String,
    #[serde(default)]
    id: Option<String>,
    #[serde(default = "default_weight")]
    weight: u32,
    #[serde(default)]
    aliases: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRouting {
    #[serde(default)]
    chain: Option<Vec<String>>,
    #[serde(default)]
    max_attempts: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClient {
    name: String,
    key_sha256: String,
    #[serde(default)]
    models: Option<Vec<String>>,
    #[serde(default)]
    limits: Option<RawClientLimits>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    #[serde(default = "default_max_body")]
    max_body_bytes: usize,
    #[serde(flatten)]
    defaults: RawClientLimits,
}

impl Default for RawLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            defaults: RawClientLimits::default(),
        }
    }
}

const DEFAULT_MAX_TOKENS: u64 = 1024;

impl RawClientLimits {
    fn over(&self, base: &Limits) -> Limits {
        Limits {
            requests_per_minute: self.requests_per_minute.or(base.requests_per_minute),
            tokens_per_minute: self.tokens_per_minute.or(base.tokens_per_minute),
            max_concurrent: self.max_concurrent.or(base.max_concurrent),
            budget_micros: self
                .budget_usd_per_day
                .map(|usd| (usd * 1e6).round() as Micros)
                .or(base.budget_micros),
            default_max_tokens: self.default_max_tokens.unwrap_or(base.default_max_tokens),
        }
    }
}

fn check_limits(at: &str, l: &RawClientLimits, problems: &mut Vec<String>) {
    if l.requests_per_minute == Some(0)
        || l.tokens_per_minute == Some(0)
        || l.max_concurrent == Some(0)
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
    if l.default_max_tokens == Some(0) {
        problems.push(format!("{at}: `default_max_tokens` must be at least 1"));
    }
}

fn default_base_path() -> String {
    "/v1".to_string()
}
fn default_timeout_ms() -> u64 {
    DEFAULT_TIMEOUT_MS
}
fn default_weight() -> u32 {
    1
}
fn default_max_body() -> usize {
    DEFAULT_MAX_BODY_BYTES
}

/// The keys allowed at each level, so that every unknown key is reported in
/// one pass (serde stops at the first).
const TOP_KEYS: &[&str] = &[
    "providers",
    "routing",
    "clients",
    "limits",
    "breaker",
    "cache",
    "prices",
    "experiments",
    "log",
];
const LOG_KEYS: &[&str] = &[
    "collector_cluster",
    "batch_size",
    "flush_interval_ms",
    "buffer_records",
    "buffer_bytes",
    "timeout_ms",
    "include_content",
];
const CLIENT_LIMIT_KEYS: &[&str] = &[
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent",
    "budget_usd_per_day",
    "default_max_tokens",
];
const PRICE_KEYS: &[&str] = &["input", "output", "cached_input"];
const EXPERIMENT_KEYS: &[&str] = &["name", "salt", "applies_to", "arms"];
const ARM_KEYS: &[&str] = &["name", "weight", "model"];
const CACHE_KEYS: &[&str] = &[
    "enabled",
    "max_bytes",
    "max_entry_bytes",
    "ways",
    "ttl_s",
    "normalize",
    "scope",
];
const PROVIDER_KEYS: &[&str] = &[
    "name",
    "cluster",
    "host",
    "base_path",
    "api_key_env",
    "timeout_ms",
    "models",
    "breaker",
];
const BREAKER_KEYS: &[&str] = &[
    "consecutive_failures",
    "failure_ratio",
    "min_requests",
    "window_ms",
    "cooldown_ms",
    "half_open_probes",
];
const MODEL_KEYS: &[&str] = &["name", "id", "weight", "aliases"];
const ROUTING_KEYS: &[&str] = &["chain", "max_attempts"];
const DEFAULT_MAX_ATTEMPTS: u32 = 3;
const CLIENT_KEYS: &[&str] = &["name", "key_sha256", "models", "limits"];
const LIMITS_KEYS: &[&str] = &[
    "max_body_bytes",
    "requests_per_minute",
    "tokens_per_minute",
    "max_concurrent",
    "budget_usd_per_day",
    "default_max_tokens",
];

/// A provider as the request path uses it.
#[derive(Debug, Clone, PartialEq)]
pub struct Provider {
    pub name: String,
    pub cluster: String,
    pub host: String,
    pub base_path: String,
    pub api_key_env: Option<String>,
    pub timeout_ms: u64,
    pub breaker: BreakerConfig,
}

/// One provider serving a model, under that provider's own model id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Serving {
    pub provider: usize,
    pub provider_model_id: String,
}

/// A model by its public (canonical) name, with the providers serving it in
/// chain order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    pub name: String,
    pub aliases: Vec<String>,
    pub serving: Vec<Serving>,
}

/// Limits of one client key (`None`: no limit).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Limits {
    pub requests_per_minute: Option<u64>,
    pub tokens_per_minute: Option<u64>,
    pub max_concurrent: Option<u32>,
    /// Daily budget in micro-USD.
    pub budget_micros: Option<Micros>,
    /// Completion tokens reserved when a request names no max.
    pub default_max_tokens: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Client {
    pub name: String,
    /// Canonical model indexes this client may use; `None` means all.
    pub allowed: Option<Vec<usize>>,
    pub limits: Limits,
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
}

/// Parse and compile a plugin config (YAML, or JSON which YAML accepts).
/// On failure, the error lists every problem found, one per line.
pub fn compile(text: &[u8]) -> Result<Gateway, String> {
    let text = std::str::from_utf8(text).map_err(|e| format!("plugin config is not UTF-8: {e}"))?;
    if text.trim().is_empty() {
        return Err("plugin config is empty: it needs at least `providers` and `clients`".into());
    }
    let mut value: Value = serde_yaml::from_str(text)
        .map_err(|e| format!("plugin config is not valid YAML/JSON: {e}"))?;
    let mut problems = Vec::new();
    check_keys(&mut value, &mut problems);
    if !value.is_mapping() {
        return Err(report(&problems));
    }
    let raw: RawConfig = match serde_yaml::from_value(value) {
        Ok(raw) => raw,
        Err(e) => {
            problems.push(format!("a field has the wrong type: {e}"));
            return Err(report(&problems));
        }
    };
    build(raw, &mut problems)
        .filter(|_| problems.is_empty())
        .ok_or_else(|| report(&problems))
}

fn report(problems: &[String]) -> String {
    let mut out = format!(
        "plugin config rejected ({} problem{}):",
        problems.len(),
        if problems.len() == 1 { "" } else { "s" }
    );
    for p in problems {
        let _ = write!(out, "\n  - {p}");
    }
    out
}

/// Report and remove unknown keys, so that the typed parse and the
/// cross-reference checks still run and every problem lands in one report.
fn unknown_keys(v: &mut Value, path: &str, allowed: &[&str], problems: &mut Vec<String>) {
    if let Value::Mapping(m) = v {
        m.retain(|k, _| {
            let name = k.as_str().unwrap_or("<non-string key>");
            let known = allowed.contains(&name);
            if !known {
                problems.push(format!(
                    "{path}: unknown key `{name}` (expected one of: {})",
                    allowed.join(", ")
                ));
            }
            known
        });
    }
}

fn check_keys(v: &mut Value, problems: &mut Vec<String>) {
    if !v.is_mapping() {
        problems.push(
            "plugin config must be a mapping with `providers`, `routing`, `clients`, `limits`"
                .into(),
        );
        return;
    }
    unknown_keys(v, "config", TOP_KEYS, problems);
    if let Some(Value::Sequence(ps)) = v.get_mut("providers") {
        for (i, p) in ps.iter_mut().enumerate() {
            unknown_keys(p, &format!("providers[{i}]"), PROVIDER_KEYS, problems);
            if let Some(b) = p.get_mut("breaker") {
                unknown_keys(
                    b,
                    &format!("providers[{i}].breaker"),
                    BREAKER_KEYS,
                    problems,
                );
            }
            if let Some(Value::Sequence(ms)) = p.get_mut("models") {
                for (j, m) in ms.iter_mut().enumerate() {
                    unknown_keys(
                        m,
                        &format!("providers[{i}].models[{j}]"),
                        MODEL_KEYS,
                        problems,
                    );
                }
            }
        }
    }
    if let Some(r) = v.get_mut("routing") {
        unknown_keys(r, "routing", ROUTING_KEYS, problems);
    }
    if let Some(Value::Sequence(cs)) = v.get_mut("clients") {
        for (i, c) in cs.iter_mut().enumerate() {
            unknown_keys(c, &format!("clients[{i}]"), CLIENT_KEYS, problems);
            if let Some(l) = c.get_mut("limits") {
                unknown_keys(
                    l,
                    &format!("clients[{i}].limits"),
                    CLIENT_LIMIT_KEYS,
                    problems,
                );
            }
        }
    }
    if let Some(Value::Mapping(ps)) = v.get_mut("prices") {
        for (k, p) in ps.iter_mut() {
            unknown_keys(
                p,
                &format!("prices.{}", k.as_str().unwrap_or("?")),
                PRICE_KEYS,
                problems,
            );
        }
    }
    if let Some(Value::Sequence(es)) = v.get_mut("experiments") {
        for (i, e) in es.iter_mut().enumerate() {
            unknown_keys(e, &format!("experiments[{i}]"), EXPERIMENT_KEYS, problems);
            if let Some(Value::Sequence(arms)) = e.get_mut("arms") {
                for (j, a) in arms.iter_mut().enumerate() {
                    unknown_keys(
                        a,
                        &format!("experiments[{i}].arms[{j}]"),
                        ARM_KEYS,
                        problems,
                    );
                }
            }
        }
    }
    if let Some(b) = v.get_mut("breaker") {
        unknown_keys(b, "breaker", BREAKER_KEYS, problems);
    }
    if let Some(c) = v.get_mut("cache") {
        unknown_keys(c, "cache", CACHE_KEYS, problems);
    }
    if let Some(l) = v.get_mut("log") {
        unknown_keys(l, "log", LOG_KEYS, problems);
    }
    if let Some(l) = v.get_mut("limits") {
        unknown_keys(l, "limits", LIMITS_KEYS, problems);
    }
}

fn valid_env_name(s: &str) -> bool {
    !s.is_empty()
        && !s.starts_with(|c: char| c.is_ascii_digit())
        && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

pub fn parse_sha256_hex(s: &str) -> Option<[u8; 32]> {
    let s = s.trim();
    if s.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        let pair = s.get(i * 2..i * 2 + 2)?;
        *byte = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

fn build(raw: RawConfig, problems: &mut Vec<String>) -> Option<Gateway> {
    if raw.providers.is_empty() {
        problems.push("providers: at least one provider is required".into());
    }
    // Providers: unique names and sane fields.
    let mut by_name: HashMap<&str, usize> = HashMap::new();
    for (i, p) in raw.providers.iter().enumerate() {
        let at = format!("providers[{i}] ({})", p.name);
        if p.name.trim().is_empty() {
            problems.push(format!("providers[{i}]: `name` is empty"));
        } else if !p
            .name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            problems.push(format!(
                "{at}: `name` may use only letters, digits, `_` and `-` (it labels metrics)"
            ));
        } else if by_name.insert(p.name.as_str(), i).is_some() {
            problems.push(format!("{at}: duplicate provider name"));
        }
        if p.cluster.trim().is_empty() {
            problems.push(format!(
                "{at}: `cluster` is empty (name the Envoy cluster of this provider)"
            ));
        }
        if p.host.trim().is_empty() {
            problems.push(format!(
                "{at}: `host` is empty (the :authority sent to the provider)"
            ));
        }
        if !p.base_path.starts_with('/') {
            problems.push(format!(
                "{at}: `base_path` must start with `/` (got `{}`)",
                p.base_path
            ));
        }
        if let Some(env) = &p.api_key_env {
            if !valid_env_name(env) {
                problems.push(format!(
                    "{at}: `api_key_env` `{env}` is not an environment variable name"
                ));
            }
        }
        if p.timeout_ms == 0 {
            problems.push(format!("{at}: `timeout_ms` must be greater than 0"));
        }
        if p.models.is_empty() {
            problems.push(format!("{at}: `models` is empty"));
        }
        let mut seen = hashbrown::HashSet::new();
        for (j, m) in p.models.iter().enumerate() {
            if m.name.trim().is_empty() {
                problems.push(format!("{at}.models[{j}]: `name` is empty"));
            } else if m.name == AUTO_MODEL {
                problems.push(format!(
                    "{at}.models[{j}]: `{AUTO_MODEL}` is reserved and cannot name a model"
                ));
            } else if !seen.insert(m.name.as_str()) {
                problems.push(format!("{at}: model `{}` listed twice", m.name));
            }
            if m.id.as_deref().is_some_and(|id| id.trim().is_empty()) {
                problems.push(format!("{at}.models[{j}]: `id` is empty"));
            }
        }
    }

    // Chain order.
    let chain: Vec<String> = match &raw.routing.chain {
        Some(c) => c.clone(),
        None => raw.providers.iter().map(|p| p.name.clone()).collect(),
    };
    let mut order: Vec<usize> = Vec::new();
    for name in &chain {
        match by_name.get(name.as_str()) {
            Some(&i) if order.contains(&i) => {
                problems.push(format!("routing.chain: provider `{name}` appears twice"))
            }
            Some(&i) => order.push(i),
            None => problems.push(format!("routing.chain: no provider named `{name}`")),
        }
    }
    for (i, p) in raw.providers.iter().enumerate() {
        if !order.contains(&i) && by_name.get(p.name.as_str()) == Some(&i) {
            problems.push(format!(
                "providers[{i}] ({}): not in routing.chain, so it would never be used",
                p.name
            ));
        }
    }

    // Models by canonical name, serving providers in chain order.
    let default_breaker = raw.breaker.over(&BreakerConfig::default());
    check_breaker("breaker", &default_breaker, problems);
    let mut providers = Vec::new();
    let mut models: Vec<Model> = Vec::new();
    let mut model_idx: HashMap<String, usize> = HashMap::new();
    for &pi in &order {
        let Some(p) = raw.providers.get(pi) else {
            continue;
        };
        let chain_pos = providers.len();
        providers.push(Provider {
            name: p.name.clone(),
            cluster: p.cluster.clone(),
            host: p.host.clone(),
            base_path: p.base_path.clone(),
            api_key_env: p.api_key_env.clone(),
            timeout_ms: p.timeout_ms,
            breaker: BreakerConfig {
                probe_timeout_ms: p.timeout_ms.saturating_add(1_000),
                ..p.breaker
                    .as_ref()
                    .map(|b| b.over(&default_breaker))
                    .unwrap_or(default_breaker)
            },
        });
        if let Some(b) = &p.breaker {
            check_breaker(
                &format!("provider `{}` breaker", p.name),
                &b.over(&default_breaker),
                problems,
            );
        }
        for m in &p.models {
            let idx = *model_idx.entry(m.name.clone()).or_insert_with(|| {
                models.push(Model {
                    name: m.name.clone(),
                    aliases: Vec::new(),
                    serving: Vec::new(),
                });
                models.len() - 1
            });
            if let Some(model) = models.get_mut(idx) {
                model.serving.push(Serving {
                    provider: chain_pos,
                    provider_model_id: m.id.clone().unwrap_or_else(|| m.name.clone()),
                });
            }
        }
    }

    // Aliases: each alias names exactly one model and never shadows a model name.
    let mut names: HashMap<String, usize> = model_idx.clone();
    let mut alias_owner: HashMap<String, usize> = HashMap::new();
    for p in &raw.providers {
        for m in &p.models {
            let Some(&target) = model_idx.get(&m.name) else {
                continue;
            };
            for a in &m.aliases {
                if a.trim().is_empty() {
                    problems.push(format!(
                        "provider `{}` model `{}`: empty alias",
                        p.name, m.name
                    ));
                } else if a == AUTO_MODEL {
                    problems.push(format!(
                        "provider `{}` model `{}`: alias `{AUTO_MODEL}` is reserved",
                        p.name, m.name
                    ));
                } else if model_idx.get(a).is_some_and(|&t| t != target) {
                    problems.push(format!(
                        "alias `{a}` (of model `{}`) collides with the model named `{a}`",
                        m.name
                    ));
                } else if let Some(&other) = alias_owner.get(a) {
                    if other != target {
                        let other_name = models.get(other).map(|o| o.name.as_str()).unwrap_or("?");
                        problems.push(format!(
                            "alias `{a}` names two models: `{other_name}` and `{}`",
                            m.name
                        ));
                    }
                } else if !model_idx.contains_key(a) {
                    alias_owner.insert(a.clone(), target);
                    names.insert(a.clone(), target);
                    if let Some(model) = models.get_mut(target) {
                        model.aliases.push(a.clone());
                    }
                }
            }
        }
    }

    // `auto`: weighted among the models of the first provider in the chain.
    let mut auto = Vec::new();
    if let Some(first) = order.first().and_then(|&i| raw.providers.get(i)) {
        for m in &first.models {
            if let Some(&idx) = model_idx.get(&m.name) {
                if m.weight > 0 {
                    auto.push((idx, m.weight));
                }
            }
        }
        if !first.models.is_empty() && auto.is_empty() {
            problems.push(format!(
                "provider `{}` (first in the chain): model weights sum to zero, so `{AUTO_MODEL}` has nothing to pick",
                first.name
            ));
        }
    }

    // Clients.
    if raw.clients.is_empty() {
        problems.push("clients: at least one client is required (name + key_sha256)".into());
    }
    check_limits("limits", &raw.limits.defaults, problems);
    let base_limits = raw.limits.defaults.over(&Limits {
        default_max_tokens: DEFAULT_MAX_TOKENS,
        ..Limits::default()
    });
    let mut clients = HashMap::new();
    let mut client_names = hashbrown::HashSet::new();
    for (i, c) in raw.clients.iter().enumerate() {
        let at = format!("clients[{i}] ({})", c.name);
        if c.name.trim().is_empty() {
            problems.push(format!("clients[{i}]: `name` is empty"));
        } else if !client_names.insert(c.name.as_str()) {
            problems.push(format!("{at}: duplicate client name"));
        }
        let allowed = c.models.as_ref().map(|ms| {
            let mut out = Vec::new();
            for m in ms {
                match names.get(m) {
                    Some(&idx) => out.push(idx),
                    None => problems.push(format!(
                        "{at}: allowed model `{m}` is not served by any provider"
                    )),
                }
            }
            out
        });
        match parse_sha256_hex(&c.key_sha256) {
            None => problems.push(format!(
                "{at}: `key_sha256` must be 64 hex characters (the SHA-256 of the key)"
            )),
            Some(hash) => {
                if let Some(l) = &c.limits {
                    check_limits(&format!("{at}.limits"), l, problems);
                }
                let limits = c
                    .limits
                    .as_ref()
                    .map(|l| l.over(&base_limits))
                    .unwrap_or_else(|| base_limits.clone());
                if clients
                    .insert(
                        hash,
                        Client {
                            name: c.name.clone(),
                            allowed,
                            limits,
                        },
                    )
                    .is_some()
                {
                    problems.push(format!(
                        "{at}: `key_sha256` is the same as another client's"
                    ));
                }
            }
        }
    }

    if raw.limits.max_body_bytes == 0 {
        problems.push("limits.max_body_bytes must be greater than 0".into());
    }

    let max_attempts = raw.routing.max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
    if max_attempts == 0 {
        problems.push("routing.max_attempts must be at least 1".into());
    }
    let cache = compile_cache(&raw.cache, problems);

    // Prices per model; a budget needs a price for every model.
    let mut prices: Vec<Option<Price>> = vec![None; models.len()];
    for (name, p) in &raw.prices {
        match names.get(name) {
            Some(&idx) => {
                if [p.input, p.output, p.cached_input.unwrap_or(0.0)]
                    .iter()
                    .any(|x| !(x.is_finite() && *x >= 0.0))
                {
                    problems.push(format!(
                        "prices.{name}: prices must be non-negative numbers (USD per 1M tokens)"
                    ));
                }
                if let Some(slot) = prices.get_mut(idx) {
                    *slot = Some(Price {
                        input: p.input,
                        output: p.output,
                        cached_input: p.cached_input.unwrap_or(p.input),
                    });
                }
            }
            None => problems.push(format!(
                "prices: `{name}` is not a model any provider serves"
            )),
        }
    }
    if clients.values().any(|c| c.limits.budget_micros.is_some()) {
        let unpriced: Vec<&str> = models
            .iter()
            .zip(&prices)
            .filter(|(_, p)| p.is_none())
            .map(|(m, _)| m.name.as_str())
            .collect();
        if !unpriced.is_empty() {
            problems.push(format!(
                "a budget is set, but these models have no entry in `prices`: {}",
                unpriced.join(", ")
            ));
        }
    }

    // Experiments.
    let mut experiments = Vec::new();
    let mut exp_names = hashbrown::HashSet::new();
    for (i, e) in raw.experiments.iter().enumerate() {
        let at = format!("experiments[{i}] ({})", e.name);
        if e.name.trim().is_empty()
            || !e
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            problems.push(format!(
                "experiments[{i}]: `name` must be letters, digits, `_` or `-`"
            ));
        } else if !exp_names.insert(e.name.as_str()) {
            problems.push(format!("{at}: duplicate experiment name"));
        }
        let applies = if e.applies_to.iter().any(|a| a == "all") {
            Applies::All
        } else {
            let mut ms = Vec::new();
            let mut auto_too = false;
            for a in &e.applies_to {
                if a == AUTO_MODEL {
                    auto_too = true;
                } else if let Some(&idx) = names.get(a) {
                    ms.push(idx);
                } else {
                    problems.push(format!(
                        "{at}: applies_to `{a}` is not a model any provider serves"
                    ));
                }
            }
            if e.applies_to.is_empty() {
                problems.push(format!(
                    "{at}: `applies_to` is empty (list models, `auto`, or `all`)"
                ));
            }
            Applies::Models {
                models: ms,
                auto: auto_too,
            }
        };
        let mut arms = Vec::new();
        let mut arm_names = hashbrown::HashSet::new();
        for a in &e.arms {
            if !arm_names.insert(a.name.as_str()) || a.name.trim().is_empty() {
                problems.push(format!("{at}: arm name `{}` is empty or repeated", a.name));
            }
            match names.get(&a.model) {
                Some(&m) => arms.push(Arm {
                    name: a.name.clone(),
                    weight: a.weight,
                    model: m,
                }),
                None => problems.push(format!(
                    "{at}: arm `{}` targets `{}`, which no provider serves",
                    a.name, a.model
                )),
            }
        }
        if e.arms.len() < 2 {
            problems.push(format!("{at}: needs at least two arms"));
        } else if e.arms.iter().all(|a| a.weight == 0) {
            problems.push(format!("{at}: arm weights sum to zero"));
        }
        experiments.push(Experiment {
            name: e.name.clone(),
            salt: e.salt.clone().unwrap_or_else(|| e.name.clone()),
            applies,
            arms,
        });
    }

    let log = raw.log.as_ref().map(|l| {
        if l.collector_cluster.trim().is_empty() {
            problems.push("log.collector_cluster is empty (name the Envoy cluster of the collector)".into());
        }
        if l.batch_size == 0 || l.flush_interval_ms == 0 || l.buffer_records == 0 || l.timeout_ms == 0 {
            problems.push("log: batch_size, flush_interval_ms, buffer_records and timeout_ms must be at least 1".into());
        }
        LogConfig {
            cluster: l.collector_cluster.clone(),
            batch_size: l.batch_size,
            flush_interval_ms: l.flush_interval_ms,
            buffer_records: l.buffer_records,
            buffer_bytes: l.buffer_bytes,
            timeout_ms: l.timeout_ms,
            include_content: l.include_content,
        }
    });

    Some(Gateway {
        log,
        providers,
        models,
        names,
        auto,
        clients,
        max_body_bytes: raw.limits.max_body_bytes,
        max_attempts,
        cache,
        prices,
        experiments,
    })
}

fn compile_cache(c: &RawCache, problems: &mut Vec<String>) -> Option<CacheConfig> {
    let per_client = match c.scope.as_str() {
        "shared" => false,
        "client" => true,
        other => {
            problems.push(format!(
                "cache.scope must be `shared` or `client` (got `{other}`)"
            ));
            false
        }
    };
    if c.max_entry_bytes == 0 || c.max_bytes < c.max_entry_bytes {
        problems.push("cache: need 0 < max_entry_bytes <= max_bytes".into());
    }
    if c.ways == 0 || c.ttl_s == 0 {
        problems.push("cache: `ways` and `ttl_s` must be at least 1".into());
    }
    if !c.enabled {
        return None;
    }
    let (sets, ways) = CacheConfig::sized(c.max_bytes, c.max_entry_bytes, c.ways);
    Some(CacheConfig {
        sets,
        ways,
        ttl_ms: c.ttl_s.saturating_mul(1000),
        max_entry_bytes: c.max_entry_bytes,
        normalize: c.normalize,
        per_client,
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    pub(crate) const GOOD: &str = r#"
providers:
  - name: primary
    cluster: c_primary
    host: primary.example
    api_key_env: OPENAI_API_KEY
    models:
      - {name: gpt-4o-mini, weight: 3, aliases: [mini]}
      - {name: gpt-4o, id: gpt-4o-2024-08-06, weight: 1}
  - name: backup
    cluster: c_backup
    host: backup.example
    base_path: /openai/v1/
    breaker: {cooldown_ms: 500}
    models:
      - {name: gpt-4o-mini, id: openai/gpt-4o-mini, aliases: [mini]}
      - {name: llama-3, weight: 0}
routing:
  chain: [primary, backup]
breaker:
  consecutive_failures: 4
clients:
  - name: demo
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000001"
  - name: limited
    key_sha256: "0000000000000000000000000000000000000000000000000000000000000002"
    models: [mini]
"#;

    #[test]
    fn good_config_compiles_with_models_in_chain_order() {
        let g = compile(GOOD.as_bytes()).unwrap();
        assert_eq!(g.providers.len(), 2);
        let mini = g.names["gpt-4o-mini"];
        assert_eq!(g.names["mini"], mini);
        let serving = &g.models[mini].serving;
        assert_eq!(serving[0].provider, 0);
        assert_eq!(serving[1].provider_model_id, "openai/gpt-4o-mini");
        assert_eq!(g.auto.len(), 2);
        let t = crate::translate::for_provider(&g.providers[1]);
        assert_eq!(t.chat_path(&g.providers[1]), "/openai/v1/chat/completions");
        assert_eq!(g.max_body_bytes, 1 << 20);
    }

    #[test]
    fn breaker_defaults_and_per_provider_overrides() {
        let g = compile(GOOD.as_bytes()).unwrap();
        assert_eq!(g.providers[0].breaker.consecutive_failures, 4);
        assert_eq!(
            g.providers[0].breaker.cooldown_ms,
            BreakerConfig::default().cooldown_ms
        );
        assert_eq!(g.providers[1].breaker.consecutive_failures, 4);
        assert_eq!(g.providers[1].breaker.cooldown_ms, 500);
        assert_eq!(g.max_attempts, 3);
        let bad = GOOD.replace(
            "breaker: {cooldown_ms: 500}",
            "breaker: {cooldown_ms: 0, failure_ratio: 2.0, probes: 1}",
        );
        let err = compile(bad.as_bytes()).unwrap_err();
        assert!(
            err.contains("`probes`")
                && err.contains("`failure_ratio` must be")
                && err.contains("`cooldown_ms`"),
            "{err}"
        );
    }

    #[test]
    fn cache_is_off_by_default_and_sized_from_bytes() {
        assert!(compile(GOOD.as_bytes()).unwrap().cache.is_none());
        let on = format!("{GOOD}cache: {{enabled: true, max_bytes: 1048576, max_entry_bytes: 16384, scope: client}}\n");
        let c = compile(on.as_bytes()).unwrap().cache.unwrap();
        assert_eq!(
            (c.sets, c.ways, c.per_client, c.ttl_ms),
            (16, 4, true, 3_600_000)
        );
        let bad = format!("{GOOD}cache: {{enabled: true, max_bytes: 10, max_entry_bytes: 100, scope: team, size: 1}}\n");
        let err = compile(bad.as_bytes()).unwrap_err();
        assert!(
            err.contains("cache.scope")
                && err.contains("max_entry_bytes <= max_bytes")
                && err.contains("`size`"),
            "{err}"
        );
    }

    #[test]
    fn limits_defaults_overrides_prices_and_experiments() {
        let cfg = GOOD.replace("limits:\n", "")
            + r#"
limits:
  requests_per_minute: 60
  budget_usd_per_day: 1.5
prices:
  gpt-4o-mini: {input: 0.15, output: 0.6}
  gpt-4o: {input: 2.5, output: 10, cached_input: 1.25}
  llama-3: {input: 0, output: 0}
experiments:
  - name: ab
    applies_to: [mini, auto]
    arms:
      - {name: control, weight: 1, model: gpt-4o-mini}
      - {name: big, weight: 1, model: gpt-4o}
"#;
        let cfg = cfg.replace(
            "    models: [mini]\n",
            "    models: [mini]\n    limits: {requests_per_minute: 5, max_concurrent: 2}\n",
        );
        let g = compile(cfg.as_bytes()).unwrap();
        let demo = g.clients.values().find(|c| c.name == "demo").unwrap();
        assert_eq!(demo.limits.requests_per_minute, Some(60));
        assert_eq!(demo.limits.budget_micros, Some(1_500_000));
        assert_eq!(demo.limits.default_max_tokens, 1024);
        let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
        assert_eq!(
            (
                limited.limits.requests_per_minute,
                limited.limits.max_concurrent
            ),
            (Some(5), Some(2))
        );
        assert_eq!(
            limited.limits.budget_micros,
            Some(1_500_000),
            "inherits the default"
        );
        assert_eq!(g.prices[g.names["gpt-4o-mini"]].unwrap().cached_input, 0.15);
        let e = &g.experiments[0];
        assert_eq!(e.salt, "ab");
        assert_eq!(
            e.applies,
            Applies::Models {
                models: vec![g.names["gpt-4o-mini"]],
                auto: true
            }
        );
    }

    #[test]
    fn limit_price_and_experiment_problems_are_reported() {
        let cfg = GOOD.to_string()
            + r#"
limits: {requests_per_minute: 0, budget_usd_per_day: 2}
prices:
  gpt-5: {input: 1, output: 1}
experiments:
  - name: ab
    applies_to: [nothing]
    arms:
      - {name: a, weight: 0, model: gpt-4o}
      - {name: a, weight: 0, model: ghost}
"#;
        let err = compile(cfg.as_bytes()).unwrap_err();
        for needle in [
            "limit of 0",
            "`gpt-5` is not a model",
            "have no entry in `prices`",
            "applies_to `nothing`",
            "arm name `a` is empty or repeated",
            "targets `ghost`",
        ] {
            assert!(err.contains(needle), "{needle} missing: {err}");
        }
    }

    #[test]
    fn json_config_is_accepted() {
        let json = r#"{"providers":[{"name":"p","cluster":"c","host":"h","models":[{"name":"m"}]}],
            "clients":[{"name":"a","key_sha256":"0000000000000000000000000000000000000000000000000000000000000001"}]}"#;
        let g = compile(json.as_bytes()).unwrap();
        assert_eq!(g.models[0].name, "m");
    }

    #[test]
    fn unknown_keys_at_every_level_are_all_reported() {
        let bad = GOOD
            .replace("routing:\n", "routing:\n  retries: 3\n")
            .replace("    api_key_env:", "    colour: red\n    api_key_env:")
            .replace("{name: gpt-4o, id:", "{name: gpt-4o, nickname: x, id:")
            + "extra: 1\n";
        let err = compile(bad.as_bytes()).unwrap_err();
        for needle in ["`retries`", "`colour`", "`nickname`", "`extra`"] {
            assert!(err.contains(needle), "{needle} missing from {err}");
        }
        assert!(
            err.starts_with("plugin config rejected (4 problems)"),
            "{err}"
        );
        let both = GOOD.replace(
            "chain: [primary, backup]",
            "chain: [primary, ghost]\n  retries: 2",
        );
        let err = compile(both.as_bytes()).unwrap_err();
        assert!(
            err.contains("`retries`") && err.contains("no provider named `ghost`"),
            "{err}"
        );
    }

    #[test]
    fn cross_reference_problems_are_reported_together() {
        let bad = GOOD
            .replace(
                "chain: [primary, backup]",
                "chain: [primary, backup, ghost]",
            )
            .replace(
                "aliases: [mini]}\n      - {name: gpt-4o,",
                "aliases: [mini, gpt-4o]}\n      - {name: gpt-4o,",
            )
            .replace("models: [mini]", "models: [mini, claude]")
            .replace("weight: 3", "weight: 0")
            .replace("weight: 1}", "weight: 0}");
        let err = compile(bad.as_bytes()).unwrap_err();
        assert!(err.contains("no provider named `ghost`"), "{err}");
        assert!(err.contains("alias `gpt-4o`"), "{err}");
        assert!(err.contains("`claude` is not served"), "{err}");
        assert!(err.contains("sum to zero"), "{err}");
    }

    #[test]
    fn alias_naming_two_models_is_rejected() {
        let bad = GOOD.replace(
            "{name: llama-3, weight: 0}",
            "{name: llama-3, weight: 0, aliases: [mini]}",
        );
        let err = compile(bad.as_bytes()).unwrap_err();
        assert!(err.contains("alias `mini` names two models"), "{err}");
    }

    #[test]
    fn provider_missing_from_chain_and_bad_fields_are_reported() {
        let bad = GOOD
            .replace("chain: [primary, backup]", "chain: [primary]")
            .replace("base_path: /openai/v1/", "base_path: openai")
            .replace(
                "\"0000000000000000000000000000000000000000000000000000000000000002\"",
                "nothex",
            );
        let err = compile(bad.as_bytes()).unwrap_err();
        assert!(err.contains("not in routing.chain"), "{err}");
        assert!(err.contains("must start with `/`"), "{err}");
        assert!(err.contains("64 hex characters"), "{err}");
    }

    #[test]
    fn empty_and_garbage_configs_are_rejected_with_a_message() {
        assert!(compile(b"").unwrap_err().contains("empty"));
        assert!(compile(b"providers: [")
            .unwrap_err()
            .contains("not valid YAML"));
        assert!(compile(b"- 1\n- 2")
            .unwrap_err()
            .contains("must be a mapping"));
        assert!(compile(b"providers: 3\nclients: []")
            .unwrap_err()
            .contains("wrong type"));
        let err = compile(b"providers: 3\nclients: []\nflavour: x").unwrap_err();
        assert!(
            err.contains("wrong type") && err.contains("`flavour`"),
            "{err}"
        );
        let err = compile(b"providers: []\nclients: []").unwrap_err();
        assert!(
            err.contains("at least one provider") && err.contains("at least one client"),
            "{err}"
        );
    }

    #[test]
    fn client_allow_list_resolves_aliases() {
        let g = compile(GOOD.as_bytes()).unwrap();
        let limited = g.clients.values().find(|c| c.name == "limited").unwrap();
        assert!(limited.may_use(g.names["gpt-4o-mini"]));
        assert!(!limited.may_use(g.names["gpt-4o"]));
    }
}
