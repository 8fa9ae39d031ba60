//! The guardrails: input checks on the prompt (before the cache and any
//! provider; external guards by callout, whose calls the caller keeps while
//! the request waits), output checks on the answer (a whole answer is held
//! and checked at its end; a stream passes through the look-behind window of
//! [`portcullis_core::guard::stream`]). The checks themselves are pure
//! ([`portcullis_core::guard`]); these functions read the host and act on
//! the parts they are handed (the routed request, the record's facts, the
//! output guard), never on the request's holder: the model call's guard
//! step (`llm::guard`) hands them over.
//!
//! May use: `host`, `request`.

use crate::host::metrics;
use crate::host::LogLevel;
use crate::host::{Host, Part};
use crate::request::flight::Flight;
use crate::request::guard::{GuardCalls, OutputGuard};
use crate::request::LogFacts;
use portcullis_core::api::Api;
use portcullis_core::config::Client;
use portcullis_core::error::GatewayError;
use portcullis_core::guard::texts::Shape;
use portcullis_core::guard::{
    self, external, stream::StreamGuard, Act, Guardrails, Kind, Stage, Verdict,
};
use portcullis_core::request::Document;

/// What the input step did: the request goes on, or waits for the
/// external guards' calls (the caller keeps them until they answer).
pub enum Started {
    Go,
    Wait(GuardCalls),
}

/// The input checks that apply to a request: local ones now, then external
/// guards by callout. Handed what it reads and writes: the routed request
/// (its prompt, rewritten in place by what the checks change; its output
/// guard, set here), the inbound API and the record's facts.
pub(crate) fn start_input(
    host: &impl Host,
    g: &Guardrails,
    client: &Client,
    api: Api,
    flight: &mut Flight,
    log: &mut LogFacts,
) -> Result<Started, GatewayError> {
    let model = flight.model;
    let active = g.active(Stage::Input, &client.name, model);
    let out_active = g.active(Stage::Output, &client.name, model);
    // Output checks read answers of chat completions, responses and
    // messages, whole or streamed; other answers pass as they are
    // (docs/security.md).
    if !out_active.is_empty() && api.answer_shape().is_some() {
        // The tree is built only when a schema check could use it.
        let schema = out_active
            .iter()
            .any(|&i| matches!(g.output.get(i).map(|c| &c.kind), Some(Kind::Schema(_))));
        let json_wanted = schema && flight.chat.document().is_ok_and(guard::wants_json);
        flight.output = Some(OutputGuard::new(out_active, json_wanted));
    }
    if active.is_empty() {
        return Ok(Started::Go);
    }
    let outcome = if flight.chat.is_form() {
        // A multipart body's text fields (its files are no text).
        let doc = flight.chat.document()?.clone();
        guard::check_input_doc(g, &active, model, Some(doc))
    } else {
        guard::check_input(g, &active, model, flight.chat.body())
    };
    log.note_verdicts(host, &outcome.verdicts);
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
            use_rewritten(flight, doc)?;
        }
        return Ok(Started::Go);
    }
    let doc = match outcome.rewritten {
        Some(doc) => doc,
        None => flight.chat.document()?.clone(),
    };
    let mut pending = GuardCalls {
        calls: Vec::new(),
        doc,
        changed: outcome.changed,
    };
    let text = external::joined_text(&mut pending.doc);
    for i in externals {
        let Some(check) = g.input.get(i) else {
            continue;
        };
        let Kind::External(e) = &check.kind else {
            continue;
        };
        let body = external::request(
            "input",
            &check.name,
            &client.name,
            &flight.model_name,
            &text,
        );
        let headers = [
            (":method", "POST"),
            (":path", e.path.as_str()),
            (":authority", e.authority.as_str()),
            ("content-type", "application/json"),
        ];
        host.count(metrics::GUARD_CALLS, 1);
        match host.dispatch(&e.cluster, &headers, &body, e.timeout_ms) {
            Ok(token) => pending.calls.push((token, i, host.now_ms())),
            Err(s) => {
                let why = format!("cannot call cluster `{}`: {s:?}", e.cluster);
                if let Some(err) = guard_failed(host, log, g, i, &why) {
                    return Err(err);
                }
            }
        }
    }
    if pending.calls.is_empty() {
        if pending.changed {
            use_rewritten(flight, &pending.doc)?;
        }
        return Ok(Started::Go);
    }
    Ok(Started::Wait(pending))
}

/// A guard that failed: its failure mode decides (`Some`: refuse).
fn guard_failed(
    host: &impl Host,
    log: &mut LogFacts,
    g: &Guardrails,
    i: usize,
    why: &str,
) -> Option<GatewayError> {
    let check = g.input.get(i)?;
    let Kind::External(e) = &check.kind else {
        return None;
    };
    host.count(metrics::GUARD_ERRORS, 1);
    host.log(
        LogLevel::Warn,
        &format!(
            "guardrail `{}`: {why}; failure mode `{}`",
            check.name,
            if e.deny_on_failure { "deny" } else { "allow" }
        ),
    );
    log.note_verdicts(
        host,
        &[Verdict {
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
        }],
    );
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

/// An external guard's answer (`on_http_call_response` while guarding),
/// the `i`th input check's, sent at `sent`: noted, and a redaction applied
/// to the calls' prompt; `Err` when the request is refused.
pub(crate) fn read_answer(
    host: &impl Host,
    log: &mut LogFacts,
    g: &Guardrails,
    pending: &mut GuardCalls,
    (i, sent): (usize, u64),
    body_size: usize,
) -> Result<(), GatewayError> {
    let Some(check) = g.input.get(i) else {
        return Ok(());
    };
    let now = host.now_ms();
    host.histogram(metrics::GUARD_LATENCY_MS, now.saturating_sub(sent));
    let status = host.headers(Part::CallResponse).ok().and_then(|h| {
        h.get(":status")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
    });
    let body = host.body(Part::CallResponse, body_size).unwrap_or_default();
    let answer = match external::answer(status, &body) {
        Ok(a) => a,
        Err(why) => {
            let timeout = match &check.kind {
                Kind::External(e) => e.timeout_ms,
                _ => 0,
            };
            let why = if status.is_none() && now.saturating_sub(sent).saturating_add(1) >= timeout {
                format!("no answer within {timeout} ms")
            } else {
                why
            };
            return match guard_failed(host, log, g, i, &why) {
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
            log.note_verdicts(host, &[verdict(1, reason.clone())]);
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
                log.note_verdicts(
                    host,
                    &[verdict(
                        u32::try_from(targets.len()).unwrap_or(u32::MAX),
                        String::new(),
                    )],
                );
                return Ok(());
            }
            let hits = external::apply_redactions(&mut pending.doc, &check.name, &targets);
            let mut v = verdict(hits, String::new());
            v.action = Act::Redact;
            log.note_verdicts(host, &[v]);
            pending.changed |= hits > 0;
            Ok(())
        }
    }
}

/// The prompt as the checks left it is the request from now on (the cache
/// key, the estimate and every provider see it).
pub(crate) fn use_rewritten(flight: &mut Flight, doc: &Document) -> Result<(), GatewayError> {
    flight.chat = flight.chat.with_document(doc)?;
    flight.rewritten = true;
    Ok(())
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
        log.note_verdicts(host, &outcome.verdicts);
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
            log.note_verdicts(host, &verdicts);
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
