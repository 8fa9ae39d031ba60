//! Prices aside, the sections that stand on their own: experiments (sticky
//! A/B arms over models), the prompt cache and the request log.

use super::models::is_label;
use super::raw::{RawCache, RawConfig, RawExperiment};
use super::{Applies, Arm, Experiment, LogConfig, AUTO_MODEL};
use crate::cache::{CacheConfig, SemanticScope, SemanticTier, SharedTier};
use hashbrown::HashMap;

pub(super) fn experiments(
    raw: &RawConfig,
    names: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Vec<Experiment> {
    let mut experiments = Vec::new();
    let mut exp_names = hashbrown::HashSet::new();
    for (i, e) in raw.experiments.iter().enumerate() {
        let at = format!("experiments[{i}] ({})", e.name);
        if e.name.trim().is_empty() || !is_label(&e.name) {
            problems.push(format!(
                "experiments[{i}]: `name` must be letters, digits, `_` or `-`"
            ));
        } else if !exp_names.insert(e.name.as_str()) {
            problems.push(format!("{at}: duplicate experiment name"));
        }
        experiments.push(Experiment {
            name: e.name.clone(),
            salt: e.salt.clone().unwrap_or_else(|| e.name.clone()),
            applies: applies(&at, e, names, problems),
            arms: arms(&at, e, names, problems),
        });
    }
    experiments
}

/// Which requests an experiment covers.
fn applies(
    at: &str,
    e: &RawExperiment,
    names: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Applies {
    if e.applies_to.iter().any(|a| a == "all") {
        return Applies::All;
    }
    let mut models = Vec::new();
    let mut auto = false;
    for a in &e.applies_to {
        if a == AUTO_MODEL {
            auto = true;
        } else if let Some(&idx) = names.get(a) {
            models.push(idx);
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
    Applies::Models { models, auto }
}

fn arms(
    at: &str,
    e: &RawExperiment,
    names: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Vec<Arm> {
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
    arms
}

pub(super) fn log(raw: &RawConfig, problems: &mut Vec<String>) -> Option<LogConfig> {
    raw.log.as_ref().map(|l| {
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
    })
}

pub(super) fn cache(c: &RawCache, problems: &mut Vec<String>) -> Option<CacheConfig> {
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
    let worker_bytes = c.worker_bytes.unwrap_or((c.max_bytes / 8).min(1 << 20));
    if worker_bytes > c.max_bytes {
        problems.push("cache: `worker_bytes` (each worker's copies of hot answers) must not exceed `max_bytes`".into());
    }
    let shared = c.shared.as_ref().map(|s| {
        if s.cluster.trim().is_empty() {
            problems.push("cache.shared.cluster is empty (name the Envoy cluster of portcullis-limiter)".into());
        }
        if s.timeout_ms == 0 || s.timeout_ms > 10_000 {
            problems.push(format!(
                "cache.shared.timeout_ms must be from 1 to 10000 (got {}): a lookup waits this long on every miss",
                s.timeout_ms
            ));
        }
        if s.queue_bytes < c.max_entry_bytes {
            problems.push(format!(
                "cache.shared.queue_bytes ({}) must hold at least one entry of max_entry_bytes ({})",
                s.queue_bytes, c.max_entry_bytes
            ));
        }
        SharedTier {
            cluster: s.cluster.clone(),
            timeout_ms: s.timeout_ms,
            queue_bytes: s.queue_bytes,
        }
    });
    let semantic = c.semantic.as_ref().map(|s| {
        if c.shared.is_none() {
            problems.push("cache.semantic needs cache.shared (the fleet's tier keeps the prompts' embeddings)".into());
        }
        if s.embedding_model.trim().is_empty() {
            problems.push("cache.semantic.embedding_model is empty (name a model of this config that serves embeddings)".into());
        }
        if !(0.5..=1.0).contains(&s.threshold) {
            problems.push(format!(
                "cache.semantic.threshold must be from 0.5 to 1 (got {}): the least cosine similarity served",
                s.threshold
            ));
        }
        if s.models.is_empty() {
            problems.push("cache.semantic.models is empty (list the models whose requests may be answered by a near-duplicate's answer)".into());
        }
        if s.cluster.trim().is_empty() || s.timeout_ms == 0 || s.timeout_ms > 60_000 {
            problems.push("cache.semantic: `cluster` must be named and `timeout_ms` be from 1 to 60000".into());
        }
        let scope = match s.scope.as_str() {
            "client" => SemanticScope::Client,
            "team" => SemanticScope::Team,
            "shared" => SemanticScope::Shared,
            other => {
                problems.push(format!(
                    "cache.semantic.scope must be `client`, `team` or `shared` (got `{other}`)"
                ));
                SemanticScope::Client
            }
        };
        SemanticTier {
            scope,
            embedding_model: s.embedding_model.clone(),
            threshold_ppm: (s.threshold.clamp(0.0, 1.0) * 1e6).round() as u32,
            models: s.models.clone(),
            multi_turn: s.multi_turn,
            cluster: s.cluster.clone(),
            timeout_ms: s.timeout_ms,
        }
    });
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
        worker_bytes,
        worker_ttl_ms: c.worker_ttl_ms,
        shared,
        semantic,
    })
}
