//! The request headers phase: what is asked for (`/v1/models`, a model, a
//! chat completion), by whom (the client key), and whether it may pass the
//! request rate. A chat request then waits for its body.

use crate::host::{Host, Part};
use crate::limits::admission;
use crate::request::{Phase, RequestContext};
use portcullis_core::api::{self, kept, Api};
use portcullis_core::error::GatewayError;
use portcullis_core::routing::{authenticate_with, model_info, models_list, KeyHashes};
use portcullis_core::telemetry::trace::{self, Trace};
use portcullis_core::wire::headers;

/// Authenticate with the worker's remembered key hashes.
pub(crate) fn authenticate<'g>(
    host: &impl Host,
    gw: &'g portcullis_core::config::Gateway,
    authorization: Option<&str>,
) -> Result<([u8; 32], &'g portcullis_core::config::Client), GatewayError> {
    let now = || host.now_ms();
    match host.worker().key_hashes.try_borrow_mut() {
        Ok(mut known) => authenticate_with(gw, authorization, &mut known, now),
        Err(_) => authenticate_with(gw, authorization, &mut KeyHashes::default(), now),
    }
}
use crate::host::Action;
use std::borrow::Cow;

/// A header value as text: bytes that are not UTF-8 read as U+FFFD (they
/// then match nothing the gateway looks for).
fn text(v: &[u8]) -> Cow<'_, str> {
    // The strict check first: it is the common case, and cheaper.
    match std::str::from_utf8(v) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => String::from_utf8_lossy(v),
    }
}

/// The headers the gateway reads.
#[derive(Default)]
struct Facts<'a> {
    method: Cow<'a, str>,
    path: Cow<'a, str>,
    authority: Cow<'a, str>,
    authorization: Option<Cow<'a, str>>,
    /// The Anthropic SDK's header for the key.
    api_key: Option<Cow<'a, str>>,
    /// `Upgrade: websocket` (a Realtime session).
    websocket: bool,
    protocols: Option<Cow<'a, str>>,
    content_length: Option<usize>,
}

impl<H: Host> RequestContext<H> {
    pub(crate) fn request_headers(&mut self, end_of_stream: bool) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        let all = self
            .host
            .headers(Part::Request)
            .map_err(|s| GatewayError::internal(format!("cannot read request headers: {s:?}")))?;
        let mut f = Facts::default();
        for (k, v) in &all {
            match k {
                ":method" => f.method = text(v),
                ":path" => f.path = text(v),
                ":authority" => f.authority = text(v),
                "authorization" => f.authorization = Some(text(v)),
                "x-api-key" => f.api_key = Some(text(v)),
                "upgrade" => f.websocket = v.eq_ignore_ascii_case(b"websocket"),
                "sec-websocket-protocol" => f.protocols = Some(text(v)),
                "content-length" => f.content_length = text(v).parse().ok(),
                "content-type" => {
                    self.request.has_content_type = true;
                    if v.get(..10)
                        .is_some_and(|p| p.eq_ignore_ascii_case(b"multipart/"))
                    {
                        self.request.multipart_type = Some(text(v).into_owned());
                    }
                }
                "cache-control" => self.request.cache_control = Some(text(v).into_owned()),
                "x-request-id" => self.log.request_id = text(v).into_owned(),
                "traceparent" => {
                    self.log.parent = portcullis_core::telemetry::trace::parse_traceparent(v)
                }
                "tracestate" => self.log.tracestate = text(v).into_owned(),
                headers::PIN_PROVIDER => {
                    self.request.pin_provider = Some(text(v).trim().to_string())
                }
                k if gw.user_header.as_deref() == Some(k) => {
                    self.request.end_user = Some(text(v).trim().to_string());
                }
                k if gw.policy.rule_headers.iter().any(|h| h == k) => {
                    self.request
                        .rule_headers
                        .push((k.to_string(), text(v).into_owned()));
                }
                _ => {}
            }
        }
        let path = f
            .path
            .split('?')
            .next()
            .unwrap_or_default()
            .trim_end_matches('/');
        // A key in `x-api-key` (the Anthropic SDK's way) counts as a bearer.
        let from_api_key = f
            .api_key
            .as_deref()
            .filter(|_| f.authorization.is_none())
            .map(|k| format!("Bearer {}", k.trim()));
        let authorization = f.authorization.as_deref().or(from_api_key.as_deref());
        // MCP clients that log in read where (RFC 9728).
        if let Some(o) = gw.mcp.as_ref().and_then(|m| m.oauth.as_ref()) {
            // Only a GET pays for the comparison (`metadata_path` builds a
            // string): every request with `mcp.oauth` passes here.
            let metadata = f.method == "GET"
                && (path == "/.well-known/oauth-protected-resource" || path == o.metadata_path());
            if metadata {
                return Ok(self.reply(200, &[("cache-control", "max-age=3600")], &o.metadata()));
            }
        }
        if let Some(server) = gw.mcp.as_ref().and_then(|m| m.config.server_of_path(path)) {
            let query = f.path.find('?').and_then(|i| f.path.get(i..)).unwrap_or("");
            let key = authenticate(&self.host, gw, authorization);
            return self.mcp_headers(gw, server, &f.method, path, query, key, end_of_stream);
        }
        if let Some(call) = portcullis_core::api::files::Call::of(&f.method, path) {
            let query = f.path.find('?').and_then(|i| f.path.get(i..)).unwrap_or("");
            let query = query.to_string();
            // Where the client reached the gateway (a result's URL).
            let scheme = all
                .get("x-forwarded-proto")
                .or_else(|| all.get(":scheme"))
                .map_or(Cow::Borrowed("http"), text);
            let origin = format!("{scheme}://{}", f.authority);
            self.bound_for_provider(&all, path, f.authority.into_owned());
            return self.stored_headers(
                gw,
                call,
                (&query, origin),
                authorization,
                f.content_length,
                end_of_stream,
            );
        }
        if path == portcullis_core::api::realtime::PATH {
            let query = f.path.find('?').and_then(|i| f.path.get(i..)).unwrap_or("");
            let query = query.to_string();
            let up = crate::request::realtime::Upgrade {
                query: &query,
                websocket: f.websocket && f.method == "GET",
                protocols: f.protocols.as_deref().map(str::to_string),
            };
            self.bound_for_provider(&all, path, f.authority.into_owned());
            return self.realtime_headers(gw, up, authorization);
        }
        match (f.method.as_ref(), path) {
            ("GET", "/v1/models") => {
                let (_, client) = authenticate(&self.host, gw, authorization)?;
                Ok(self.reply(200, &[], &models_list(gw, client)))
            }
            ("GET", p) if p.starts_with("/v1/models/") => {
                let (_, client) = authenticate(&self.host, gw, authorization)?;
                let id = p.get("/v1/models/".len()..).unwrap_or_default();
                let body = model_info(gw, client, id)?;
                Ok(self.reply(200, &[], &body))
            }
            ("GET" | "DELETE", p) if kept::by_id(p).is_some() => {
                // A kept response, at the provider that made it (and for
                // the key that made it).
                let (hash, _) = authenticate(&self.host, gw, authorization)?;
                self.request.key = Some(hash);
                let full = f.path.to_string();
                self.bound_for_provider(&all, path, f.authority.into_owned());
                self.response_by_id(gw, &full)
            }
            ("POST", p) if Api::of_path(p).is_some() => {
                self.request.api = Api::of_path(p).unwrap_or_default();
                self.chat_headers(gw, authorization, f.content_length, end_of_stream)?;
                self.bound_for_provider(&all, path, f.authority.into_owned());
                self.phase = Phase::ChatBody;
                Ok(Action::Pause)
            }
            (method, _) => {
                // Under an API's path, the 404 is in that API's shape.
                if let Some(api) = api::ALL.iter().find(|a| path.starts_with(a.path())) {
                    self.request.api = *api;
                }
                Err(GatewayError::not_found_path(
                    method,
                    path,
                    &api::served_paths(),
                ))
            }
        }
    }

    /// A request on its way to a provider: its path and authority kept (the
    /// upstream request is built from them), the headers no provider gets
    /// removed; the rest pass.
    fn bound_for_provider(&mut self, all: &crate::host::Headers, path: &str, authority: String) {
        self.request.path = path.to_string();
        self.request.authority = authority;
        for (k, _) in all
            .iter()
            .filter(|(k, _)| headers::removed_before_routing(k))
        {
            let _ = self.host.set_header(Part::Request, k, None);
        }
    }

    /// The key, then one request of its rate (a refused request's body is
    /// never read).
    pub(crate) fn key_and_rate<'g>(
        &mut self,
        gw: &'g portcullis_core::config::Gateway,
        authorization: Option<&str>,
        now: u64,
    ) -> Result<&'g portcullis_core::config::Client, GatewayError> {
        let (key, client) = authenticate(&self.host, gw, authorization)?;
        self.request.key = Some(key);
        self.take_rate(gw, client, now, 1)?;
        Ok(client)
    }

    /// `n` requests of the key's rate at every level, or its 429.
    pub(crate) fn take_rate(
        &mut self,
        gw: &portcullis_core::config::Gateway,
        client: &portcullis_core::config::Client,
        now: u64,
        n: u64,
    ) -> Result<(), GatewayError> {
        match admission::take_requests(&self.host, gw, client, now, n) {
            Ok(t) => {
                if n == 1 {
                    self.limits.took_rate(t);
                }
                Ok(())
            }
            Err((e, t)) => {
                self.log.limited_by = "local";
                self.limits.rate_refused(t);
                Err(e)
            }
        }
    }

    /// A chat request's checks at its headers: the key, the request rate
    /// (a refused request's body is never read), the declared size.
    fn chat_headers(
        &mut self,
        gw: &portcullis_core::config::Gateway,
        authorization: Option<&str>,
        content_length: Option<usize>,
        end_of_stream: bool,
    ) -> Result<(), GatewayError> {
        self.log.chat = true;
        let now = self.host.now_ms();
        self.log.started_ms = now;
        self.log.trace = match self.log.parent.take() {
            Some(p) => Some(Trace::continued(p, self.roll)),
            None if trace::sampled(gw.trace_sample_rate, self.roll) => {
                Some(Trace::started(self.roll, &self.log.request_id, now))
            }
            None => None,
        };
        let client = self.key_and_rate(gw, authorization, now)?;
        if gw.cache.as_ref().is_some_and(|c| c.semantic.is_some()) {
            self.request.bearer = authorization.map(str::to_string);
        }
        let limit = client.limits.max_body_bytes;
        let own = limit != gw.max_body_bytes;
        self.request.max_body = Some((limit, own));
        if content_length.is_some_and(|n| n > limit) {
            return Err(GatewayError::body_too_large(limit, own));
        }
        if end_of_stream {
            return Err(GatewayError::bad_request(
                "invalid_json",
                "Request body is empty: send a JSON object with `model` and `messages`.",
            ));
        }
        Ok(())
    }
}
