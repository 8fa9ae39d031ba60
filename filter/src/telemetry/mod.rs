//! Telemetry: the request record and per-request metrics (this file),
//! and the shipper that sends buffered records to the collector
//! (`shipper`).
//!
//! May use: `host`, `request`, `mcp`.
//!
//! The request record and per-request metrics, at the end of a chat
//! request: who asked, what was resolved, who answered, each attempt, the
//! cache, tokens and cost. Handed to the host, which buffers it for the
//! collector; nothing here can fail a request.

pub mod shipper;

use crate::host::metrics;
use crate::host::Host;
use crate::request::Ended;
use portcullis_core::pricing;
use portcullis_core::telemetry::record::{Attempt, Record};

/// The record is written from what the request hands it when it ends
/// ([`Ended`]): its facts, its client's request and its routed request; it
/// reads nothing else of the request.
impl<H: Host> Ended<'_, H> {
    /// A chat request's record (and metrics).
    pub(crate) fn emit_record(mut self, gw: &portcullis_core::config::Gateway) {
        if !self.log.chat {
            return;
        }
        let answering = self
            .flight
            .and_then(crate::request::flight::Flight::answering);
        let mut rec = Record {
            usage_estimated: self.log.usage_estimated,
            ttft_ms: self.log.ttft_ms,
            prompt: std::mem::take(&mut self.log.prompt),
            completion: std::mem::take(&mut self.log.completion),
            provider: answering
                .and_then(|i| gw.providers.get(i))
                .map(|p| p.name.clone())
                .unwrap_or_default(),
            ..self.record_base(gw, None)
        };
        let logged = gw.log.is_some();
        if logged {
            self.trace_facts(&mut rec, gw);
        }
        self.flight_facts(&mut rec, logged);
        if let Some(u) = self.log.usage {
            rec.prompt_tokens = u.prompt;
            rec.completion_tokens = u.completion;
            rec.cached_tokens = u.cached;
            rec.reasoning_tokens = u.reasoning;
            let model = self.flight.map(|f| (f.model, f.chat.units));
            match model.and_then(|(m, units)| pricing::price_for(gw, m, answering, &units)) {
                Some((price, source)) => {
                    rec.cost_micros = price.usage_cost(&u);
                    rec.price_source = source.as_str().into();
                }
                None => self.host.count(&metrics::unpriced(&rec.model), 1),
            }
        }
        self.emit(&rec);
    }

    /// A record made: counted in the request metrics, handed to the host.
    pub(crate) fn emit(&self, rec: &Record) {
        self.request_metrics(rec);
        self.host.emit_record(rec);
    }

    /// What every record says of its request: who, when, how it ended,
    /// how long it took, what the guardrails did.
    pub(crate) fn record_base(
        &mut self,
        gw: &portcullis_core::config::Gateway,
        team: Option<usize>,
    ) -> Record {
        let client = self
            .request
            .client(gw)
            .map(|c| crate::mcp::effective(c, team));
        let client = client.as_deref();
        let mut rec = Record {
            request_id: std::mem::take(&mut self.log.request_id),
            time_ms: self.log.started_ms,
            client: client.map(|c| c.name.clone()).unwrap_or_default(),
            team: client
                .and_then(|c| gw.teams.get(c.team?))
                .map(|t| t.name.clone())
                .unwrap_or_default(),
            status: u32::from(self.log.status),
            error: self.log.error.to_string(),
            limited_by: self.log.limited_by.to_string(),
            guardrails: portcullis_core::guard::record_json(&self.log.guardrails),
            latency_ms: self.host.now_ms().saturating_sub(self.log.started_ms),
            ttfb_ms: self.log.ttfb_ms,
            cache: "off".into(),
            ..Record::default()
        };
        if rec.request_id.is_empty() {
            rec.request_id = format!("{:x}-{:x}", self.log.started_ms, self.roll);
        }
        rec
    }

    /// An MCP request's record (`api` "mcp"): the server as its provider,
    /// a tool call's qualified tool as its model, its method, JSON-RPC
    /// error, sizes, price and trace; counted in the request metrics by
    /// server and tool.
    pub(crate) fn emit_mcp_record(
        mut self,
        gw: &portcullis_core::config::Gateway,
        call: &crate::request::mcp::McpCall,
    ) {
        let server = gw
            .mcp
            .as_ref()
            .and_then(|m| m.config.servers.get(call.server?));
        let mut rec = Record {
            provider: server.map(|s| s.name.clone()).unwrap_or_default(),
            requested_model: call.tool.clone(),
            model: call.tool.clone(),
            stream: call.sse,
            api: "mcp",
            mcp_method: call.method.clone(),
            rpc_error: call.rpc_error,
            request_bytes: call.request_bytes,
            response_bytes: call.response_bytes,
            cost_micros: if call.charged {
                server.map_or(0, |s| s.price_micros)
            } else {
                0
            },
            ..self.record_base(gw, call.team)
        };
        if let Some(t) = &self.log.trace {
            rec.trace_id = t.trace_id.to_vec();
            rec.span_id = t.span.to_vec();
            rec.parent_span_id = t.parent.map(|p| p.to_vec()).unwrap_or_default();
            rec.trace_flags = u32::from(t.flags);
            rec.tracestate = std::mem::take(&mut self.log.tracestate);
        }
        // The call to the server (or, fanned out, to each): the span its
        // `traceparent` named, so the server's spans hang from it.
        if call.sent_ms > 0 {
            rec.attempts
                .push(portcullis_core::telemetry::record::Attempt {
                    provider: if call.fanout_servers > 0 {
                        "*".into()
                    } else {
                        rec.provider.clone()
                    },
                    status: rec.status,
                    cause: String::new(),
                    span_id: self
                        .log
                        .trace
                        .as_ref()
                        .filter(|_| gw.log.is_some())
                        .map(|t| t.attempt_span(1).to_vec())
                        .unwrap_or_default(),
                    start_ms: call.sent_ms,
                    end_ms: self.host.now_ms(),
                });
        }
        self.emit(&rec);
    }

    /// What only the request log reads (the metrics do not): the trace,
    /// the API, the answering provider's format and host, the request's
    /// parameters and what the answer said of itself.
    fn trace_facts(&mut self, rec: &mut Record, gw: &portcullis_core::config::Gateway) {
        rec.api = self.request.api.name();
        if let Some(t) = &self.log.trace {
            rec.trace_id = t.trace_id.to_vec();
            rec.span_id = t.span.to_vec();
            rec.parent_span_id = t.parent.map(|p| p.to_vec()).unwrap_or_default();
            rec.trace_flags = u32::from(t.flags);
            if t.parent.is_some() {
                rec.tracestate = std::mem::take(&mut self.log.tracestate);
            }
        }
        let facts = std::mem::take(&mut self.log.answer_facts);
        rec.response_id = facts.id;
        rec.response_model = facts.model;
        rec.finish_reasons = facts.finish_reasons;
        let Some(f) = self.flight else {
            return;
        };
        if let Some(p) = f
            .current
            .as_ref()
            .and_then(|c| gw.providers.get(c.provider))
        {
            rec.provider_format = p.schema.name();
            rec.server_address = p.host.clone();
        }
        rec.max_tokens = f.chat.max_tokens.unwrap_or(0);
        rec.temperature = f.chat.temperature;
    }

    /// The routed request's part of the record: models, experiment, cache
    /// and every attempt (failed, skipped, answered; with the log on, each
    /// one's span id and times).
    fn flight_facts(&self, rec: &mut Record, logged: bool) {
        let Some(f) = self.flight else {
            return;
        };
        let span = |n: u32| {
            self.log
                .trace
                .as_ref()
                .filter(|_| logged)
                .map(|t| t.attempt_span(n).to_vec())
                .unwrap_or_default()
        };
        rec.requested_model = f.chat.model.clone();
        rec.model = f.model_name.clone();
        rec.stream = f.chat.stream;
        rec.budget_routed = f.budget_routed;
        rec.cache = f.cache.status.as_str().to_string();
        if let Some((e, a)) = &f.experiment {
            rec.experiment = e.clone();
            rec.arm = a.clone();
        }
        for ((p, cause), (n, start, end)) in f.tried.iter().zip(&f.tried_at) {
            rec.attempts.push(Attempt {
                provider: p.clone(),
                status: cause.status(),
                cause: cause.class().into(),
                span_id: span(*n),
                start_ms: *start,
                end_ms: *end,
            });
        }
        for (p, _, why) in &f.skipped {
            rec.attempts.push(Attempt {
                provider: p.clone(),
                status: 0,
                cause: why.class().into(),
                ..Attempt::default()
            });
        }
        if let (Some(status), Some(cur)) = (f.answered, f.current.as_ref()) {
            rec.attempts.push(Attempt {
                provider: rec.provider.clone(),
                status: status.into(),
                cause: String::new(),
                span_id: span(cur.n),
                start_ms: cur.started_ms,
                end_ms: rec.time_ms.saturating_add(rec.latency_ms),
            });
        }
        if f.attempts > 1 {
            // Single-attempt requests skip it: one host call less each.
            self.host
                .histogram(metrics::ATTEMPTS, u64::from(f.attempts));
        }
    }

    /// Requests by client, provider, model, status class and cache status;
    /// tokens; the gateway's latency.
    fn request_metrics(&self, r: &Record) {
        metrics::with_requests(
            &self.host.worker().metric_name,
            &r.client,
            &r.provider,
            &r.model,
            r.status,
            &r.cache,
            |n| {
                self.host.count(n, 1);
            },
        );
        if r.prompt_tokens.saturating_add(r.completion_tokens) > 0 {
            let signed = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
            metrics::with_tokens(
                &self.host.worker().metric_name,
                metrics::TOKENS_IN,
                &r.provider,
                &r.model,
                |n| {
                    self.host.count(n, signed(r.prompt_tokens));
                },
            );
            metrics::with_tokens(
                &self.host.worker().metric_name,
                metrics::TOKENS_OUT,
                &r.provider,
                &r.model,
                |n| {
                    self.host.count(n, signed(r.completion_tokens));
                },
            );
        }
        metrics::with_latency(&self.host.worker().metric_name, &r.provider, |n| {
            self.host.histogram(n, r.latency_ms)
        });
        if r.ttft_ms > 0 {
            metrics::with_ttft(&self.host.worker().metric_name, &r.provider, |n| {
                self.host.histogram(n, r.ttft_ms)
            });
            if let Some(us) = per_output_token_us(r) {
                metrics::with_output_token(&self.host.worker().metric_name, &r.provider, |n| {
                    self.host.histogram(n, us)
                });
            }
        }
    }
}

/// A stream's time per output token after the first, in microseconds:
/// what followed the first chunk over the tokens after the first.
pub(crate) fn per_output_token_us(r: &Record) -> Option<u64> {
    let after = r.completion_tokens.checked_sub(1).filter(|n| *n > 0)?;
    let rest_ms = r.latency_ms.checked_sub(r.ttft_ms)?;
    Some(rest_ms.saturating_mul(1000) / after)
}
