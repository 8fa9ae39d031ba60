//! `guardrails`: every check compiled at load (regular expressions, the
//! JSON schema subset, names to indexes), every problem reported with the
//! rest of the config's.

use super::raw::{RawCheck, RawConfig, RawExternal};
use crate::guard::{
    pii::Pii, schema::Schema, Act, Bounds, Check, External, Guardrails, Kind, Stage,
    DEFAULT_DENY_STATUS, DEFAULT_LOOKBEHIND,
};
use hashbrown::{HashMap, HashSet};

/// Compiled size a regular expression may take (bounds memory per VM).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Longest look-behind a stream may hold per choice.
const MAX_LOOKBEHIND: usize = 64 << 10;

pub(super) fn guardrails(
    raw: &RawConfig,
    names: &HashMap<String, usize>,
    problems: &mut Vec<String>,
) -> Option<Guardrails> {
    let g = raw.guardrails.as_ref()?;
    let deny_status = g.deny_status.unwrap_or(DEFAULT_DENY_STATUS);
    if !(400..=599).contains(&deny_status) {
        problems.push(format!(
            "guardrails.deny_status must be an error status (400-599), got {deny_status}"
        ));
    }
    let lookbehind = g.lookbehind_bytes.unwrap_or(DEFAULT_LOOKBEHIND);
    if lookbehind == 0 || lookbehind > MAX_LOOKBEHIND {
        problems.push(format!(
            "guardrails.lookbehind_bytes must be between 1 and {MAX_LOOKBEHIND}"
        ));
    }
    let clients: HashSet<&str> = raw.clients.iter().map(|c| c.name.as_str()).collect();
    let cx = Cx {
        names,
        clients: &clients,
    };
    let compile_all = |stage: Stage, list: &[RawCheck], problems: &mut Vec<String>| {
        // Names are unique within a stage (the record and metrics say which).
        let mut seen = HashSet::new();
        let mut out = Vec::new();
        for (i, c) in list.iter().enumerate() {
            let stage_name = match stage {
                Stage::Input => "input",
                Stage::Output => "output",
            };
            let at = format!("guardrails.{stage_name}[{i}] ({})", c.name);
            if c.name.trim().is_empty() {
                problems.push(format!("guardrails.{stage_name}[{i}]: `name` is empty"));
            } else if !seen.insert(c.name.clone()) {
                problems.push(format!("{at}: duplicate check name"));
            }
            if let Some(check) = check(&at, stage, c, &cx, problems) {
                out.push(check);
            }
        }
        out
    };
    let input = compile_all(Stage::Input, &g.input, problems);
    let output = compile_all(Stage::Output, &g.output, problems);
    Some(Guardrails {
        input,
        output,
        deny_status,
        lookbehind,
        include_content: g.include_content,
    })
}

struct Cx<'a> {
    names: &'a HashMap<String, usize>,
    clients: &'a HashSet<&'a str>,
}

impl Cx<'_> {
    fn models(
        &self,
        at: &str,
        key: &str,
        list: &[String],
        problems: &mut Vec<String>,
    ) -> Vec<usize> {
        let mut out = Vec::new();
        for m in list {
            match self.names.get(m) {
                Some(&i) => out.push(i),
                None => problems.push(format!(
                    "{at}.{key}: `{m}` is not a model any provider serves"
                )),
            }
        }
        out
    }
}

fn check(
    at: &str,
    stage: Stage,
    c: &RawCheck,
    cx: &Cx<'_>,
    problems: &mut Vec<String>,
) -> Option<Check> {
    let act = match c.action.as_deref() {
        None => Act::Deny,
        Some(a) => Act::parse(a).or_else(|| {
            problems.push(format!(
                "{at}.action: `{a}` is not an action (expected deny, redact or log)"
            ));
            None
        })?,
    };
    if let Some(list) = &c.clients {
        for name in list.iter().filter(|n| !cx.clients.contains(n.as_str())) {
            problems.push(format!("{at}.clients: `{name}` is not a client"));
        }
    }
    let models = c
        .models
        .as_ref()
        .map(|m| cx.models(at, "models", m, problems));
    let kind = kind(at, stage, c, cx, problems)?;
    let redactable = matches!(kind, Kind::Regex(_) | Kind::Pii(_));
    if act == Act::Redact && !redactable {
        problems.push(format!(
            "{at}: `redact` needs text to replace (regex or pii checks); use deny or log"
        ));
    }
    Some(Check {
        name: c.name.clone(),
        kind,
        act,
        clients: c.clients.clone(),
        models,
    })
}

/// The check's one kind.
fn kind(
    at: &str,
    stage: Stage,
    c: &RawCheck,
    cx: &Cx<'_>,
    problems: &mut Vec<String>,
) -> Option<Kind> {
    let bounds = c.min_words.is_some() || c.max_words.is_some() || c.max_tokens.is_some();
    let models = c.allow_models.is_some() || c.deny_models.is_some();
    let given = [
        ("regex", c.regex.is_some()),
        ("pii", c.pii.is_some()),
        ("min_words/max_words/max_tokens", bounds),
        ("allow_models/deny_models", models),
        ("json_schema", c.json_schema.is_some()),
        ("external", c.external.is_some()),
    ];
    let kinds: Vec<&str> = given
        .iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| *k)
        .collect();
    if kinds.len() != 1 {
        problems.push(format!(
            "{at}: a check needs exactly one of regex, pii, min_words/max_words/max_tokens, allow_models/deny_models, json_schema, external (got {})",
            if kinds.is_empty() { "none".to_string() } else { kinds.join(", ") }
        ));
        return None;
    }
    if let Some(re) = &c.regex {
        return match regex::RegexBuilder::new(re)
            .size_limit(REGEX_SIZE_LIMIT)
            .build()
        {
            Ok(re) => Some(Kind::Regex(re)),
            Err(e) => {
                let e = e.to_string().replace('\n', " ");
                problems.push(format!("{at}.regex: not a valid regular expression: {e}"));
                None
            }
        };
    }
    if let Some(list) = &c.pii {
        let mut kinds = Vec::new();
        for p in list {
            match (p.as_str(), Pii::parse(p)) {
                ("all", _) => kinds.extend(Pii::ALL),
                (_, Some(k)) => kinds.push(k),
                (_, None) => problems.push(format!(
                    "{at}.pii: `{p}` is not a built-in pattern (expected all, email, phone, card, iban, api_key)"
                )),
            }
        }
        if list.is_empty() {
            problems.push(format!("{at}.pii: list at least one pattern (or `all`)"));
        }
        kinds.dedup();
        return Some(Kind::Pii(kinds));
    }
    if bounds {
        if c.min_words
            .is_some_and(|min| c.max_words.is_some_and(|max| min > max))
        {
            problems.push(format!("{at}: `min_words` is above `max_words`"));
        }
        return Some(Kind::Bounds(Bounds {
            min_words: c.min_words,
            max_words: c.max_words,
            max_tokens: c.max_tokens,
        }));
    }
    if models {
        if stage == Stage::Output {
            problems.push(format!("{at}: model checks run on input only"));
        }
        let allow = c
            .allow_models
            .as_ref()
            .map(|m| cx.models(at, "allow_models", m, problems));
        let deny = c
            .deny_models
            .as_ref()
            .map(|m| cx.models(at, "deny_models", m, problems))
            .unwrap_or_default();
        return Some(Kind::Models { allow, deny });
    }
    if let Some(schema) = &c.json_schema {
        if stage == Stage::Input {
            problems.push(format!("{at}: json_schema checks run on output only"));
        }
        let value = match serde_json::to_value(schema) {
            Ok(v) => v,
            Err(e) => {
                problems.push(format!("{at}.json_schema: not a JSON value: {e}"));
                return None;
            }
        };
        return Some(Kind::Schema(Schema::compile(
            &value,
            &format!("{at}.json_schema"),
            problems,
        )));
    }
    let e = c.external.as_ref()?;
    if stage == Stage::Output {
        problems.push(format!("{at}: external checks run on input only"));
    }
    Some(Kind::External(external(at, e, problems)))
}

fn external(at: &str, e: &RawExternal, problems: &mut Vec<String>) -> External {
    if e.cluster.trim().is_empty() {
        problems.push(format!(
            "{at}.external.cluster is empty (name the guard's Envoy cluster)"
        ));
    }
    if !e.path.starts_with('/') {
        problems.push(format!("{at}.external.path must start with `/`"));
    }
    if e.timeout_ms == 0 {
        problems.push(format!("{at}.external.timeout_ms must be at least 1"));
    }
    let deny_on_failure = match e.failure_mode.as_str() {
        "allow" => false,
        "deny" => true,
        other => {
            problems.push(format!(
                "{at}.external.failure_mode: `{other}` is not allow or deny"
            ));
            false
        }
    };
    External {
        cluster: e.cluster.clone(),
        path: e.path.clone(),
        authority: e.authority.clone().unwrap_or_else(|| e.cluster.clone()),
        timeout_ms: e.timeout_ms,
        deny_on_failure,
    }
}
