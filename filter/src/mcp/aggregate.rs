//! The aggregated MCP endpoint (`{mcp.path}` itself, #47): every server
//! the caller may reach behind one URL, their tools and prompts named
//! `{server}__{name}`. Envoy's `mcp_router` forwards none of the client's
//! headers to the servers, so the gateway fans out itself, by callouts,
//! each with the server's credential, the trace and the server's own
//! session (the client holds one session over them:
//! `portcullis_core::mcp::aggregate::session_id`):
//!
//! | the client's message | what the gateway does |
//! |---|---|
//! | `initialize` | to every server the key reaches; one answer, one session over theirs |
//! | a notification, an answer to a server | to every server of the session; 202 |
//! | `tools/list`, `prompts/list` | to every server of the session; the lists merged, names qualified, tools filtered |
//! | `tools/call`, `prompts/get` of `server__name` | through Envoy's router to that server, the name its own, its session; the tool policy as on `/mcp/{server}` |
//! | `ping` | answered here |
//! | `resources/list`, `resources/templates/list` | answered here, empty: resources are read at `/mcp/{server}` |
//! | `DELETE` | to every server of the session; 200 |
//! | anything else | -32601 |

use crate::host::{Action, Host, Part};
use crate::mcp::{levels, session_missing};
use crate::request::{Phase, RequestContext};
use portcullis_core::config::{Client, Gateway};
use portcullis_core::error::GatewayError;
use portcullis_core::mcp::aggregate;
use portcullis_core::mcp::message::{Message, Method};
use portcullis_core::mcp::McpGateway;

/// An answer made of several servers' answers, with every server's
/// credential scrubbed from it.
fn scrubbed(loaded: &crate::loaded::Loaded, body: Vec<u8>) -> Vec<u8> {
    portcullis_core::credentials::secrets::scrub_all(&body, &loaded.mcp_secrets()).unwrap_or(body)
}

impl<H: Host> RequestContext<H> {
    /// The headers of a request to the aggregated endpoint.
    pub(crate) fn mcp_aggregate_headers(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        method: &str,
        end_of_stream: bool,
    ) -> Result<Action, GatewayError> {
        if let Some(call) = self.mcp.as_mut() {
            call.aggregate = true;
            call.method = method.to_string();
        }
        match method {
            "POST" if end_of_stream => Err(Message::read(b"")
                .err()
                .map(|r| r.into_error())
                .unwrap_or_else(|| GatewayError::internal("empty body"))),
            "POST" => {
                self.phase = Phase::McpBody;
                Ok(Action::Pause)
            }
            "DELETE" => {
                let sessions = self.session_servers(client)?;
                self.fan_out(gw, m, client, "DELETE", &sessions, b"")
            }
            _ => Err(GatewayError::new(
                405,
                "invalid_request_error",
                "method_not_allowed",
                format!(
                    "{method} at {}: POST a message or DELETE the session (the aggregated endpoint has no GET stream; a server's is at {}/{{server}}).",
                    m.config.path, m.config.path
                ),
            )),
        }
    }

    /// The servers' sessions the client's session holds, when the gateway
    /// sealed it to this caller and it is alive (else MCP's 404: no server
    /// is asked with another caller's session).
    pub(crate) fn session_servers(
        &self,
        client: &Client,
    ) -> Result<Vec<(String, String)>, GatewayError> {
        let loaded = self.loaded()?;
        let seal = loaded.sealer()?;
        let now = self.host.now_ms();
        self.mcp
            .as_ref()
            .and_then(|c| c.session.as_deref())
            .and_then(|id| aggregate::sessions_of(id, self.session_holder(client), now, seal))
            .ok_or_else(session_missing)
    }

    /// Who this caller's MCP sessions are sealed to: its key, and the user
    /// a login named.
    pub(crate) fn session_holder<'a>(&'a self, client: &'a Client) -> aggregate::Holder<'a> {
        aggregate::Holder {
            key: &client.name,
            user: self.request.end_user.as_deref(),
        }
    }

    /// A session id sealed to this caller for `sessions`.
    pub(crate) fn sealed_session(
        &self,
        client: &Client,
        sessions: &[(String, String)],
    ) -> Result<String, GatewayError> {
        let loaded = self.loaded()?;
        let expires = self.host.now_ms().saturating_add(aggregate::SESSION_TTL_MS);
        Ok(aggregate::session_id(
            sessions,
            self.session_holder(client),
            expires,
            loaded.sealer()?,
        ))
    }

    /// A message to the aggregated endpoint.
    pub(crate) fn mcp_aggregate_body(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        msg: &Message<'_>,
        body: &[u8],
        body_size: usize,
    ) -> Result<Action, GatewayError> {
        let id = msg.id.map_or("null", |i| i.get());
        match &msg.method {
            Method::Initialize => {
                let all: Vec<(String, String)> = m
                    .config
                    .servers
                    .iter()
                    .filter(|s| levels(gw, m, client).reaches(&s.name))
                    .map(|s| (s.name.clone(), String::new()))
                    .collect();
                self.fan_out(gw, m, client, "POST", &all, body)
            }
            Method::Notification(_) | Method::Response | Method::ToolsList => {
                let sessions = self.session_servers(client)?;
                self.fan_out(gw, m, client, "POST", &sessions, body)
            }
            Method::Other(o) if o == "prompts/list" => {
                let sessions = self.session_servers(client)?;
                self.fan_out(gw, m, client, "POST", &sessions, body)
            }
            Method::Other(o) if o == "ping" => Ok(self.reply(200, &[], &aggregate::pong(id))),
            Method::Other(o) if o == "resources/list" => {
                Ok(self.reply(200, &[], &aggregate::empty(id, "resources")))
            }
            Method::Other(o) if o == "resources/templates/list" => {
                Ok(self.reply(200, &[], &aggregate::empty(id, "resourceTemplates")))
            }
            Method::ToolCall { name, .. } => {
                self.mcp_routed(gw, m, client, name, true, body, body_size)
            }
            Method::Other(o) if o == "prompts/get" => {
                let name = aggregate::param_name(msg.params).unwrap_or_default();
                self.mcp_routed(gw, m, client, &name, false, body, body_size)
            }
            Method::Other(o) => Err(GatewayError::new(
                404,
                "invalid_request_error",
                "method_not_found",
                format!(
                    "Method not found at {}: `{o}` (resources are read at {}/{{server}}).",
                    m.config.path, m.config.path
                ),
            )),
        }
    }

    /// A `tools/call` or `prompts/get` of a qualified name: to its server
    /// through Envoy's router, under that server's name, credential and
    /// session.
    #[allow(clippy::too_many_arguments)]
    fn mcp_routed(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        qualified: &str,
        tool: bool,
        body: &[u8],
        body_size: usize,
    ) -> Result<Action, GatewayError> {
        let sessions = self.session_servers(client)?;
        let unknown = || {
            GatewayError::new(
                if tool { 403 } else { 400 },
                "permission_error",
                if tool { "tool_not_allowed" } else { "invalid_params" },
                format!(
                    "`{qualified}` names no server of this session (names are {{server}}__{{name}})."
                ),
            )
        };
        let (server_name, name) = aggregate::split(qualified).ok_or_else(unknown)?;
        let index = m
            .config
            .servers
            .iter()
            .position(|s| s.name == server_name)
            .ok_or_else(unknown)?;
        let server = m.config.servers.get(index).ok_or_else(unknown)?;
        if !levels(gw, m, client).reaches(server_name) {
            if let Some(call) = self.mcp.as_mut() {
                call.tool = qualified.to_string();
            }
            return Err(unknown());
        }
        let session = sessions
            .iter()
            .find(|(s, _)| s == server_name)
            .map(|(_, id)| id.clone())
            .ok_or_else(session_missing)?;
        let renamed = aggregate::renamed(body, name)
            .ok_or_else(|| GatewayError::bad_request("invalid_params", "Invalid params"))?;
        self.host
            .set_body(Part::Request, body_size, &renamed)
            .map_err(|s| GatewayError::internal(format!("cannot rewrite the body: {s:?}")))?;
        let _ = self.host.set_header(
            Part::Request,
            "content-length",
            Some(&renamed.len().to_string()),
        );
        if let Some(call) = self.mcp.as_mut() {
            call.server = Some(index);
        }
        let waiting =
            tool && self.mcp_tool_call(gw, m, client, server, name, &renamed, renamed.len())?;
        self.mcp_upstream(server, Some(index), "", false)?;
        let now = self.host.now_ms();
        if let Some(call) = self.mcp.as_mut() {
            call.sent_ms = now;
        }
        let value = (!session.is_empty()).then_some(session.as_str());
        let _ = self.host.set_header(Part::Request, "mcp-session-id", value);
        if waiting {
            self.phase = Phase::McpGuarding;
            return Ok(Action::Pause);
        }
        self.phase = Phase::McpProxied;
        Ok(Action::Continue)
    }

    /// The same message to each server (`sessions`: each server's name and
    /// session, empty for none yet), by callouts; the answer is made when
    /// the last one is in.
    fn fan_out(
        &mut self,
        gw: &Gateway,
        m: &McpGateway,
        client: &Client,
        method: &str,
        sessions: &[(String, String)],
        body: &[u8],
    ) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let lv = levels(gw, m, client);
        let traceparent = self.log.trace.as_ref().map(|t| t.traceparent(1));
        let (authority, version) = (
            self.request.authority.clone(),
            self.mcp.as_ref().and_then(|c| c.protocol_version.clone()),
        );
        let mut calls = Vec::new();
        for (name, session) in sessions {
            let Some(index) = m.config.servers.iter().position(|s| &s.name == name) else {
                continue;
            };
            let Some(server) = m.config.servers.get(index).filter(|s| lv.reaches(&s.name)) else {
                continue;
            };
            let mut hdrs: Vec<(&str, &str)> = vec![
                (":method", method),
                (":path", &server.path),
                (":authority", &authority),
                ("content-type", "application/json"),
                ("accept", "application/json, text/event-stream"),
            ];
            if !session.is_empty() {
                hdrs.push(("mcp-session-id", session));
            }
            if let Some(v) = &version {
                hdrs.push(("mcp-protocol-version", v));
            }
            if let Some(tp) = &traceparent {
                hdrs.push(("traceparent", tp));
            }
            if let Some((k, v)) = loaded.mcp_credentials.get(index).and_then(Option::as_ref) {
                hdrs.push((k, v));
            }
            if let Ok(token) = self
                .host
                .dispatch(&server.cluster, &hdrs, body, server.timeout_ms)
            {
                calls.push((token, index));
            }
        }
        if calls.is_empty() {
            return Err(GatewayError::new(
                502,
                "api_error",
                "no_server",
                "No MCP server of this key could be reached.",
            ));
        }
        let now = self.host.now_ms();
        if let Some(call) = self.mcp.as_mut() {
            call.fanout_servers = calls.len();
            call.fanout = calls;
            call.sent_ms = now;
        }
        self.phase = Phase::McpFanout;
        Ok(Action::Pause)
    }

    /// A server's answer to a fanned-out message; the last one makes the
    /// client's answer.
    pub(crate) fn mcp_fanout_answer(&mut self, token: u32, body_size: usize) {
        let Some(mut call) = self.mcp.take() else {
            return;
        };
        let Some(pos) = call.fanout.iter().position(|(t, _)| *t == token) else {
            self.mcp = Some(call);
            return;
        };
        let (_, index) = call.fanout.swap_remove(pos);
        let headers = self.host.headers(Part::CallResponse).unwrap_or_default();
        let find = |name: &str| {
            headers
                .get(name)
                .map(|v| String::from_utf8_lossy(v).into_owned())
        };
        let status = find(":status").and_then(|s| s.parse().ok()).unwrap_or(0);
        let session = find("mcp-session-id");
        let body = self
            .host
            .body(Part::CallResponse, body_size)
            .unwrap_or_default();
        call.response_bytes = call.response_bytes.saturating_add(body.len() as u64);
        call.answers.push((index, status, session, body));
        let done = call.fanout.is_empty();
        self.mcp = Some(call);
        if done {
            // Both end the request with the client's answer.
            let _ = self.fanned_in().unwrap_or_else(|e| self.fail(&e));
        }
    }

    /// Every server answered: the client's answer.
    fn fanned_in(&mut self) -> Result<Action, GatewayError> {
        let loaded = self.loaded()?;
        let gw = &loaded.gw;
        let (Some(m), Some(client)) = (gw.mcp.as_ref(), self.mcp_client(gw)) else {
            return Err(GatewayError::unknown_key());
        };
        let client: &Client = &client;
        let Some(call) = self.mcp.as_mut() else {
            return Err(GatewayError::internal("no MCP request"));
        };
        let answers = std::mem::take(&mut call.answers);
        let id = call
            .id
            .as_ref()
            .map_or_else(|| "null".to_string(), |i| i.get().to_string());
        let method = call.method.clone();
        let name = |i: usize| m.config.servers.get(i).map_or("", |s| s.name.as_str());
        let ok = answers
            .iter()
            .filter(|(_, status, _, _)| *status / 100 == 2);
        // Every server forgot the session (or never had it): the client
        // starts again (MCP's 404).
        let forgotten = method != "initialize"
            && answers.iter().all(|(_, status, _, _)| *status / 100 != 2)
            && answers.iter().any(|(_, status, _, _)| *status == 404);
        if forgotten {
            return Err(session_missing());
        }
        match method.as_str() {
            "initialize" => {
                let mut sessions = Vec::new();
                let mut messages = Vec::new();
                for (i, _, session, body) in ok {
                    if let Some(msg) =
                        aggregate::answer_to(body, &id).filter(|m| m.contains_key("result"))
                    {
                        sessions.push((name(*i).to_string(), session.clone().unwrap_or_default()));
                        messages.push(msg);
                    }
                }
                if messages.is_empty() {
                    return Err(GatewayError::new(
                        502,
                        "api_error",
                        "no_server",
                        "No MCP server of this key answered `initialize`.",
                    ));
                }
                let sid = self.sealed_session(client, &sessions)?;
                let body = scrubbed(&loaded, aggregate::initialize(&id, &messages));
                Ok(self.reply(200, &[("mcp-session-id", &sid)], &body))
            }
            "tools/list" | "prompts/list" => {
                let member = if method == "tools/list" {
                    "tools"
                } else {
                    "prompts"
                };
                let lists: Vec<(&str, _)> = ok
                    .filter_map(|(i, _, _, body)| {
                        Some((name(*i), aggregate::answer_to(body, &id)?))
                    })
                    .collect();
                let lv = levels(gw, m, client);
                let keep = |server: &str, n: &str| {
                    if member == "tools" {
                        lv.calls(server, n)
                    } else {
                        lv.reaches(server)
                    }
                };
                let body = scrubbed(&loaded, aggregate::merged_list(&id, member, &lists, &keep));
                Ok(self.reply(200, &[], &body))
            }
            "DELETE" => Ok(self.reply(200, &[], b"")),
            // Notifications and answers to a server: accepted.
            _ => Ok(self.reply(202, &[], b"")),
        }
    }
}
