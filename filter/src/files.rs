//! OpenAI's files and batches through the gateway (#48): each call to the
//! provider that keeps the file or batch, with that provider's credential;
//! the ids the client sees sealed by the gateway's seal with the provider
//! and the client (`portcullis_core::api::files`, `portcullis_core::credentials::seal`),
//! so any replica routes a later call with the id alone and no other
//! client can use it. An upload goes to a
//! provider that serves the model its batch file names; a batch's requests
//! count against the key's request rate; each call is recorded.
//!
//! May use: `host`, `limits`, `request`, `upstream`.

use crate::host::{Action, Host, Part};
use crate::limits::admission;
use crate::request::files::StoredCall;
use crate::request::{Phase, RequestContext};
use crate::upstream::UpstreamRequest;
use portcullis_core::api::files::{self, Call};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::guard::{self, Kind, Stage};
use portcullis_core::routing::resolve;
use portcullis_core::telemetry::record::Record;
use portcullis_core::{pricing, translate, wire::form};

/// Anthropic's 404 for a batch it does not have.
fn message_batch_not_found(id: &str) -> GatewayError {
    GatewayError::new(
        404,
        "not_found_error",
        "not_found",
        format!("Message batch {id} not found"),
    )
}

fn not_found(what: &str, id: &str) -> GatewayError {
    GatewayError::new(
        404,
        "invalid_request_error",
        "not_found",
        format!("No such {what} object: {id}"),
    )
}

impl<H: Host> RequestContext<H> {
    /// A sealed id opened for this client: the provider's id, the
    /// provider, the requests it holds.
    fn open_id(&self, gw: &Gateway, client: &Client, id: &str) -> Option<files::Opened> {
        let seal = self.loaded.as_ref()?.seal.as_ref().ok()?;
        let names: Vec<&str> = gw.providers.iter().map(|p| p.name.as_str()).collect();
        files::open(id, &names, &client.name, seal).map(|(inner, p, n)| (inner.to_string(), p, n))
    }

    /// The provider a new file (or a list) goes to: the pinned one, else
    /// the first that keeps files among the model's (an upload's batch
    /// model), else the first in the chain that keeps files.
    fn stored_provider(
        &self,
        gw: &Gateway,
        client: &Client,
        model: Option<&str>,
        root: &str,
    ) -> Result<usize, GatewayError> {
        let keeps = |i: usize| {
            gw.providers
                .get(i)
                .is_some_and(|p| translate::stored_path(p, root).is_some())
        };
        if let Some(pin) = self.request.pin_provider.as_deref() {
            return gw
                .providers
                .iter()
                .position(|p| p.name == pin)
                .filter(|i| keeps(*i))
                .ok_or_else(|| {
                    GatewayError::bad_request(
                        "invalid_provider",
                        format!(
                            "Provider `{pin}` does not keep files here (only {} do).",
                            files::KEEPERS
                        ),
                    )
                });
        }
        if let Some(model) = model {
            let route = resolve(gw, client, model, self.roll)?;
            return route
                .candidates
                .iter()
                .map(|(p, _)| *p)
                .find(|p| keeps(*p))
                .ok_or_else(|| {
                    GatewayError::new(
                        404,
                        "invalid_request_error",
                        "model_not_found",
                        format!(
                            "The model `{model}` the batch file names has no provider that keeps files (only {} do).",
                            files::KEEPERS
                        ),
                    )
                });
        }
        (0..gw.providers.len()).find(|i| keeps(*i)).ok_or_else(|| {
            GatewayError::new(
                404,
                "invalid_request_error",
                "not_found",
                format!(
                    "No provider of this gateway keeps files (only {} do).",
                    files::KEEPERS
                ),
            )
        })
    }

    /// Each request line of a batch file checked as the request it will be
    /// (#61): its model one the key may use, its texts through the key's
    /// input guardrails for that model. The first line that fails is the
    /// error, naming it (line number, `custom_id`); `Some`: the file with
    /// the lines a check redacted rewritten.
    fn check_batch_lines(
        &mut self,
        gw: &Gateway,
        client: &Client,
        file: &[u8],
    ) -> Result<Option<Vec<u8>>, GatewayError> {
        let mut out: Option<Vec<u8>> = None;
        let mut passed = 0usize;
        for line in files::batch_lines(file) {
            let line = line?;
            let model = line.model.as_deref().ok_or_else(|| {
                line.error(GatewayError::bad_request(
                    "missing_model",
                    "the request's body names no `model`.",
                ))
            })?;
            let route = resolve(gw, client, model, self.roll).map_err(|e| line.error(e))?;
            let Some(g) = gw.guardrails.as_ref() else {
                continue;
            };
            let active = g.active(Stage::Input, &client.name, route.model);
            if active.is_empty() {
                continue;
            }
            if active
                .iter()
                .any(|&i| matches!(g.input.get(i).map(|c| &c.kind), Some(Kind::External(_))))
            {
                return Err(line.error(GatewayError::new(
                    403,
                    "permission_error",
                    "batch_unavailable",
                    "an external guardrail checks this key's prompts, and a batch's lines cannot wait for it: send them as requests.",
                )));
            }
            let outcome = guard::check_input(g, &active, route.model, line.body);
            self.note_verdicts(&outcome.verdicts);
            if let Some(e) = outcome.denied {
                return Err(line.error(e));
            }
            if let Some(doc) = outcome.rewritten {
                let new_line = files::line_with_body(line.line, &doc)
                    .ok_or_else(|| GatewayError::internal("cannot rewrite a batch line"))?;
                // The file up to this line as it came, then this line anew.
                let at = line.at;
                let o = out.get_or_insert_with(|| Vec::with_capacity(file.len()));
                o.extend_from_slice(file.get(passed..at).unwrap_or_default());
                o.extend_from_slice(&new_line);
                passed = at.saturating_add(line.line.len());
            }
        }
        Ok(out.map(|mut o| {
            o.extend_from_slice(file.get(passed..).unwrap_or_default());
            o
        }))
    }

    /// A files or batches call at its headers: the key, the request rate;
    /// a call on an id goes at once to the provider that keeps it.
    pub(crate) fn stored_headers(
        &mut self,
        gw: &Gateway,
        call: Call<'_>,
        (query, origin): (&str, String),
        authorization: Option<&str>,
        content_length: Option<usize>,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        let now = self.host.now_ms();
        self.log.started_ms = now;
        self.request.api = call.error_api();
        self.stored = Some(Box::new(StoredCall {
            api: call.api_name(),
            sealed: call.answer_sealed(),
            reports_usage: call.reports_usage(),
            origin,
            ..StoredCall::default()
        }));
        let client = self.key_and_rate(gw, authorization, now)?;
        self.loaded()?.sealer()?;
        if call.has_body() {
            let limit = client.limits.max_body_bytes;
            let own = limit != gw.max_body_bytes;
            if content_length.is_some_and(|n| n > limit) {
                return Err(GatewayError::body_too_large(limit, own));
            }
            if end_of_stream {
                return Err(GatewayError::bad_request(
                    "invalid_request",
                    "Request body is empty.",
                ));
            }
            if let Some(s) = self.stored.as_mut() {
                s.upload = call == Call::Upload;
                s.batch = call == Call::CreateBatch;
                s.message_batch = call == Call::CreateMessageBatch;
            }
            self.phase = Phase::StoredBody;
            return Ok(Action::Pause);
        }
        let (provider, rest) = match call {
            Call::File { id, tail } => {
                let (inner, p, n) = self
                    .open_id(gw, client, id)
                    .ok_or_else(|| not_found("File", id))?;
                // Its object is sealed again with the requests it holds.
                if let Some(s) = self.stored.as_mut() {
                    s.requests = n;
                }
                (p, format!("/files/{inner}{tail}"))
            }
            Call::Batch { id, tail } => {
                let (inner, p, _) = self
                    .open_id(gw, client, id)
                    .ok_or_else(|| not_found("Batch", id))?;
                (p, format!("/batches/{inner}{tail}"))
            }
            Call::MessageBatch { id, tail } => {
                let (inner, p, _) = self
                    .open_id(gw, client, id)
                    .ok_or_else(|| message_batch_not_found(id))?;
                if let (true, Some(s)) = (call.results(), self.stored.as_mut()) {
                    s.results = Some(Box::default());
                    s.batch_id = inner.clone();
                }
                (p, format!("/messages/batches/{inner}{tail}"))
            }
            Call::ListMessageBatches => {
                return Err(GatewayError::new(
                    403,
                    "permission_error",
                    "batches_list_unavailable",
                    "Listing Message Batches is not available through the gateway: a provider's batches are shared by every key of the gateway. Keep the ids your batches return.",
                ))
            }
            Call::ListBatches => {
                let p = self.stored_provider(gw, client, None, call.root())?;
                let marks = files::owner_marks(&client.name, self.loaded()?.sealer()?);
                if let Some(s) = self.stored.as_mut() {
                    s.keep = Some(marks);
                }
                (p, "/batches".to_string())
            }
            Call::ListFiles => {
                return Err(GatewayError::new(
                    403,
                    "invalid_request_error",
                    "files_list_unavailable",
                    "Listing files is not available through the gateway: a provider's files are shared by every key of the gateway. Keep the ids your uploads return (GET /v1/files/{id} reads one).",
                ))
            }
            Call::Upload | Call::CreateBatch | Call::CreateMessageBatch => {
                return Err(GatewayError::internal("a call with a body at its headers"))
            }
        };
        self.send_stored(gw, provider, &rest, query, None)
    }

    /// An upload's or a batch's whole body: where it goes, then sent.
    pub(crate) fn stored_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        let client = self
            .client(gw)
            .ok_or_else(|| GatewayError::internal("no client"))?;
        let limit = client.limits.max_body_bytes;
        if body_size > limit {
            return Err(GatewayError::body_too_large(
                limit,
                limit != gw.max_body_bytes,
            ));
        }
        if !end_of_stream {
            return Ok(Action::Pause);
        }
        let body = self
            .host
            .body(Part::Request, body_size)
            .map_err(|s| GatewayError::internal(format!("cannot read request body: {s:?}")))?;
        let (upload, batch, message_batch) =
            self.stored.as_ref().map_or((false, false, false), |s| {
                (s.upload, s.batch, s.message_batch)
            });
        if let Some(s) = self.stored.as_mut() {
            s.request_bytes = body.len() as u64;
        }
        if upload {
            let content_type = self.request.multipart_type.as_deref().unwrap_or("");
            let boundary = form::boundary(content_type).ok_or_else(|| {
                GatewayError::bad_request(
                    "invalid_multipart",
                    "/v1/files takes a multipart/form-data body: send `Content-Type: multipart/form-data; boundary=...`.",
                )
            })?;
            let f = form::parse(&body, boundary)?;
            let file = f.part("file").ok_or_else(|| {
                GatewayError::bad_request(
                    "missing_file",
                    "Missing required parameter: `file` (a multipart file part).",
                )
            })?;
            let purpose = f
                .part("purpose")
                .map(|p| f.value(&body, p))
                .ok_or_else(|| {
                    GatewayError::bad_request(
                        "missing_purpose",
                        "Missing required parameter: `purpose`.",
                    )
                })?;
            let batch = purpose == b"batch";
            let (requests, model) = if batch {
                files::batch_file(f.value(&body, file))
            } else {
                (0, None)
            };
            let provider = self.stored_provider(gw, client, model.as_deref(), "/files")?;
            // Every line of a batch file: its model the key's, its prompts
            // through the input guardrails (a redaction rewrites the file).
            let rewritten = if batch {
                self.check_batch_lines(gw, client, f.value(&body, file))?
                    .map(|file_bytes| {
                        let (start, end) = file.value;
                        let mut out = Vec::with_capacity(body.len());
                        out.extend_from_slice(body.get(..start).unwrap_or_default());
                        out.extend_from_slice(&file_bytes);
                        out.extend_from_slice(body.get(end..).unwrap_or_default());
                        (out, body_size)
                    })
            } else {
                None
            };
            if let Some(s) = self.stored.as_mut() {
                s.requests = requests;
                s.model = model.unwrap_or_default();
            }
            return self.send_stored(gw, provider, "/files", "", rewritten);
        }
        if batch {
            let seal = loaded.sealer()?;
            let open = |id: &str| self.open_id(gw, client, id);
            let mark = |_: usize| files::owner_mark(&client.name, seal);
            let (out, provider, requests) = files::batch_body(&body, &open, &mark)?;
            // A batch of n requests is n requests of the key's rate (the
            // call itself took one).
            if requests > 1 {
                let now = self.host.now_ms();
                self.take_rate(gw, client, now, requests.saturating_sub(1))?;
            }
            if let Some(s) = self.stored.as_mut() {
                s.requests = requests;
            }
            return self.send_stored(gw, provider, "/batches", "", Some((out, body_size)));
        }
        if message_batch {
            let (requests, model) = files::message_batch_requests(&body)?;
            let provider = self.stored_provider(gw, client, Some(&model), "/messages/batches")?;
            // Every request as the request it will be: its model the key's,
            // its texts through the input guardrails (#61).
            let roll = self.roll;
            let mut verdicts = Vec::new();
            let checked = files::message_batch_checked(&body, &mut |model, params| {
                let route = resolve(gw, client, model, roll)?;
                let Some(g) = gw.guardrails.as_ref() else {
                    return Ok(None);
                };
                let active = g.active(Stage::Input, &client.name, route.model);
                if active
                    .iter()
                    .any(|&i| matches!(g.input.get(i).map(|c| &c.kind), Some(Kind::External(_))))
                {
                    return Err(GatewayError::new(
                        403,
                        "permission_error",
                        "batch_unavailable",
                        "an external guardrail checks this key's prompts, and a batch's requests cannot wait for it: send them one by one.",
                    ));
                }
                let outcome = guard::check_input(g, &active, route.model, params);
                verdicts.extend(outcome.verdicts);
                match outcome.denied {
                    Some(e) => Err(e),
                    None => Ok(outcome.rewritten),
                }
            });
            self.note_verdicts(&verdicts);
            let body = checked?.unwrap_or(body);
            // Each request's model as that provider names it.
            let map = |name: &str| {
                resolve(gw, client, name, roll)
                    .ok()?
                    .candidates
                    .into_iter()
                    .find(|(p, _)| *p == provider)
                    .map(|(_, id)| id)
            };
            let out = files::message_batch_body(&body, &map)?;
            if requests > 1 {
                let now = self.host.now_ms();
                self.take_rate(gw, client, now, requests.saturating_sub(1))?;
            }
            if let Some(s) = self.stored.as_mut() {
                s.requests = requests;
                s.model = model;
            }
            return self.send_stored(
                gw,
                provider,
                "/messages/batches",
                "",
                Some((out, body_size)),
            );
        }
        Err(GatewayError::internal(
            "a stored call's body without a call",
        ))
    }

    /// The call through Envoy's router to the provider that keeps it.
    fn send_stored(
        &mut self,
        gw: &Gateway,
        provider: usize,
        rest: &str,
        query: &str,
        body: Option<(Vec<u8>, usize)>,
    ) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let p = gw
            .providers
            .get(provider)
            .ok_or_else(|| GatewayError::internal("no such provider"))?;
        let mut path = translate::stored_path(p, rest).ok_or_else(|| {
            GatewayError::internal(format!("provider `{}` keeps no files", p.name))
        })?;
        if let Some(q) = query.strip_prefix('?').filter(|q| !q.is_empty()) {
            path.push(if path.contains('?') { '&' } else { '?' });
            path.push_str(q);
        }
        let (body, body_size) = match body {
            Some((b, size)) => (Some(b), size),
            None => (None, 0),
        };
        if !self
            .stored
            .as_ref()
            .is_some_and(|s| s.upload || s.batch || s.message_batch)
        {
            // A call without a body (a read, a cancel) gets no content type.
            self.request.has_content_type = true;
        }
        let up = UpstreamRequest::to_provider(&loaded, provider, path, false, body)?;
        let traceparent = self.attempt_traceparent();
        crate::upstream::through_router(&self.host, &up, &self.request, traceparent, body_size)?;
        if let Some(s) = self.stored.as_mut() {
            s.provider = Some(provider);
        }
        self.phase = Phase::StoredProxied;
        Ok(Action::Continue)
    }

    /// The provider's answer: a JSON one held whole to seal its ids.
    pub(crate) fn stored_answer_headers(&mut self) -> Action {
        let status = self.answer_status();
        let sealed = self.stored.as_ref().is_some_and(|s| s.sealed) && status == 200;
        if let Some(s) = self.stored.as_mut() {
            s.sealed = sealed;
        }
        if sealed {
            let _ = self.host.set_header(Part::Response, "content-length", None);
        }
        if status != 200 {
            if let Some(s) = self.stored.as_mut() {
                s.results = None;
            }
        }
        self.phase = Phase::StoredResponding;
        Action::Continue
    }

    /// The answer's bytes: counted; a sealed answer held until whole.
    pub(crate) fn stored_answer_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let sealed = self.stored.as_ref().is_some_and(|s| s.sealed);
        if !sealed {
            if let Some(s) = self.stored.as_mut() {
                s.response_bytes = s.response_bytes.saturating_add(body_size as u64);
            }
            if self.stored.as_ref().is_some_and(|s| s.results.is_some()) {
                self.read_results(body_size, end_of_stream);
            }
            return Action::Continue;
        }
        if !end_of_stream {
            return Action::Pause;
        }
        let Ok(loaded) = self.loaded() else {
            return Action::Continue;
        };
        let gw = &loaded.gw;
        let (Some(client), Some(call)) = (self.client(gw), self.stored.as_ref()) else {
            return Action::Continue;
        };
        let Some(provider) = call.provider else {
            return Action::Continue;
        };
        let Ok(gw_seal) = loaded.sealer() else {
            return Action::Continue;
        };
        let name = gw.providers.get(provider).map_or("", |p| p.name.as_str());
        let seal = |id: &str, n: u64| files::seal(id, name, &client.name, gw_seal, n);
        let chunk = self
            .host
            .body(Part::Response, body_size)
            .unwrap_or_default();
        let finished = if call.reports_usage {
            files::finished_batches(&chunk, call.keep.as_deref())
        } else {
            Vec::new()
        };
        let out = files::seal_answer(
            &chunk,
            &seal,
            call.requests,
            call.keep.as_deref(),
            &call.origin,
        );
        if let Some(s) = self.stored.as_mut() {
            s.response_bytes = chunk.len() as u64;
        }
        for (id, model_id, usage) in finished {
            self.charge_batch(gw, provider, &id, &model_id, usage);
        }
        if let Some(out) = out {
            let _ = self.host.set_body(Part::Response, body_size, &out);
        }
        Action::Continue
    }

    /// A Message Batch's results as they pass: their usage summed; at
    /// their end, the batch's cost charged.
    fn read_results(&mut self, body_size: usize, end_of_stream: bool) {
        if body_size > 0 {
            let chunk = self
                .host
                .body(Part::Response, body_size)
                .unwrap_or_default();
            if let Some(r) = self.stored.as_mut().and_then(|s| s.results.as_mut()) {
                r.push(&chunk);
            }
        }
        if !end_of_stream {
            return;
        }
        let Some(mut r) = self.stored.as_mut().and_then(|s| s.results.take()) else {
            return;
        };
        r.finish();
        let Ok(loaded) = self.loaded() else {
            return;
        };
        let (provider, id) = match self.stored.as_ref() {
            Some(s) => (s.provider, s.batch_id.clone()),
            None => return,
        };
        if let (Some(p), true) = (provider, r.lines > 0) {
            self.charge_batch(&loaded.gw, p, &id, &r.model, r.usage);
        }
    }

    /// A finished batch's cost, charged to the client's budgets once (the
    /// first answer that shows its usage, a read or a list, on this Envoy):
    /// half the model's price, as providers bill batches.
    fn charge_batch(
        &mut self,
        gw: &Gateway,
        provider: usize,
        id: &str,
        model_id: &str,
        usage: portcullis_core::usage::Usage,
    ) {
        let Some(p) = gw.providers.get(provider) else {
            return;
        };
        let key = portcullis_core::shared::keys::batch_charged(&p.name, id);
        let first = portcullis_core::shared::store::update(&self.host, &key, |cur| match cur {
            Some(_) => (None, false),
            None => (Some(vec![1]), true),
        });
        if first != Ok(true) {
            return;
        }
        let priced = pricing::price_of_id(gw, provider, model_id)
            .map(|(price, source)| (price.scaled(pricing::BATCH_FACTOR), source));
        let price = priced.map(|(price, _)| price);
        if let Some(client) = self.client(gw) {
            let now = self.host.now_ms();
            let used = (&usage, price);
            let _ = admission::charge(
                &self.host,
                gw,
                (client, None),
                used,
                admission::Charge::Budgets,
                now,
            );
        }
        if let Some(s) = self.stored.as_mut() {
            let mut sum = s.usage.unwrap_or_default();
            sum.prompt = sum.prompt.saturating_add(usage.prompt);
            sum.completion = sum.completion.saturating_add(usage.completion);
            sum.cached = sum.cached.saturating_add(usage.cached);
            s.usage = Some(sum);
            s.cost_micros = s
                .cost_micros
                .saturating_add(price.map_or(0, |p| p.usage_cost(&usage)));
            s.price_source = priced.map_or("", |(_, source)| source.as_str());
            s.model = model_id.to_string();
        }
    }

    /// The call's end: its record.
    pub(crate) fn stored_end(&mut self) {
        let Some(call) = self.stored.take() else {
            return;
        };
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let gw = &loaded.gw;
        let mut ended = self.ended();
        let rec = Record {
            provider: call
                .provider
                .and_then(|p| gw.providers.get(p))
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            requested_model: call.model.clone(),
            model: call.model.clone(),
            api: call.api,
            request_bytes: call.request_bytes,
            response_bytes: call.response_bytes,
            prompt_tokens: call.usage.map_or(0, |u| u.prompt),
            completion_tokens: call.usage.map_or(0, |u| u.completion),
            cached_tokens: call.usage.map_or(0, |u| u.cached),
            cost_micros: call.cost_micros,
            price_source: call.price_source.to_string(),
            ..ended.record_base(gw, None)
        };
        ended.emit(&rec);
    }
}
