//! Parse and compile the plugin config (YAML or JSON) into [`crate::config`]'s
//! types: validate everything at once, and either return a complete
//! [`Gateway`] or one error listing every problem found; the host swaps a
//! new config in only on success. The steps, each in its own file: unknown
//! keys (`known_keys`, from the serde structs in `raw`), then `build`:
//! providers and models (`models`, with the provider presets of `presets`),
//! clients and their limits (`clients`), prices, experiments, cache and log
//! (`sections`), guardrails (`guardrails`), routing policy (`policy`).
//!
//! It sits above the provider formats, the translation matrix and the price
//! table (it checks a model's API against [`crate::translate::reach`] and
//! its prices against [`crate::pricing`]); none of them imports it.
//!
//! May use: `api`, `cache`, `config`, `guard`, `health`, `limits`, `mcp`, `pricing`, `providers`, `shared`, `translate`, `wire`.

mod build;
mod clients;
mod guardrails;
mod known_keys;
mod mcp;
pub use known_keys::section_keys;
mod models;
mod policy;
pub mod presets;
mod raw;
mod sections;
#[cfg(test)]
mod tenancy_tests;
#[cfg(test)]
pub(crate) mod tests;

pub(crate) use crate::config::*;
use raw::RawConfig;
use serde_yaml::Value;
use std::fmt::Write as _;

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
    known_keys::check(&mut value, &mut problems);
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
    build::build(raw, &mut problems)
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

pub(crate) fn valid_env_name(s: &str) -> bool {
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
