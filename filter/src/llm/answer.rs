//! The answer path, one for every attempt: `begin` (status and headers),
//! `chunk` (bytes as they pass), `end`. Envoy's router feeds it the first
//! attempt's answer callback by callback; a fallback's answer arrives whole
//! from its callout and goes through the same three steps. What it does
//! once: the status for the record, whether the answer can be read
//! (content-encoded answers pass untouched), the usage read and settled,
//! the stream's usage chunk dropped when only the gateway asked for it, the
//! cache store, the completion text for the record.

use crate::host::metrics;
use crate::host::Action;
use crate::host::{Headers, Host, Part};
use crate::limits::admission::Finish;
use crate::request::flight::Translation;
use crate::request::reading::Reader;
use crate::request::{Phase, RequestContext};
use portcullis_core::credentials::secrets;
use portcullis_core::error::GatewayError;
use portcullis_core::health::attempt::{classify, classify_call, Outcome};
use portcullis_core::limits::stream_cap::StreamCap;
use portcullis_core::translate::{self, EventUsage};
use portcullis_core::wire::headers;
use portcullis_core::wire::sse;

/// Whether a whole answer waits for vendor checks.
enum Vendors {
    Wait,
    /// None to wait for: the answer as kept replacements left it (`None`:
    /// unchanged).
    Done(Option<Vec<u8>>),
}

/// Whether a response's headers say its body is content-encoded.
fn is_encoded(headers: &Headers) -> bool {
    headers
        .iter()
        .any(|(k, v)| k == "content-encoding" && !v.eq_ignore_ascii_case(b"identity"))
}

impl<H: Host> RequestContext<H> {
    /// The key the gateway gave the answering provider (to scrub from what
    /// it answers).
    fn answering_secret(&self) -> Option<&str> {
        let provider = self.flight.as_ref()?.current.as_ref()?.provider;
        self.loaded.as_ref()?.secrets.get(provider)?.as_deref()
    }

    /// Header values that quote the provider's key, scrubbed.
    fn scrubbed_headers(&self, resp: &Headers) -> Vec<(String, Vec<u8>)> {
        let Some(secret) = self.answering_secret() else {
            return Vec::new();
        };
        resp.iter()
            // The name is copied only for a value that had the key.
            .filter_map(|(k, v)| secrets::scrub(v, secret).map(|clean| (k.to_string(), clean)))
            .collect()
    }

    /// A whole body (an error, a held answer, a fallback's) that quotes
    /// the provider's key, scrubbed.
    fn scrubbed_body(&self, body: &[u8]) -> Option<Vec<u8>> {
        secrets::scrub(body, self.answering_secret()?)
    }

    /// A chunk of an answer passing through, the provider's key scrubbed
    /// (each key by as many bytes: a `Content-Length` stays true); `None`:
    /// the chunk as it came.
    fn scrubbed_chunk(&mut self, chunk: &[u8], end: bool) -> Option<Vec<u8>> {
        let loaded = self.loaded.clone()?;
        let f = self.flight.as_mut()?;
        let secret = loaded
            .secrets
            .get(f.current.as_ref()?.provider)?
            .as_deref()?;
        f.scrubber.as_mut()?.chunk(chunk, &[secret], end)
    }

    /// An answer's status and headers arrived; decide how to read it.
    fn answer_begin(&mut self, status: u16, resp: &Headers) {
        self.phase = Phase::Responding;
        self.log.status = status;
        let stream = self.flight.as_ref().is_some_and(|f| f.chat.stream);
        if stream {
            self.log.ttfb_ms = self.host.now_ms().saturating_sub(self.log.started_ms);
        }
        if (400..500).contains(&status) {
            self.log.error = "provider_client_error";
        }
        if status >= 400 {
            // Passed through as the client's error: it used nothing.
            self.finish_limits(Finish::Release);
        }
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let wants_usage = self.wants_usage(&loaded.gw);
        let api = self.request.api;
        let has_secret = self.answering_secret().is_some();
        let Some(f) = self.flight.as_mut() else {
            return;
        };
        let stream = f.chat.stream;
        let encoded = is_encoded(resp);
        let translated_by = f
            .current
            .as_ref()
            .and_then(|c| loaded.gw.providers.get(c.provider))
            .and_then(|p| translate::back_for(p, &f.chat));
        f.hold = false;
        f.translation = None;
        f.remember_response = api.keeps_responses() && status == 200 && translated_by.is_none();
        if let Some(back) = translated_by.filter(|_| !encoded) {
            let translated_stream = (status == 200 && stream)
                .then(|| {
                    let emit_usage = f.chat.include_usage || f.usage_chunk;
                    back.stream(self.host.now_ms() / 1000, emit_usage)
                })
                .flatten();
            match translated_stream {
                Some(s) => f.translation = Some(Translation::Stream(Box::new(s))),
                None => {
                    f.translation = Some(Translation::Whole { status, back });
                    f.hold = true;
                }
            }
        }
        // A success passing through is scrubbed of the provider's key as it
        // goes (an error is held whole for it, below).
        f.scrubber = (status == 200 && !encoded && has_secret)
            .then(portcullis_core::credentials::secrets::Scrubber::same_length);
        if status != 200 || encoded {
            // Not read: an error, or compressed (passed on untouched, the
            // reservation stands). An error is held whole to scrub the
            // provider's key from it.
            f.cache.forget();
            if status >= 400 && !encoded && has_secret {
                f.hold = true;
            }
            return;
        }
        if f.output.is_some() && !stream {
            f.hold = true;
        }
        // How much of a whole answer to keep whole: what the cache may store,
        // or the record's completion text; past that only the tail (usage).
        let store = f.cache.will_store();
        let cache_max = loaded.gw.cache.as_ref().map_or(0, |c| c.max_entry_bytes);
        let content_max = if include_content(&loaded.gw) && api.answer_is_json() {
            1 << 16
        } else {
            0
        };
        let keep = if store { cache_max } else { 0 }.max(content_max);
        f.reader = match EventUsage::for_api(api).filter(|_| stream) {
            // Passed on as it is; only its usage is read.
            Some(events) => wants_usage.then_some(Reader::Events(events)),
            None => Reader::for_answer(f.chat.stream, f.usage_chunk, store, wants_usage, keep),
        };
        f.stream_cap = f.cap.filter(|_| stream).and_then(|(n, prompt_est)| {
            let shape = api.capped_stream_shape()?;
            Some(StreamCap::new(shape, n, prompt_est, f.chat.include_usage))
        });
        if stream {
            self.start_stream_guard();
        }
    }

    /// Bytes of the answer as they pass; `Some` when what the client gets
    /// differs (a stream without the usage chunk only the gateway asked for).
    fn answer_chunk(&mut self, bytes: &[u8], end: bool) -> Option<Vec<u8>> {
        if self.log.ttft_ms == 0
            && self.log.status == 200
            && !bytes.is_empty()
            && self.flight.as_ref().is_some_and(|f| f.chat.stream)
        {
            // The first token's arrival: the stream's first bytes (a
            // sub-millisecond one counts as 1 ms; 0 means none).
            let ms = self.host.now_ms().saturating_sub(self.log.started_ms);
            self.log.ttft_ms = ms.max(1);
        }
        if self.flight.as_ref().is_some_and(|f| f.remember_response) {
            self.remember_response(bytes);
        }
        let f = self.flight.as_mut()?;
        let translated = match f.translation.as_mut() {
            Some(Translation::Stream(s)) => {
                let mut out = s.push(bytes);
                if end {
                    out.extend(s.finish());
                }
                Some(out)
            }
            _ => None,
        };
        let input = translated.as_deref().unwrap_or(bytes);
        let relayed = f.reader.as_mut().and_then(|r| r.chunk(input, end));
        let out = if f.output.as_ref().is_some_and(|o| o.stream.is_some()) {
            let input = relayed.as_deref().unwrap_or(input).to_vec();
            self.guard_stream(&input, end)
        } else {
            relayed.or(translated)
        };
        // Last: the client's stream held to its cap.
        let f = self.flight.as_mut()?;
        let Some(cap) = f.stream_cap.as_mut() else {
            return out;
        };
        let mut capped = cap.push(out.as_deref().unwrap_or(bytes));
        if end {
            capped.extend(cap.finish());
        }
        Some(capped)
    }

    /// Whether the answer is a stream translated to the client's events.
    fn translates_stream(&self) -> bool {
        self.flight
            .as_ref()
            .is_some_and(|f| matches!(f.translation, Some(Translation::Stream(_))))
    }

    /// Whether the router's answer is held whole (output checks, a
    /// translation).
    fn holds_answer(&self) -> bool {
        self.flight.as_ref().is_some_and(|f| f.hold)
    }

    /// A whole answer in OpenAI's shape: translated from the answering
    /// provider's API when it has another; `Err` when it does not read.
    fn whole_answer(&mut self, body: Vec<u8>) -> Result<Vec<u8>, GatewayError> {
        let now_s = self.host.now_ms() / 1000;
        match self.flight.as_ref().and_then(|f| f.translation.as_ref()) {
            Some(Translation::Whole { status: 200, back }) => {
                back.answer(&body, now_s).ok_or_else(|| {
                    GatewayError::new(
                        502,
                        "api_error",
                        "provider_bad_answer",
                        "The provider's answer could not be read as a message.",
                    )
                })
            }
            Some(Translation::Whole { status, back }) => Ok(back.error(&body, *status)),
            _ => Ok(body),
        }
    }

    /// The whole answer has passed: settle the limits with its usage, keep
    /// its text for the record when asked, store it in the cache.
    fn answer_end(&mut self) {
        let Some(f) = self.flight.as_mut() else {
            return;
        };
        let Some(reader) = f.reader.take() else {
            return;
        };
        let facts = reader.facts();
        let (usage, whole) = reader.finish();
        self.log.answer_facts = facts
            .or_else(|| {
                whole
                    .as_deref()
                    .map(portcullis_core::usage::AnswerFacts::from_body)
            })
            .unwrap_or_default();
        if whole.is_none() && f.cache.forget() {
            self.host.count(metrics::CACHE_TOO_LARGE, 1);
        }
        if f.output.as_ref().is_some_and(|o| o.touched) {
            // Denied or redacted for this client: not an answer for others.
            f.cache.forget();
        }
        // Images, characters, searches: the request's units; audio seconds:
        // the answer's. An answer that is not JSON (speech) is never read
        // for tokens.
        let usage = match f.chat.api.has_units() {
            true => {
                let u = usage.unwrap_or_default();
                Some(portcullis_core::usage::Usage {
                    units: u.units.max(f.chat.units.count),
                    ..u
                })
            }
            false => usage,
        };
        let whole = whole.filter(|_| f.chat.api.answer_is_json());
        self.log.usage = usage;
        // No usage from the provider (vLLM's streams by default): what was
        // counted, never nothing.
        let usage = usage.or_else(|| self.counted_usage()).or_else(|| {
            let text = whole.as_deref().map(sse::completion_text)?;
            let u = self.usage_from_text(&text);
            self.log.usage = Some(u);
            Some(u)
        });
        self.finish_limits(Finish::Settle(usage));
        if let Some(c) = whole {
            if self.loaded.as_ref().is_some_and(|l| include_content(&l.gw)) {
                self.log.completion = sse::completion_text(&c);
            }
            self.cache_store(&c);
        }
    }

    /// The router's answer: a retryable failure falls back (its headers held);
    /// anything else is the client's answer, with the gateway's headers.
    pub(crate) fn router_answer_headers(&mut self, end_of_stream: bool) -> Action {
        let resp = self.host.headers(Part::Response).unwrap_or_default();
        let status = crate::host::status_of(&resp).unwrap_or(0);
        // Tries Envoy's retries made of this provider (its route says how
        // many in x-envoy-attempt-count).
        if let Some(tries) = resp
            .get("x-envoy-attempt-count")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u32>().ok())
        {
            // Removed only when Envoy retried (the host call costs; a lone
            // `1` says nothing a client could use).
            if tries > 1 {
                let _ = self
                    .host
                    .set_header(Part::Response, "x-envoy-attempt-count", None);
            }
            if let Some(f) = self.flight.as_mut() {
                f.retried = f.retried.saturating_add(tries.saturating_sub(1));
            }
        }
        self.note_retry_after(&resp);
        // Why Envoy failed, for its own local replies (read on failures only).
        let details = (status == 429 || status >= 500)
            .then(|| self.host.property(&["response", "code_details"]))
            .flatten()
            .and_then(|b| String::from_utf8(b).ok());
        let mut outcome = classify(status, details.as_deref());
        if outcome == Outcome::ClientError && self.refusals_read() {
            if !end_of_stream {
                // Held until its body tells its error class (its body
                // comes to `router_answer_body`).
                if let Some(f) = self.flight.as_mut() {
                    f.refusal = Some(status);
                }
                self.phase = Phase::Responding;
                return Action::Pause;
            }
            outcome = self.refusal_outcome(status, b"");
        }
        if let Some(action) = self.after_attempt(Some(status), outcome) {
            return action;
        }
        self.answer_begin(status, &resp);
        self.decorate_answer(&resp, end_of_stream)
    }

    /// A provider's `Retry-After` (seconds), kept for its adaptive
    /// concurrency's pause.
    fn note_retry_after(&mut self, resp: &Headers) {
        let ms = resp
            .get("retry-after")
            .and_then(|v| std::str::from_utf8(v).ok()?.trim().parse::<u64>().ok())
            .map(|s| s.saturating_mul(1000));
        if let Some(f) = self.flight.as_mut() {
            f.retry_after_ms = ms;
        }
    }

    /// The client's answer's headers: ours in, a provider's gateway headers
    /// out, the length dropped when we change the body; `Pause` when the
    /// answer is held whole.
    fn decorate_answer(&mut self, resp: &Headers, end_of_stream: bool) -> Action {
        // Gateway headers from a provider never reach the client as ours;
        // the provider's other headers are left as they are.
        for (k, _) in resp.iter().filter(|(k, _)| headers::is_gateway_header(k)) {
            let _ = self.host.set_header(Part::Response, k, None);
        }
        // The provider's key never goes back, even in a debug header.
        for (k, v) in self.scrubbed_headers(resp) {
            let _ = self
                .host
                .set_header(Part::Response, &k, Some(&String::from_utf8_lossy(&v)));
        }
        self.each_gateway_header(|k, v| {
            let _ = self.host.add_header(Part::Response, k, v);
        });
        if self.flight.as_ref().is_some_and(|f| {
            f.translation.is_some()
                || (f.chat.stream
                    && self.log.status == 200
                    && ((f.usage_chunk && !f.chat.include_usage)
                        || f.stream_cap.is_some()
                        || f.output.as_ref().is_some_and(|o| o.stream.is_some())))
        }) {
            // A translated answer has its own length; so has a stream the
            // gateway changes as it passes (the usage chunk only it asked
            // for dropped, a cap, a guardrail): a provider's
            // `Content-Length` would promise the client bytes that never
            // come (#61). Envoy frames it chunked instead.
            let _ = self.host.set_header(Part::Response, "content-length", None);
        }
        if self.translates_stream() {
            // Server-sent events, whatever the provider's framing (AWS's
            // binary event stream).
            let _ = self
                .host
                .set_header(Part::Response, "content-type", Some("text/event-stream"));
        }
        if self.holds_answer() {
            if end_of_stream {
                // No body to check.
                if let Some(f) = self.flight.as_mut() {
                    f.hold = false;
                }
            } else {
                // Held with its body until the checks have read it all; a
                // redaction changes its length.
                let _ = self.host.set_header(Part::Response, "content-length", None);
                return Action::Pause;
            }
        }
        Action::Continue
    }

    /// The router's answer passes chunk by chunk (never held: Envoy's buffer
    /// limits never apply and the client gets bytes at once).
    pub(crate) fn router_answer_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if let Some(status) = self.flight.as_ref().and_then(|f| f.refusal) {
            return self.held_refusal(status, body_size, end_of_stream);
        }
        if self.holds_answer() {
            return self.held_answer_body(body_size, end_of_stream);
        }
        let (reads, scrubs) = self.flight.as_ref().map_or((false, false), |f| {
            (
                f.reader.is_some()
                    || f.remember_response
                    || f.translation.is_some()
                    || f.stream_cap.is_some()
                    || f.output.as_ref().is_some_and(|o| o.stream.is_some()),
                f.scrubber.is_some(),
            )
        });
        if reads || scrubs {
            let chunk = self
                .host
                .body(Part::Response, body_size)
                .unwrap_or_default();
            // Scrubbed first: what is read, cached and translated has no key.
            let scrubbed = if scrubs {
                self.scrubbed_chunk(&chunk, end_of_stream)
            } else {
                None
            };
            let input = scrubbed.as_deref().unwrap_or(&chunk);
            let out = if reads {
                self.answer_chunk(input, end_of_stream)
            } else {
                None
            };
            if let Some(out) = out.or(scrubbed) {
                let _ = self.host.set_body(Part::Response, body_size, &out);
            }
        }
        if end_of_stream {
            self.answer_end();
        }
        Action::Continue
    }

    /// A 4xx held until its body is whole: fall over when its class says
    /// so (its headers stay held), else it is the client's answer.
    fn held_refusal(&mut self, status: u16, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        if let Some(f) = self.flight.as_mut() {
            f.refusal = None;
        }
        let body = self
            .host
            .body(Part::Response, body_size)
            .unwrap_or_default();
        let outcome = self.refusal_outcome(status, &body);
        if let Some(action) = self.after_attempt(Some(status), outcome) {
            return action;
        }
        let resp = self.host.headers(Part::Response).unwrap_or_default();
        self.answer_begin(status, &resp);
        if self.decorate_answer(&resp, false) == Action::Pause {
            return self.held_answer_body(body_size, true);
        }
        Action::Continue
    }

    /// A whole answer held for the output checks: buffered until its end,
    /// then checked; a deny replaces it with the error (its headers were
    /// held), a redaction rewrites it.
    fn held_answer_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        if !end_of_stream {
            return Action::Pause;
        }
        let raw = self
            .host
            .body(Part::Response, body_size)
            .unwrap_or_default();
        let translated = self
            .flight
            .as_ref()
            .is_some_and(|f| f.translation.is_some());
        let mut body = match self.whole_answer(raw) {
            Ok(b) => b,
            Err(e) => {
                self.answer_end();
                return self.fail(&e);
            }
        };
        let checked = if self.log.status == 200 {
            self.check_whole_answer(&body)
        } else {
            Ok(None)
        };
        let mut changed = translated;
        if let Ok(Some(new)) = &checked {
            body.clone_from(new);
            changed = true;
        }
        if checked.is_ok() && self.log.status == 200 {
            match self.start_answer_vendors(&body) {
                Ok(Vendors::Wait) => return Action::Pause,
                Ok(Vendors::Done(Some(new))) => {
                    body = new;
                    changed = true;
                }
                Ok(Vendors::Done(None)) => {}
                Err(e) => {
                    self.answer_end();
                    return self.fail(&e);
                }
            }
        }
        self.finish_held(body, body_size, changed, checked)
    }

    /// A held answer's last steps once every check read it: scrubbed of the
    /// provider's key, read for the cache and the record, set as the body.
    fn finish_held(
        &mut self,
        mut body: Vec<u8>,
        body_size: usize,
        mut changed: bool,
        checked: Result<Option<Vec<u8>>, GatewayError>,
    ) -> Action {
        if let Some(clean) = self.scrubbed_body(&body) {
            body = clean;
            changed = true;
        }
        if let Some(out) = self.answer_chunk(&body, true) {
            body = out;
            changed = true;
        }
        if changed {
            let _ = self.host.set_body(Part::Response, body_size, &body);
        }
        self.answer_end();
        match checked {
            Err(e) => self.fail(&e),
            Ok(_) => Action::Continue,
        }
    }

    /// The vendor checks over a whole answer (`body`, as the client would
    /// get it): asked at once while the answer is held (`Wait`), or done
    /// at once (every verdict kept, or none apply): the answer as their
    /// kept replacements left it.
    fn start_answer_vendors(&mut self, body: &[u8]) -> Result<Vendors, GatewayError> {
        let Some(loaded) = self.loaded.clone() else {
            return Ok(Vendors::Done(None));
        };
        let (Some(g), Some(shape)) = (
            loaded.gw.guardrails.as_ref(),
            self.request.api.answer_shape(),
        ) else {
            return Ok(Vendors::Done(None));
        };
        let vendors = match self.flight.as_ref().and_then(|f| f.output.as_ref()) {
            Some(o) if !o.vendors.is_empty() => o.vendors.clone(),
            _ => return Ok(Vendors::Done(None)),
        };
        let started = crate::guardrails::start_answer(
            &self.host,
            g,
            &loaded.guard_output_credentials,
            &vendors,
            shape,
            body,
            &mut self.log,
        )?;
        let Some(calls) = started else {
            return Ok(Vendors::Done(None));
        };
        if calls.calls.is_empty() {
            return Ok(Vendors::Done(self.vendors_body(&calls)));
        }
        // The answer's headers as they were to go out (pseudo-headers and
        // framing left to Envoy's local reply).
        let headers = self
            .host
            .headers(Part::Response)
            .unwrap_or_default()
            .iter()
            .filter(|(k, _)| {
                !(k.starts_with(':')
                    || matches!(
                        *k,
                        "content-length" | "transfer-encoding" | "connection" | "keep-alive"
                    ))
            })
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        self.held_answer = Some(crate::request::guard::HeldAnswer {
            calls,
            status: self.log.status,
            headers,
            body: body.to_vec(),
        });
        self.phase = Phase::GuardingAnswer;
        Ok(Vendors::Wait)
    }

    /// The answer as the vendors' replacements left it (`None`: unchanged);
    /// a changed answer is not stored in the cache.
    fn vendors_body(&mut self, calls: &crate::request::guard::GuardCalls) -> Option<Vec<u8>> {
        if !calls.changed {
            return None;
        }
        if let Some(o) = self.flight.as_mut().and_then(|f| f.output.as_mut()) {
            o.touched = true;
        }
        Some(portcullis_core::guard::vendor::write_message(&calls.doc))
    }

    /// A vendor's answer about a held whole answer (`on_http_call_response`
    /// while `GuardingAnswer`): once the last is in, the answer goes to the
    /// client as the vendors left it, or the check's refusal does.
    pub(crate) fn on_answer_guard(&mut self, token: u32, body_size: usize) {
        let Some(mut held) = self.held_answer.take() else {
            return;
        };
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(read) = crate::guardrails::answer_for(
            &self.host,
            &mut self.log,
            &loaded,
            &mut held.calls,
            token,
            body_size,
        ) else {
            self.held_answer = Some(held);
            return;
        };
        if let Err(e) = read {
            if let Some(o) = self.flight.as_mut().and_then(|f| f.output.as_mut()) {
                o.touched = true;
            }
            self.log.error = "guardrail_denied";
            self.answer_end();
            self.fail(&e);
            return;
        }
        let mut body = self.vendors_body(&held.calls).unwrap_or(held.body);
        if let Some(clean) = self.scrubbed_body(&body) {
            body = clean;
        }
        if let Some(out) = self.answer_chunk(&body, true) {
            body = out;
        }
        self.answer_end();
        let headers: Vec<(&str, &[u8])> = held
            .headers
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_slice()))
            .collect();
        self.send(held.status, &headers, &body);
    }

    /// A fallback's answer, whole: the same steps, then sent to the client
    /// in place of the failed upstream's answer.
    pub(crate) fn fallback_answer(&mut self, token: u32, body_size: usize) {
        let Some(call) = self
            .flight
            .as_mut()
            .and_then(|f| f.call.take_if(|c| c.token == token))
        else {
            return;
        };
        // As bytes: the provider's header values pass to the client unchanged.
        let resp = self.host.headers(Part::CallResponse).unwrap_or_default();
        let status = crate::host::status_of(&resp);
        self.note_retry_after(&resp);
        let elapsed = self.host.now_ms().saturating_sub(call.started_ms);
        let mut outcome = classify_call(status, elapsed, call.timeout_ms);
        if let (Outcome::ClientError, Some(s)) = (outcome, status) {
            if self.refusals_read() {
                let body = self
                    .host
                    .body(Part::CallResponse, body_size)
                    .unwrap_or_default();
                outcome = self.refusal_outcome(s, &body);
            }
        }
        if self.after_attempt(status, outcome).is_some() {
            return; // the next attempt was dispatched, or the error was sent
        }
        let status = status.unwrap_or(502);
        let mut body = self
            .host
            .body(Part::CallResponse, body_size)
            .unwrap_or_default();
        self.answer_begin(status, &resp);
        body = match self.whole_answer(body) {
            Ok(b) => b,
            Err(e) => {
                self.answer_end();
                self.fail(&e);
                return;
            }
        };
        let checked = if status == 200 && self.flight.as_ref().is_some_and(|f| f.output.is_some()) {
            self.check_whole_answer(&body)
        } else {
            Ok(None)
        };
        if let Ok(Some(new)) = &checked {
            body.clone_from(new);
        }
        if let Some(clean) = self.scrubbed_body(&body) {
            body = clean;
        }
        let translated_stream = self.translates_stream();
        if let Some(out) = self.answer_chunk(&body, true) {
            body = out;
        }
        self.answer_end();
        if let Err(e) = checked {
            self.fail(&e);
            return;
        }
        let scrubbed = self.scrubbed_headers(&resp);
        let resp: Headers = resp
            .iter()
            .map(|(k, v)| match scrubbed.iter().find(|(s, _)| s == k) {
                Some((_, clean)) => (k, clean.as_slice()),
                None => (k, v),
            })
            .collect();
        let ours = self.gateway_headers();
        let event_stream = translated_stream;
        let mut hdrs: Vec<(&str, &[u8])> = resp
            .iter()
            .filter(|(k, _)| {
                let hop_or_length = k.starts_with(':')
                    || matches!(
                        *k,
                        "content-length" | "transfer-encoding" | "connection" | "keep-alive"
                    );
                let replaced = event_stream && *k == "content-type";
                !(hop_or_length || replaced || headers::is_gateway_header(k))
            })
            .collect();
        if event_stream {
            hdrs.push(("content-type", b"text/event-stream"));
        }
        hdrs.extend(ours.pairs());
        self.send(status, &hdrs, &body);
    }

    /// The gateway's response headers: who answered, how, and the limits.
    /// (For an answer the filter sends itself: all the values in one buffer.)
    pub(crate) fn gateway_headers(&self) -> GatewayHeaders {
        let mut out = GatewayHeaders {
            text: String::with_capacity(256),
            spans: Vec::with_capacity(self.limits.headers().len().saturating_add(6)),
        };
        self.each_gateway_header(|k, v| {
            let start = out.text.len();
            out.text.push_str(v);
            out.spans.push((k, start..out.text.len()));
        });
        out
    }

    /// The same, each header handed to `f` as it is read (nothing copied
    /// when a caller adds them one by one).
    pub(crate) fn each_gateway_header(&self, mut f: impl FnMut(&'static str, &str)) {
        if let Some(fl) = self.flight.as_ref() {
            f(headers::MODEL, &fl.model_name);
            if let Some(p) = self.answering_provider_name() {
                f(headers::PROVIDER, p);
            }
            f(
                headers::ATTEMPTS,
                &fl.attempts.saturating_add(fl.retried).to_string(),
            );
            if !fl.dropped.is_empty() {
                f(headers::DROPPED, &fl.dropped.join(","));
            }
            f(headers::CACHE, fl.cache.status.as_str());
            if let Some(hit) = fl.cache.semantic.as_ref().and_then(|s| s.hit) {
                f(
                    headers::CACHE_SIMILARITY,
                    &format!("{:.4}", f64::from(hit.0) / 1e6),
                );
                f(headers::CACHE_AGE, &hit.1.to_string());
            }
            if let Some((e, a)) = &fl.experiment {
                f(headers::EXPERIMENT, &format!("{e}/{a}"));
            }
            if fl.budget_routed {
                f(headers::BUDGET_ROUTED, &fl.chat.model);
            }
        }
        for (k, v) in self.limits.headers() {
            f(k, v);
        }
    }
}

/// The gateway's response headers, their values in one buffer.
pub(crate) struct GatewayHeaders {
    text: String,
    spans: Vec<(&'static str, std::ops::Range<usize>)>,
}

impl GatewayHeaders {
    /// Each header's name and value.
    pub(crate) fn pairs(&self) -> impl Iterator<Item = (&str, &[u8])> {
        self.spans.iter().map(|(k, r)| {
            (
                &**k,
                self.text.as_bytes().get(r.clone()).unwrap_or_default(),
            )
        })
    }
}

fn include_content(gw: &portcullis_core::config::Gateway) -> bool {
    gw.log.as_ref().is_some_and(|l| l.include_content)
}
