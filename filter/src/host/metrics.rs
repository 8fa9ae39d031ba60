//! Every metric name, in one place. Names are `portcullis.<what>` with label
//! values spelled in (`portcullis.provider.<name>.<what>`); Envoy shows them
//! as `wasmcustom.<name>`, and the bootstrap's `stats_tags` turn the parts
//! into Prometheus labels. A label value is escaped by [`label`], so a dot
//! in a provider, model, client, experiment or arm name cannot shift a tag.

use portcullis_core::guard::{Act, Stage};
use portcullis_core::health::attempt::Cause;
use portcullis_core::health::breaker::State;
use std::cell::RefCell;

/// A label value inside a metric name: dots and whitespace would split it.
pub fn label(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    push_label(&mut out, v);
    out
}

/// [`label`], appended to a name being built (no allocation when the value
/// needs no escaping, as most do).
fn push_label(out: &mut String, v: &str) {
    let splits = |c: char| c == '.' || c.is_whitespace();
    if v.is_empty() {
        out.push_str("none");
    } else if !v.contains(splits) {
        out.push_str(v);
    } else {
        out.extend(v.chars().map(|c| if splits(c) { '_' } else { c }));
    }
}

/// Build a name in the worker's scratch buffer (`Worker::metric_name`)
/// and use it: the per-request metrics (several a request, each up to ~100
/// bytes) cost no allocation.
fn with_name<R>(
    scratch: &RefCell<String>,
    build: impl FnOnce(&mut String),
    then: impl FnOnce(&str) -> R,
) -> R {
    match scratch.try_borrow_mut() {
        Ok(mut buf) => {
            buf.clear();
            build(&mut buf);
            then(&buf)
        }
        Err(_) => {
            let mut buf = String::new();
            build(&mut buf);
            then(&buf)
        }
    }
}

pub const CACHE_HITS: &str = "portcullis.cache.hits";
pub const CACHE_MISSES: &str = "portcullis.cache.misses";
/// Hits answered from the worker's own copy (also counted in `hits`).
pub const CACHE_WORKER_HITS: &str = "portcullis.cache.worker_hits";
pub const CACHE_STORES: &str = "portcullis.cache.stores";
/// The fleet's tier (`cache.shared`): lookups it answered, lookups it
/// did not have, lookups that failed or timed out (each a miss), entries
/// sent to it, and entries not shared (the queue full, or the store call
/// failed).
pub const CACHE_SHARED_HITS: &str = "portcullis.cache.shared_hits";
pub const CACHE_SHARED_MISSES: &str = "portcullis.cache.shared_misses";
pub const CACHE_SHARED_ERRORS: &str = "portcullis.cache.shared_errors";
pub const CACHE_SHARED_STORES: &str = "portcullis.cache.shared_stores";
pub const CACHE_SHARED_DROPPED: &str = "portcullis.cache.shared_dropped";
/// The semantic tier (`cache.semantic`): prompts embedded to be looked up,
/// near-duplicates served, lookups that found none, lookups that failed
/// (no embedding, the tier not answering: each a miss), and requests of a
/// listed model that were not eligible (tools, images, conversations).
pub const CACHE_SEMANTIC_LOOKUPS: &str = "portcullis.cache.semantic_lookups";
pub const CACHE_SEMANTIC_HITS: &str = "portcullis.cache.semantic_hits";
pub const CACHE_SEMANTIC_MISSES: &str = "portcullis.cache.semantic_misses";
pub const CACHE_SEMANTIC_ERRORS: &str = "portcullis.cache.semantic_errors";
pub const CACHE_SEMANTIC_INELIGIBLE: &str = "portcullis.cache.semantic_ineligible";
pub const CACHE_EVICTIONS: &str = "portcullis.cache.evictions";
pub const CACHE_TOO_LARGE: &str = "portcullis.cache.too_large";
/// Gauge: bytes held by the cache table.
pub const CACHE_BYTES: &str = "portcullis.cache.bytes";
pub const FALLBACKS: &str = "portcullis.fallbacks";
/// Access tokens fetched from a token source (Vertex AI).
pub const TOKEN_FETCHES: &str = "portcullis.token_fetches";
/// Token fetches that failed, and waits that ran out (requests went on
/// without a token).
pub const TOKEN_FAILURES: &str = "portcullis.token_failures";
/// Histogram: providers tried, for requests that tried more than one.
pub const ATTEMPTS: &str = "portcullis.attempts";
pub const RATE_LIMITED: &str = "portcullis.rate_limited";
pub const LOG_DROPPED: &str = "portcullis.log.dropped";
pub const LOG_FLUSH_FAILURES: &str = "portcullis.log.flush_failures";
pub const LOG_RECORDS_SENT: &str = "portcullis.log.records_sent";
/// Output checks started on an answer (plain, streamed or a cache hit).
pub const GUARD_OUTPUT_CHECKS: &str = "portcullis.guardrail.output_checked";
/// Calls to external guards, their failures (errors, bad answers,
/// timeouts) and their latency (histogram, ms).
pub const GUARD_CALLS: &str = "portcullis.guardrail.guard_calls";
pub const GUARD_ERRORS: &str = "portcullis.guardrail.guard_errors";
pub const GUARD_LATENCY_MS: &str = "portcullis.guardrail.guard_latency_ms";
/// Vendor checks: messages sent to a vendor, messages whose kept verdict
/// served instead, and answers that flagged something.
pub const VENDOR_TEXTS_SENT: &str = "portcullis.guardrail.vendor_texts_sent";
pub const VENDOR_TEXTS_KEPT: &str = "portcullis.guardrail.vendor_texts_kept";
pub const VENDOR_FLAGGED: &str = "portcullis.guardrail.vendor_flagged";
/// Gauge: rises once per distinct applied config.
pub const CONFIG_GENERATION: &str = "portcullis.config_generation";

/// A check's verdicts: `portcullis.guardrail.stage.<stage>.check.<check>.<action>`
/// (action: deny, redact or log; `stage` and `check` become labels).
pub fn guardrail(stage: Stage, check: &str, act: Act) -> String {
    let stage = match stage {
        Stage::Input => "input",
        Stage::Output => "output",
    };
    let act = match act {
        Act::Deny => "deny",
        Act::Redact => "redact",
        Act::Log => "log",
    };
    format!(
        "portcullis.guardrail.stage.{stage}.check.{}.{act}",
        label(check)
    )
}

fn provider(name: &str, what: &str) -> String {
    format!("portcullis.provider.{}.{what}", label(name))
}

/// Gauge: the breaker's state (0 closed, 1 open, 2 half-open).
pub fn breaker_state(p: &str) -> String {
    provider(p, "breaker_state")
}

pub fn breaker_transition(p: &str, to: State) -> String {
    provider(p, &format!("breaker_to_{}", to.name()))
}

/// A failed attempt by error class: `portcullis.provider.<p>.class.<class>.failures`.
pub fn attempt_class(p: &str, class: &str) -> String {
    provider(p, &format!("class.{class}.failures"))
}

/// Gauge: a provider's adaptive concurrency limit.
pub fn concurrency_limit(p: &str) -> String {
    provider(p, "concurrency_limit")
}

/// Attempts that went to the next candidate because the provider was
/// paused or at its concurrency limit.
pub fn skipped_busy(p: &str) -> String {
    provider(p, "skipped_busy")
}

pub fn skipped_open(p: &str) -> String {
    provider(p, "skipped_open")
}

pub fn attempt_failure(p: &str, cause: Cause) -> String {
    provider(p, cause.metric())
}

/// Answers of a model no price layer prices (their cost is unknown, not 0).
pub fn unpriced(model: &str) -> String {
    format!("portcullis.unpriced_requests.model.{}.total", label(model))
}

pub fn experiment_requests(experiment: &str, arm: &str) -> String {
    format!(
        "portcullis.experiment_requests.experiment.{}.arm.{}.total",
        label(experiment),
        label(arm)
    )
}

fn status_class(status: u32) -> &'static str {
    match status {
        200..=299 => "2xx",
        400..=499 => "4xx",
        500..=599 => "5xx",
        _ => "other",
    }
}

/// `portcullis.requests.client.<c>.provider.<p>.model.<m>.status.<class>.cache.<c>.total`,
/// handed to `then` (built in the scratch buffer).
pub fn with_requests<R>(
    scratch: &RefCell<String>,
    client: &str,
    provider: &str,
    model: &str,
    status: u32,
    cache: &str,
    then: impl FnOnce(&str) -> R,
) -> R {
    with_name(
        scratch,
        |b| {
            b.push_str("portcullis.requests.client.");
            push_label(b, client);
            b.push_str(".provider.");
            push_label(b, provider);
            b.push_str(".model.");
            push_label(b, model);
            b.push_str(".status.");
            b.push_str(status_class(status));
            b.push_str(".cache.");
            push_label(b, cache);
            b.push_str(".total");
        },
        then,
    )
}

/// `portcullis.<what>.provider.<p>.model.<m>.total` (`what`: tokens_in or
/// tokens_out), handed to `then`.
pub fn with_tokens<R>(
    scratch: &RefCell<String>,
    what: &str,
    provider: &str,
    model: &str,
    then: impl FnOnce(&str) -> R,
) -> R {
    with_name(
        scratch,
        |b| {
            b.push_str("portcullis.");
            b.push_str(what);
            b.push_str(".provider.");
            push_label(b, provider);
            b.push_str(".model.");
            push_label(b, model);
            b.push_str(".total");
        },
        then,
    )
}

pub const TOKENS_IN: &str = "tokens_in";
pub const TOKENS_OUT: &str = "tokens_out";

/// A per-provider histogram's name (`portcullis.<family>.provider.<p>.<unit>`),
/// built in the worker's scratch buffer and handed to `then`.
fn with_provider_histogram<R>(
    scratch: &RefCell<String>,
    family: &str,
    provider: &str,
    unit: &str,
    then: impl FnOnce(&str) -> R,
) -> R {
    with_name(
        scratch,
        |b| {
            b.push_str("portcullis.");
            b.push_str(family);
            b.push_str(".provider.");
            push_label(b, provider);
            b.push('.');
            b.push_str(unit);
        },
        then,
    )
}

/// Histogram: the gateway's latency per answering provider
/// (`portcullis.latency.provider.<p>.ms`).
pub fn with_latency<R>(
    scratch: &RefCell<String>,
    provider: &str,
    then: impl FnOnce(&str) -> R,
) -> R {
    with_provider_histogram(scratch, "latency", provider, "ms", then)
}

/// Histogram: a stream's time to first token per answering provider
/// (`portcullis.ttft.provider.<p>.ms`).
pub fn with_ttft<R>(scratch: &RefCell<String>, provider: &str, then: impl FnOnce(&str) -> R) -> R {
    with_provider_histogram(scratch, "ttft", provider, "ms", then)
}

/// Histogram: a stream's time per output token after the first, per
/// answering provider (`portcullis.output_token.provider.<p>.us`).
pub fn with_output_token<R>(
    scratch: &RefCell<String>,
    provider: &str,
    then: impl FnOnce(&str) -> R,
) -> R {
    with_provider_histogram(scratch, "output_token", provider, "us", then)
}

#[cfg(test)]
pub fn requests(client: &str, provider: &str, model: &str, status: u32, cache: &str) -> String {
    with_requests(
        &RefCell::default(),
        client,
        provider,
        model,
        status,
        cache,
        str::to_string,
    )
}

/// Gauge: the Wasm linear memory of the filter's VMs, in bytes (each
/// worker's VM adds its own; it only grows, so flat means no leak).
pub const VM_MEMORY_BYTES: &str = "portcullis.vm_memory_bytes";

/// Calls to the rate limit service for `global` limits, and their outcomes.
pub const GLOBAL_CHECKS: &str = "portcullis.global.checks";
pub const GLOBAL_OVER_LIMIT: &str = "portcullis.global.over_limit";
/// `local_share`: requests admitted and refused by this replica's shares
/// while the service did not answer, and each worker's switches to its
/// shares and back to the service.
pub const GLOBAL_SHARE_ADMITTED: &str = "portcullis.global.share_admitted";
pub const GLOBAL_SHARE_REFUSED: &str = "portcullis.global.share_refused";
pub const GLOBAL_TO_SHARES: &str = "portcullis.global.to_shares";
pub const GLOBAL_TO_SERVICE: &str = "portcullis.global.to_service";
/// Failed calls (no answer, an error status, an answer that makes no
/// sense), by the failure mode that then decided.
pub fn global_errors(failure_mode: &str) -> String {
    format!("portcullis.global.errors.{failure_mode}")
}
/// The subset of errors that were the call's timeout, by failure mode.
pub fn global_timeouts(failure_mode: &str) -> String {
    format!("portcullis.global.timeouts.{failure_mode}")
}
/// Settlements (usage above a reservation) sent after the answer.
pub const GLOBAL_SETTLED: &str = "portcullis.global.settled";
/// Settlements dropped: the queue was full or the call failed.
pub const GLOBAL_SETTLE_DROPPED: &str = "portcullis.global.settle_dropped";

/// What kind of metric a name is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub enum Kind {
    Counter,
    Gauge,
    Histogram,
}

/// One name of every metric the gateway publishes (label values filled
/// with `x`), by kind: the native build declares each as Envoy's
/// dynamic-module ABI asks, up front with its label names
/// (`portcullis_core::telemetry::metric_tags`). A test checks every name above is here.
#[cfg_attr(target_arch = "wasm32", allow(dead_code))]
pub fn families() -> Vec<(Kind, String)> {
    use portcullis_core::config::GlobalFailure;
    let x = "x";
    let mut counters: Vec<String> = [
        CACHE_HITS,
        CACHE_MISSES,
        CACHE_WORKER_HITS,
        CACHE_STORES,
        CACHE_SHARED_HITS,
        CACHE_SHARED_MISSES,
        CACHE_SHARED_ERRORS,
        CACHE_SHARED_STORES,
        CACHE_SHARED_DROPPED,
        CACHE_SEMANTIC_LOOKUPS,
        CACHE_SEMANTIC_HITS,
        CACHE_SEMANTIC_MISSES,
        CACHE_SEMANTIC_ERRORS,
        CACHE_SEMANTIC_INELIGIBLE,
        CACHE_EVICTIONS,
        CACHE_TOO_LARGE,
        FALLBACKS,
        TOKEN_FETCHES,
        TOKEN_FAILURES,
        RATE_LIMITED,
        LOG_DROPPED,
        LOG_FLUSH_FAILURES,
        LOG_RECORDS_SENT,
        GUARD_OUTPUT_CHECKS,
        GUARD_CALLS,
        GUARD_ERRORS,
        VENDOR_TEXTS_SENT,
        VENDOR_TEXTS_KEPT,
        VENDOR_FLAGGED,
        GLOBAL_CHECKS,
        GLOBAL_OVER_LIMIT,
        GLOBAL_SHARE_ADMITTED,
        GLOBAL_SHARE_REFUSED,
        GLOBAL_TO_SHARES,
        GLOBAL_TO_SERVICE,
        GLOBAL_SETTLED,
        GLOBAL_SETTLE_DROPPED,
    ]
    .iter()
    .map(|n| n.to_string())
    .collect();
    for mode in [
        GlobalFailure::Allow,
        GlobalFailure::Deny,
        GlobalFailure::LocalShare,
    ] {
        counters.push(global_errors(mode.as_str()));
        counters.push(global_timeouts(mode.as_str()));
    }
    for stage in [Stage::Input, Stage::Output] {
        for act in [Act::Deny, Act::Redact, Act::Log] {
            counters.push(guardrail(stage, x, act));
        }
    }
    for to in [State::Closed, State::Open, State::HalfOpen] {
        counters.push(breaker_transition(x, to));
    }
    counters.push(attempt_class(x, x));
    counters.push(skipped_busy(x));
    counters.push(skipped_open(x));
    for cause in [
        Cause::Status(429),
        Cause::Status(500),
        Cause::Refused(400, portcullis_core::health::attempt::Class::Transient),
        Cause::ConnectFailure,
        Cause::Reset,
        Cause::Timeout,
    ] {
        counters.push(attempt_failure(x, cause));
    }
    counters.push(unpriced(x));
    counters.push(experiment_requests(x, x));
    let scratch = RefCell::default();
    counters.push(with_requests(&scratch, x, x, x, 200, x, str::to_string));
    for what in [TOKENS_IN, TOKENS_OUT] {
        counters.push(with_tokens(&scratch, what, x, x, str::to_string));
    }
    let gauges = [
        CACHE_BYTES.to_string(),
        CONFIG_GENERATION.to_string(),
        VM_MEMORY_BYTES.to_string(),
        breaker_state(x),
        concurrency_limit(x),
    ];
    let histograms = [
        ATTEMPTS.to_string(),
        GUARD_LATENCY_MS.to_string(),
        with_latency(&scratch, x, str::to_string),
        with_ttft(&scratch, x, str::to_string),
        with_output_token(&scratch, x, str::to_string),
    ];
    counters
        .into_iter()
        .map(|n| (Kind::Counter, n))
        .chain(gauges.into_iter().map(|n| (Kind::Gauge, n)))
        .chain(histograms.into_iter().map(|n| (Kind::Histogram, n)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every metric name this file declares is in `families` (the native
    /// build publishes only what it declared).
    #[test]
    fn every_declared_name_is_a_family() {
        let names: Vec<String> = families().into_iter().map(|(_, n)| n).collect();
        let source = include_str!("metrics.rs");
        for line in source.lines() {
            let Some(rest) = line.strip_prefix("pub const ") else {
                continue;
            };
            let Some((_, value)) = rest.split_once("= \"") else {
                continue;
            };
            let value = value.trim_end_matches("\";");
            if value.starts_with("portcullis.") {
                assert!(
                    names.iter().any(|n| n == value),
                    "{value} is not in families()"
                );
            }
        }
        // Each name is one kind only (Envoy keeps one metric per name).
        let mut bases: Vec<(String, Kind)> = families()
            .into_iter()
            .filter_map(|(k, n)| {
                portcullis_core::telemetry::metric_tags::split(&n).map(|(b, _)| (b, k))
            })
            .collect();
        bases.sort_by(|a, b| a.0.cmp(&b.0));
        for w in bases.windows(2) {
            if let [a, b] = w {
                assert!(a.0 != b.0 || a.1 == b.1, "{} is two kinds", a.0);
            }
        }
    }

    /// `stats_tags` cut names at dots: a raw `v1.2` arm once became two tags.
    #[test]
    fn label_values_with_dots_stay_one_label() {
        assert_eq!(
            experiment_requests("exp.a", "v1.2"),
            "portcullis.experiment_requests.experiment.exp_a.arm.v1_2.total"
        );
        assert_eq!(
            breaker_state("eu.primary"),
            "portcullis.provider.eu_primary.breaker_state"
        );
        assert_eq!(
            requests("", "p", "llama-3.1-8b", 503, "off"),
            "portcullis.requests.client.none.provider.p.model.llama-3_1-8b.status.5xx.cache.off.total"
        );
    }
}
