//! Content-safety services operators already pay for, as guard checks:
//! each vendor's request built from the texts to check and its answer read
//! as the vendor documents it, into one [`Finding`]. Pure: the host layer
//! sends the request (signing or adding the credential) and hands the
//! answer back.
//!
//! | vendor | call | verdict read from |
//! |---|---|---|
//! | AWS Bedrock Guardrails | `POST /guardrail/{id}/version/{v}/apply` (`source` INPUT/OUTPUT, one `content` block per text), SigV4 | `action` `GUARDRAIL_INTERVENED`; a policy's `BLOCKED` is a deny, `ANONYMIZED` PII (`match`) a redaction |
//! | Azure AI Content Safety | `POST /contentsafety/text:analyze?api-version=…` (10,000 characters a call), `Ocp-Apim-Subscription-Key` | `categoriesAnalysis[].severity` at or above the category's threshold |
//! | Azure Prompt Shields | `POST /contentsafety/text:shieldPrompt?api-version=…` (`userPrompt`, tool results as `documents`) | `userPromptAnalysis.attackDetected`, `documentsAnalysis[].attackDetected` |
//! | Google Model Armor | `POST /v1/projects/{p}/locations/{l}/templates/{t}:sanitizeUserPrompt` (or `:sanitizeModelResponse`), bearer token | `sanitizationResult.filterMatchState` `MATCH_FOUND`; only sensitive-data findings (`byteRange`) are redactable |
//! | OpenAI moderation | `POST /v1/moderations` (`model`, `input` as strings), bearer key | `results[].category_scores` at or above a threshold, else `flagged` |
//! | Lakera Guard | `POST /v2/guard` (`messages`, `project_id`, `breakdown`, `payload`), bearer key | `flagged`; `breakdown[]` detectors; `payload[]` PII spans redactable |
//! | Presidio analyzer | `POST /analyze` (`text`, `language`, `entities`, `score_threshold`) | each entity (`start`/`end` in characters) is a redaction |

use super::Stage;
use serde::Serialize;
use serde_json::{json, Value};

/// Which vendor a check asks, and what it needs besides the cluster.
#[derive(Debug, Clone, PartialEq)]
pub enum Vendor {
    Bedrock {
        guardrail_id: String,
        version: String,
        region: String,
        /// Prefix of the `AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY` variables.
        env_prefix: String,
    },
    AzureAnalyze {
        api_version: String,
        /// (category, severity at which it is flagged).
        thresholds: Vec<(String, u32)>,
    },
    AzureShields {
        api_version: String,
    },
    ModelArmor {
        project: String,
        location: String,
        template: String,
    },
    OpenAiModeration {
        model: String,
        /// (category, score at which it is flagged); none: the vendor's `flagged`.
        thresholds: Vec<(String, f64)>,
    },
    Lakera {
        project_id: Option<String>,
    },
    Presidio {
        language: String,
        entities: Vec<String>,
        score_threshold: Option<f64>,
    },
}

/// How a vendor's calls are authorized (the value comes from the VM
/// environment, never the plugin config).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// `authorization: Bearer <value>`.
    Bearer,
    /// A header of its own carrying the key.
    Header(&'static str),
    /// AWS SigV4 over the body.
    SigV4,
    /// None needed (a service inside the operator's network); a key, when
    /// given, goes as a bearer token.
    Optional,
}

/// Azure's categories of harm.
pub const AZURE_CATEGORIES: &[&str] = &["Hate", "SelfHarm", "Sexual", "Violence"];
/// Azure's default severity at which a category is flagged (medium).
pub const AZURE_DEFAULT_THRESHOLD: u32 = 4;
/// Characters Azure takes in one call's text.
pub const AZURE_MAX_CHARS: usize = 10_000;
pub const AZURE_API_VERSION: &str = "2024-09-01";
pub const OPENAI_MODERATION_MODEL: &str = "omni-moderation-latest";
/// The SigV4 service of Bedrock's runtime (ApplyGuardrail's).
pub const BEDROCK_SERVICE: &str = "bedrock";

impl Vendor {
    /// The vendor's name in the record and the docs.
    pub fn name(&self) -> &'static str {
        match self {
            Vendor::Bedrock { .. } => "bedrock_guardrails",
            Vendor::AzureAnalyze { .. } => "azure_content_safety",
            Vendor::AzureShields { .. } => "azure_prompt_shields",
            Vendor::ModelArmor { .. } => "model_armor",
            Vendor::OpenAiModeration { .. } => "openai_moderation",
            Vendor::Lakera { .. } => "lakera_guard",
            Vendor::Presidio { .. } => "presidio",
        }
    }

    pub fn auth(&self) -> Auth {
        match self {
            Vendor::Bedrock { .. } => Auth::SigV4,
            Vendor::AzureAnalyze { .. } | Vendor::AzureShields { .. } => {
                Auth::Header("ocp-apim-subscription-key")
            }
            Vendor::ModelArmor { .. } | Vendor::OpenAiModeration { .. } | Vendor::Lakera { .. } => {
                Auth::Bearer
            }
            Vendor::Presidio { .. } => Auth::Optional,
        }
    }

    /// The SigV4 scope a signing vendor's calls are signed in.
    pub fn signing_scope(&self) -> Option<crate::credentials::sigv4::Scope<'_>> {
        match self {
            Vendor::Bedrock { region, .. } => Some(crate::credentials::sigv4::Scope {
                region,
                service: BEDROCK_SERVICE,
            }),
            _ => None,
        }
    }

    /// Whether the vendor can say which text to replace (a `redact` check
    /// needs it).
    pub fn redacts(&self) -> bool {
        matches!(
            self,
            Vendor::Bedrock { .. }
                | Vendor::ModelArmor { .. }
                | Vendor::Lakera { .. }
                | Vendor::Presidio { .. }
        )
    }

    /// The path a check of `stage` calls.
    pub fn path(&self, stage: Stage) -> String {
        match self {
            Vendor::Bedrock {
                guardrail_id,
                version,
                ..
            } => format!("/guardrail/{guardrail_id}/version/{version}/apply"),
            Vendor::AzureAnalyze { api_version, .. } => {
                format!("/contentsafety/text:analyze?api-version={api_version}")
            }
            Vendor::AzureShields { api_version } => {
                format!("/contentsafety/text:shieldPrompt?api-version={api_version}")
            }
            Vendor::ModelArmor {
                project,
                location,
                template,
            } => format!(
                "/v1/projects/{project}/locations/{location}/templates/{template}:{}",
                match stage {
                    Stage::Input => "sanitizeUserPrompt",
                    Stage::Output => "sanitizeModelResponse",
                }
            ),
            Vendor::OpenAiModeration { .. } => "/v1/moderations".into(),
            Vendor::Lakera { .. } => "/v2/guard".into(),
            Vendor::Presidio { .. } => "/analyze".into(),
        }
    }

    /// The `:authority` a check sends when the config names none.
    pub fn default_authority(&self, cluster: &str) -> String {
        match self {
            Vendor::Bedrock { region, .. } => format!("bedrock-runtime.{region}.amazonaws.com"),
            Vendor::ModelArmor { location, .. } => {
                format!("modelarmor.{location}.rep.googleapis.com")
            }
            Vendor::OpenAiModeration { .. } => "api.openai.com".into(),
            Vendor::Lakera { .. } => "api.lakera.ai".into(),
            Vendor::AzureAnalyze { .. } | Vendor::AzureShields { .. } | Vendor::Presidio { .. } => {
                cluster.into()
            }
        }
    }

    /// Most characters of text one call carries (`None`: no limit of ours).
    fn max_chars(&self) -> Option<usize> {
        match self {
            Vendor::AzureAnalyze { .. } | Vendor::AzureShields { .. } => Some(AZURE_MAX_CHARS),
            _ => None,
        }
    }

    /// Whether each text goes as an item of its own (else the texts are
    /// joined into one).
    fn takes_items(&self) -> bool {
        matches!(
            self,
            Vendor::Bedrock { .. } | Vendor::OpenAiModeration { .. } | Vendor::Lakera { .. }
        )
    }
}

/// Who wrote a text, as far as a vendor cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
    /// A tool's result or retrieved text: a document to a prompt shield.
    Tool,
}

/// One text a vendor reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Text {
    pub role: Role,
    pub text: String,
}

/// The texts of one call, and which of the step's texts it holds whole
/// (`whole`, by index: its verdict can be kept for them); a text longer
/// than one call takes is split, and no piece's verdict is kept for it.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    pub body: Vec<u8>,
    pub whole: Vec<usize>,
    /// The text the vendor's offsets refer to (joined texts).
    pub joined: String,
}

const JOIN: &str = "\n\n";

/// The calls a check makes for `texts` (none when there is nothing to send).
pub fn batches(vendor: &Vendor, stage: Stage, texts: &[Text]) -> Vec<Batch> {
    if texts.is_empty() {
        return Vec::new();
    }
    // Groups of (text index, the piece of it) under the vendor's limit.
    let mut groups: Vec<Group> = Vec::new();
    match vendor.max_chars() {
        None => groups.push((
            (0..texts.len()).collect(),
            texts
                .iter()
                .enumerate()
                .map(|(i, t)| (i, t.text.clone()))
                .collect(),
        )),
        Some(max) => {
            let mut whole = Vec::new();
            let mut pieces: Vec<(usize, String)> = Vec::new();
            let mut chars = 0usize;
            for (i, t) in texts.iter().enumerate() {
                let n = t.text.chars().count();
                if n > max {
                    if !pieces.is_empty() {
                        groups.push((std::mem::take(&mut whole), std::mem::take(&mut pieces)));
                        chars = 0;
                    }
                    // Split across calls of its own.
                    let all: Vec<char> = t.text.chars().collect();
                    for piece in all.chunks(max) {
                        groups.push((Vec::new(), vec![(i, piece.iter().collect())]));
                    }
                    continue;
                }
                let add = n.saturating_add(if pieces.is_empty() { 0 } else { JOIN.len() });
                if chars.saturating_add(add) > max && !pieces.is_empty() {
                    groups.push((std::mem::take(&mut whole), std::mem::take(&mut pieces)));
                    chars = 0;
                }
                chars = chars.saturating_add(n.saturating_add(JOIN.len()));
                whole.push(i);
                pieces.push((i, t.text.clone()));
            }
            if !pieces.is_empty() {
                groups.push((whole, pieces));
            }
        }
    }
    groups
        .into_iter()
        .map(|(whole, pieces)| {
            let joined = pieces
                .iter()
                .map(|(_, s)| s.as_str())
                .collect::<Vec<_>>()
                .join(JOIN);
            let body = body(vendor, stage, texts, &pieces, &joined);
            Batch {
                body: serde_json::to_vec(&body).unwrap_or_default(),
                whole,
                joined: if vendor.takes_items() {
                    String::new()
                } else {
                    joined
                },
            }
        })
        .collect()
}

fn set(b: &mut Value, key: &str, v: Value) {
    if let Some(o) = b.as_object_mut() {
        o.insert(key.into(), v);
    }
}

/// Texts grouped for one call: the texts it holds whole, and its pieces
/// (text index, text).
type Group = (Vec<usize>, Vec<(usize, String)>);

fn role_of(texts: &[Text], i: usize) -> Role {
    texts.get(i).map_or(Role::User, |t| t.role)
}

fn body(
    vendor: &Vendor,
    stage: Stage,
    texts: &[Text],
    pieces: &[(usize, String)],
    joined: &str,
) -> Value {
    match vendor {
        Vendor::Bedrock { .. } => json!({
            "source": match stage { Stage::Input => "INPUT", Stage::Output => "OUTPUT" },
            "content": pieces.iter().map(|(_, s)| json!({"text": {"text": s}})).collect::<Vec<_>>(),
        }),
        Vendor::AzureAnalyze { .. } => json!({
            "text": joined,
            "categories": AZURE_CATEGORIES,
            "outputType": "FourSeverityLevels",
        }),
        Vendor::AzureShields { .. } => {
            let mut prompt = Vec::new();
            let mut documents = Vec::new();
            for (i, s) in pieces {
                match (stage, role_of(texts, *i)) {
                    (Stage::Input, Role::System | Role::User) => prompt.push(s.as_str()),
                    _ => documents.push(s.as_str()),
                }
            }
            let mut b = json!({"userPrompt": prompt.join(JOIN)});
            if !documents.is_empty() {
                set(&mut b, "documents", json!(documents));
            }
            b
        }
        Vendor::ModelArmor { .. } => match stage {
            Stage::Input => json!({"userPromptData": {"text": joined}}),
            Stage::Output => json!({"modelResponseData": {"text": joined}}),
        },
        Vendor::OpenAiModeration { model, .. } => json!({
            "model": model,
            "input": pieces.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>(),
        }),
        Vendor::Lakera { project_id } => {
            let messages: Vec<Value> = pieces
                .iter()
                .map(|(i, s)| {
                    let role = match role_of(texts, *i) {
                        Role::System => "system",
                        Role::Assistant => "assistant",
                        Role::User | Role::Tool => "user",
                    };
                    json!({"role": role, "content": s})
                })
                .collect();
            let mut b = json!({"messages": messages, "breakdown": true, "payload": true});
            if let Some(p) = project_id {
                set(&mut b, "project_id", json!(p));
            }
            b
        }
        Vendor::Presidio {
            language,
            entities,
            score_threshold,
        } => {
            let mut b = json!({"text": joined, "language": language});
            if !entities.is_empty() {
                set(&mut b, "entities", json!(entities));
            }
            if let Some(t) = score_threshold {
                set(&mut b, "score_threshold", json!(t));
            }
            b
        }
    }
}

/// What a vendor found in one call's texts.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Finding {
    /// The vendor flagged something.
    pub flagged: bool,
    /// What it flagged (the vendor's own names).
    pub categories: Vec<String>,
    /// Texts it says to replace (PII and the like); only when everything
    /// it flagged can be replaced (else a redact check denies).
    pub redact: Vec<String>,
    /// Something was flagged that no replacement removes.
    pub blocked: bool,
}

impl Finding {
    fn flag(&mut self, category: impl Into<String>) {
        let c = category.into();
        self.flagged = true;
        if !self.categories.contains(&c) {
            self.categories.push(c);
        }
    }

    fn block(&mut self, category: impl Into<String>) {
        self.blocked = true;
        self.flag(category);
    }

    fn replace(&mut self, category: impl Into<String>, text: &str) {
        self.flag(category);
        if !text.is_empty() && !self.redact.iter().any(|t| t == text) {
            self.redact.push(text.to_string());
        }
    }
}

/// Most bytes of a vendor's error quoted in a reason.
const MAX_QUOTE: usize = 160;

/// Read a vendor's answer to `batch`; `Err` says why it is a failure (the
/// check's `failure_mode` decides).
pub fn read(
    vendor: &Vendor,
    status: Option<u16>,
    body: &[u8],
    batch_joined: &str,
) -> Result<Finding, String> {
    let name = vendor.name();
    match status {
        Some(200) => {}
        Some(s) => {
            let quote: String = String::from_utf8_lossy(body)
                .chars()
                .take(MAX_QUOTE)
                .collect();
            return Err(format!("{name} answered {s}: {quote}"));
        }
        None => return Err(format!("no answer from {name}")),
    }
    let v: Value =
        serde_json::from_slice(body).map_err(|e| format!("{name}'s answer is not JSON: {e}"))?;
    let shape = |what: &str| format!("{name}'s answer has no {what}");
    let mut f = Finding::default();
    match vendor {
        Vendor::Bedrock { .. } => {
            let action = v
                .get("action")
                .and_then(Value::as_str)
                .ok_or_else(|| shape("`action`"))?;
            if action == "NONE" {
                return Ok(f);
            }
            if action != "GUARDRAIL_INTERVENED" {
                return Err(format!(
                    "{name}'s `action` `{action}` is not NONE or GUARDRAIL_INTERVENED"
                ));
            }
            bedrock_assessments(&v, &mut f);
            if !f.flagged {
                // Intervened with nothing we can name: a block.
                f.block("GUARDRAIL_INTERVENED");
            }
        }
        Vendor::AzureAnalyze { thresholds, .. } => {
            let list = v
                .get("categoriesAnalysis")
                .and_then(Value::as_array)
                .ok_or_else(|| shape("`categoriesAnalysis`"))?;
            for c in list {
                let (Some(cat), Some(sev)) = (
                    c.get("category").and_then(Value::as_str),
                    c.get("severity").and_then(Value::as_u64),
                ) else {
                    return Err(shape("category and severity in `categoriesAnalysis`"));
                };
                let at = thresholds
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(cat))
                    .map_or(AZURE_DEFAULT_THRESHOLD, |(_, t)| *t);
                if sev >= u64::from(at) {
                    f.block(format!("{cat}:{sev}"));
                }
            }
            for m in v
                .get("blocklistsMatch")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let list = m
                    .get("blocklistName")
                    .and_then(Value::as_str)
                    .unwrap_or("blocklist");
                f.block(format!("blocklist:{list}"));
            }
        }
        Vendor::AzureShields { .. } => {
            let user = v
                .get("userPromptAnalysis")
                .and_then(|u| u.get("attackDetected"))
                .and_then(Value::as_bool);
            let docs = v.get("documentsAnalysis").and_then(Value::as_array);
            if user.is_none() && docs.is_none() {
                return Err(shape("`userPromptAnalysis` or `documentsAnalysis`"));
            }
            if user == Some(true) {
                f.block("userPromptAttack");
            }
            if docs
                .into_iter()
                .flatten()
                .any(|d| d.get("attackDetected").and_then(Value::as_bool) == Some(true))
            {
                f.block("documentAttack");
            }
        }
        Vendor::ModelArmor { .. } => {
            let r = v
                .get("sanitizationResult")
                .ok_or_else(|| shape("`sanitizationResult`"))?;
            let state = r
                .get("filterMatchState")
                .and_then(Value::as_str)
                .ok_or_else(|| shape("`filterMatchState`"))?;
            if state != "MATCH_FOUND" {
                return Ok(f);
            }
            model_armor_filters(r, batch_joined, &mut f);
            if !f.flagged {
                f.block("MATCH_FOUND");
            }
        }
        Vendor::OpenAiModeration { thresholds, .. } => {
            let results = v
                .get("results")
                .and_then(Value::as_array)
                .ok_or_else(|| shape("`results`"))?;
            for r in results {
                if thresholds.is_empty() {
                    if r.get("flagged").and_then(Value::as_bool) == Some(true) {
                        let cats = r.get("categories").and_then(Value::as_object);
                        let mut any = false;
                        for (c, on) in cats.into_iter().flatten() {
                            if on.as_bool() == Some(true) {
                                f.block(c.clone());
                                any = true;
                            }
                        }
                        if !any {
                            f.block("flagged");
                        }
                    }
                    continue;
                }
                let scores = r
                    .get("category_scores")
                    .and_then(Value::as_object)
                    .ok_or_else(|| shape("`category_scores`"))?;
                for (cat, at) in thresholds {
                    if scores
                        .get(cat)
                        .and_then(Value::as_f64)
                        .is_some_and(|s| s >= *at)
                    {
                        f.block(cat.clone());
                    }
                }
            }
        }
        Vendor::Lakera { .. } => {
            let flagged = v
                .get("flagged")
                .and_then(Value::as_bool)
                .ok_or_else(|| shape("`flagged`"))?;
            if !flagged {
                return Ok(f);
            }
            let pii = |t: &str| t.starts_with("pii/");
            let mut detected = Vec::new();
            for b in v
                .get("breakdown")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if b.get("detected").and_then(Value::as_bool) == Some(true) {
                    if let Some(t) = b.get("detector_type").and_then(Value::as_str) {
                        detected.push(t.to_string());
                    }
                }
            }
            for p in v
                .get("payload")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let t = p
                    .get("detector_type")
                    .and_then(Value::as_str)
                    .unwrap_or("pii");
                match p.get("text").and_then(Value::as_str) {
                    Some(text) if pii(t) => f.replace(t, text),
                    _ => {}
                }
            }
            for t in detected {
                if pii(&t) && !f.redact.is_empty() {
                    f.flag(t);
                } else {
                    f.block(t);
                }
            }
            if !f.flagged {
                f.block("flagged");
            }
        }
        Vendor::Presidio { .. } => {
            let list = v.as_array().ok_or_else(|| shape("list of entities"))?;
            let chars: Vec<(usize, char)> = batch_joined.char_indices().collect();
            let byte_at = |c: usize| chars.get(c).map_or(batch_joined.len(), |(b, _)| *b);
            for e in list {
                let (Some(kind), Some(start), Some(end)) = (
                    e.get("entity_type").and_then(Value::as_str),
                    e.get("start").and_then(Value::as_u64),
                    e.get("end").and_then(Value::as_u64),
                ) else {
                    return Err(shape("entity_type, start and end in an entity"));
                };
                let (s, t) = (
                    usize::try_from(start).unwrap_or(usize::MAX),
                    usize::try_from(end).unwrap_or(usize::MAX),
                );
                if s >= t || t > chars.len() {
                    return Err(format!(
                        "{name}'s entity {kind} at {start}..{end} is outside the text sent"
                    ));
                }
                let text = batch_joined.get(byte_at(s)..byte_at(t)).unwrap_or_default();
                f.replace(kind, text);
            }
        }
    }
    Ok(f)
}

fn bedrock_assessments(v: &Value, f: &mut Finding) {
    let arr = |o: &Value, a: &str, b: &str| -> Vec<Value> {
        o.get(a)
            .and_then(|p| p.get(b))
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default()
    };
    for a in v
        .get("assessments")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let lists = [
            ("topic", arr(a, "topicPolicy", "topics"), "name"),
            ("content", arr(a, "contentPolicy", "filters"), "type"),
            ("word", arr(a, "wordPolicy", "customWords"), "match"),
            ("word", arr(a, "wordPolicy", "managedWordLists"), "type"),
            (
                "pii",
                arr(a, "sensitiveInformationPolicy", "piiEntities"),
                "type",
            ),
            (
                "regex",
                arr(a, "sensitiveInformationPolicy", "regexes"),
                "name",
            ),
            (
                "grounding",
                arr(a, "contextualGroundingPolicy", "filters"),
                "type",
            ),
        ];
        for (policy, items, label) in lists {
            for item in items {
                let action = item.get("action").and_then(Value::as_str).unwrap_or("");
                let what = item.get(label).and_then(Value::as_str).unwrap_or(policy);
                let category = format!("{policy}:{what}");
                match (policy, action) {
                    ("pii" | "regex", "ANONYMIZED") => {
                        let m = item.get("match").and_then(Value::as_str).unwrap_or("");
                        if m.is_empty() {
                            f.block(category);
                        } else {
                            f.replace(category, m);
                        }
                    }
                    (_, "BLOCKED") => f.block(category),
                    _ => {}
                }
            }
        }
    }
}

fn model_armor_filters(r: &Value, joined: &str, f: &mut Finding) {
    let Some(filters) = r.get("filterResults").and_then(Value::as_object) else {
        return;
    };
    for (name, result) in filters {
        // Each filter's result is one member (`raiFilterResult`, ...).
        let Some(inner) = result.as_object().and_then(|o| o.values().next()) else {
            continue;
        };
        if name == "sdp" {
            let inspect = inner.get("inspectResult");
            let matched = inspect
                .and_then(|i| i.get("matchState"))
                .and_then(Value::as_str)
                == Some("MATCH_FOUND");
            if !matched {
                continue;
            }
            let mut any = false;
            for finding in inspect
                .and_then(|i| i.get("findings"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                let info = finding
                    .get("infoType")
                    .and_then(Value::as_str)
                    .unwrap_or("sdp");
                let range = finding.get("location").and_then(|l| l.get("byteRange"));
                // Model Armor's int64s are JSON strings.
                let num = |k: &str| {
                    range.and_then(|r| r.get(k)).and_then(|x| match x {
                        Value::String(s) => s.parse::<usize>().ok(),
                        Value::Number(n) => n.as_u64().and_then(|n| usize::try_from(n).ok()),
                        _ => None,
                    })
                };
                let start = num("start").unwrap_or(0);
                match num("end").and_then(|end| joined.get(start..end)) {
                    Some(text) if !text.is_empty() => {
                        f.replace(format!("sdp:{info}"), text);
                        any = true;
                    }
                    _ => f.block(format!("sdp:{info}")),
                }
            }
            if !any {
                f.block("sdp");
            }
            continue;
        }
        if inner.get("matchState").and_then(Value::as_str) == Some("MATCH_FOUND") {
            f.block(name.clone());
        }
    }
}

/// Split a `Finding`'s replacements by text: for each of `texts`, the
/// replacements wholly inside it; `None` when one lies across two texts
/// (no per-text verdict can be kept then).
pub fn per_text(redact: &[String], texts: &[&str]) -> Option<Vec<Vec<String>>> {
    let mut out = vec![Vec::new(); texts.len()];
    for r in redact {
        let mut found = false;
        for (t, slot) in texts.iter().zip(out.iter_mut()) {
            if t.contains(r.as_str()) {
                slot.push(r.clone());
                found = true;
            }
        }
        if !found {
            return None;
        }
    }
    Some(out)
}

/// The texts a model reads in a request, one per message with its author
/// (chat completions, Messages, Responses, embeddings): the unit a vendor's
/// verdict is kept for, so a conversation's next turn sends only what is
/// new.
pub fn message_texts(doc: &serde_json::Map<String, Value>) -> Vec<Text> {
    let mut out = Vec::new();
    for key in ["system", "instructions"] {
        if let Some(v) = doc.get(key) {
            push(&mut out, Role::System, content_text(v));
        }
    }
    if let Some(Value::Array(msgs)) = doc.get("messages") {
        for m in msgs {
            message(m, &mut out);
        }
    }
    match doc.get("input") {
        Some(Value::String(s)) => push(&mut out, Role::User, s.clone()),
        Some(Value::Array(items)) => {
            for i in items {
                match i {
                    Value::String(s) => push(&mut out, Role::User, s.clone()),
                    Value::Object(o) => match o.get("type").and_then(Value::as_str) {
                        Some("function_call_output") => push(
                            &mut out,
                            Role::Tool,
                            o.get("output").map(content_text).unwrap_or_default(),
                        ),
                        Some("function_call") => {
                            push(&mut out, Role::Assistant, str_of(o.get("arguments")))
                        }
                        _ => message(i, &mut out),
                    },
                    _ => {}
                }
            }
        }
        _ => {}
    }
    for key in ["prompt", "query"] {
        if let Some(Value::String(s)) = doc.get(key) {
            push(&mut out, Role::User, s.clone());
        }
    }
    out
}

fn push(out: &mut Vec<Text>, role: Role, text: String) {
    if !text.trim().is_empty() {
        out.push(Text { role, text });
    }
}

fn str_of(v: Option<&Value>) -> String {
    match v {
        Some(Value::String(s)) => s.clone(),
        Some(v @ (Value::Object(_) | Value::Array(_))) => v.to_string(),
        _ => String::new(),
    }
}

/// A content's text: a string, or its text blocks joined by newlines.
fn content_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => {
            let mut parts = Vec::new();
            for b in blocks {
                match b {
                    Value::String(s) => parts.push(s.clone()),
                    Value::Object(o) => {
                        if let Some(Value::String(t)) = o.get("text") {
                            parts.push(t.clone());
                        }
                    }
                    _ => {}
                }
            }
            parts.join("\n")
        }
        _ => String::new(),
    }
}

fn message(m: &Value, out: &mut Vec<Text>) {
    let Some(o) = m.as_object() else {
        return;
    };
    let role = match o.get("role").and_then(Value::as_str) {
        Some("system" | "developer") => Role::System,
        Some("assistant") => Role::Assistant,
        Some("tool" | "function") => Role::Tool,
        _ => Role::User,
    };
    match o.get("content") {
        Some(Value::Array(blocks)) => {
            let mut own = Vec::new();
            for b in blocks {
                match b.get("type").and_then(Value::as_str) {
                    Some("tool_result") => {
                        push(
                            out,
                            Role::Tool,
                            b.get("content").map(content_text).unwrap_or_default(),
                        );
                    }
                    Some("tool_use") => push(out, Role::Assistant, str_of(b.get("input"))),
                    _ => {
                        if let Some(Value::String(t)) = b.get("text") {
                            own.push(t.clone());
                        }
                    }
                }
            }
            push(out, role, own.join("\n"));
        }
        Some(v) => push(out, role, content_text(v)),
        None => {}
    }
    for call in o
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        push(
            out,
            Role::Assistant,
            str_of(call.get("function").and_then(|f| f.get("arguments"))),
        );
    }
}

/// A whole answer's texts as a vendor reads them (the model's words, each
/// run of them one text, and each tool call's arguments), in the client's
/// API's shape.
pub fn answer_texts(
    shape: super::texts::Shape,
    doc: &mut serde_json::Map<String, Value>,
) -> Vec<Text> {
    let mut v = Value::Object(std::mem::take(doc));
    let mut out = Vec::new();
    {
        let (slots, _) = super::texts::answer_slots(shape, &mut v);
        for t in super::texts::texts(&slots) {
            push(&mut out, Role::Assistant, t.into_owned());
        }
    }
    if let Value::Object(m) = v {
        *doc = m;
    }
    out
}

/// Replace every listed text in a whole answer's texts by
/// `[REDACTED:<label>]`; the number replaced.
pub fn redact_answer(
    shape: super::texts::Shape,
    doc: &mut serde_json::Map<String, Value>,
    label: &str,
    targets: &[String],
) -> u32 {
    let mut v = Value::Object(std::mem::take(doc));
    let n = {
        let (mut slots, _) = super::texts::answer_slots(shape, &mut v);
        super::texts::rewrite(
            &mut slots,
            &mut |t: &str, spans: &mut Vec<super::Span<'_>>| {
                for target in targets.iter().filter(|t| !t.is_empty()) {
                    spans.extend(
                        t.match_indices(target.as_str())
                            .map(|(start, m)| super::Span {
                                start,
                                end: start.saturating_add(m.len()),
                                label,
                            }),
                    );
                }
            },
        )
    };
    if let Value::Object(m) = v {
        *doc = m;
    }
    n
}

/// A JSON-RPC message's object (`None`: not an object).
pub fn read_message(body: &[u8]) -> Option<serde_json::Map<String, Value>> {
    match serde_json::from_slice(body) {
        Ok(Value::Object(m)) => Some(m),
        _ => None,
    }
}

/// A message's bytes again.
pub fn write_message(msg: &serde_json::Map<String, Value>) -> Vec<u8> {
    serde_json::to_vec(msg).unwrap_or_default()
}

/// An MCP `tools/call`'s arguments as a vendor reads them: each string in
/// `params.arguments` (at any depth) one text, as the tool will read it.
pub fn argument_texts(msg: &serde_json::Map<String, Value>) -> Vec<Text> {
    let mut out = Vec::new();
    if let Some(args) = msg.get("params").and_then(|p| p.get("arguments")) {
        strings(args, &mut |s| push(&mut out, Role::User, s.to_string()));
    }
    out
}

fn strings(v: &Value, f: &mut dyn FnMut(&str)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter().for_each(|x| strings(x, f)),
        Value::Object(o) => o.values().for_each(|x| strings(x, f)),
        _ => {}
    }
}

fn strings_mut(v: &mut Value, f: &mut dyn FnMut(&mut String)) {
    match v {
        Value::String(s) => f(s),
        Value::Array(a) => a.iter_mut().for_each(|x| strings_mut(x, f)),
        Value::Object(o) => o.values_mut().for_each(|x| strings_mut(x, f)),
        _ => {}
    }
}

/// Replace every listed text in a `tools/call`'s argument strings by
/// `[REDACTED:<label>]`; the number replaced.
pub fn redact_arguments(
    msg: &mut serde_json::Map<String, Value>,
    label: &str,
    targets: &[String],
) -> u32 {
    let mut n = 0u32;
    let marker = format!("[REDACTED:{label}]");
    if let Some(args) = msg.get_mut("params").and_then(|p| p.get_mut("arguments")) {
        strings_mut(args, &mut |s| {
            for t in targets.iter().filter(|t| !t.is_empty()) {
                let hits = s.matches(t.as_str()).count();
                if hits > 0 {
                    *s = s.replace(t.as_str(), &marker);
                    n = n.saturating_add(u32::try_from(hits).unwrap_or(u32::MAX));
                }
            }
        });
    }
    n
}

/// Verdicts kept per text in shared data, so a conversation's next turn
/// sends the vendor only its new messages: a text the check found clean
/// (or found only replacements in) is not sent again while its verdict is
/// kept. A direct-mapped table of [`KEPT_SLOTS`] entries bounds the memory;
/// a clash replaces the older verdict (the text is then sent again).
pub mod kept {
    use sha2::{Digest, Sha256};

    /// Entries of the table.
    pub const KEPT_SLOTS: u32 = 8192;
    /// Most bytes of replacements kept with one text's verdict.
    pub const MAX_KEPT_BYTES: usize = 4096;

    /// A text's identity for a check: SHA-256 over the check's fingerprint
    /// (its name and settings, so a changed check asks again) and the text.
    pub fn id(fingerprint: u64, text: &str) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(fingerprint.to_le_bytes());
        h.update(text.as_bytes());
        h.finalize().into()
    }

    /// The shared-data key of the entry an id lives in.
    pub fn key(id: &[u8; 32]) -> String {
        let n = u32::from_le_bytes([id[0], id[1], id[2], id[3]]) % KEPT_SLOTS;
        format!("portcullis.gv.{n}")
    }

    /// The entry for `id`: kept until `until` (ms), with its replacements;
    /// `None` when they are too long to keep. Binary: the id's 32 bytes,
    /// `until` (8 bytes, little-endian), then each replacement after a
    /// newline.
    pub fn encode(id: &[u8; 32], until: u64, redact: &[String]) -> Option<Vec<u8>> {
        let len: usize = redact.iter().map(|r| r.len().saturating_add(1)).sum();
        if len > MAX_KEPT_BYTES || redact.iter().any(|r| r.contains('\n')) {
            return None;
        }
        let mut out = Vec::with_capacity(40usize.saturating_add(len));
        out.extend_from_slice(id);
        out.extend_from_slice(&until.to_le_bytes());
        for r in redact {
            out.push(b'\n');
            out.extend_from_slice(r.as_bytes());
        }
        Some(out)
    }

    /// The replacements kept for `id` at `now` (`None`: no verdict kept).
    pub fn decode(entry: &[u8], id: &[u8; 32], now: u64) -> Option<Vec<String>> {
        let (head, rest) = (entry.get(..40)?, entry.get(40..)?);
        let until = u64::from_le_bytes(head.get(32..40)?.try_into().ok()?);
        if head.get(..32)? != id.as_slice() || until <= now {
            return None;
        }
        let rest = std::str::from_utf8(rest).ok()?;
        Some(rest.split('\n').skip(1).map(str::to_string).collect())
    }
}

#[cfg(test)]
mod tests;
