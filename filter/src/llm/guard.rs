//! The guardrails' step of a model call: it hands the guardrails
//! (`guardrails.rs`, which never sees the request's holder) the parts they
//! read — the routed request, the inbound API, the record's facts, the
//! output guard — and keeps the external guards' calls while the request
//! waits for them (`Phase::Guarding`).

use crate::guardrails::{self, Started};
use crate::host::{Action, Host};
use crate::request::guard::GuardCalls;
use crate::request::{Phase, RequestContext};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;

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
        let (Some(g), Some(flight)) = (gw.guardrails.as_ref(), self.flight.as_mut()) else {
            return Ok(Guarded::Go);
        };
        let api = self.request.api;
        let creds = self
            .loaded
            .as_ref()
            .map(|l| l.guard_credentials.as_slice())
            .unwrap_or_default();
        match guardrails::start_input(&self.host, g, creds, client, api, flight, &mut self.log)? {
            Started::Go => Ok(Guarded::Go),
            Started::Wait(calls) => {
                self.guarding = Some(calls);
                self.phase = Phase::Guarding;
                Ok(Guarded::Wait)
            }
        }
    }

    /// An external guard's answer (`on_http_call_response` while guarding).
    pub(crate) fn on_guard_answer(&mut self, token: u32, body_size: usize) {
        let Some(mut pending) = self.guarding.take() else {
            return;
        };
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(read) = guardrails::answer_for(
            &self.host,
            &mut self.log,
            &loaded,
            &mut pending,
            token,
            body_size,
        ) else {
            self.guarding = Some(pending);
            return;
        };
        let step = read.and_then(|()| self.after_guards(&pending));
        self.resume_with(step);
    }

    /// Every guard answered: go on with the (maybe rewritten) prompt.
    fn after_guards(&mut self, pending: &GuardCalls) -> Result<Action, GatewayError> {
        self.phase = Phase::ChatBody;
        if pending.changed {
            if let Some(f) = self.flight.as_mut() {
                guardrails::use_rewritten(f, &pending.doc)?;
            }
        }
        self.resume()
    }

    /// Output checks on a whole answer: `Err` when a check denies it;
    /// `Ok(Some)` when it was rewritten.
    pub(crate) fn check_whole_answer(
        &mut self,
        body: &[u8],
    ) -> Result<Option<Vec<u8>>, GatewayError> {
        let Some(loaded) = self.loaded.clone() else {
            return Ok(None);
        };
        let Some(g) = loaded.gw.guardrails.as_ref() else {
            return Ok(None);
        };
        let Some(out) = self.flight.as_mut().and_then(|f| f.output.as_mut()) else {
            return Ok(None);
        };
        let shape = self.request.api.answer_shape();
        out.check_whole(&self.host, g, shape, &mut self.log, body)
    }

    /// A streamed answer's bytes through the output checks.
    pub(crate) fn guard_stream(&mut self, bytes: &[u8], end: bool) -> Option<Vec<u8>> {
        let loaded = self.loaded.clone()?;
        let g = loaded.gw.guardrails.as_ref()?;
        let out = self.flight.as_mut()?.output.as_mut()?;
        out.stream(&self.host, g, &mut self.log, bytes, end)
    }

    /// Start the stream guard for a streamed answer.
    pub(crate) fn start_stream_guard(&mut self) {
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(g) = loaded.gw.guardrails.as_ref() else {
            return;
        };
        if let Some(out) = self.flight.as_mut().and_then(|f| f.output.as_mut()) {
            out.start_stream(&self.host, g, self.request.api.answer_shape());
        }
    }
}
