//! `guardrails`: every check compiled at load (regular expressions, the
//! JSON schema subset, names to indexes), every problem reported with the
//! rest of the config's.

use super::raw::{RawCheck, RawConfig, RawExternal, RawVendor};
use crate::guard::vendor::{self, Vendor};
use crate::guard::{
    pii::Pii, schema::Schema, Act, Bounds, Check, External, Guardrails, Kind, Stage,
    DEFAULT_DENY_STATUS, DEFAULT_LOOKBEHIND,
};
use hashbrown::{HashMap, HashSet};

/// Compiled size a regular expression may take (bounds memory per VM).
const REGEX_SIZE_LIMIT: usize = 1 << 20;
/// Longest look-behind a stream may hold per choice.
const MAX_LOOKBEHIND: usize = 64 << 10;
/// How long a vendor's verdict on a message is kept by default, and at most.
const DEFAULT_VERDICT_TTL_S: u64 = 600;
const MAX_VERDICT_TTL_S: u64 = 86_400;

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
    let mut input = compile_all(Stage::Input, &g.input, problems);
    let mut output = compile_all(Stage::Output, &g.output, problems);
    team_overrides(raw, &mut input, &mut output, problems);
    let verdict_ttl_s = g.vendor_verdict_ttl_s.unwrap_or(DEFAULT_VERDICT_TTL_S);
    if verdict_ttl_s > MAX_VERDICT_TTL_S {
        problems.push(format!(
            "guardrails.vendor_verdict_ttl_s must be at most {MAX_VERDICT_TTL_S} (a day)"
        ));
    }
    Some(Guardrails {
        input,
        output,
        deny_status,
        lookbehind,
        include_content: g.include_content,
        verdict_ttl_ms: verdict_ttl_s.saturating_mul(1000),
    })
}

/// `teams[].guardrails`: a team's own action for a check, compiled into
/// the checks themselves (no cost per request): the check no longer applies
/// to the team's keys, and a copy with the team's action applies to them
/// only (`off`: no copy).
fn team_overrides(
    raw: &RawConfig,
    input: &mut Vec<Check>,
    output: &mut Vec<Check>,
    problems: &mut Vec<String>,
) {
    for (t, team) in raw.teams.iter().enumerate() {
        let Some(over) = &team.guardrails else {
            continue;
        };
        let members: Vec<String> = raw
            .clients
            .iter()
            .filter(|c| c.team.as_deref() == Some(team.name.as_str()))
            .map(|c| c.name.clone())
            .collect();
        for (name, action) in over {
            let at = format!("teams[{t}] ({}).guardrails.{name}", team.name);
            let act = match action.as_str() {
                "off" => None,
                a => match Act::parse(a) {
                    Some(act) => Some(act),
                    None => {
                        problems.push(format!(
                            "{at}: `{a}` is not an action (expected deny, redact, log or off)"
                        ));
                        continue;
                    }
                },
            };
            let mut found = false;
            for list in [&mut *input, &mut *output] {
                let Some(i) = list.iter().position(|c| &c.name == name) else {
                    continue;
                };
                found = true;
                let Some(check) = list.get_mut(i) else {
                    continue;
                };
                // The team's keys the check applied to.
                let theirs: Vec<String> = members
                    .iter()
                    .filter(|m| check.for_client(m))
                    .cloned()
                    .collect();
                check.except.extend(theirs.iter().cloned());
                let Some(act) = act else {
                    continue;
                };
                if act == Act::Redact && !redactable(&check.kind) {
                    problems.push(format!(
                        "{at}: `redact` needs text to replace, and check `{name}` names none; use deny or log"
                    ));
                    continue;
                }
                let mut copy = check.clone();
                copy.act = act;
                copy.clients = Some(theirs);
                copy.except.clear();
                if let Kind::External(e) = &mut copy.kind {
                    e.fingerprint = fingerprint(&copy.name, act, e);
                }
                list.insert(i.saturating_add(1), copy);
            }
            if !found {
                problems.push(format!("{at}: `{name}` is not a guardrail check"));
            }
        }
    }
}

/// Whether a check's kind names text to replace (`redact` needs it).
fn redactable(kind: &Kind) -> bool {
    match kind {
        Kind::Regex(_) | Kind::Pii(_) => true,
        Kind::External(e) => e.vendor.as_ref().is_none_or(Vendor::redacts),
        _ => false,
    }
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
    if act == Act::Redact && !redactable(&kind) {
        problems.push(format!(
            "{at}: `redact` needs text to replace (regex, pii, external checks and the vendors that name what to replace: bedrock_guardrails, model_armor, lakera_guard, presidio); use deny or log"
        ));
    }
    let kind = match kind {
        Kind::External(mut e) => {
            // A changed check (its action included) asks again.
            e.fingerprint = fingerprint(&c.name, act, &e);
            Kind::External(e)
        }
        k => k,
    };
    Some(Check {
        name: c.name.clone(),
        kind,
        act,
        clients: c.clients.clone(),
        except: Vec::new(),
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
        ("vendor", c.vendor.is_some()),
    ];
    let kinds: Vec<&str> = given
        .iter()
        .filter(|(_, on)| *on)
        .map(|(k, _)| *k)
        .collect();
    if kinds.len() != 1 {
        problems.push(format!(
            "{at}: a check needs exactly one of regex, pii, min_words/max_words/max_tokens, allow_models/deny_models, json_schema, external, vendor (got {})",
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
    if let Some(v) = &c.vendor {
        return vendor_check(&format!("{at}.vendor"), stage, v, problems).map(Kind::External);
    }
    let e = c.external.as_ref()?;
    if stage == Stage::Output {
        problems.push(format!("{at}: external checks run on input only"));
    }
    Some(Kind::External(external(at, e, problems)))
}

fn fingerprint(name: &str, act: Act, e: &External) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(name.as_bytes());
    h.write(format!("{act:?}|{}|{}|{:?}", e.cluster, e.authority, e.vendor).as_bytes());
    h.finish()
}

/// What a vendor check names, checked: every problem listed.
fn vendor_check(
    at: &str,
    stage: Stage,
    v: &RawVendor,
    problems: &mut Vec<String>,
) -> Option<External> {
    let start = problems.len();
    let need = |key: &str, val: &Option<String>, problems: &mut Vec<String>| -> String {
        match val.as_deref().map(str::trim) {
            Some(s) if !s.is_empty() => s.to_string(),
            _ => {
                problems.push(format!("{at}.{key} is required for `{}`", v.kind));
                String::new()
            }
        }
    };
    // Keys of one vendor set on another are mistakes worth naming.
    let given: [(&str, bool); 13] = [
        ("guardrail_id", v.guardrail_id.is_some()),
        ("guardrail_version", v.guardrail_version.is_some()),
        ("region", v.region.is_some()),
        ("aws_env_prefix", v.aws_env_prefix.is_some()),
        ("api_version", v.api_version.is_some()),
        ("thresholds", v.thresholds.is_some()),
        ("project", v.project.is_some()),
        ("location", v.location.is_some()),
        ("template", v.template.is_some()),
        ("model", v.model.is_some()),
        ("project_id", v.project_id.is_some()),
        ("language", v.language.is_some()),
        (
            "entities",
            v.entities.is_some() || v.score_threshold.is_some(),
        ),
    ];
    let allowed: &[&str] = match v.kind.as_str() {
        "bedrock_guardrails" => &[
            "guardrail_id",
            "guardrail_version",
            "region",
            "aws_env_prefix",
        ],
        "azure_content_safety" => &["api_version", "thresholds"],
        "azure_prompt_shields" => &["api_version"],
        "model_armor" => &["project", "location", "template"],
        "openai_moderation" => &["model", "thresholds"],
        "lakera_guard" => &["project_id"],
        "presidio" => &["language", "entities"],
        other => {
            problems.push(format!(
                "{at}.kind: `{other}` is not a vendor (expected bedrock_guardrails, azure_content_safety, azure_prompt_shields, model_armor, openai_moderation, lakera_guard or presidio)"
            ));
            return None;
        }
    };
    for (key, on) in given {
        if on && !allowed.contains(&key) {
            let key = if key == "entities" {
                "entities/score_threshold"
            } else {
                key
            };
            problems.push(format!("{at}.{key} does not apply to `{}`", v.kind));
        }
    }
    let thresholds = v.thresholds.clone().unwrap_or_default();
    let vendor = match v.kind.as_str() {
        "bedrock_guardrails" => {
            if v.api_key_env.is_some() {
                problems.push(format!(
                    "{at}: `bedrock_guardrails` signs with AWS credentials: use `aws_env_prefix` (or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY in Envoy's environment) instead of `api_key_env`"
                ));
            }
            Vendor::Bedrock {
                guardrail_id: need("guardrail_id", &v.guardrail_id, problems),
                version: need("guardrail_version", &v.guardrail_version, problems),
                region: need("region", &v.region, problems),
                env_prefix: v.aws_env_prefix.clone().unwrap_or_default(),
            }
        }
        "azure_content_safety" => {
            let mut list = Vec::new();
            for (cat, sev) in &thresholds {
                let Some(name) = vendor::AZURE_CATEGORIES
                    .iter()
                    .find(|c| c.eq_ignore_ascii_case(cat))
                else {
                    problems.push(format!(
                        "{at}.thresholds: `{cat}` is not a category (expected Hate, SelfHarm, Sexual, Violence)"
                    ));
                    continue;
                };
                if !(0.0..=7.0).contains(sev) || sev.fract() != 0.0 {
                    problems.push(format!(
                        "{at}.thresholds.{cat}: a severity is a whole number from 0 to 7"
                    ));
                    continue;
                }
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                list.push(((*name).to_string(), *sev as u32));
            }
            Vendor::AzureAnalyze {
                api_version: v
                    .api_version
                    .clone()
                    .unwrap_or_else(|| vendor::AZURE_API_VERSION.into()),
                thresholds: list,
            }
        }
        "azure_prompt_shields" => Vendor::AzureShields {
            api_version: v
                .api_version
                .clone()
                .unwrap_or_else(|| vendor::AZURE_API_VERSION.into()),
        },
        "model_armor" => Vendor::ModelArmor {
            project: need("project", &v.project, problems),
            location: need("location", &v.location, problems),
            template: need("template", &v.template, problems),
        },
        "openai_moderation" => {
            let mut list = Vec::new();
            for (cat, score) in &thresholds {
                if !(0.0..=1.0).contains(score) {
                    problems.push(format!("{at}.thresholds.{cat}: a score is between 0 and 1"));
                }
                list.push((cat.clone(), *score));
            }
            Vendor::OpenAiModeration {
                model: v
                    .model
                    .clone()
                    .unwrap_or_else(|| vendor::OPENAI_MODERATION_MODEL.into()),
                thresholds: list,
            }
        }
        "lakera_guard" => Vendor::Lakera {
            project_id: v.project_id.clone(),
        },
        _ => {
            if v.score_threshold.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
                problems.push(format!("{at}.score_threshold: a score is between 0 and 1"));
            }
            Vendor::Presidio {
                language: v.language.clone().unwrap_or_else(|| "en".into()),
                entities: v.entities.clone().unwrap_or_default(),
                score_threshold: v.score_threshold,
            }
        }
    };
    let needs_key = matches!(
        vendor.auth(),
        vendor::Auth::Bearer | vendor::Auth::Header(_)
    );
    match &v.api_key_env {
        Some(env) if !super::valid_env_name(env) => problems.push(format!(
            "{at}.api_key_env: `{env}` is not an environment variable name"
        )),
        None if needs_key => problems.push(format!(
            "{at}.api_key_env is required for `{}` (the variable holding its key; never the key itself)",
            v.kind
        )),
        _ => {}
    }
    if v.cluster.trim().is_empty() {
        problems.push(format!(
            "{at}.cluster is empty (name the vendor's Envoy cluster)"
        ));
    }
    let timeout_ms = v.timeout_ms.unwrap_or(DEFAULT_VENDOR_TIMEOUT_MS);
    if timeout_ms == 0 {
        problems.push(format!("{at}.timeout_ms must be at least 1"));
    }
    let deny_on_failure = match v.failure_mode.as_str() {
        "allow" => false,
        "deny" => true,
        other => {
            problems.push(format!("{at}.failure_mode: `{other}` is not allow or deny"));
            false
        }
    };
    if problems.len() > start {
        return None;
    }
    let credential_env = match &vendor {
        Vendor::Bedrock { env_prefix, .. } => Some(env_prefix.clone()),
        _ => v.api_key_env.clone(),
    };
    Some(External {
        cluster: v.cluster.clone(),
        path: vendor.path(stage),
        authority: v
            .authority
            .clone()
            .unwrap_or_else(|| vendor.default_authority(&v.cluster)),
        timeout_ms,
        deny_on_failure,
        vendor: Some(vendor),
        credential_env,
        fingerprint: 0,
    })
}

/// A vendor's default time to answer.
const DEFAULT_VENDOR_TIMEOUT_MS: u64 = 500;

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
        vendor: None,
        credential_env: None,
        fingerprint: 0,
    }
}
