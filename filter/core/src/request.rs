//! The chat-completions request body: validate what the gateway needs and
//! rewrite it for a provider.
//!
//! One parse decides what a body is for every later step (validation, the
//! rewrite, the cache key, the estimate): `parse` reads the whole body
//! strictly in one pass ([`crate::wire::strict`]: numbers in range, no lone
//! surrogates, nesting within serde's limit) while borrowing the fields the
//! gateway needs; a body it cannot read whole is a 400. The tree the cache
//! key and the usage rewrite need is built only when they need it, from a
//! body already known to read; its accessors return a `Result` all the same,
//! so no step can ever work from a default. The rewrite splices the new
//! model id into the client's bytes at the span serde borrowed, so every
//! other byte reaches the provider as the client sent it.

use crate::api::{Api, Required};
use crate::error::GatewayError;
use crate::wire::strict::{self, Messages};
use serde_json::value::RawValue;
use serde_json::{Map, Value};
use std::cell::OnceCell;

/// A request body as a JSON tree.
pub type Document = Map<String, Value>;

#[derive(Debug, Clone, PartialEq)]
pub struct ChatRequest {
    body: Vec<u8>,
    /// The whole body as a tree, built on first use (cache key, usage
    /// rewrite, the record's prompt text).
    doc: OnceCell<Document>,
    /// Byte range of the `model` value (with its quotes) in `body`.
    model_span: (usize, usize),
    pub model: String,
    pub stream: bool,
    /// `stream_options.include_usage` as the client sent it.
    pub include_usage: bool,
    /// `max_completion_tokens`, else `max_tokens`, if given (embeddings:
    /// 0, they produce no tokens).
    pub max_tokens: Option<u64>,
    /// `temperature`, when a number (the record's).
    pub temperature: Option<f64>,
    /// The inbound API the body was read for.
    pub api: Api,
    /// What the request is priced by besides tokens (images asked for,
    /// characters to speak, searches).
    pub units: crate::api::Units,
    /// A multipart body's parts (`None`: JSON).
    form: Option<crate::wire::form::Form>,
}

fn invalid_json(detail: impl std::fmt::Display) -> GatewayError {
    GatewayError::bad_request(
        "invalid_json",
        format!("Request body is not valid JSON ({detail}). Send a JSON object with `model` and `messages`."),
    )
}

/// Offset of a borrowed slice inside the buffer it was borrowed from.
fn span_in(outer: &[u8], inner: &str) -> Option<(usize, usize)> {
    let start = (inner.as_ptr() as usize).checked_sub(outer.as_ptr() as usize)?;
    let end = start.checked_add(inner.len())?;
    (end <= outer.len()).then_some((start, end))
}

/// The body as text, if it is a JSON object at all.
fn json_object_text(body: &[u8]) -> Result<&str, GatewayError> {
    if body.is_empty() {
        return Err(GatewayError::bad_request(
            "invalid_json",
            "Request body is empty: send a JSON object with `model` and `messages`.",
        ));
    }
    let text = std::str::from_utf8(body).map_err(|e| invalid_json(format!("not UTF-8: {e}")))?;
    // serde would also read a struct from an array.
    if !text.trim_start().starts_with('{') {
        let not_object = || {
            GatewayError::bad_request(
                "invalid_json",
                "Request body must be a JSON object with `model` and `messages`.",
            )
        };
        return Err(serde_json::from_str::<serde::de::IgnoredAny>(text)
            .map_or_else(invalid_json, |_| not_object()));
    }
    Ok(text)
}

/// The requested model and the span of its value in `body`.
fn model_of(body: &[u8], raw: Option<&RawValue>) -> Result<(String, (usize, usize)), GatewayError> {
    let missing = || {
        GatewayError::bad_request(
            "missing_model",
            "You must provide a model parameter (`model`).",
        )
    };
    let raw = raw.ok_or_else(missing)?;
    match serde_json::from_str::<String>(raw.get()) {
        Ok(s) if s.is_empty() => Err(missing()),
        Ok(s) => {
            let span =
                span_in(body, raw.get()).ok_or_else(|| GatewayError::internal("model span"))?;
            Ok((s, span))
        }
        Err(_) => Err(GatewayError::bad_request(
            "invalid_model",
            "`model` must be a string.",
        )),
    }
}

/// `messages` must be a non-empty array.
fn check_messages(messages: Option<Messages>) -> Result<(), GatewayError> {
    match messages {
        None => Err(GatewayError::bad_request(
            "missing_messages",
            "Missing required parameter: `messages`.",
        )),
        Some(Messages::Array(0)) => Err(GatewayError::bad_request(
            "missing_messages",
            "`messages` must contain at least one message.",
        )),
        Some(Messages::Array(_)) => Ok(()),
        Some(Messages::NotArray) => Err(GatewayError::bad_request(
            "invalid_messages",
            "`messages` must be an array.",
        )),
    }
}

/// `input` must be a non-empty string or a non-empty array.
fn check_input(input: Option<&RawValue>) -> Result<(), GatewayError> {
    let bad = |code, message: &str| Err(GatewayError::bad_request(code, message.to_string()));
    let Some(raw) = input else {
        return bad("missing_input", "Missing required parameter: `input`.");
    };
    match serde_json::from_str::<Value>(raw.get()) {
        Ok(Value::String(s)) if !s.is_empty() => Ok(()),
        Ok(Value::Array(items)) if !items.is_empty() => Ok(()),
        _ => bad(
            "invalid_input",
            "`input` must be a non-empty string, or a non-empty array of strings or of token arrays.",
        ),
    }
}

impl ChatRequest {
    /// Parse a chat completion (see [`ChatRequest::parse_for`]).
    pub fn parse(body: &[u8]) -> Result<Self, GatewayError> {
        Self::parse_for(Api::ChatCompletions, body)
    }

    /// Parse and check the fields the gateway relies on for an API; the
    /// rest is the provider's business and passes through untouched.
    pub fn parse_for(api: Api, body: &[u8]) -> Result<Self, GatewayError> {
        Self::parse_owned(api, body.to_vec())
    }

    /// The same, keeping the caller's buffer as the request's body (no copy
    /// of a body that may be 32 MiB).
    pub fn parse_owned(api: Api, body: Vec<u8>) -> Result<Self, GatewayError> {
        let fields = Self::read_fields(api, &body)?;
        Ok(Self { body, ..fields })
    }

    /// A multipart request of an API (`content_type` names its boundary):
    /// its text fields read, its files never; the body kept as it came.
    pub fn parse_form(api: Api, body: Vec<u8>, content_type: &str) -> Result<Self, GatewayError> {
        let boundary = crate::wire::form::boundary(content_type).ok_or_else(|| {
            GatewayError::bad_request(
                "invalid_multipart",
                format!(
                    "{} takes a multipart/form-data body: send `Content-Type: multipart/form-data; boundary=...`.",
                    api.path()
                ),
            )
        })?;
        let form = crate::wire::form::parse(&body, boundary)?;
        let missing = || {
            GatewayError::bad_request(
                "missing_model",
                "You must provide a model parameter (`model`).",
            )
        };
        let part = form
            .parts
            .iter()
            .find(|p| p.name == "model" && p.filename.is_none())
            .ok_or_else(missing)?;
        let model = std::str::from_utf8(form.value(&body, part))
            .map_err(|_| GatewayError::bad_request("invalid_model", "`model` must be UTF-8 text."))?
            .to_string();
        if model.is_empty() {
            return Err(missing());
        }
        let model_span = part.value;
        let fields = form.fields(&body);
        let mut units = match api.required() {
            Required::Own(check) => check(&fields)?,
            Required::File => crate::api::audio::file_units(&form, &body)?,
            Required::Messages | Required::Input => crate::api::Units::default(),
        };
        if api == Api::ImagesEdits && form.part("image").or(form.part("image[]")).is_none() {
            return Err(GatewayError::bad_request(
                "missing_image",
                "Missing required parameter: `image` (a multipart file part).",
            ));
        }
        let stream = match fields.get("stream").and_then(Value::as_str) {
            None | Some("false") => false,
            Some("true") if api.streams() => true,
            Some(_) if !api.streams() => {
                return Err(GatewayError::bad_request(
                    "invalid_stream",
                    format!(
                        "{} answers are not streamed: leave out `stream`.",
                        api.path()
                    ),
                ))
            }
            Some(_) => {
                return Err(GatewayError::bad_request(
                    "invalid_stream",
                    "`stream` must be true or false.",
                ))
            }
        };
        if api == Api::ImagesEdits {
            units.count = units.count.max(1);
        }
        let doc = OnceCell::new();
        let _ = doc.set(fields);
        Ok(Self {
            body,
            doc,
            model_span,
            model,
            stream,
            include_usage: false,
            max_tokens: Some(0),
            temperature: None,
            api,
            units,
            form: Some(form),
        })
    }

    /// The request with its text fields as guardrails left them (a
    /// redaction): a JSON body rebuilt, a multipart one with those
    /// values replaced and every other byte (the files) as it came.
    pub fn with_document(&self, doc: &Document) -> Result<Self, GatewayError> {
        match &self.form {
            None => Self::from_document(self.api, doc),
            Some(form) => {
                let body = form.rewrite(&self.body, doc);
                Self::parse_form(
                    self.api,
                    body,
                    &format!("multipart/form-data; boundary={}", form.boundary),
                )
            }
        }
    }

    /// The length the prompt estimate counts: the body, or a multipart
    /// body's text fields (its files are no prompt).
    pub fn prompt_len(&self) -> usize {
        match &self.form {
            None => self.body.len(),
            Some(f) => f
                .parts
                .iter()
                .filter(|p| p.filename.is_none())
                .map(|p| p.value.1.saturating_sub(p.value.0))
                .sum(),
        }
    }

    /// Every field but the body, read from it.
    fn read_fields(api: Api, body: &[u8]) -> Result<Self, GatewayError> {
        let text = json_object_text(body)?;
        // Anything serde cannot read exactly (a number out of range, a lone
        // surrogate, nesting past its limit) is refused here, before any
        // step could see a partial document.
        let peek = strict::read(text).map_err(invalid_json)?;
        let (model, model_span) = model_of(body, peek.model)?;
        let doc = OnceCell::new();
        let units = match api.required() {
            Required::Messages => {
                check_messages(peek.messages)?;
                crate::api::Units::default()
            }
            Required::Input => {
                check_input(peek.input)?;
                crate::api::Units::default()
            }
            Required::Own(check) => {
                let d: Document = serde_json::from_str(text).map_err(invalid_json)?;
                let units = check(&d)?;
                let _ = doc.set(d);
                units
            }
            Required::File => {
                return Err(GatewayError::bad_request(
                    "invalid_multipart",
                    format!("{} takes a multipart/form-data body.", api.path()),
                ))
            }
        };
        let stream = match peek.stream.map(|r| r.get()) {
            None | Some("null") | Some("false") => false,
            Some("true") => true,
            Some(_) => {
                return Err(GatewayError::bad_request(
                    "invalid_stream",
                    "`stream` must be true or false.",
                ))
            }
        };
        let include_usage = peek
            .stream_options
            .and_then(|r| serde_json::from_str::<Value>(r.get()).ok())
            .and_then(|v| v.get("include_usage").and_then(Value::as_bool))
            .unwrap_or(false);
        let count =
            |r: Option<&RawValue>| r.and_then(|r| serde_json::from_str::<u64>(r.get()).ok());
        let max_tokens = if !api.streams() || api.has_units() {
            Some(0)
        } else if api == Api::Responses {
            count(peek.max_output_tokens)
        } else {
            count(peek.max_completion_tokens).or(count(peek.max_tokens))
        };
        if stream && !api.streams() {
            return Err(GatewayError::bad_request(
                "invalid_stream",
                format!(
                    "{} answers are not streamed: leave out `stream`.",
                    api.path()
                ),
            ));
        }
        Ok(Self {
            body: Vec::new(),
            doc,
            model_span,
            model,
            stream,
            include_usage,
            max_tokens,
            temperature: peek
                .temperature
                .and_then(|r| serde_json::from_str::<f64>(r.get()).ok()),
            api,
            units,
            form: None,
        })
    }

    /// A request of an API rebuilt from a document (the prompt as
    /// guardrails left it).
    pub fn from_document(api: Api, doc: &Document) -> Result<Self, GatewayError> {
        let body = serde_json::to_vec(doc)
            .map_err(|e| GatewayError::internal(format!("request rewrite: {e}")))?;
        Self::parse_for(api, &body)
    }

    /// The body to send to a provider: the client's bytes with the provider's
    /// model id spliced in.
    pub fn body_for(&self, provider_model_id: &str) -> Vec<u8> {
        let (start, end) = self.model_span;
        let id = if self.form.is_some() {
            // A multipart value is the text itself.
            provider_model_id.as_bytes().to_vec()
        } else {
            serde_json::to_vec(provider_model_id).unwrap_or_default()
        };
        let mut out = Vec::with_capacity(self.body.len() + id.len());
        out.extend_from_slice(self.body.get(..start).unwrap_or_default());
        out.extend_from_slice(&id);
        out.extend_from_slice(self.body.get(end..).unwrap_or_default());
        out
    }

    /// The `messages` array as JSON text (for records that keep content).
    pub fn messages_text(&self) -> Result<String, GatewayError> {
        Ok(self
            .document()?
            .get("messages")
            .map(Value::to_string)
            .unwrap_or_default())
    }

    /// The client's body as it came.
    pub fn body(&self) -> &[u8] {
        &self.body
    }

    pub fn body_len(&self) -> usize {
        self.body.len()
    }

    /// Whether the gateway must ask the provider for the usage chunk itself
    /// (a stream whose client did not ask for it).
    pub fn needs_usage_request(&self) -> bool {
        self.stream && !self.include_usage
    }

    /// The request with its completion capped at `n` tokens (a clamp to
    /// what the limits allow): the API's own field — `max_tokens` for
    /// Messages, `max_output_tokens` for Responses; for chat completions
    /// the field the client used, else `max_completion_tokens` (OpenAI's
    /// current name, which its reasoning models require) — set to `n`.
    pub fn with_max_tokens(&self, n: u64) -> Result<ChatRequest, GatewayError> {
        let mut doc = self.document()?.clone();
        let field = match self.api {
            Api::Messages => "max_tokens",
            Api::Responses => "max_output_tokens",
            _ if doc.contains_key("max_tokens") && !doc.contains_key("max_completion_tokens") => {
                "max_tokens"
            }
            _ => "max_completion_tokens",
        };
        doc.insert(field.into(), Value::from(n));
        Self::from_document(self.api, &doc)
    }

    /// `body_for`, asking a streaming provider for the final usage chunk
    /// (`stream_options.include_usage: true`) when `ask_usage`.
    pub fn body_for_with(
        &self,
        provider_model_id: &str,
        ask_usage: bool,
    ) -> Result<Vec<u8>, GatewayError> {
        if !(ask_usage && self.needs_usage_request()) {
            return Ok(self.body_for(provider_model_id));
        }
        let mut doc = self.document()?.clone();
        doc.insert("model".into(), Value::String(provider_model_id.to_string()));
        let opts = doc
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if !opts.is_object() {
            *opts = Value::Object(Map::new());
        }
        if let Some(o) = opts.as_object_mut() {
            o.insert("include_usage".into(), Value::Bool(true));
        }
        serde_json::to_vec(&doc).map_err(|e| GatewayError::internal(format!("rewrite: {e}")))
    }

    /// Whether the body is multipart (not JSON).
    pub fn is_form(&self) -> bool {
        self.form.is_some()
    }

    /// The whole document as a tree, built on first use. `parse` read the
    /// body strictly, so this does not fail; were it to, the caller gets
    /// the error, never an empty document.
    pub fn document(&self) -> Result<&Document, GatewayError> {
        if let Some(d) = self.doc.get() {
            return Ok(d);
        }
        let d: Document = serde_json::from_slice(&self.body).map_err(invalid_json)?;
        Ok(self.doc.get_or_init(|| d))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn parses_model_and_stream() {
        let r = ChatRequest::parse(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
        )
        .unwrap();
        assert_eq!(r.model, "m");
        assert!(r.stream);
        assert!(!r.include_usage);
        let r = ChatRequest::parse(br#"{"model":"m","messages":[{}],"stream":true,"stream_options":{"include_usage":true}}"#).unwrap();
        assert!(r.include_usage);
        let r = ChatRequest::parse(br#"{"model":"m","messages":[{}],"max_tokens":50}"#).unwrap();
        assert_eq!(r.max_tokens, Some(50));
        let r = ChatRequest::parse(
            br#"{"model":"m","messages":[{}],"max_tokens":50,"max_completion_tokens":70}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, Some(70));
    }

    /// The raw body length (for prompt-size estimates).
    #[test]
    fn body_len_is_the_client_body() {
        let r = ChatRequest::parse(br#"{"model":"m","messages":[{}]}"#).unwrap();
        assert_eq!(r.body_len(), 29);
    }

    #[test]
    fn rewrite_changes_only_the_model_bytes() {
        let src = br#"{ "temperature":0.5, "model" : "m\u00e9", "messages":[{"role":"user","content":"model"}],"x":{"model":"inner"}}"#;
        let r = ChatRequest::parse(src).unwrap();
        assert_eq!(r.model, "mé");
        let out = r.body_for("provider/\"m\"");
        assert_eq!(
            String::from_utf8(out.clone()).unwrap(),
            r#"{ "temperature":0.5, "model" : "provider/\"m\"", "messages":[{"role":"user","content":"model"}],"x":{"model":"inner"}}"#
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model"], "provider/\"m\"");
        assert_eq!(v["x"]["model"], "inner");
    }

    #[test]
    fn usage_is_requested_only_for_streams_that_did_not_ask() {
        let r = ChatRequest::parse(
            br#"{"model":"m","messages":[{}],"stream":true,"stream_options":{"x":1}}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&r.body_for_with("p", true).unwrap()).unwrap();
        assert_eq!(
            (
                v["model"].as_str(),
                v["stream_options"]["include_usage"].as_bool(),
                v["stream_options"]["x"].as_i64()
            ),
            (Some("p"), Some(true), Some(1))
        );
        let plain = ChatRequest::parse(br#"{"model":"m","messages":[{}]}"#).unwrap();
        assert_eq!(plain.body_for_with("p", true).unwrap(), plain.body_for("p"));
        assert!(!plain.needs_usage_request());
    }

    #[test]
    fn document_is_the_full_tree() {
        let r = ChatRequest::parse(
            br#"{"model":"m","messages":[{"role":"user","content":"hi"}],"seed":3}"#,
        )
        .unwrap();
        assert_eq!(r.document().unwrap()["seed"], 3);
    }

    /// Bodies that pass a lenient skim but not a whole read: each is refused,
    /// so no later step (cache key, rewrite) can work from a partial tree.
    #[test]
    fn bodies_serde_cannot_read_whole_are_refused() {
        let deep = format!(
            r#"{{"model":"m","messages":[{{"role":"user","content":"x"}}],"x":{}1{}}}"#,
            "[".repeat(200),
            "]".repeat(200)
        );
        for body in [
            r#"{"model":"m","messages":[{"role":"user","content":"x"}],"seed":1e400}"#.to_string(),
            r#"{"model":"m","messages":[{"role":"user","content":"\ud800"}]}"#.to_string(),
            r#"{"model":"m","messages":[{"role":"user","content":"\udc00 x"}],"stream":true}"#
                .to_string(),
            deep,
        ] {
            let e = ChatRequest::parse(body.as_bytes()).unwrap_err();
            assert_eq!((e.status, e.code), (400, "invalid_json"), "{body}");
        }
    }

    /// The rewrite that asks for usage works from the parsed tree: the
    /// messages and every other field survive it.
    #[test]
    fn usage_rewrite_keeps_the_messages_and_every_field() {
        let r = ChatRequest::parse(
            br#"{"model":"m","messages":[{"role":"user","content":"keep me"}],"stream":true,"seed":7}"#,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&r.body_for_with("p", true).unwrap()).unwrap();
        assert_eq!(v["messages"][0]["content"], "keep me");
        assert_eq!(
            (v["seed"].as_i64(), v["stream"].as_bool()),
            (Some(7), Some(true))
        );
        assert_eq!(v["stream_options"]["include_usage"], true);
    }

    #[test]
    fn a_clamp_sets_each_apis_own_cap_field() {
        let chat = ChatRequest::parse(br#"{"model":"m","messages":[{}]}"#).unwrap();
        assert_eq!(chat.max_tokens, None);
        let c = chat.with_max_tokens(40).unwrap();
        assert_eq!(c.max_tokens, Some(40));
        assert_eq!(c.document().unwrap()["max_completion_tokens"], 40);
        // The client's older field is the one lowered.
        let old = ChatRequest::parse(br#"{"model":"m","messages":[{}],"max_tokens":900}"#).unwrap();
        let c = old.with_max_tokens(40).unwrap();
        assert_eq!(c.document().unwrap()["max_tokens"], 40);
        assert!(!c.document().unwrap().contains_key("max_completion_tokens"));
        let m = ChatRequest::parse_for(
            Api::Messages,
            br#"{"model":"m","max_tokens":4096,"messages":[{}]}"#,
        )
        .unwrap();
        assert_eq!(m.with_max_tokens(7).unwrap().max_tokens, Some(7));
        let r = ChatRequest::parse_for(
            Api::Responses,
            br#"{"model":"m","input":"hi","max_output_tokens":500}"#,
        )
        .unwrap();
        assert_eq!(r.max_tokens, Some(500), "Responses' cap is read");
        let r = r.with_max_tokens(9).unwrap();
        assert_eq!(r.document().unwrap()["max_output_tokens"], 9);
        assert_eq!(r.max_tokens, Some(9));
    }

    #[test]
    fn every_bad_body_is_a_400_with_a_specific_code() {
        let cases: &[(&[u8], &str)] = &[
            (b"", "invalid_json"),
            (b"{not json", "invalid_json"),
            (b"[1,2]", "invalid_json"),
            (b"\"str\"", "invalid_json"),
            (
                b"{\"model\":\"m\",\"messages\":[{}]} trailing",
                "invalid_json",
            ),
            (b"\xff\xfe", "invalid_json"),
            (
                br#"{"model":"a","model":"b","messages":[{}]}"#,
                "invalid_json",
            ),
            (
                br#"{"messages":[{"role":"user","content":"x"}]}"#,
                "missing_model",
            ),
            (
                br#"{"model":"","messages":[{"role":"user","content":"x"}]}"#,
                "missing_model",
            ),
            (
                br#"{"model":3,"messages":[{"role":"user","content":"x"}]}"#,
                "invalid_model",
            ),
            (br#"{"model":"m"}"#, "missing_messages"),
            (br#"{"model":"m","messages":[]}"#, "missing_messages"),
            (br#"{"model":"m","messages":"hi"}"#, "invalid_messages"),
            (
                br#"{"model":"m","messages":[{}],"stream":"yes"}"#,
                "invalid_stream",
            ),
        ];
        for (body, code) in cases {
            let e = ChatRequest::parse(body).unwrap_err();
            assert_eq!(
                (e.status, e.code),
                (400, *code),
                "{}",
                String::from_utf8_lossy(body)
            );
        }
    }

    #[test]
    fn the_new_endpoints_bodies_give_their_units_and_refuse_what_they_lack() {
        let img = ChatRequest::parse_for(
            Api::ImagesGenerations,
            br#"{"model":"dall-e-3","prompt":"fox","n":3,"size":"1024x1792","quality":"hd"}"#,
        )
        .unwrap();
        assert_eq!(img.units.count, 3);
        assert_eq!(
            img.units.image,
            Some(crate::pricing::ImageKey::of("hd", "1024x1792"))
        );
        assert_eq!(img.max_tokens, Some(0));
        let speech = ChatRequest::parse_for(
            Api::AudioSpeech,
            r#"{"model":"tts-1","voice":"alloy","input":"héllo"}"#.as_bytes(),
        )
        .unwrap();
        assert_eq!(speech.units.count, 5, "characters, not bytes");
        let rr = ChatRequest::parse_for(
            Api::Rerank,
            format!(
                r#"{{"model":"r","query":"q","documents":{}}}"#,
                serde_json::to_string(&vec!["d"; 101]).unwrap()
            )
            .as_bytes(),
        )
        .unwrap();
        assert_eq!(rr.units.count, 2, "a search per 100 documents");
        let e = ChatRequest::parse_for(Api::AudioTranscriptions, br#"{"model":"w"}"#).unwrap_err();
        assert_eq!(e.code, "invalid_multipart");
        let e =
            ChatRequest::parse_for(Api::Moderations, br#"{"model":"m","input":[]}"#).unwrap_err();
        assert_eq!(e.code, "invalid_input");
        // A WAV's seconds from its header: 8000 bytes a second, 2.5 s.
        let mut wav = b"RIFF\0\0\0\0WAVEfmt \x10\0\0\0\x01\0\x01\0\x40\x1f\0\0\x40\x1f\0\0\x01\0\x08\0LIST\x04\0\0\0abcddata".to_vec();
        wav.extend_from_slice(&20_000u32.to_le_bytes());
        assert_eq!(crate::api::audio::wav_seconds(&wav), Some(3));
        assert_eq!(crate::api::audio::wav_seconds(&wav[..30]), None);
        assert_eq!(crate::api::audio::wav_seconds(b"ID3 not a wav"), None);
    }

    #[test]
    fn a_multipart_request_splices_the_model_and_redacts_text_fields_only() {
        let body = b"--b1\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\x00prompt\r\n--b1\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b1\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\ncall 555-1234\r\n--b1--\r\n".to_vec();
        let ct = "multipart/form-data; boundary=b1";
        let r = ChatRequest::parse_form(Api::AudioTranscriptions, body.clone(), ct).unwrap();
        assert_eq!(r.model, "whisper");
        assert!(r.is_form());
        assert_eq!(r.prompt_len(), "whisper".len() + "call 555-1234".len());
        assert_eq!(r.document().unwrap()["prompt"], "call 555-1234");
        let sent = r.body_for("whisper-1");
        let again = ChatRequest::parse_form(Api::AudioTranscriptions, sent, ct).unwrap();
        assert_eq!(again.model, "whisper-1");
        let mut doc = r.document().unwrap().clone();
        doc.insert("prompt".into(), Value::String("call [PHONE]".into()));
        let red = r.with_document(&doc).unwrap();
        assert_eq!(red.document().unwrap()["prompt"], "call [PHONE]");
        assert!(red.body().windows(10).any(|w| w == b"RIFF\x00promp"));
        assert_eq!(
            ChatRequest::parse_form(Api::AudioTranscriptions, body, "text/plain")
                .unwrap_err()
                .code,
            "invalid_multipart"
        );
    }
}
