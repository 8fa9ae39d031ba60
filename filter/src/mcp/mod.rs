//! The MCP gateway: one server at `{mcp.path}/{server}` (this file) and
//! every server behind one endpoint at `{mcp.path}` (`aggregate`).
//!
//! May use: `host`, `loaded`, `limits`, `request`, `guardrails`.
//!
//! The MCP gateway on the request path (#47): `{mcp.path}/{server}` on the
//! gateway's listener, one MCP server through Envoy's router. At the
//! headers: the caller's key (401 with `WWW-Authenticate`), the server it
//! may reach, the upstream request (cluster, path, the server's credential
//! in place of the key, the call's bound, the trace). At the body: one
//! JSON-RPC message (`portcullis_core::mcp::message`), and for a
//! `tools/call` the tool's policy (may the caller call it), its limits and
//! price at every level, the input guardrails over its arguments. At the
//! answer: a `tools/list` filtered to the caller's tools and a tool's
//! result through the output guardrails, whole or event by event. Every
//! refusal is a JSON-RPC error to the request's id (`request::fail`).

pub mod aggregate;

use crate::host::{Action, Host, Part};
use crate::limits::admission;
use crate::request::mcp::McpCall;
use crate::request::{Phase, RequestContext};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::credentials::secrets;
use portcullis_core::error::GatewayError;
use portcullis_core::guard::{self, Stage, Verdict};
use portcullis_core::limits::ratelimit::{self, Bucket, Micros};
use portcullis_core::mcp::access::Levels;
use portcullis_core::mcp::answer;
use portcullis_core::mcp::message::{Message, Method};
use portcullis_core::mcp::{self as core_mcp, McpGateway, Server};
use portcullis_core::shared::keys::{self, Limit, Owner};
use portcullis_core::shared::store::update;
use std::borrow::Cow;

/// MCP's 404 for a session the gateway did not seal for this caller (or
/// none at all where one is needed): the client starts a new one.
pub(crate) fn session_missing() -> GatewayError {
    GatewayError::new(
        404,
        "invalid_request_error",
        "session_not_found",
        "Session not found: start one with `initialize` (MCP-Session-Id is the gateway's).",
    )
}

fn team_of<'g>(gw: &'g Gateway, c: &Client) -> Option<&'g portcullis_core::config::Team> {
    gw.teams.get(c.team?)
}

/// The owners of a caller's levels, with their access and limits: its
/// key's, its team's.
fn owners<'g>(
    gw: &'g Gateway,
    m: &'g McpGateway,
    c: &'g Client,
) -> Vec<(
    Owner<'g>,
    Option<&'g core_mcp::Access>,
    &'g portcullis_core::config::Limits,
)> {
    let mut out = vec![(Owner::Key(&c.name), m.keys.get(&c.name), &c.limits)];
    if let Some(t) = team_of(gw, c) {
        out.push((Owner::Team(&t.name), m.teams.get(&t.name), &t.limits));
    }
    out
}

/// The client a request acts as: its key's, with the team a login's
/// claims named (`mcp.oauth`) in place of the key's own.
pub(crate) fn effective(c: &Client, team: Option<usize>) -> Cow<'_, Client> {
    match team {
        Some(t) if c.team != Some(t) => Cow::Owned(Client {
            team: Some(t),
            ..c.clone()
        }),
        _ => Cow::Borrowed(c),
    }
}

pub(crate) fn levels<'g>(gw: &'g Gateway, m: &'g McpGateway, c: &'g Client) -> Levels<'g> {
    m.levels(&c.name, team_of(gw, c).map(|t| t.name.as_str()))
}

impl<H: Host> RequestContext<H> {
    /// The client an MCP request acts as ([`effective`]).
    pub(crate) fn mcp_client<'g>(&self, gw: &'g Gateway) -> Option<Cow<'g, Client>> {
        let team = self.mcp.as_ref().and_then(|c| c.team);
        self.client(gw).map(|c| effective(c, team))
    }

    /// The headers of a request to `{mcp.path}/...`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mcp_headers(
        &mut self,
        gw: &Gateway,
        server: Option<&Server>,
        method: &str,
        path: &str,
        query: &str,
        key: Result<([u8; 32], &Client), GatewayError>,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        let mut call = Box::<McpCall>::default();
        let oauth = gw.mcp.as_ref().and_then(|m| m.oauth.as_ref());
        let mut payload = None;
        let all = self.host.headers(Part::Request).unwrap_or_default();
        for (k, v) in &all {
            let text = || String::from_utf8_lossy(v).into_owned();
            match k {
                "mcp-session-id" => call.session = Some(text()),
                "mcp-protocol-version" => call.protocol_version = Some(text()),
                ":authority" => self.request.authority = text(),
                k if oauth.is_some_and(|o| o.payload_header == k) => payload = Some(text()),
                _ => {}
            }
        }
        self.mcp = Some(call);
        // A caller that logged in: the token was verified by jwt_authn,
        // which forwards its payload; the claims pick the team.
        let key = match (oauth, payload) {
            (Some(o), Some(p)) => self.mcp_login(gw, o, &p),
            _ => key,
        };
        self.log.chat = true;
        let now = self.host.now_ms();
        self.log.started_ms = now;
        self.log.trace = self
            .log
            .parent
            .take()
            .map(|p| portcullis_core::telemetry::trace::Trace::continued(p, self.roll));
        let (hash, client) = key?;
        self.request.key = Some(hash);
        let m = gw
            .mcp
            .as_ref()
            .ok_or_else(|| GatewayError::internal("no mcp section"))?;
        // Sessions are sealed: without the gateway's secret, no session.
        self.loaded()?.sealer()?;
        if path == m.config.path {
            return self.mcp_aggregate_headers(gw, m, client, method, end_of_stream);
        }
        let Some(server) = server else {
            let name = path
                .strip_prefix(m.config.path.as_str())
                .unwrap_or_default()
                .trim_matches('/');
            let lv = levels(gw, m, client);
            let reachable: Vec<&str> = m
                .config
                .servers
                .iter()
                .filter(|s| lv.reaches(&s.name))
                .map(|s| s.name.as_str())
                .collect();
            return Err(GatewayError::new(
                404,
                "invalid_request_error",
                "method_not_found",
                format!(
                    "No MCP server `{name}` behind this gateway: yours are at {}/{{server}} for {}.",
                    m.config.path,
                    reachable.join(", ")
                ),
            ));
        };
        let index = m.config.servers.iter().position(|s| s.name == server.name);
        if let Some(call) = self.mcp.as_mut() {
            call.server = index;
            call.method = method.to_string();
        }
        if !levels(gw, m, client).reaches(&server.name) {
            return Err(GatewayError::new(
                403,
                "permission_error",
                "server_not_allowed",
                format!(
                    "Key `{}` may not use MCP server `{}`.",
                    client.name, server.name
                ),
            ));
        }
        let stream = match method {
            "POST" => false,
            "GET" | "DELETE" => true,
            _ => {
                return Err(GatewayError::new(
                    405,
                    "invalid_request_error",
                    "method_not_allowed",
                    format!("{method} is not an MCP method: POST a message, GET the server's stream, DELETE a session."),
                ))
            }
        };
        self.mcp_upstream(server, index, query, stream)?;
        if stream {
            // A POST's session is opened with its body (its id known).
            self.open_server_session(client, &server.name)?;
        }
        if let Some(call) = self.mcp.as_mut() {
            call.sent_ms = now;
        }
        if stream {
            self.phase = Phase::McpProxied;
            return Ok(Action::Continue);
        }
        if end_of_stream {
            return Err(core_mcp::message::Message::read(b"")
                .err()
                .map(|r| r.into_error())
                .unwrap_or_else(|| GatewayError::internal("empty body")));
        }
        self.phase = Phase::McpBody;
        Ok(Action::Pause)
    }

    /// At `{path}/{server}`: the caller's session id, sealed by the
    /// gateway to this caller and this server, becomes the server's own
    /// (MCP's 404 for one that is not, and no server is asked with it).
    fn open_server_session(&mut self, client: &Client, server: &str) -> Result<(), GatewayError> {
        if self.mcp.as_ref().and_then(|c| c.session.as_ref()).is_none() {
            return Ok(());
        }
        let sessions = self.session_servers(client)?;
        let own = match sessions.as_slice() {
            [(name, own)] if name == server && !own.is_empty() => own,
            _ => return Err(session_missing()),
        };
        self.host
            .set_header(Part::Request, "mcp-session-id", Some(own))
            .map_err(|s| GatewayError::internal(format!("cannot rewrite the request: {s:?}")))
    }

    /// A server's answer names its session: the caller gets it sealed to
    /// itself and this server.
    fn seal_server_session(&mut self, own: &str) {
        let Ok(loaded) = self.loaded() else {
            return;
        };
        let gw = &loaded.gw;
        let Some(server) = gw
            .mcp
            .as_ref()
            .and_then(|m| m.config.servers.get(self.mcp.as_ref()?.server?))
        else {
            return;
        };
        let Some(client) = self.mcp_client(gw) else {
            return;
        };
        let sealed = self.sealed_session(&client, &[(server.name.clone(), own.to_string())]);
        // Without a seal no answer reaches here (the request was refused);
        // a server's session never passes as it is.
        let value = sealed.ok();
        let _ = self
            .host
            .set_header(Part::Response, "mcp-session-id", value.as_deref());
    }

    /// A verified login's client (`mcp.oauth.client`) and team (its claim).
    fn mcp_login<'g>(
        &mut self,
        gw: &'g Gateway,
        o: &portcullis_core::mcp::oauth::Oauth,
        payload: &str,
    ) -> Result<([u8; 32], &'g Client), GatewayError> {
        let refused = || {
            GatewayError::new(
                401,
                "invalid_request_error",
                "invalid_token",
                "The login's token could not be read: log in again.",
            )
        };
        let claims = portcullis_core::mcp::oauth::claims(payload).ok_or_else(refused)?;
        let client = gw.clients.get(&o.client_key).ok_or_else(refused)?;
        let teams: Vec<&str> = gw.teams.iter().map(|t| t.name.as_str()).collect();
        let team = o.team(&claims, &teams);
        self.request.end_user = o.user(&claims);
        if let Some(call) = self.mcp.as_mut() {
            call.team = team;
        }
        Ok((o.client_key, client))
    }

    /// The request as the server gets it: its cluster and path, the
    /// server's credential in place of the caller's key, the call's bound
    /// (none for a stream), the trace continued.
    pub(crate) fn mcp_upstream(
        &mut self,
        server: &Server,
        index: Option<usize>,
        query: &str,
        stream: bool,
    ) -> Result<(), GatewayError> {
        let loaded = self.loaded()?;
        let set = |k: &str, v: Option<&str>| {
            self.host
                .set_header(Part::Request, k, v)
                .map_err(|s| GatewayError::internal(format!("cannot rewrite the request: {s:?}")))
        };
        let all = self.host.headers(Part::Request).unwrap_or_default();
        for (k, _) in all.iter().filter(|(k, _)| {
            portcullis_core::wire::headers::removed_before_routing(k) || *k == "authorization"
        }) {
            set(k, None)?;
        }
        set(
            portcullis_core::wire::headers::CLUSTER,
            Some(&server.cluster),
        )?;
        let upstream_path = format!("{}{query}", server.path);
        set(":path", Some(&upstream_path))?;
        let bound = if stream { 0 } else { server.timeout_ms };
        set("x-envoy-upstream-rq-timeout-ms", Some(&bound.to_string()))?;
        if let Some((name, value)) = index.and_then(|i| loaded.mcp_credentials.get(i)?.as_ref()) {
            set(name, Some(value))?;
        }
        if let Some(tp) = self.log.trace.as_ref().map(|t| t.traceparent(1)) {
            set("traceparent", Some(&tp))?;
        }
        Ok(())
    }

    /// The body of a POST: one message, its policy, then on to the server.
    pub(crate) fn mcp_body(
        &mut self,
        body_size: usize,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        let limit = self
            .client(gw)
            .map_or(gw.max_body_bytes, |c| c.limits.max_body_bytes);
        if body_size > limit {
            return Err(GatewayError::body_too_large(limit, false));
        }
        if !end_of_stream {
            return Ok(Action::Pause);
        }
        let body = self
            .host
            .body(Part::Request, body_size)
            .map_err(|s| GatewayError::internal(format!("cannot read request body: {s:?}")))?;
        let msg = Message::read(&body).map_err(|r| r.into_error())?;
        let (m, client) = match (gw.mcp.as_ref(), self.mcp_client(gw)) {
            (Some(m), Some(c)) => (m, c),
            _ => return Err(GatewayError::unknown_key()),
        };
        let client: &Client = &client;
        let aggregate = self.mcp.as_ref().is_some_and(|c| c.aggregate);
        if let Some(call) = self.mcp.as_mut() {
            call.id = msg.id.map(ToOwned::to_owned);
            call.method = msg.method_name().to_string();
            call.request_bytes = body.len() as u64;
        }
        if aggregate {
            return self.mcp_aggregate_body(gw, m, client, &msg, &body, body_size);
        }
        let server = self
            .mcp
            .as_ref()
            .and_then(|c| m.config.servers.get(c.server?))
            .ok_or_else(|| GatewayError::internal("no server"))?;
        self.open_server_session(client, &server.name)?;
        self.phase = Phase::McpProxied;
        let now = self.host.now_ms();
        if let Some(call) = self.mcp.as_mut() {
            call.sent_ms = now;
        }
        let waiting = match &msg.method {
            Method::ToolsList => {
                if let Some(call) = self.mcp.as_mut() {
                    call.list = true;
                }
                false
            }
            Method::ToolCall { name, .. } => {
                self.mcp_tool_call(gw, m, client, server, name, &body, body_size)?
            }
            _ => false,
        };
        if waiting {
            self.phase = Phase::McpGuarding;
            return Ok(Action::Pause);
        }
        Ok(Action::Continue)
    }

    /// A `tools/call` of `name` at `server`: may the caller call it, the
    /// input checks over its arguments (`body` as the server will get it),
    /// its limits and price, the output checks its result will get.
    /// `Ok(true)`: the vendor checks were asked and the call waits for them
    /// (`Phase::McpGuarding`; the limits are taken once they answered).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn mcp_tool_call(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        server: &Server,
        name: &str,
        body: &[u8],
        body_size: usize,
    ) -> Result<bool, GatewayError> {
        let tool = core_mcp::qualified(&server.name, name);
        if let Some(call) = self.mcp.as_mut() {
            call.tool.clone_from(&tool);
        }
        if !levels(gw, m, client).calls(&server.name, name) {
            return Err(GatewayError::new(
                403,
                "permission_error",
                "tool_not_allowed",
                format!("Key `{}` may not call tool `{tool}`.", client.name),
            ));
        }
        let rewritten = self.mcp_input_checks(gw, client, body, body_size)?;
        if self.mcp_vendor_checks(
            gw,
            client,
            rewritten.as_deref().unwrap_or(body),
            rewritten.as_ref().map_or(body_size, Vec::len),
        )? {
            return Ok(true);
        }
        self.admit_tool_call(gw, m, client, server)?;
        Ok(false)
    }

    /// A tool call that passed its input checks: its limits and price
    /// taken, its result's output checks set.
    fn admit_tool_call(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        server: &Server,
    ) -> Result<(), GatewayError> {
        self.take_tool_call(gw, m, client, server.price_micros)?;
        if let Some(g) = gw.guardrails.as_ref() {
            let output = guard::active_for_tools(g, Stage::Output, &client.name);
            if let Some(call) = self.mcp.as_mut() {
                call.output = output;
            }
        }
        Ok(())
    }

    /// The vendor checks over a tool call's arguments (`body`, `body_size`
    /// bytes buffered), all asked at once: `true` when the call waits for
    /// them; when every verdict was kept, their replacements are applied
    /// now.
    fn mcp_vendor_checks(
        &mut self,
        gw: &Gateway,
        client: &Client,
        body: &[u8],
        body_size: usize,
    ) -> Result<bool, GatewayError> {
        let Some(g) = gw.guardrails.as_ref() else {
            return Ok(false);
        };
        let Some(msg) = portcullis_core::guard::vendor::read_message(body) else {
            return Ok(false);
        };
        let creds = self
            .loaded
            .as_ref()
            .map(|l| l.guard_credentials.as_slice())
            .unwrap_or_default();
        let started = crate::guardrails::start_tool_arguments(
            &self.host,
            g,
            creds,
            &client.name,
            msg,
            body_size,
            &mut self.log,
        )?;
        let Some(pending) = started else {
            return Ok(false);
        };
        if pending.calls.is_empty() {
            self.rewrite_tool_call(&pending)?;
            return Ok(false);
        }
        if let Some(call) = self.mcp.as_mut() {
            call.guarding = Some(pending);
        }
        Ok(true)
    }

    /// The tool call's body as the vendors' replacements left it.
    fn rewrite_tool_call(
        &mut self,
        pending: &crate::request::guard::GuardCalls,
    ) -> Result<(), GatewayError> {
        let crate::request::guard::Target::ToolArguments { body_size } = pending.target else {
            return Ok(());
        };
        if !pending.changed {
            return Ok(());
        }
        let bytes = portcullis_core::guard::vendor::write_message(&pending.doc);
        self.host
            .set_body(Part::Request, body_size, &bytes)
            .map_err(|s| GatewayError::internal(format!("cannot rewrite the body: {s:?}")))?;
        let _ = self.host.set_header(
            Part::Request,
            "content-length",
            Some(&bytes.len().to_string()),
        );
        Ok(())
    }

    /// A vendor's answer about a tool call's arguments (`on_http_call_response`
    /// while `McpGuarding`): when the last is in, the call goes on with its
    /// arguments as the vendors left them, or is refused in JSON-RPC's shape.
    pub(crate) fn on_mcp_guard_answer(&mut self, token: u32, body_size: usize) {
        let Some(mut pending) = self.mcp.as_mut().and_then(|c| c.guarding.take()) else {
            return;
        };
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let gw = &loaded.gw;
        let Some(read) = crate::guardrails::answer_for(
            &self.host,
            &mut self.log,
            &loaded,
            &mut pending,
            token,
            body_size,
        ) else {
            if let Some(c) = self.mcp.as_mut() {
                c.guarding = Some(pending);
            }
            return;
        };
        let step = read.and_then(|()| {
            self.rewrite_tool_call(&pending)?;
            let m = gw
                .mcp
                .as_ref()
                .ok_or_else(|| GatewayError::internal("no MCP"))?;
            let client = self.mcp_client(gw).ok_or_else(GatewayError::unknown_key)?;
            let server = self
                .mcp
                .as_ref()
                .and_then(|c| m.config.servers.get(c.server?))
                .ok_or_else(|| GatewayError::internal("no server"))?;
            self.admit_tool_call(gw, m, &client, server)?;
            self.phase = Phase::McpProxied;
            Ok(Action::Continue)
        });
        self.resume_with(step);
    }

    /// The input checks over a tool's arguments: a deny refuses the call, a
    /// redaction rewrites the body the server gets.
    fn mcp_input_checks(
        &mut self,
        gw: &Gateway,
        client: &Client,
        body: &[u8],
        body_size: usize,
    ) -> Result<Option<Vec<u8>>, GatewayError> {
        let Some(g) = gw.guardrails.as_ref() else {
            return Ok(None);
        };
        let active = guard::active_for_tools(g, Stage::Input, &client.name);
        if active.is_empty() {
            return Ok(None);
        }
        let (out, rewritten) = answer::check_arguments(g, &active, body);
        self.log.guardrails.extend(out.verdicts);
        if let Some(e) = out.denied {
            return Err(e);
        }
        if let Some(rewritten) = &rewritten {
            let _ = self.host.set_body(Part::Request, body_size, rewritten);
            let _ = self.host.set_header(
                Part::Request,
                "content-length",
                Some(&rewritten.len().to_string()),
            );
        }
        Ok(rewritten)
    }

    /// A tool call's limits at every level (calls per minute, calls in
    /// flight) and its price in every budget: all or nothing.
    fn take_tool_call(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        price: Micros,
    ) -> Result<(), GatewayError> {
        let now = self.host.now_ms();
        let mut taken: Vec<(String, u64)> = Vec::new();
        let mut held: Vec<String> = Vec::new();
        let mut spent: Vec<admission::Taken> = Vec::new();
        let result = self.take_levels(gw, m, client, price, now, &mut taken, &mut held, &mut spent);
        if result.is_err() {
            for (key, per_minute) in &taken {
                let _ = update(&self.host, key, |cur| {
                    let next = ratelimit::adjust(&Bucket::decode(cur), *per_minute, 1, now);
                    (Some(next.encode()), ())
                });
            }
            for key in &held {
                let _ = update(&self.host, key, |cur| (ratelimit::release(cur), ()));
            }
            for t in &spent {
                admission::give_back(&self.host, t, now);
            }
            self.log.limited_by = "local";
        } else if let Some(call) = self.mcp.as_mut() {
            call.concurrency = held;
            call.charged = price > 0;
        }
        result
    }

    #[allow(clippy::too_many_arguments)]
    fn take_levels(
        &self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        price: Micros,
        now: u64,
        taken: &mut Vec<(String, u64)>,
        held: &mut Vec<String>,
        spent: &mut Vec<admission::Taken>,
    ) -> Result<(), GatewayError> {
        for (owner, access, limits) in owners(gw, m, client) {
            if let Some(per_minute) = access.and_then(|a| a.calls_per_minute) {
                let key = keys::limit(owner, Limit::ToolCallsPerMinute);
                let take = update(&self.host, &key, |cur| {
                    let (next, t) = ratelimit::take(&Bucket::decode(cur), per_minute, 1, now);
                    (Some(next.encode()), t)
                });
                match take {
                    Ok(t) if t.admitted => taken.push((key, per_minute)),
                    Ok(t) => {
                        return Err(GatewayError::new(
                            429,
                            "requests",
                            "rate_limit_exceeded",
                            format!(
                                "Tool calls per minute for {}: limit {per_minute}. Retry in {} s.",
                                owner.describe(),
                                t.wait_ms.div_ceil(1000).max(1)
                            ),
                        )
                        .with_retry_after(t.wait_ms.div_ceil(1000).max(1)))
                    }
                    Err(_) => {}
                }
            }
            if let Some(max) = access.and_then(|a| a.max_concurrent_calls) {
                let key = keys::limit(owner, Limit::ToolCalls);
                let max = u32::try_from(max).unwrap_or(u32::MAX);
                match update(&self.host, &key, |cur| ratelimit::acquire(cur, max)) {
                    Ok(true) => held.push(key),
                    Ok(false) => {
                        return Err(GatewayError::new(
                            429,
                            "requests",
                            "concurrency_limit_exceeded",
                            format!(
                                "Too many tool calls in flight for {}: limit {max}. Retry when one finishes.",
                                owner.describe()
                            ),
                        )
                        .with_retry_after(1))
                    }
                    Err(_) => {}
                }
            }
            let level = portcullis_core::config::Level::new(owner, limits);
            if let Some(t) = admission::spend_budgets(&self.host, gw, level, price, now)? {
                spent.push(t);
            }
        }
        Ok(())
    }

    /// The server's answer starts: a `tools/list` or a guarded tool result
    /// is read as it passes (its length changes, so `content-length` goes).
    pub(crate) fn mcp_answer_headers(&mut self) -> Action {
        let resp = self.host.headers(Part::Response).unwrap_or_default();
        let mut status = 0u16;
        let mut sse = false;
        let mut session = None;
        for (k, v) in &resp {
            match k {
                ":status" => {
                    status = std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .unwrap_or(0)
                }
                "content-type" => sse = v.starts_with(b"text/event-stream"),
                "mcp-session-id" => session = Some(String::from_utf8_lossy(v).into_owned()),
                _ => {}
            }
        }
        let aggregate = self.mcp.as_ref().is_some_and(|c| c.aggregate);
        match session {
            // The client holds the gateway's session over all its servers.
            Some(_) if aggregate => {
                let _ = self.host.set_header(Part::Response, "mcp-session-id", None);
            }
            Some(own) => self.seal_server_session(&own),
            None => {}
        }
        // The server's credential, should it echo it: scrubbed from the
        // headers here and from the body as it passes.
        let secret = self.loaded.clone().and_then(|l| {
            let i = self.mcp.as_ref()?.server?;
            l.mcp_secret(i).map(str::to_string)
        });
        let scrubbing = secret
            .as_ref()
            .is_some_and(|s| s.len() >= secrets::MIN_SECRET_LEN);
        if let Some(secret) = secret.as_deref().filter(|_| scrubbing) {
            for (k, v) in &resp {
                if k.starts_with(':') || k == "mcp-session-id" {
                    continue;
                }
                if let Some(clean) = secrets::scrub(v, secret) {
                    let clean = String::from_utf8_lossy(&clean).into_owned();
                    let _ = self.host.set_header(Part::Response, k, Some(&clean));
                }
            }
        }
        self.log.status = status;
        self.log.ttfb_ms = self.host.now_ms().saturating_sub(self.log.started_ms);
        let rewriting = status == 200
            && self
                .mcp
                .as_ref()
                .is_some_and(|c| c.list || !c.output.is_empty());
        if let Some(call) = self.mcp.as_mut() {
            call.sse = sse;
            call.rewriting = rewriting;
            call.scrubbing = scrubbing;
        }
        if rewriting || scrubbing {
            let _ = self.host.set_header(Part::Response, "content-length", None);
        }
        self.phase = Phase::McpResponding;
        Action::Continue
    }

    /// The answer's bytes: counted; rewritten when they are read (a JSON
    /// answer held until whole, an SSE one event by event).
    pub(crate) fn mcp_answer_body(&mut self, body_size: usize, end_of_stream: bool) -> Action {
        let Some(mut call) = self.mcp.take() else {
            return Action::Continue;
        };
        let action = self.mcp_rewrite(&mut call, body_size, end_of_stream);
        self.mcp = Some(call);
        action
    }

    fn mcp_rewrite(&mut self, call: &mut McpCall, body_size: usize, end_of_stream: bool) -> Action {
        if !call.rewriting {
            call.response_bytes = call.response_bytes.saturating_add(body_size as u64);
            if call.scrubbing {
                let chunk = self
                    .host
                    .body(Part::Response, body_size)
                    .unwrap_or_default();
                self.scrub_chunk(call, &chunk, None, end_of_stream);
            }
            return Action::Continue;
        }
        if !call.sse && !end_of_stream {
            return Action::Pause;
        }
        let Ok(loaded) = self.loaded() else {
            return Action::Continue;
        };
        let gw = &loaded.gw;
        let (Some(m), Some(client)) = (
            gw.mcp.as_ref(),
            self.client(gw).map(|c| effective(c, call.team)),
        ) else {
            return Action::Continue;
        };
        let client: &Client = &client;
        let server = call
            .server
            .and_then(|i| m.config.servers.get(i))
            .map(|s| s.name.clone())
            .unwrap_or_default();
        let lv = levels(gw, m, client);
        let keep = |name: &str| lv.calls(&server, name);
        let policy = answer::Policy {
            id: call.id.as_ref().map(|i| i.get()),
            list: call.list.then_some(&keep as &dyn Fn(&str) -> bool),
            output: gw
                .guardrails
                .as_ref()
                .filter(|_| !call.output.is_empty())
                .map(|g| (g, call.output.as_slice())),
        };
        let mut verdicts: Vec<Verdict> = Vec::new();
        let mut edit = |msg: &mut answer::Message| policy.edit(msg, &mut verdicts);
        let chunk = self
            .host
            .body(Part::Response, body_size)
            .unwrap_or_default();
        call.response_bytes = call.response_bytes.saturating_add(chunk.len() as u64);
        let out = if call.sse {
            let mut out = call.events.chunk(&chunk, &mut edit);
            if end_of_stream {
                out.extend(call.events.finish());
            }
            Some(out)
        } else {
            answer::rewrite_json(&chunk, &mut edit)
        };
        self.log.guardrails.extend(verdicts);
        if call.scrubbing {
            self.scrub_chunk(call, &chunk, out, end_of_stream);
        } else if let Some(out) = out {
            let _ = self.host.set_body(Part::Response, body_size, &out);
        }
        Action::Continue
    }

    /// A chunk of the answer (`out`: as rewritten, else as it came) with the
    /// server's credential scrubbed, in place of the chunk.
    fn scrub_chunk(&mut self, call: &mut McpCall, chunk: &[u8], out: Option<Vec<u8>>, end: bool) {
        let Some(loaded) = self.loaded.clone() else {
            return;
        };
        let Some(secret) = call.server.and_then(|i| loaded.mcp_secret(i)) else {
            return;
        };
        let bytes = out.as_deref().unwrap_or(chunk);
        match (call.scrubber.chunk(bytes, &[secret], end), out) {
            (Some(sent), _) | (None, Some(sent)) => {
                let _ = self.host.set_body(Part::Response, chunk.len(), &sent);
            }
            (None, None) => {}
        }
    }
}

impl<H: Host> RequestContext<H> {
    /// The request's end: its tool-call slots given back, its record.
    pub(crate) fn mcp_end(&mut self) {
        let Some(mut call) = self.mcp.take() else {
            return;
        };
        for key in std::mem::take(&mut call.concurrency) {
            let _ = update(&self.host, &key, |cur| (ratelimit::release(cur), ()));
        }
        if let Some(loaded) = self.loaded.clone() {
            self.ended().emit_mcp_record(&loaded.gw, &call);
        }
    }
}
