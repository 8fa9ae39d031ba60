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
//! May use: `host`, `loaded`, `request`.

use crate::host::metrics;
use crate::host::LogLevel;
use crate::host::{Host, Part};
use crate::loaded::GuardCredential;
use crate::request::flight::Flight;
use crate::request::guard::{GuardCall, GuardCalls, OutputGuard, SentBatch, Target};
use crate::request::LogFacts;
use portcullis_core::api::Api;
use portcullis_core::config::Client;
use portcullis_core::credentials::sigv4;
use portcullis_core::error::GatewayError;
use portcullis_core::guard::texts::Shape;
use portcullis_core::guard::vendor::{self, kept};
use portcullis_core::guard::{
    self, external, stream::StreamGuard, Act, Guardrails, Kind, Stage, VendorFacts, Verdict,
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
    creds: &[GuardCredential],
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
        let (vendors, local): (Vec<usize>, Vec<usize>) = out_active.into_iter().partition(|&i| {
            matches!(g.output.get(i).map(|c| &c.kind), Some(Kind::External(e)) if e.vendor.is_some())
        });
        if flight.chat.stream {
            // A streamed answer is not read by vendors yet: said, never a
            // silent pass (docs/vendor-guardrails.md).
            for &i in &vendors {
                let why =
                    "a streamed answer is not checked by vendor checks (ask without `stream`)";
                if let Some(err) = guard_failed(host, log, g, (Stage::Output, i), why) {
                    return Err(err);
                }
            }
        }
        let mut out = OutputGuard::new(local, json_wanted);
        if !flight.chat.stream {
            out.vendors = vendors;
        }
        flight.output = Some(out);
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
        target: Target::Prompt,
    };
    // Every external check reads the prompt as the local checks left it;
    // all are asked at once (the step waits for the slowest).
    // Our own contract reads the texts joined; vendors read them message
    // by message. Each is built only when a check of its kind applies.
    let ours = externals.iter().any(|&i| {
        matches!(g.input.get(i).map(|c| &c.kind), Some(Kind::External(e)) if e.vendor.is_none())
    });
    let text = if ours {
        external::joined_text(&mut pending.doc)
    } else {
        String::new()
    };
    let messages = if ours && externals.len() == 1 {
        Vec::new()
    } else {
        vendor::message_texts(&pending.doc)
    };
    for i in externals {
        let Some(check) = g.input.get(i) else {
            continue;
        };
        let Kind::External(e) = &check.kind else {
            continue;
        };
        if e.vendor.is_some() {
            ask_vendors(host, g, creds, &[i], &messages, &mut pending, log)?;
            continue;
        }
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
            Ok(token) => pending.calls.push(GuardCall {
                token,
                check: i,
                sent: host.now_ms(),
                batch: None,
            }),
            Err(s) => {
                let why = format!("cannot call cluster `{}`: {s:?}", e.cluster);
                if let Some(err) = guard_failed(host, log, g, (Stage::Input, i), &why) {
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

/// The vendor checks over an MCP `tools/call`'s arguments (`msg`, the
/// message as the server will get it; `body_size` bytes buffered): each
/// argument string a text, every vendor asked at once. `None`: no vendor
/// check applies; else the calls (none left when every verdict was kept).
pub(crate) fn start_tool_arguments(
    host: &impl Host,
    g: &Guardrails,
    creds: &[GuardCredential],
    client: &str,
    msg: Document,
    body_size: usize,
    log: &mut LogFacts,
) -> Result<Option<GuardCalls>, GatewayError> {
    let vendors: Vec<usize> = g
        .input
        .iter()
        .enumerate()
        .filter(|(_, c)| {
            c.models.is_none()
                && c.for_client(client)
                && matches!(&c.kind, Kind::External(e) if e.vendor.is_some())
        })
        .map(|(i, _)| i)
        .collect();
    if vendors.is_empty() {
        return Ok(None);
    }
    let texts = vendor::argument_texts(&msg);
    if texts.is_empty() {
        return Ok(None);
    }
    let mut pending = GuardCalls {
        calls: Vec::new(),
        doc: msg,
        changed: false,
        target: Target::ToolArguments { body_size },
    };
    ask_vendors(host, g, creds, &vendors, &texts, &mut pending, log)?;
    Ok(Some(pending))
}

/// The vendor checks over a whole answer (`body`, in the client's API's
/// `shape`), all asked at once. `None`: the answer does not read as JSON
/// (nothing to check); else the calls (none left when every verdict was
/// kept).
pub(crate) fn start_answer(
    host: &impl Host,
    g: &Guardrails,
    creds: &[GuardCredential],
    vendors: &[usize],
    shape: Shape,
    body: &[u8],
    log: &mut LogFacts,
) -> Result<Option<GuardCalls>, GatewayError> {
    let Some(mut doc) = vendor::read_message(body) else {
        return Ok(None);
    };
    let texts = vendor::answer_texts(shape, &mut doc);
    let mut pending = GuardCalls {
        calls: Vec::new(),
        doc,
        changed: false,
        target: Target::Answer(shape),
    };
    if texts.is_empty() {
        return Ok(Some(pending));
    }
    ask_vendors(host, g, creds, vendors, &texts, &mut pending, log)?;
    Ok(Some(pending))
}

/// Every vendor check of `indexes` (of `pending`'s stage) asked about
/// `texts` at once; a check whose call cannot be made fails by its mode.
fn ask_vendors(
    host: &impl Host,
    g: &Guardrails,
    creds: &[GuardCredential],
    indexes: &[usize],
    texts: &[vendor::Text],
    pending: &mut GuardCalls,
    log: &mut LogFacts,
) -> Result<(), GatewayError> {
    let stage = pending.target.stage();
    for &i in indexes {
        let Some(check) = g.checks(stage).get(i) else {
            continue;
        };
        let Kind::External(e) = &check.kind else {
            continue;
        };
        let Some(v) = &e.vendor else {
            continue;
        };
        let credential = creds.get(i).unwrap_or(&GuardCredential::None);
        let asked = ask_vendor(host, g, (i, check, e, v), credential, texts, pending, log);
        if let Err(why) = asked {
            if let Some(err) = guard_failed(host, log, g, (stage, i), &why) {
                return Err(err);
            }
        }
    }
    Ok(())
}

/// A vendor check: the messages whose verdict is kept are not sent (their
/// kept replacements applied), the rest go to the vendor in as few calls as
/// it takes; `Err` when a call cannot be made.
fn ask_vendor(
    host: &impl Host,
    g: &Guardrails,
    (i, check, e, v): (usize, &guard::Check, &guard::External, &vendor::Vendor),
    credential: &GuardCredential,
    messages: &[vendor::Text],
    pending: &mut GuardCalls,
    log: &mut LogFacts,
) -> Result<(), String> {
    let now = host.now_ms();
    let stage = pending.target.stage();
    let mut to_send: Vec<vendor::Text> = Vec::new();
    let mut ids: Vec<[u8; 32]> = Vec::new();
    let mut kept = 0u32;
    let mut kept_redact: Vec<String> = Vec::new();
    for m in messages {
        let id = kept::id(e.fingerprint, &m.text);
        let found = (g.verdict_ttl_ms > 0)
            .then(|| host.get(&kept::key(&id)).ok())
            .flatten()
            .and_then(|(entry, _)| kept::decode(&entry?, &id, now));
        match found {
            Some(targets) => {
                kept = kept.saturating_add(1);
                kept_redact.extend(targets);
            }
            None => {
                ids.push(id);
                to_send.push(m.clone());
            }
        }
    }
    host.count(metrics::VENDOR_TEXTS_KEPT, i64::from(kept));
    if !kept_redact.is_empty() && check.act != Act::Log {
        let hits = pending.redact(&check.name, &kept_redact);
        log.note_verdicts(
            host,
            &[Verdict {
                stage,
                check: check.name.clone(),
                action: Act::Redact,
                hits,
                matched: Vec::new(),
                reason: "kept verdict".into(),
                vendor: Some(VendorFacts {
                    vendor: v.name(),
                    categories: Vec::new(),
                    latency_ms: 0,
                    sent: 0,
                    kept,
                }),
            }],
        );
    }
    for batch in vendor::batches(v, stage, &to_send) {
        let mut headers: Vec<(&str, String)> = vec![
            (":method", "POST".into()),
            (":path", e.path.clone()),
            (":authority", e.authority.clone()),
            ("content-type", "application/json".into()),
        ];
        match credential {
            GuardCredential::None => {}
            GuardCredential::Header(name, value) => headers.push((name, value.clone())),
            GuardCredential::Sign(s) => {
                let Some(scope) = v.signing_scope() else {
                    return Err(format!("{} does not sign its calls", v.name()));
                };
                let (path, query) = e.path.split_once('?').unwrap_or((&e.path, ""));
                let req = sigv4::Request {
                    method: "POST",
                    path,
                    query,
                    host: &e.authority,
                    body: &batch.body,
                };
                let now_s = now / 1000;
                let signed = match s.day_key.try_borrow_mut() {
                    Ok(mut day_key) => sigv4::sign_with(&s.keys, &scope, &req, now_s, &mut day_key),
                    Err(_) => sigv4::sign(&s.keys, &scope, &req, now_s),
                };
                headers.extend(signed);
            }
        }
        let refs: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        host.count(metrics::GUARD_CALLS, 1);
        let whole: Vec<([u8; 32], String)> = batch
            .whole
            .iter()
            .filter_map(|&t| Some((*ids.get(t)?, to_send.get(t)?.text.clone())))
            .collect();
        host.count(
            metrics::VENDOR_TEXTS_SENT,
            i64::try_from(whole.len().max(1)).unwrap_or(i64::MAX),
        );
        let token = host
            .dispatch(&e.cluster, &refs, &batch.body, e.timeout_ms)
            .map_err(|s| format!("cannot call cluster `{}`: {s:?}", e.cluster))?;
        pending.calls.push(GuardCall {
            token,
            check: i,
            sent: now,
            batch: Some(SentBatch {
                joined: batch.joined,
                whole,
                kept,
            }),
        });
    }
    Ok(())
}

/// A guard that failed: its failure mode decides (`Some`: refuse).
fn guard_failed(
    host: &impl Host,
    log: &mut LogFacts,
    g: &Guardrails,
    (stage, i): (Stage, usize),
    why: &str,
) -> Option<GatewayError> {
    let check = g.checks(stage).get(i)?;
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
            stage,
            check: check.name.clone(),
            action: if e.deny_on_failure {
                Act::Deny
            } else {
                Act::Log
            },
            hits: 0,
            matched: Vec::new(),
            reason: format!("guard failed: {why}"),
            vendor: e.vendor.as_ref().map(|v| VendorFacts {
                vendor: v.name(),
                categories: Vec::new(),
                latency_ms: 0,
                sent: 0,
                kept: 0,
            }),
        }],
    );
    e.deny_on_failure.then(|| {
        GatewayError::new(
            503,
            "server_error",
            "guardrail_unavailable",
            format!(
                "Guardrail `{}` could not check the {}, and this gateway refuses what it cannot check. Retry shortly.",
                check.name,
                match stage {
                    Stage::Input => "request",
                    Stage::Output => "answer",
                }
            ),
        )
        .with_retry_after(1)
    })
}

/// An external guard's answer (`on_http_call_response` while guarding),
/// for `call`: noted, and a redaction applied to the calls' prompt; `Err`
/// when the request is refused.
fn read_answer(
    host: &impl Host,
    log: &mut LogFacts,
    g: &Guardrails,
    pending: &mut GuardCalls,
    call: GuardCall,
    body_size: usize,
    secret: Option<&str>,
) -> Result<(), GatewayError> {
    let (i, sent) = (call.check, call.sent);
    let stage = pending.target.stage();
    let Some(check) = g.checks(stage).get(i) else {
        return Ok(());
    };
    let Kind::External(e) = &check.kind else {
        return Ok(());
    };
    let now = host.now_ms();
    host.histogram(metrics::GUARD_LATENCY_MS, now.saturating_sub(sent));
    let status = host.headers(Part::CallResponse).ok().and_then(|h| {
        h.get(":status")
            .and_then(|v| std::str::from_utf8(v).ok()?.parse().ok())
    });
    let mut body = host.body(Part::CallResponse, body_size).unwrap_or_default();
    // A vendor that quotes the key in an error: never in a log or a record.
    if let Some(clean) = secret.and_then(|k| portcullis_core::credentials::secrets::scrub(&body, k))
    {
        body = clean;
    }
    let late = |why: String| {
        if status.is_none() && now.saturating_sub(sent).saturating_add(1) >= e.timeout_ms {
            format!("no answer within {} ms", e.timeout_ms)
        } else {
            why
        }
    };
    if let (Some(v), Some(batch)) = (&e.vendor, call.batch) {
        return match vendor::read(v, status, &body, &batch.joined) {
            Ok(finding) => read_finding(
                host,
                log,
                g,
                pending,
                (check, v),
                &batch,
                finding,
                now.saturating_sub(sent),
            ),
            Err(why) => match guard_failed(host, log, g, (stage, i), &late(why)) {
                Some(err) => Err(err),
                None => Ok(()),
            },
        };
    }
    let answer = match external::answer(status, &body) {
        Ok(a) => a,
        Err(why) => {
            return match guard_failed(host, log, g, (stage, i), &late(why)) {
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
        vendor: None,
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
            let hits = pending.redact(&check.name, &targets);
            let mut v = verdict(hits, String::new());
            v.action = Act::Redact;
            log.note_verdicts(host, &[v]);
            Ok(())
        }
    }
}

/// A guard's answer to one of `pending`'s calls (by its `token`), read
/// with the config it was asked under. `None`: the step still waits (the
/// token is not one of them, or it passed and others are out); `Some`: the
/// step is over, passed (`Ok`, every call answered) or refused.
pub(crate) fn answer_for(
    host: &impl Host,
    log: &mut LogFacts,
    loaded: &crate::loaded::Loaded,
    pending: &mut GuardCalls,
    token: u32,
    body_size: usize,
) -> Option<Result<(), GatewayError>> {
    let pos = pending.calls.iter().position(|c| c.token == token)?;
    let call = pending.calls.swap_remove(pos);
    let read = match loaded.gw.guardrails.as_ref() {
        Some(g) => {
            let secret = loaded
                .guard_credential(pending.target.stage(), call.check)
                .secret();
            read_answer(host, log, g, pending, call, body_size, secret)
        }
        None => Ok(()),
    };
    (read.is_err() || pending.calls.is_empty()).then_some(read)
}

/// What a vendor found in one call: kept per message when it can be used
/// again, noted, applied by the check's action.
#[allow(clippy::too_many_arguments)]
fn read_finding(
    host: &impl Host,
    log: &mut LogFacts,
    g: &Guardrails,
    pending: &mut GuardCalls,
    (check, v): (&guard::Check, &vendor::Vendor),
    batch: &SentBatch,
    finding: vendor::Finding,
    latency_ms: u64,
) -> Result<(), GatewayError> {
    let keep = |redact: &[String], id: &[u8; 32]| {
        if g.verdict_ttl_ms == 0 {
            return;
        }
        let until = host.now_ms().saturating_add(g.verdict_ttl_ms);
        if let Some(entry) = kept::encode(id, until, redact) {
            let _ = host.set(&kept::key(id), &entry, None);
        }
    };
    if !finding.flagged {
        for (id, _) in &batch.whole {
            keep(&[], id);
        }
        return Ok(());
    }
    host.count(metrics::VENDOR_FLAGGED, 1);
    let facts = VendorFacts {
        vendor: v.name(),
        categories: finding.categories.clone(),
        latency_ms,
        sent: u32::try_from(batch.whole.len()).unwrap_or(u32::MAX),
        kept: batch.kept,
    };
    let what = finding.categories.join(", ");
    let mut verdict = Verdict {
        stage: pending.target.stage(),
        check: check.name.clone(),
        action: check.act,
        hits: u32::try_from(finding.categories.len()).unwrap_or(u32::MAX),
        matched: if g.include_content {
            finding.redact.clone()
        } else {
            Vec::new()
        },
        reason: format!("{} flagged {what}", v.name()),
        vendor: Some(facts),
    };
    match check.act {
        Act::Log => {
            log.note_verdicts(host, &[verdict]);
            Ok(())
        }
        Act::Redact if !finding.blocked && !finding.redact.is_empty() => {
            let hits = pending.redact(&check.name, &finding.redact);
            verdict.hits = hits;
            log.note_verdicts(host, &[verdict]);
            // Each message's replacements kept, when each lies in one.
            let texts: Vec<&str> = batch.whole.iter().map(|(_, t)| t.as_str()).collect();
            if let Some(per) = vendor::per_text(&finding.redact, &texts) {
                for ((id, _), redact) in batch.whole.iter().zip(per) {
                    keep(&redact, id);
                }
            }
            Ok(())
        }
        _ => {
            verdict.action = Act::Deny;
            log.note_verdicts(host, &[verdict]);
            Err(g.denial(&check.name, &format!("{} flagged it ({what})", v.name())))
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
