//! Unknown keys, all reported in one pass (serde stops at the first), and
//! removed so the typed parse and the cross-reference checks still run. The
//! keys each section accepts are read from its serde struct, so the structs
//! in `raw` are the only list: a new field is a known key at once.

use super::raw::{
    RawArm, RawBreaker, RawBudget, RawBudgetLow, RawCache, RawCheck, RawClient, RawClientLimits,
    RawConcurrency, RawConfig, RawExperiment, RawExternal, RawFastest, RawGlobal, RawGuardrails,
    RawLog, RawMatch, RawMcp, RawMcpAccess, RawMcpCredential, RawMcpOauth, RawMcpServer, RawModel,
    RawPrice, RawProvider, RawRetries, RawRouting, RawRule, RawTeam, RawTesting, RawVendor,
};
use serde::de::{self, DeserializeOwned, Deserializer, Visitor};
use serde_yaml::Value;
use std::cell::Cell;

/// A deserializer that only records the field names serde's derive passes
/// to `deserialize_struct`, then stops.
struct FieldNames(Cell<&'static [&'static str]>);

impl<'de> Deserializer<'de> for &FieldNames {
    type Error = de::value::Error;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("not a struct"))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.set(fields);
        Err(de::Error::custom("field names only"))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
        byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
        identifier ignored_any
    }
}

/// The keys a serde struct accepts.
fn fields<T: DeserializeOwned>() -> Vec<&'static str> {
    let names = FieldNames(Cell::new(&[]));
    let _ = T::deserialize(&names);
    names.0.get().to_vec()
}

/// `limits` flattens the per-client limits next to its own key.
fn limits_keys() -> Vec<&'static str> {
    let mut keys = vec![
        "global",
        "budget_utc_offset",
        "user_header",
        "max_users_per_key",
    ];
    keys.extend(fields::<RawClientLimits>());
    keys
}

/// Each section: where it sits (`name[]` for every item of a list, `*` for
/// every value of a map) and the keys it accepts.
type Keys = fn() -> Vec<&'static str>;
const SECTIONS: &[(&[&str], Keys)] = &[
    (&[], fields::<RawConfig>),
    (&["providers[]"], fields::<RawProvider>),
    (&["providers[]", "breaker"], fields::<RawBreaker>),
    (&["providers[]", "retries"], fields::<RawRetries>),
    (&["providers[]", "concurrency"], fields::<RawConcurrency>),
    (&["providers[]", "models[]"], fields::<RawModel>),
    (&["routing"], fields::<RawRouting>),
    (&["routing", "fastest"], fields::<RawFastest>),
    (&["routing", "routes[]"], fields::<RawRule>),
    (&["routing", "routes[]", "match"], fields::<RawMatch>),
    (&["providers[]", "models[]", "price"], fields::<RawPrice>),
    (&["clients[]"], fields::<RawClient>),
    (&["clients[]", "limits"], fields::<RawClientLimits>),
    (&["prices", "*"], fields::<RawPrice>),
    (&["experiments[]"], fields::<RawExperiment>),
    (&["experiments[]", "arms[]"], fields::<RawArm>),
    (&["breaker"], fields::<RawBreaker>),
    (&["cache"], fields::<RawCache>),
    (&["log"], fields::<RawLog>),
    (&["limits"], limits_keys),
    (&["limits", "global"], fields::<RawGlobal>),
    (&["limits", "budgets[]"], fields::<RawBudget>),
    (&["limits", "on_budget_low"], fields::<RawBudgetLow>),
    (
        &["clients[]", "limits", "on_budget_low"],
        fields::<RawBudgetLow>,
    ),
    (
        &["teams[]", "limits", "on_budget_low"],
        fields::<RawBudgetLow>,
    ),
    (&["clients[]", "limits", "budgets[]"], fields::<RawBudget>),
    (&["limits", "per_user"], fields::<RawClientLimits>),
    (&["limits", "per_user", "budgets[]"], fields::<RawBudget>),
    (
        &["clients[]", "limits", "per_user"],
        fields::<RawClientLimits>,
    ),
    (
        &["clients[]", "limits", "per_user", "budgets[]"],
        fields::<RawBudget>,
    ),
    (&["teams[]"], fields::<RawTeam>),
    (&["teams[]", "limits"], fields::<RawClientLimits>),
    (&["teams[]", "limits", "budgets[]"], fields::<RawBudget>),
    (&["testing"], fields::<RawTesting>),
    (&["mcp"], fields::<RawMcp>),
    (&["mcp", "servers[]"], fields::<RawMcpServer>),
    (&["mcp", "oauth"], fields::<RawMcpOauth>),
    (
        &["mcp", "servers[]", "credential"],
        fields::<RawMcpCredential>,
    ),
    (&["clients[]", "mcp"], fields::<RawMcpAccess>),
    (&["teams[]", "mcp"], fields::<RawMcpAccess>),
    (&["guardrails"], fields::<RawGuardrails>),
    (&["guardrails", "input[]"], fields::<RawCheck>),
    (&["guardrails", "output[]"], fields::<RawCheck>),
    (
        &["guardrails", "input[]", "external"],
        fields::<RawExternal>,
    ),
    (
        &["guardrails", "output[]", "external"],
        fields::<RawExternal>,
    ),
    (&["guardrails", "input[]", "vendor"], fields::<RawVendor>),
    (&["guardrails", "output[]", "vendor"], fields::<RawVendor>),
];

/// The keys the section at `path` accepts (as in [`SECTIONS`]: `[]` is
/// "providers[]"), for tests that check what the compiler reports.
pub fn section_keys(path: &[&str]) -> Option<Vec<&'static str>> {
    SECTIONS
        .iter()
        .find(|(p, _)| *p == path)
        .map(|(_, keys)| keys())
}

pub(super) fn check(v: &mut Value, problems: &mut Vec<String>) {
    untag(v, "", problems);
    if !v.is_mapping() {
        problems.push(
            "plugin config must be a mapping with `providers`, `routing`, `clients`, `limits`"
                .into(),
        );
        return;
    }
    for (path, keys) in SECTIONS {
        check_at(v, path, String::new(), &keys(), problems);
    }
}

/// YAML tags (`!name`) mean nothing in the plugin config, and a tagged
/// mapping would slip past the key checks: each is reported, then removed
/// so the rest is still checked.
fn untag(v: &mut Value, at: &str, problems: &mut Vec<String>) {
    if let Value::Tagged(t) = v {
        let place = if at.is_empty() { "config" } else { at };
        problems.push(format!(
            "{place}: YAML tag `{}` is not accepted (remove it)",
            t.tag
        ));
        let inner = std::mem::replace(&mut t.value, Value::Null);
        *v = inner;
        return untag(v, at, problems);
    }
    match v {
        Value::Mapping(m) => {
            for (k, child) in m.iter_mut() {
                untag(child, &join(at, k.as_str().unwrap_or("?")), problems);
            }
        }
        Value::Sequence(items) => {
            for (i, item) in items.iter_mut().enumerate() {
                untag(item, &format!("{at}[{i}]"), problems);
            }
        }
        _ => {}
    }
}

fn join(at: &str, name: &str) -> String {
    if at.is_empty() {
        name.to_string()
    } else {
        format!("{at}.{name}")
    }
}

fn check_at(
    v: &mut Value,
    path: &[&str],
    at: String,
    allowed: &[&str],
    problems: &mut Vec<String>,
) {
    let Some((seg, rest)) = path.split_first() else {
        let at = if at.is_empty() {
            "config".to_string()
        } else {
            at
        };
        return unknown_keys(v, &at, allowed, problems);
    };
    if *seg == "*" {
        if let Value::Mapping(m) = v {
            for (k, child) in m.iter_mut() {
                let at = join(&at, k.as_str().unwrap_or("?"));
                check_at(child, rest, at, allowed, problems);
            }
        }
    } else if let Some(name) = seg.strip_suffix("[]") {
        if let Some(Value::Sequence(items)) = v.get_mut(name) {
            for (i, item) in items.iter_mut().enumerate() {
                let at = format!("{}[{i}]", join(&at, name));
                check_at(item, rest, at, allowed, problems);
            }
        }
    } else if let Some(child) = v.get_mut(*seg) {
        check_at(child, rest, join(&at, seg), allowed, problems);
    }
}

/// Report and remove the keys of one mapping that are not `allowed`.
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

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// The key lists come from the serde structs themselves.
    #[test]
    fn keys_are_the_serde_fields() {
        assert_eq!(fields::<RawRouting>()[..2], ["chain", "max_attempts"]);
        assert_eq!(
            fields::<RawPrice>(),
            [
                "input",
                "output",
                "cached_input",
                "cache_write",
                "reasoning",
                "input_audio",
                "output_audio",
                "per_image",
                "per_audio_minute",
                "per_million_characters",
                "per_thousand_searches"
            ]
        );
        assert!(limits_keys().contains(&"max_body_bytes"));
        assert!(limits_keys().contains(&"tokens_per_minute"));
        assert!(fields::<RawConfig>().contains(&"experiments"));
    }
}
