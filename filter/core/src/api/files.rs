//! OpenAI's files and batches: `POST /v1/files` (multipart: `file`,
//! `purpose`), `GET`/`DELETE /v1/files/{id}`, `GET /v1/files/{id}/content`;
//! `POST /v1/batches` (JSON: `input_file_id`, `endpoint`,
//! `completion_window`, `metadata`), `GET /v1/batches/{id}`,
//! `POST /v1/batches/{id}/cancel`, `GET /v1/batches`.
//!
//! A file or batch lives at the provider that made it. The id the client
//! sees carries that provider and who owns it, so any replica routes a
//! later call with the id alone and no other client can use it:
//! `{provider's id}~{tag}{mac}{n}` where `tag` names the provider (8 hex
//! digits of its name's SHA-256), `mac` seals the rest (32 hex digits: the
//! gateway's seal, [`crate::credentials::seal`], over the client's name, the provider,
//! the id and `n`) and `n` (decimal) is the requests a batch file holds.
//! The seal is the gateway's own secret, not a provider's credential: a
//! provider without a key is as safe as one with, and rotating a
//! provider's key leaves every id valid (#61). A batch the gateway creates
//! carries its owner in its metadata (`portcullis_owner`, a MAC of the
//! owner's name), so a list shows each client its own.

use crate::credentials::seal::Seal;
use crate::error::GatewayError;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

pub const FILES: &str = "/v1/files";
/// Which providers keep files and batches, for messages
/// ([`crate::translate::stored_path`] says where).
pub const KEEPERS: &str = "OpenAI-compatible and Azure OpenAI providers";
pub const BATCHES: &str = "/v1/batches";
/// Anthropic's Message Batches.
pub const MESSAGE_BATCHES: &str = "/v1/messages/batches";

/// The metadata key that names a batch's owner.
pub const OWNER_KEY: &str = "portcullis_owner";
/// The metadata key that holds the requests of a batch's file (so its ids
/// are sealed alike wherever the batch object appears).
pub const REQUESTS_KEY: &str = "portcullis_requests";

/// A call on files or batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call<'a> {
    /// `POST /v1/files`.
    Upload,
    /// `GET /v1/files`.
    ListFiles,
    /// `GET`/`DELETE /v1/files/{id}`, `GET .../content` (`tail`).
    File { id: &'a str, tail: &'a str },
    /// `POST /v1/batches`.
    CreateBatch,
    /// `GET /v1/batches`.
    ListBatches,
    /// `GET /v1/batches/{id}`, `POST .../cancel` (`tail`).
    Batch { id: &'a str, tail: &'a str },
    /// `POST /v1/messages/batches` (Anthropic).
    CreateMessageBatch,
    /// `GET /v1/messages/batches`.
    ListMessageBatches,
    /// `GET`/`DELETE /v1/messages/batches/{id}`, `GET .../results`,
    /// `POST .../cancel` (`tail`).
    MessageBatch { id: &'a str, tail: &'a str },
}

impl<'a> Call<'a> {
    /// The call a method and path (query and trailing `/` removed) are.
    pub fn of(method: &str, path: &'a str) -> Option<Call<'a>> {
        let under = |root: &str| -> Option<(&'a str, &'a str)> {
            let rest = path.strip_prefix(root)?.strip_prefix('/')?;
            let (id, tail) = match rest.find('/') {
                Some(i) => (rest.get(..i)?, rest.get(i..)?),
                None => (rest, ""),
            };
            (!id.is_empty()).then_some((id, tail))
        };
        match (method, path) {
            ("POST", FILES) => Some(Call::Upload),
            ("GET", FILES) => Some(Call::ListFiles),
            ("POST", BATCHES) => Some(Call::CreateBatch),
            ("GET", BATCHES) => Some(Call::ListBatches),
            ("POST", MESSAGE_BATCHES) => Some(Call::CreateMessageBatch),
            ("GET", MESSAGE_BATCHES) => Some(Call::ListMessageBatches),
            _ => {
                if let Some((id, tail)) = under(MESSAGE_BATCHES) {
                    return matches!(
                        (method, tail),
                        ("GET" | "DELETE", "") | ("GET", "/results") | ("POST", "/cancel")
                    )
                    .then_some(Call::MessageBatch { id, tail });
                }
                if let Some((id, tail)) = under(FILES) {
                    return matches!((method, tail), ("GET" | "DELETE", "") | ("GET", "/content"))
                        .then_some(Call::File { id, tail });
                }
                let (id, tail) = under(BATCHES)?;
                matches!((method, tail), ("GET", "") | ("POST", "/cancel"))
                    .then_some(Call::Batch { id, tail })
            }
        }
    }

    /// The record's `api`.
    pub fn api_name(self) -> &'static str {
        match self {
            Call::Upload | Call::ListFiles | Call::File { .. } => "files",
            Call::CreateBatch | Call::ListBatches | Call::Batch { .. } => "batches",
            Call::CreateMessageBatch | Call::ListMessageBatches | Call::MessageBatch { .. } => {
                "message_batches"
            }
        }
    }

    /// Whose API the call is, for its errors' shape (Anthropic's for
    /// Message Batches, OpenAI's for the rest).
    pub fn error_api(self) -> super::Api {
        match self {
            Call::CreateMessageBatch | Call::ListMessageBatches | Call::MessageBatch { .. } => {
                super::Api::Messages
            }
            _ => super::Api::ChatCompletions,
        }
    }

    /// Where a provider keeps what the call is on: its path's root
    /// ([`crate::translate::stored_path`] says which formats keep it).
    pub fn root(self) -> &'static str {
        match self {
            Call::Upload | Call::ListFiles | Call::File { .. } => "/files",
            Call::CreateBatch | Call::ListBatches | Call::Batch { .. } => "/batches",
            Call::CreateMessageBatch | Call::ListMessageBatches | Call::MessageBatch { .. } => {
                "/messages/batches"
            }
        }
    }

    /// Whether the answer is a Message Batch's results (read for usage).
    pub fn results(self) -> bool {
        matches!(
            self,
            Call::MessageBatch {
                tail: "/results",
                ..
            }
        )
    }

    /// Whether the answer may report a finished batch's usage (OpenAI's
    /// batch object carries `usage` once its requests are done).
    pub fn reports_usage(self) -> bool {
        matches!(self, Call::Batch { .. } | Call::ListBatches)
    }

    /// Whether the client's body is read first (an upload, a batch).
    pub fn has_body(self) -> bool {
        matches!(
            self,
            Call::Upload | Call::CreateBatch | Call::CreateMessageBatch
        )
    }

    /// Whether the answer is JSON whose ids are sealed (a file's content
    /// passes as it is).
    pub fn answer_sealed(self) -> bool {
        !matches!(
            self,
            Call::File {
                tail: "/content",
                ..
            } | Call::MessageBatch {
                tail: "/results",
                ..
            }
        )
    }
}

/// A provider's tag in ids.
pub fn tag(provider: &str) -> String {
    crate::wire::text::hex(
        Sha256::digest(provider.as_bytes())
            .get(..4)
            .unwrap_or_default(),
    )
}

/// Hex digits of the MAC in an id.
const MAC_HEX: usize = crate::credentials::seal::MAC_BYTES * 2;

fn parts<'a>(owner: &'a str, provider: &'a str, id: &'a str, n: &'a str) -> [&'a [u8]; 4] {
    [
        owner.as_bytes(),
        provider.as_bytes(),
        id.as_bytes(),
        n.as_bytes(),
    ]
}

/// The id a client sees for a provider's id.
pub fn seal(id: &str, provider: &str, owner: &str, seal: &Seal, n: u64) -> String {
    let count = n.to_string();
    format!(
        "{id}~{}{}{count}",
        tag(provider),
        seal.mac_hex(&parts(owner, provider, id, &count))
    )
}

/// A sealed id opened: the provider's id, the provider's index among
/// `providers` (their names), the requests it holds; `None` for an id the
/// gateway did not give this owner.
pub fn open<'i>(
    id: &'i str,
    providers: &[&str],
    owner: &str,
    seal: &Seal,
) -> Option<(&'i str, usize, u64)> {
    let (inner, sealed) = id.rsplit_once('~')?;
    let tag_of = sealed.get(..8)?;
    let mac_of = sealed.get(8..8usize.checked_add(MAC_HEX)?)?;
    let count = sealed.get(8usize.checked_add(MAC_HEX)?..)?;
    let n: u64 = count.parse().ok()?;
    if n.to_string() != count {
        return None;
    }
    providers
        .iter()
        .enumerate()
        .find(|(_, name)| {
            tag(name) == tag_of && seal.verify_hex(&parts(owner, name, inner, count), mac_of)
        })
        .map(|(i, _)| (inner, i, n))
}

/// The owner's mark in a batch's metadata (not its name: the seal's MAC
/// of it).
pub fn owner_mark(owner: &str, seal: &Seal) -> String {
    seal.mac_hex(&parts(owner, "", "", "owner"))
}

/// Every mark `owner`'s batches may carry (one per key of the seal, the
/// current key's first): a batch marked before a rotation is still listed.
pub fn owner_marks(owner: &str, seal: &Seal) -> Vec<String> {
    seal.macs(&parts(owner, "", "", "owner"))
        .iter()
        .map(|m| crate::wire::text::hex(m))
        .collect()
}

/// A batch file's requests: its non-empty lines, and the model the first
/// names (`body.model`), if it names one.
pub fn batch_file(bytes: &[u8]) -> (u64, Option<String>) {
    let mut n = 0u64;
    let mut model = None;
    // Lines found with memchr (a file may be tens of MB; a per-byte split
    // cost ~10 instructions a byte on Wasm).
    let mut start = 0usize;
    let ends = memchr::memchr_iter(b'\n', bytes).chain(std::iter::once(bytes.len()));
    let lines = ends.map(|end| {
        let line = bytes.get(start..end).unwrap_or_default();
        start = end.saturating_add(1);
        line
    });
    for line in lines {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        if n == 0 {
            model = serde_json::from_slice::<Value>(line)
                .ok()
                .and_then(|v| v.get("body")?.get("model")?.as_str().map(str::to_string));
        }
        n = n.saturating_add(1);
    }
    (n, model)
}

/// One request line of a batch file (#61): where it is, what it names.
#[derive(Debug)]
pub struct BatchLine<'a> {
    /// 1-based, counting every line of the file (blank ones too), as an
    /// editor shows it.
    pub number: u64,
    /// Its bytes (without the line break), and where they start in the file.
    pub line: &'a [u8],
    pub at: usize,
    pub custom_id: Option<String>,
    /// `body.model`.
    pub model: Option<String>,
    /// `body`, as sent.
    pub body: &'a [u8],
}

impl BatchLine<'_> {
    /// An error about this line: `e`'s status and code, the message naming
    /// the line and its `custom_id`.
    pub fn error(&self, e: GatewayError) -> GatewayError {
        let at = match &self.custom_id {
            Some(id) => format!("Batch file line {} (custom_id `{id}`)", self.number),
            None => format!("Batch file line {}", self.number),
        };
        GatewayError {
            message: format!("{at}: {}", e.message),
            ..e
        }
    }
}

/// Every request line of a batch file, read (a line that is not a JSON
/// object with a `body` object is an error naming it).
pub fn batch_lines(bytes: &[u8]) -> Vec<Result<BatchLine<'_>, GatewayError>> {
    #[derive(serde::Deserialize)]
    struct Line<'a> {
        #[serde(default)]
        custom_id: Option<String>,
        #[serde(borrow)]
        body: Option<&'a serde_json::value::RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Body {
        #[serde(default)]
        model: Option<Value>,
    }
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut number = 0u64;
    let ends = memchr::memchr_iter(b'\n', bytes).chain(std::iter::once(bytes.len()));
    for end in ends {
        let at = start;
        let line = bytes.get(start..end).unwrap_or_default();
        start = end.saturating_add(1);
        number = number.saturating_add(1);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        let read = serde_json::from_slice::<Line<'_>>(line).ok().and_then(|l| {
            let body = l.body.filter(|b| b.get().trim_start().starts_with('{'))?;
            let model = serde_json::from_str::<Body>(body.get()).ok()?.model;
            Some(BatchLine {
                number,
                line,
                at,
                custom_id: l.custom_id,
                model: model.and_then(|m| m.as_str().map(str::to_string)),
                body: body.get().as_bytes(),
            })
        });
        out.push(read.ok_or_else(|| {
            bad(
                "invalid_batch_line",
                format!("Batch file line {number}: not a request (a JSON object with `custom_id`, `method`, `url` and a `body` object)."),
            )
        }));
    }
    out
}

/// A batch file's line with its `body` replaced (a redaction).
pub fn line_with_body(line: &[u8], body: &Map<String, Value>) -> Option<Vec<u8>> {
    let mut v: Map<String, Value> = serde_json::from_slice(line).ok()?;
    v.insert("body".into(), Value::Object(body.clone()));
    serde_json::to_vec(&v).ok()
}

/// Each request of a Message Batch body checked by `check` (its index,
/// `custom_id`, `params.model` and `params` as JSON), which may refuse it
/// (the error then names the request) or give its `params` redacted;
/// `Some`: the body with those `params` replaced.
#[allow(clippy::type_complexity)]
pub fn message_batch_checked(
    body: &[u8],
    check: &mut dyn FnMut(&str, &[u8]) -> Result<Option<Map<String, Value>>, GatewayError>,
) -> Result<Option<Vec<u8>>, GatewayError> {
    let mut doc: Value = serde_json::from_slice(body).map_err(|e| {
        bad(
            "invalid_json",
            format!("Request body is not a JSON object ({e})."),
        )
    })?;
    let requests = doc
        .get_mut("requests")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad("invalid_requests", "`requests` must be an array."))?;
    let mut changed = false;
    for (i, r) in requests.iter_mut().enumerate() {
        let at = match r.get("custom_id").and_then(Value::as_str) {
            Some(id) => format!("requests.{i} (custom_id `{id}`)"),
            None => format!("requests.{i}"),
        };
        let name = |e: GatewayError| GatewayError {
            message: format!("{at}: {}", e.message),
            ..e
        };
        let Some(params) = r.get_mut("params") else {
            return Err(bad(
                "missing_params",
                format!("{at}.params: Field required"),
            ));
        };
        let model = params
            .get("model")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let bytes = serde_json::to_vec(params).unwrap_or_default();
        if let Some(redacted) = check(&model, &bytes).map_err(name)? {
            *params = Value::Object(redacted);
            changed = true;
        }
    }
    if !changed {
        return Ok(None);
    }
    serde_json::to_vec(&doc)
        .map(Some)
        .map_err(|e| GatewayError::internal(format!("batch rewrite: {e}")))
}

/// A sealed id opened: the provider's id, the provider, the requests.
pub type Opened = (String, usize, u64);

fn bad(code: &'static str, message: impl Into<String>) -> GatewayError {
    GatewayError::bad_request(code, message)
}

/// A batch's body for its provider: `input_file_id` opened by `open` (the
/// provider's id and the requests it holds), the owner's mark added to
/// `metadata`. The provider's index and the requests.
pub fn batch_body(
    body: &[u8],
    open: &dyn Fn(&str) -> Option<Opened>,
    mark: &dyn Fn(usize) -> String,
) -> Result<(Vec<u8>, usize, u64), GatewayError> {
    let mut doc: Map<String, Value> = serde_json::from_slice(body).map_err(|e| {
        bad(
            "invalid_json",
            format!("Request body is not a JSON object ({e})."),
        )
    })?;
    let file = doc
        .get("input_file_id")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            bad(
                "missing_input_file_id",
                "Missing required parameter: `input_file_id`.",
            )
        })?;
    let (inner, provider, n) = open(file).ok_or_else(|| {
        GatewayError::new(
            404,
            "invalid_request_error",
            "file_not_found",
            format!("No such File object: {file} (upload the batch's file through this gateway with this key)."),
        )
    })?;
    doc.insert("input_file_id".into(), Value::String(inner));
    let metadata = doc
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()));
    if metadata.is_null() {
        *metadata = Value::Object(Map::new());
    }
    let Some(m) = metadata.as_object_mut() else {
        return Err(bad("invalid_metadata", "`metadata` must be an object."));
    };
    m.insert(OWNER_KEY.into(), Value::String(mark(provider)));
    m.insert(REQUESTS_KEY.into(), Value::String(n.to_string()));
    let out = serde_json::to_vec(&doc)
        .map_err(|e| GatewayError::internal(format!("batch rewrite: {e}")))?;
    Ok((out, provider, n))
}

/// A Message Batch's requests: how many, and the model the first names
/// (`requests[].params.model`).
pub fn message_batch_requests(body: &[u8]) -> Result<(u64, String), GatewayError> {
    let doc: Value = serde_json::from_slice(body).map_err(|e| {
        bad(
            "invalid_json",
            format!("Request body is not a JSON object ({e})."),
        )
    })?;
    let requests = doc
        .get("requests")
        .and_then(Value::as_array)
        .filter(|r| !r.is_empty())
        .ok_or_else(|| {
            bad(
                "invalid_requests",
                "`requests` must be a non-empty array of {custom_id, params}.",
            )
        })?;
    let model = requests
        .first()
        .and_then(|r| r.get("params")?.get("model")?.as_str())
        .filter(|m| !m.is_empty())
        .ok_or_else(|| bad("missing_model", "requests.0.params.model: Field required"))?;
    Ok((requests.len() as u64, model.to_string()))
}

/// A Message Batch's body for its provider: each request's `params.model`
/// as `map` names it there (a model it does not serve: a 400).
pub fn message_batch_body(
    body: &[u8],
    map: &dyn Fn(&str) -> Option<String>,
) -> Result<Vec<u8>, GatewayError> {
    let mut doc: Value = serde_json::from_slice(body).map_err(|e| {
        bad(
            "invalid_json",
            format!("Request body is not a JSON object ({e})."),
        )
    })?;
    let requests = doc
        .get_mut("requests")
        .and_then(Value::as_array_mut)
        .ok_or_else(|| bad("invalid_requests", "`requests` must be an array."))?;
    for (i, r) in requests.iter_mut().enumerate() {
        let Some(m) = r.get_mut("params").and_then(|p| p.get_mut("model")) else {
            return Err(bad(
                "missing_model",
                format!("requests.{i}.params.model: Field required"),
            ));
        };
        let name = m.as_str().unwrap_or("").to_string();
        let id = map(&name).ok_or_else(|| {
            bad(
                "model_not_in_batch_provider",
                format!("requests.{i}.params.model: `{name}` is not served by the provider this batch goes to (the first request's model's): send one batch per provider."),
            )
        })?;
        *m = Value::String(id);
    }
    serde_json::to_vec(&doc).map_err(|e| GatewayError::internal(format!("batch rewrite: {e}")))
}

/// The fields of a file or batch object that hold ids of files or batches.
/// Finished batches' usage as their objects report it (`completed`,
/// `cancelled` or `expired`, with `usage`), in a batch or a list of them
/// (only those of the owner `keep` marks): each one's id at the provider,
/// the model id it names, its usage.
pub fn finished_batches(
    body: &[u8],
    keep: Option<&[String]>,
) -> Vec<(String, String, crate::usage::Usage)> {
    #[derive(serde::Deserialize)]
    struct Batch {
        #[serde(default)]
        id: String,
        #[serde(default)]
        object: String,
        #[serde(default)]
        status: String,
        #[serde(default)]
        model: Option<String>,
        #[serde(default)]
        usage: Option<Value>,
        #[serde(default)]
        metadata: Option<Value>,
        #[serde(default)]
        data: Vec<Batch>,
    }
    let Ok(b) = serde_json::from_slice::<Batch>(body) else {
        return Vec::new();
    };
    let items = if b.object == "list" { b.data } else { vec![b] };
    items
        .into_iter()
        .filter(|b| {
            b.object == "batch"
                && matches!(b.status.as_str(), "completed" | "cancelled" | "expired")
        })
        .filter(|b| {
            keep.is_none_or(|marks| {
                b.metadata
                    .as_ref()
                    .and_then(|m| m.get(OWNER_KEY))
                    .and_then(Value::as_str)
                    .is_some_and(|mark| marks.iter().any(|m| m == mark))
            })
        })
        .filter_map(|b| {
            let usage = crate::usage::Usage::from_usage(b.usage.as_ref()?)?;
            Some((b.id, b.model.unwrap_or_default(), usage))
        })
        .collect()
}

/// A Message Batch's results (JSONL) read for their usage as they pass:
/// each succeeded request's `message.usage` summed, and the model.
#[derive(Debug, Default)]
pub struct ResultsUsage {
    /// The end of a line not whole yet.
    partial: Vec<u8>,
    pub usage: crate::usage::Usage,
    pub model: String,
    pub lines: u64,
}

impl ResultsUsage {
    /// A line can be long (a whole answer); a longer one is not read.
    const MAX_LINE: usize = 4 << 20;

    pub fn push(&mut self, chunk: &[u8]) {
        let mut rest = chunk;
        while let Some(end) = memchr::memchr(b'\n', rest) {
            let (line, after) = rest.split_at(end);
            if self.partial.is_empty() {
                self.line(line);
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                self.line(&whole);
            }
            rest = after.get(1..).unwrap_or_default();
        }
        if self.partial.len().saturating_add(rest.len()) <= Self::MAX_LINE {
            self.partial.extend_from_slice(rest);
        } else {
            self.partial.clear();
        }
    }

    /// The end of the results (a last line without its newline).
    pub fn finish(&mut self) {
        let last = std::mem::take(&mut self.partial);
        if !last.is_empty() {
            self.line(&last);
        }
    }

    fn line(&mut self, line: &[u8]) {
        #[derive(serde::Deserialize)]
        struct Line {
            result: Result,
        }
        #[derive(serde::Deserialize)]
        struct Result {
            #[serde(default)]
            message: Option<Message>,
        }
        #[derive(serde::Deserialize)]
        struct Message {
            #[serde(default)]
            model: String,
            #[serde(default)]
            usage: Option<Value>,
        }
        let Ok(l) = serde_json::from_slice::<Line>(line) else {
            return;
        };
        let Some(m) = l.result.message else {
            return;
        };
        let Some(u) = m.usage.as_ref().and_then(crate::usage::Usage::from_usage) else {
            return;
        };
        self.lines = self.lines.saturating_add(1);
        let sum = &mut self.usage;
        sum.prompt = sum.prompt.saturating_add(u.prompt);
        sum.completion = sum.completion.saturating_add(u.completion);
        sum.cached = sum.cached.saturating_add(u.cached);
        sum.cache_write = sum.cache_write.saturating_add(u.cache_write);
        if self.model.is_empty() {
            self.model = m.model;
        }
    }
}

const ID_FIELDS: &[&str] = &["id", "input_file_id", "output_file_id", "error_file_id"];

/// A provider's JSON answer with every id of a file or batch in it sealed
/// (an object, or a list's `data`, `first_id` and `last_id`) by `seal(id,
/// n)`: a file's with `file_n` (the requests its upload counted), a batch's
/// own id and input file's with the requests its metadata holds, its output
/// files' with 0. A list of batches keeps only those marked `keep` (`None`:
/// all). `None` when the answer is not JSON.
pub fn seal_answer(
    body: &[u8],
    seal: &dyn Fn(&str, u64) -> String,
    file_n: u64,
    keep: Option<&[String]>,
    origin: &str,
) -> Option<Vec<u8>> {
    let mut v: Value = serde_json::from_slice(body).ok()?;
    let obj = v.as_object_mut()?;
    if obj.get("object").and_then(Value::as_str) == Some("list") {
        if let Some(Value::Array(items)) = obj.get_mut("data") {
            if let Some(marks) = keep {
                items.retain(|i| {
                    i.get("metadata")
                        .and_then(|m| m.get(OWNER_KEY))
                        .and_then(Value::as_str)
                        .is_some_and(|mark| marks.iter().any(|m| m == mark))
                });
            }
            for i in items.iter_mut() {
                if let Some(o) = i.as_object_mut() {
                    seal_object(o, seal, file_n, origin);
                }
            }
            let first = items.first().and_then(|i| i.get("id")).cloned();
            let last = items.last().and_then(|i| i.get("id")).cloned();
            obj.insert("first_id".into(), first.unwrap_or(Value::Null));
            obj.insert("last_id".into(), last.unwrap_or(Value::Null));
        }
    } else {
        seal_object(obj, seal, file_n, origin);
    }
    serde_json::to_vec(&v).ok()
}

fn seal_object(
    o: &mut Map<String, Value>,
    seal: &dyn Fn(&str, u64) -> String,
    file_n: u64,
    origin: &str,
) {
    // An Anthropic Message Batch (`type`): its id, and its results at the
    // gateway (the SDK fetches `results_url` as it is).
    if matches!(
        o.get("type").and_then(Value::as_str),
        Some("message_batch" | "message_batch_deleted")
    ) {
        let Some(Value::String(id)) = o.get_mut("id") else {
            return;
        };
        *id = seal(id, 0);
        let sealed = id.clone();
        if let Some(url) = o.get_mut("results_url").filter(|u| u.is_string()) {
            *url = Value::String(format!("{origin}{MESSAGE_BATCHES}/{sealed}/results"));
        }
        return;
    }
    // Only a file's or a batch's own ids (an error object has no `id`).
    let kind = match o.get("object").and_then(Value::as_str) {
        Some("file") => "file",
        Some("batch") => "batch",
        _ => return,
    };
    let batch_n = o
        .get("metadata")
        .and_then(|m| m.get(REQUESTS_KEY))
        .and_then(Value::as_str)
        .and_then(|n| n.parse::<u64>().ok())
        .unwrap_or(0);
    for f in ID_FIELDS {
        let n = match (kind, *f) {
            ("file", "id") => file_n,
            ("batch", "id" | "input_file_id") => batch_n,
            ("batch", _) => 0,
            _ => continue,
        };
        if let Some(Value::String(id)) = o.get_mut(*f) {
            *id = seal(id, n);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn calls_are_read_from_method_and_path() {
        assert_eq!(Call::of("POST", "/v1/files"), Some(Call::Upload));
        assert_eq!(
            Call::of("GET", "/v1/files/file-1/content"),
            Some(Call::File {
                id: "file-1",
                tail: "/content"
            })
        );
        assert_eq!(
            Call::of("POST", "/v1/batches/b~x/cancel"),
            Some(Call::Batch {
                id: "b~x",
                tail: "/cancel"
            })
        );
        assert_eq!(Call::of("DELETE", "/v1/batches/b"), None);
        assert_eq!(Call::of("GET", "/v1/files/a/b"), None);
        assert_eq!(Call::of("GET", "/v1/files/"), None);
        assert!(!Call::of("GET", "/v1/files/f/content")
            .unwrap()
            .answer_sealed());
    }

    #[test]
    fn a_sealed_id_opens_only_for_its_owner_and_provider() {
        let providers = ["primary", "backup"];
        let gw = Seal::with_secret("the gateway's secret");
        let id = seal("file-abc", "backup", "team-a", &gw, 12);
        assert_eq!(
            open(&id, &providers, "team-a", &gw),
            Some(("file-abc", 1, 12))
        );
        assert_eq!(open(&id, &providers, "team-b", &gw), None, "another owner");
        assert_eq!(open("file-abc", &providers, "team-a", &gw), None);
        // Any change of the id, the count or the seal is refused.
        for forged in [
            id.replacen("abc", "abd", 1),
            id.replace("~", "~0").chars().take(id.len()).collect(),
            format!("{}3", id.trim_end_matches("12")),
            format!("{}012", id.trim_end_matches("12")),
        ] {
            assert_eq!(open(&forged, &providers, "team-a", &gw), None, "{forged}");
        }
        // The gateway's secret is the seal: another gateway's (or a guess
        // made knowing the raw id, the owner and the provider) opens nothing.
        assert_eq!(
            open(
                &id,
                &providers,
                "team-a",
                &Seal::with_secret("another gateway's")
            ),
            None
        );
        // A batch's owner mark: the owner's, under the seal's keys.
        assert_eq!(owner_marks("team-a", &gw), vec![owner_mark("team-a", &gw)]);
        assert_ne!(owner_mark("team-a", &gw), owner_mark("team-b", &gw));
    }

    #[test]
    fn every_line_of_a_batch_file_is_read_with_its_number_and_custom_id() {
        let f = b"{\"custom_id\":\"a\",\"body\":{\"model\":\"m1\",\"messages\":[]}}\r\n\n{\"custom_id\":\"b\",\"body\":{\"model\":\"m2\"}}\nnot json\n{\"custom_id\":\"c\"}\n{\"body\":{\"model\":7}}";
        let lines = batch_lines(f);
        assert_eq!(lines.len(), 5);
        let first = lines[0].as_ref().unwrap();
        assert_eq!(
            (
                first.number,
                first.custom_id.as_deref(),
                first.model.as_deref()
            ),
            (1, Some("a"), Some("m1"))
        );
        assert_eq!(first.body, br#"{"model":"m1","messages":[]}"#);
        let second = lines[1].as_ref().unwrap();
        assert_eq!(
            (second.number, second.model.as_deref()),
            (3, Some("m2")),
            "blank lines count"
        );
        assert_eq!(&f[second.at..second.at + second.line.len()], second.line);
        for (i, n) in [(2, 4), (3, 5)] {
            let e = lines[i].as_ref().unwrap_err();
            assert_eq!((e.status, e.code), (400, "invalid_batch_line"));
            assert!(
                e.message.starts_with(&format!("Batch file line {n}:")),
                "{}",
                e.message
            );
        }
        let last = lines[4].as_ref().unwrap();
        assert_eq!(
            (last.custom_id.as_deref(), last.model.as_deref()),
            (None, None)
        );
        let e = second.error(GatewayError::new(
            403,
            "permission_error",
            "model_not_allowed",
            "no",
        ));
        assert_eq!(
            (e.status, e.code, e.message.as_str()),
            (
                403,
                "model_not_allowed",
                "Batch file line 3 (custom_id `b`): no"
            )
        );
        let body: Map<String, Value> = serde_json::from_str(r#"{"model":"m2","x":1}"#).unwrap();
        let v: Value =
            serde_json::from_slice(&line_with_body(second.line, &body).unwrap()).unwrap();
        assert_eq!(
            v,
            json!({"custom_id": "b", "body": {"model": "m2", "x": 1}})
        );
    }

    #[test]
    fn each_message_batch_request_is_checked_and_a_refusal_names_it() {
        let body = br#"{"requests":[{"custom_id":"a","params":{"model":"m","messages":[{"role":"user","content":"hi"}]}},{"custom_id":"b","params":{"model":"m","messages":[{"role":"user","content":"secret"}]}}]}"#;
        let mut seen = Vec::new();
        let out = message_batch_checked(body, &mut |model, params| {
            seen.push(model.to_string());
            let v: Value = serde_json::from_slice(params).unwrap();
            Ok((v["messages"][0]["content"] == "secret").then(|| {
                serde_json::from_value(
                    json!({"model": "m", "messages": [{"role": "user", "content": "[REDACTED]"}]}),
                )
                .unwrap()
            }))
        })
        .unwrap()
        .unwrap();
        assert_eq!(seen, ["m", "m"]);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["requests"][1]["params"]["messages"][0]["content"],
            "[REDACTED]"
        );
        assert_eq!(v["requests"][1]["custom_id"], "b");
        assert_eq!(v["requests"][0]["params"]["messages"][0]["content"], "hi");
        let e = message_batch_checked(body, &mut |_, params| {
            if serde_json::from_slice::<Value>(params).unwrap()["messages"][0]["content"]
                == "secret"
            {
                Err(GatewayError::new(
                    400,
                    "invalid_request_error",
                    "guardrail_denied",
                    "denied",
                ))
            } else {
                Ok(None)
            }
        })
        .unwrap_err();
        assert_eq!(
            (e.code, e.message.as_str()),
            ("guardrail_denied", "requests.1 (custom_id `b`): denied")
        );
        assert_eq!(
            message_batch_checked(body, &mut |_, _| Ok(None)).unwrap(),
            None
        );
    }

    #[test]
    fn a_batch_file_counts_its_requests_and_names_its_model() {
        let f = b"{\"custom_id\":\"a\",\"method\":\"POST\",\"url\":\"/v1/chat/completions\",\"body\":{\"model\":\"gpt-4o-mini\"}}\n\n{\"custom_id\":\"b\"}\n";
        assert_eq!(batch_file(f), (2, Some("gpt-4o-mini".into())));
        assert_eq!(batch_file(b"not json\n"), (1, None));
    }

    #[test]
    fn answers_seal_ids_and_lists_keep_the_owners_batches() {
        let s = |id: &str, n: u64| format!("{id}~S{n}");
        let b = br#"{"object":"batch","id":"batch_1","input_file_id":"file-1","output_file_id":null,"error_file_id":"file-e","metadata":{"portcullis_requests":"7"}}"#;
        let v: Value = serde_json::from_slice(&seal_answer(b, &s, 3, None, "").unwrap()).unwrap();
        assert_eq!(
            (
                v["id"].as_str(),
                v["input_file_id"].as_str(),
                v["error_file_id"].as_str()
            ),
            (Some("batch_1~S7"), Some("file-1~S7"), Some("file-e~S0"))
        );
        let f = br#"{"object":"file","id":"file-1","bytes":3}"#;
        let v: Value = serde_json::from_slice(&seal_answer(f, &s, 3, None, "").unwrap()).unwrap();
        assert_eq!(v["id"], "file-1~S3");
        assert!(v["output_file_id"].is_null());
        let list = br#"{"object":"list","data":[{"object":"batch","id":"b1","metadata":{"portcullis_owner":"me"}},{"object":"batch","id":"b2","metadata":null}],"first_id":"b1","last_id":"b2","has_more":false}"#;
        let v: Value = serde_json::from_slice(
            &seal_answer(list, &s, 0, Some(&["other".into(), "me".into()]), "").unwrap(),
        )
        .unwrap();
        assert_eq!(v["data"].as_array().unwrap().len(), 1);
        assert_eq!(
            (v["first_id"].as_str(), v["last_id"].as_str()),
            (Some("b1~S0"), Some("b1~S0"))
        );
        let err = br#"{"error":{"message":"No such File object: file-x","type":"invalid_request_error"}}"#;
        assert_eq!(
            serde_json::from_slice::<Value>(&seal_answer(err, &s, 0, None, "").unwrap()).unwrap(),
            serde_json::from_slice::<Value>(err).unwrap()
        );
    }

    #[test]
    fn a_batch_body_opens_its_file_and_carries_its_owner() {
        let open = |id: &str| (id == "file-1~S").then(|| ("file-1".to_string(), 1, 5));
        let mark = |p: usize| format!("mark{p}");
        let (body, p, n) = batch_body(
            br#"{"input_file_id":"file-1~S","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"a":"b"}}"#,
            &open,
            &mark,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!((p, n), (1, 5));
        assert_eq!(v["input_file_id"], "file-1");
        assert_eq!(
            v["metadata"],
            serde_json::json!({"a": "b", "portcullis_owner": "mark1", "portcullis_requests": "5"})
        );
        let e = batch_body(br#"{"input_file_id":"file-2"}"#, &open, &mark).unwrap_err();
        assert_eq!((e.status, e.code), (404, "file_not_found"));
        let e = batch_body(br#"{"endpoint":"x"}"#, &open, &mark).unwrap_err();
        assert_eq!(e.code, "missing_input_file_id");
    }

    #[test]
    fn message_batches_are_read_and_their_results_are_at_the_gateway() {
        assert_eq!(
            Call::of("GET", "/v1/messages/batches/m~x/results"),
            Some(Call::MessageBatch {
                id: "m~x",
                tail: "/results"
            })
        );
        assert_eq!(
            Call::of("POST", "/v1/messages/batches"),
            Some(Call::CreateMessageBatch)
        );
        assert_eq!(Call::of("PUT", "/v1/messages/batches/m"), None);
        let body = br#"{"requests":[{"custom_id":"a","params":{"model":"sonnet","max_tokens":5,"messages":[]}},{"custom_id":"b","params":{"model":"haiku"}}]}"#;
        assert_eq!(
            message_batch_requests(body).unwrap(),
            (2, "sonnet".to_string())
        );
        let map = |m: &str| (m != "other").then(|| format!("{m}-id"));
        let out: Value = serde_json::from_slice(&message_batch_body(body, &map).unwrap()).unwrap();
        assert_eq!(out["requests"][1]["params"]["model"], "haiku-id");
        let e = message_batch_body(br#"{"requests":[{"params":{"model":"other"}}]}"#, &map)
            .unwrap_err();
        assert_eq!(e.code, "model_not_in_batch_provider");
        assert_eq!(
            message_batch_requests(br#"{"requests":[]}"#)
                .unwrap_err()
                .code,
            "invalid_requests"
        );
        let s = |id: &str, n: u64| format!("{id}~S{n}");
        let b = br#"{"type":"message_batch","id":"msgbatch_1","results_url":"https://api.anthropic.com/v1/messages/batches/msgbatch_1/results"}"#;
        let v: Value =
            serde_json::from_slice(&seal_answer(b, &s, 0, None, "http://gw:1").unwrap()).unwrap();
        assert_eq!(v["id"], "msgbatch_1~S0");
        assert_eq!(
            v["results_url"],
            "http://gw:1/v1/messages/batches/msgbatch_1~S0/results"
        );
    }

    #[test]
    fn message_batch_results_are_read_for_their_usage_split_anywhere() {
        let line = |i: u64| {
            json!({"custom_id": format!("q{i}"), "result": {"type": "succeeded", "message": {"model": "claude-x",
                "usage": {"input_tokens": i, "output_tokens": 2, "cache_read_input_tokens": 1}}}})
            .to_string()
        };
        let errored =
            json!({"custom_id": "e", "result": {"type": "errored", "error": {"type": "error"}}})
                .to_string();
        let body = format!("{}\n{errored}\n{}\n{}", line(3), line(4), line(5));
        for cut in 0..body.len() {
            let mut r = ResultsUsage::default();
            r.push(&body.as_bytes()[..cut]);
            r.push(&body.as_bytes()[cut..]);
            r.finish();
            // Anthropic's input excludes cache reads: the prompt counts them.
            assert_eq!(
                (r.lines, r.usage.prompt, r.usage.completion, r.usage.cached),
                (3, 15, 6, 3),
                "{cut}"
            );
            assert_eq!(r.model, "claude-x");
        }
    }

    #[test]
    fn finished_batches_report_their_usage_and_a_list_only_the_owners() {
        let done = |id: &str, owner: &str| {
            json!({"id": id, "object": "batch", "status": "completed", "model": "gpt-4o-mini-2024-07-18",
                "metadata": {OWNER_KEY: owner}, "usage": {"input_tokens": 10, "output_tokens": 4, "total_tokens": 14}})
        };
        let one = serde_json::to_vec(&done("batch_1", "a")).unwrap();
        let found = finished_batches(&one, None);
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].0.as_str(), found[0].1.as_str()),
            ("batch_1", "gpt-4o-mini-2024-07-18")
        );
        assert_eq!((found[0].2.prompt, found[0].2.completion), (10, 4));
        let running = json!({"id": "batch_2", "object": "batch", "status": "in_progress", "usage": {"input_tokens": 1}});
        let list = json!({"object": "list", "data": [done("batch_1", "a"), done("batch_3", "b"), running]});
        let found = finished_batches(
            &serde_json::to_vec(&list).unwrap(),
            Some(&["a".to_string()]),
        );
        assert_eq!(
            found.iter().map(|f| f.0.as_str()).collect::<Vec<_>>(),
            vec!["batch_1"]
        );
        assert!(finished_batches(b"not json", None).is_empty());
    }
}
