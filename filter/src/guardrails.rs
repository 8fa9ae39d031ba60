//! The guardrails step: input checks on the prompt (before the cache and any
//! provider; an external guard by callout, the request waiting in
//! `Phase::Guarding`), output checks on the answer (a whole answer is held
//! and checked at its end; a stream passes through the look-behind window of
//! [`portcullis_core::guard::stream`]). The checks themselves are pure
//! ([`portcullis_core::guard`]); this file reads the host and acts.
//!
//! May use: `host`, `request`.

use crate::host::metrics;
use crate::host::{Action, LogLevel};
use crate::host::{Host, Part};
use crate::request::guard::{GuardCalls, OutputGuard};
use crate::request::{LogFacts, Phase, RequestContext};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::guard::texts::Shape;
use portcullis_core::guard::{
    self, external, stream::StreamGuard, Act, Guardrails, Kind, Stage, Verdict,
};
use portcullis_core::request::Document;

/// Whether the input step is done or waits for external guards.
#[derive(Debug, PartialEq, Eq)]
pub enum Guarded {
    Go,
    Wait,
}

impl<H: Host> RequestContext<H> {
    /// The input checks that apply to this request: local ones now, then
    /// external guards by callout.
    pub(crate) fn input_guardrails(
        &mut self,
        gw: &Gateway,
        client: &Client,
    ) -> Result<Guarded, GatewayError> {
        let Some(g) = gw.guardrails.as_ref() else {
            return Ok(Guarded::Go);
        };
        let Some(flight) = self.flight.as_mut() else {
            return Ok(Guarded::Go);
        };
        let model = flight.model;
        let active = g.active(Stage::Input, &client.name, model);
        let out_active = g.active(Stage::Output, &client.name, model);
        // Output checks read answers of chat completions, responses and
        // messages, whole or streamed; other answers pass as they are
        // (docs/security.md).
        let checked = self.request.api.answer_shape().is_some();
        if !out_active.is_empty() && checked {
            // The tree is built only when a schema check could use it.
            let schema = out_active
                .iter()
                .any(|&i| matches!(g.output.get(i).map(|c| &c.kind), Some(Kind::Schema(_))));
            let json_wanted = schema && flight.chat.document().is_ok_and(guard::wants_json);
            flight.output = Some(OutputGuard::new(out_active, json_wanted));
        }
        if active.is_empty() {
            return Ok(Guarded::Go);
        }
        let outcome = if flight.chat.is_form() {
            // A multipart body's text fields (its files are no text).
            let doc = flight.chat.document()?.clone();
            guard::check_input_doc(g, &active, model, Some(doc))
        } else {
            guard::check_input(g, &active, model, flight.chat.body())
        };
        self.note_verdicts(&outcome.verdicts);
        if let Some(err) = outcome.denied {
            return Err(err);
        }
        let externals: Vec<usize> = active
            .iter()
            .copied()
            .filter(|&i| matches!(g.input.get(i).map(|c| &c.kind), Some(Kind::External(_))))
            .collect();
        if externals.is_empty() {
            if let Some(doc) = &outcome.rewritten {
                self.use_rewritten(doc)?;
            }
            return Ok(Guarded::Go);
        }
        let doc = match outcome.rewritten {
            Some(doc) => doc,
            None => self
                .flight
                .as_ref()
                .map(|f| f.chat.document().cloned())
                .transpose()?
                .unwrap_or_default(),
        };
        let mut pending = GuardCalls {
            calls: Vec::new(),
            doc,
            changed: outcome.changed,
        };
        let text = external::joined_text(&mut pending.doc);
        let model_name = self
            .flight
            .as_ref()
            .map(|f| f.model_name.clone())
            .unwrap_or_default();
        for i in externals {
            let Some(check) = g.input.get(i) else {
                continue;
            };
            let Kind::External(e) = &check.kind else {
                continue;
            };
            let body = external::request("input", &check.name, &client.name, &model_name, &text);
            let headers = [
                (":method", "POST"),
                (":path", e.path.as_str()),
                (":authority", e.authority.as_str()),
                ("content-type", "application/json"),
            ];
            self.host.count(metrics::GUARD_CALLS, 1);
            match self
                .host
                .dispatch(&e.cluster, &headers, &body, e.timeout_ms)
            {
                Ok(token) => pending.calls.push((token, i, self.host.now_ms())),
                Err(s) => {
                    let why = format!("cannot call cluster `{}`: {s:?}", e.cluster);
                    if let Some(err) = self.guard_failed(g, i, &why) {
                        return Err(err);
                    }
                }
            }
        }
        if pending.calls.is_empty() {
            if pending.changed {
                self.use_rewritten(&pending.doc)?;
            }
            return Ok(Guarded::Go);
        }
        self.guarding = Some(pending);
        self.phase = Phase::Guarding;
        Ok(Guarded::Wait)
    }

    /// A guard that failed: its failure mode decides (`Some`: refuse).
    fn guard_failed(&mut self, g: &Guardrails, i: usize, why: &str) -> Option<GatewayError> {
        let check = g.input.get(i)?;
        let Kind::External(e) = &check.kind else {
            return None;
        };
        self.host.count(metrics::GUARD_ERRORS, 1);
        self.host.log(
            LogLevel::Warn,
            &format!(
                "guardrail `{}`: {why}; failure mode `{}`",
                check.name,
                if e.deny_on_failure { "deny" } else { "allow" }
            ),
        );
        self.note_verdicts(&[Verdict {
            stage: Stage::Input,
            check: check.name.clone(),
            action: if e.deny_on_failure {
                Act::Deny
            } else {
                Act::Log
            },
            hits: 0,
            matched: Vec::new(),
            reason: format!("guard failed: {why}"),
        }]);
        e.deny_on_failure.then(|| {
            GatewayError::new(
                503,
                "server_error",
                "guardrail_unavailable",
                format!(
                    "Guardrail `{}` could not check the request, and this gateway refuses what it cannot check. Retry shortly.",
                    check.name
                ),
            )
            .with_retry_after(1)
        })
    }

    /// An external guard's answer (`on_http_call_response` while guarding).
    pub(crate) fn on_guard_answer(&mut self, token: u32, body_size: usize) {
        let Some(mut pending) = self.guarding.take() else {
            return;
        };
        let Some(pos) = pending.calls.iter().position(|(t, _, _)| *t == token) else {
            self.guarding = Some(pending);
            return;
        };
        let (_, i, sent) = pending.calls.swap_remove(pos);
        let step = self.read_guard_answer(&mut pending, i, sent, body_size);
        let step = match step {
            Ok(()) if !pending.calls.is_empty() => {
                self.guarding = Some(pending);
                return;
            }
            Ok(()) => self.after_guards(pending),
            Err(e) => Err(e),
        };
        self.resume_with(step);
    }

    fn read_guard_answer(
        &mut self,
        pending: &mut GuardCalls,
        i: usize,
        sent: u64,
        body_size: usize,
    ) -> Result<(), GatewayError> {
        let loaded = self.loaded()?;
        let Some(g) = loaded.gw.guardrails.as_ref() else {
            return Ok(());
        };
        let Some(check) = g.input.get(i) else {
            return Ok(());
        };
        let now = self.host.now_ms();
        self.host
            .histogram(metrics::GUARD_LATENCY_MS, now.saturating_sub(sent));
        let status = self.host.headers(Part::CallResponse).ok().and_then(|h| {
            h.get(":status")
                .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
        });
        let body = self
            .host
            .body(Part::CallResponse, body_size)
            .unwrap_or_default();
        let answer = match external::answer(status, &body) {
            Ok(a) => a,
            Err(why) => {
                let timeout = match &check.kind {
                    Kind::External(e) => e.timeout_ms,
                    _ => 0,
                };
                let why =
                    if status.is_none() && now.saturating_sub(sent).saturating_add(1) >= timeout {
                        format!("no answer within {timeout} ms")
                    } else {
                        why
                    };
                return match self.guard_failed(g, i, &why) {
                    Some(err) => Err(err),
                    None => Ok(()),
                };
            }
        };
        let verdict = |hits: u32, reason: String| Verdict {
            stage: Stage::Input,
            check: check.name.clone(),
            action: check.act,
            hits,
            matched: Vec::new(),
            reason,
        };
        match answer {
            external::Answer::Allow => Ok(()),
            external::Answer::Deny(reason) => {
                self.note_verdicts(&[verdict(1, reason.clone())]);
                if check.act == Act::Log {
                    return Ok(());
                }
                Err(g.denial(
                    &check.name,
                    &format!("the guard service denied it ({reason})"),
                ))
            }
            external::Answer::Redact(targets) => {
                if check.act == Act::Log {
                    self.note_verdicts(&[verdict(
                        u32::try_from(targets.len()).unwrap_or(u32::MAX),
                        String::new(),
                    )]);
                    return Ok(());
                }
                let hits = external::apply_redactions(&mut pending.doc, &check.name, &targets);
                let mut v = verdict(hits, String::new());
                v.action = Act::Redact;
                self.note_verdicts(&[v]);
                pending.changed |= hits > 0;
                Ok(())
            }
        }
    }

    /// Every guard answered: go on with the (maybe rewritten) prompt.
    fn after_guards(&mut self, pending: GuardCalls) -> Result<Action, GatewayError> {
        self.phase = Phase::ChatBody;
        if pending.changed {
            self.use_rewritten(&pending.doc)?;
        }
        self.resume()
    }

    /// The prompt as the checks left it is the request from now on (the
    /// cache key, the estimate and every provider see it).
    fn use_rewritten(&mut self, doc: &Document) -> Result<(), GatewayError> {
        if let Some(f) = self.flight.as_mut() {
            f.chat = f.chat.with_document(doc)?;
            f.rewritten = true;
        }
        Ok(())
    }

    /// Verdicts go to the record and the metrics.
    pub(crate) fn note_verdicts(&mut self, verdicts: &[Verdict]) {
        note_verdicts(&self.host, &mut self.log, verdicts);
    }
}

/// Verdicts go to the record (`log`) and the metrics.
pub(crate) fn note_verdicts(host: &impl Host, log: &mut LogFacts, verdicts: &[Verdict]) {
    for v in verdicts {
        host.count(&metrics::guardrail(v.stage, &v.check, v.action), 1);
    }
    log.guardrails.extend(verdicts.iter().cloned());
}

/// The output checks across an answer: they read only the request's output
/// guard, the answer's shape and the record's facts, which the answer step
/// hands them.
impl OutputGuard {
    /// Output checks on a whole answer: `Err` when a check denies it;
    /// `Ok(Some)` when it was rewritten.
    pub(crate) fn check_whole(
        &mut self,
        host: &impl Host,
        g: &Guardrails,
        shape: Option<Shape>,
        log: &mut LogFacts,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, GatewayError> {
        host.count(metrics::GUARD_OUTPUT_CHECKS, 1);
        let Some(shape) = shape else {
            return Ok(None);
        };
        let (outcome, rewritten) =
            guard::check_answer_of(shape, g, &self.active, self.json_wanted, body);
        note_verdicts(host, log, &outcome.verdicts);
        self.touched = outcome.changed || outcome.denied.is_some();
        match outcome.denied {
            Some(err) => Err(err),
            None => Ok(rewritten),
        }
    }

    /// A streamed answer's bytes through the output checks (`None`: no
    /// stream guard).
    pub(crate) fn stream(
        &mut self,
        host: &impl Host,
        g: &Guardrails,
        log: &mut LogFacts,
        bytes: &[u8],
        end: bool,
    ) -> Option<Vec<u8>> {
        let sg = self.stream.as_mut()?;
        let mut sent = sg.chunk(g, bytes);
        if end {
            sent.extend(sg.finish(g));
        }
        let done = end || sg.denied.is_some();
        if done && !self.noted {
            self.noted = true;
            self.touched = sg.changed || sg.denied.is_some();
            let verdicts = std::mem::take(&mut sg.verdicts);
            if sg.denied.is_some() {
                log.error = "guardrail_denied";
            }
            note_verdicts(host, log, &verdicts);
        }
        Some(sent)
    }

    /// Start the stream guard for a streamed answer.
    pub(crate) fn start_stream(&mut self, host: &impl Host, g: &Guardrails, shape: Option<Shape>) {
        host.count(metrics::GUARD_OUTPUT_CHECKS, 1);
        if let Some(shape) = shape {
            self.stream = Some(StreamGuard::new(
                g,
                shape,
                self.active.clone(),
                self.json_wanted,
            ));
        }
    }
}
