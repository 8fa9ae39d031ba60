//! `mcp`, `clients[].mcp`, `teams[].mcp`: the MCP servers and who may call
//! what, checked against each other (every problem pushed).

use super::raw::{RawConfig, RawMcpAccess, RawMcpOauth};
use crate::mcp::access::{Access, Credential, McpConfig, McpGateway, Server};
use crate::mcp::oauth::Oauth;
use crate::mcp::SEPARATOR;
use hashbrown::HashMap;

/// Five minutes: a tool may run long and stream progress meanwhile.
const DEFAULT_TIMEOUT_MS: u64 = 300_000;

/// A server's name: it prefixes its tools' qualified names
/// (`server__tool`), so it may hold no `__` and may not end with `_`
/// (`alpha_` beside `alpha` would make `alpha___echo` read as either's).
fn name_ok(name: &str) -> bool {
    !name.is_empty()
        && !name.contains(SEPARATOR)
        && !name.ends_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// The compiled section (`None` without one), and each key's and team's
/// access by name.
pub(super) fn mcp(raw: &RawConfig, problems: &mut Vec<String>) -> Option<McpGateway> {
    let Some(m) = raw.mcp.as_ref() else {
        for (i, c) in raw.clients.iter().enumerate() {
            if c.mcp.is_some() {
                problems.push(format!(
                    "clients[{i}] ({}).mcp: there is no `mcp` section with servers",
                    c.name
                ));
            }
        }
        for (i, t) in raw.teams.iter().enumerate() {
            if t.mcp.is_some() {
                problems.push(format!(
                    "teams[{i}] ({}).mcp: there is no `mcp` section with servers",
                    t.name
                ));
            }
        }
        return None;
    };
    if !m.path.starts_with('/') || m.path.len() < 2 || m.path.ends_with('/') {
        problems.push(format!(
            "mcp.path `{}` must start with `/` and not end with one (e.g. /mcp)",
            m.path
        ));
    }
    if m.path.starts_with("/v1/") || m.path == "/v1" {
        problems.push(format!(
            "mcp.path `{}` is under /v1, the LLM APIs' paths",
            m.path
        ));
    }
    let mut servers: Vec<Server> = Vec::with_capacity(m.servers.len());
    for (i, s) in m.servers.iter().enumerate() {
        let at = format!("mcp.servers[{i}] ({})", s.name);
        if !name_ok(&s.name) {
            problems.push(format!(
                "{at}: `name` must be letters, digits, `-` and `_`, without `{SEPARATOR}` and not ending with `_` (it prefixes the server's tools: `{{server}}{SEPARATOR}{{tool}}` must read one way only)"
            ));
        } else if servers.iter().any(|o| o.name == s.name) {
            problems.push(format!("{at}: duplicate server name"));
        }
        if s.cluster.trim().is_empty() {
            problems.push(format!("{at}: `cluster` is empty"));
        }
        if !s.path.starts_with('/') {
            problems.push(format!("{at}: `path` must start with `/`"));
        }
        if !(s.price_per_call_usd.is_finite() && s.price_per_call_usd >= 0.0) {
            problems.push(format!(
                "{at}: `price_per_call_usd` must be a number of USD, 0 or more"
            ));
        }
        if s.timeout_ms == Some(0) {
            problems.push(format!("{at}: `timeout_ms` must be at least 1"));
        }
        let credential = match &s.credential {
            None => Credential::None,
            Some(c) => {
                let header = c.header.trim().to_ascii_lowercase();
                if header.is_empty() || header.starts_with(':') {
                    problems.push(format!("{at}.credential: `header` must name a header"));
                }
                if c.env.trim().is_empty() {
                    problems.push(format!(
                        "{at}.credential: `env` must name an environment variable"
                    ));
                }
                Credential::Header {
                    name: header,
                    env: c.env.trim().to_string(),
                    prefix: c.prefix.clone(),
                }
            }
        };
        servers.push(Server {
            name: s.name.clone(),
            cluster: s.cluster.clone(),
            path: s.path.clone(),
            credential,
            price_micros: if s.price_per_call_usd.is_finite() {
                (s.price_per_call_usd.max(0.0) * 1e6).round() as i64
            } else {
                0
            },
            timeout_ms: s.timeout_ms.unwrap_or(DEFAULT_TIMEOUT_MS).max(1),
        });
    }
    if servers.is_empty() {
        problems.push("mcp.servers: at least one server is required".into());
    }
    let config = McpConfig {
        path: m.path.clone(),
        servers,
    };
    let mut keys = HashMap::new();
    for (i, c) in raw.clients.iter().enumerate() {
        if let Some(a) = &c.mcp {
            let at = format!("clients[{i}] ({}).mcp", c.name);
            keys.insert(c.name.clone(), access(&at, a, &config, problems));
        }
    }
    let mut teams = HashMap::new();
    for (i, t) in raw.teams.iter().enumerate() {
        if let Some(a) = &t.mcp {
            let at = format!("teams[{i}] ({}).mcp", t.name);
            teams.insert(t.name.clone(), access(&at, a, &config, problems));
        }
    }
    let oauth = m.oauth.as_ref().and_then(|o| oauth(raw, o, problems));
    Some(McpGateway {
        config,
        oauth,
        keys,
        teams,
    })
}

fn oauth(raw: &RawConfig, o: &RawMcpOauth, problems: &mut Vec<String>) -> Option<Oauth> {
    let at = "mcp.oauth";
    let client = raw.clients.iter().find(|c| c.name == o.client);
    if client.is_none() {
        problems.push(format!("{at}.client: `{}` is not in `clients`", o.client));
    }
    if !(o.resource.starts_with("https://") || o.resource.starts_with("http://")) {
        problems.push(format!(
            "{at}.resource: `{}` must be the MCP endpoint's URL (https://host/mcp)",
            o.resource
        ));
    }
    if o.authorization_servers.is_empty() {
        problems.push(format!(
            "{at}.authorization_servers: name at least one issuer"
        ));
    }
    let header = o.payload_header.trim().to_ascii_lowercase();
    if header.is_empty() || header.starts_with(':') || header == "authorization" {
        problems.push(format!(
            "{at}.payload_header: `{}` must be a header of its own (jwt_authn's forward_payload_header)",
            o.payload_header
        ));
    }
    for (k, v) in [("team_claim", &o.team_claim), ("user_claim", &o.user_claim)] {
        if v.trim().is_empty() {
            problems.push(format!("{at}.{k} is empty"));
        }
    }
    let client_key = super::parse_sha256_hex(&client?.key_sha256)?;
    Some(Oauth {
        payload_header: header,
        client: o.client.clone(),
        client_key,
        team_claim: o.team_claim.clone(),
        user_claim: o.user_claim.clone(),
        resource: o.resource.trim_end_matches('/').to_string(),
        authorization_servers: o.authorization_servers.clone(),
        scopes: o.scopes.clone(),
    })
}

fn access(at: &str, a: &RawMcpAccess, config: &McpConfig, problems: &mut Vec<String>) -> Access {
    for s in a.servers.iter().flatten() {
        if config.server(s).is_none() {
            problems.push(format!("{at}.servers: `{s}` is not in mcp.servers"));
        }
    }
    for p in a.tools.iter().flatten() {
        if p.is_empty() {
            problems.push(format!("{at}.tools: a pattern is empty"));
        } else if !p.contains(SEPARATOR) && p != "*" {
            problems.push(format!(
                "{at}.tools: `{p}` names no server (patterns are `{{server}}{SEPARATOR}{{tool}}`, e.g. `alpha{SEPARATOR}*`)"
            ));
        }
    }
    if a.calls_per_minute == Some(0) {
        problems.push(format!("{at}.calls_per_minute must be at least 1"));
    }
    if a.max_concurrent_calls == Some(0) {
        problems.push(format!("{at}.max_concurrent_calls must be at least 1"));
    }
    Access {
        servers: a.servers.clone(),
        tools: a.tools.clone(),
        calls_per_minute: a.calls_per_minute,
        max_concurrent_calls: a.max_concurrent_calls,
    }
}
