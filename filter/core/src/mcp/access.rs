//! The MCP gateway's config, compiled (`mcp:`, `clients[].mcp`,
//! `teams[].mcp`), and who may call what: a caller passes a server or a
//! tool only when every level that names some (its key's, its team's)
//! allows it.

use crate::limits::ratelimit::Micros;
use hashbrown::HashMap;

/// The compiled MCP gateway: its servers, and each key's and team's
/// access by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpGateway {
    pub config: McpConfig,
    /// Callers that log in (`mcp.oauth`).
    pub oauth: Option<super::oauth::Oauth>,
    pub keys: HashMap<String, Access>,
    pub teams: HashMap<String, Access>,
}

impl McpGateway {
    /// The access levels of a caller: its key's, its team's.
    pub fn levels(&self, key: &str, team: Option<&str>) -> Levels<'_> {
        Levels([self.keys.get(key), team.and_then(|t| self.teams.get(t))])
    }
}

/// The `mcp` section: the servers behind `{path}/{server}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct McpConfig {
    /// The endpoint's path (default `/mcp`); each server is at
    /// `{path}/{server}`.
    pub path: String,
    pub servers: Vec<Server>,
}

/// An MCP server behind the gateway.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server {
    pub name: String,
    /// The Envoy cluster it is reached through.
    pub cluster: String,
    /// Its endpoint's path on that cluster (default `/mcp`).
    pub path: String,
    /// What the gateway sends it instead of the caller's key.
    pub credential: Credential,
    /// Counted in the caller's budgets for each `tools/call` (0: free).
    pub price_micros: Micros,
    /// A call's bound, answer included (Envoy's route timeout).
    pub timeout_ms: u64,
}

/// The credential a server gets (the caller's gateway key never goes
/// upstream).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Credential {
    None,
    /// A header whose value is read from the VM's environment at configure
    /// time (never from the plugin config), after `prefix`.
    Header {
        name: String,
        env: String,
        prefix: String,
    },
}

/// A key's or a team's tools and tool-call limits (`clients[].mcp`,
/// `teams[].mcp`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Access {
    /// The servers it may reach (`None`: every server).
    pub servers: Option<Vec<String>>,
    /// Patterns over qualified tool names, `server__tool`, `*` for any run
    /// of characters (`None`: every tool of the servers it may reach). A
    /// pattern is read as a (server, tool) pair split at its first `__`
    /// and matched against the server's name and the tool's apart, never
    /// against the joined string.
    pub tools: Option<Vec<String>>,
    pub calls_per_minute: Option<u64>,
    pub max_concurrent_calls: Option<u64>,
}

impl McpConfig {
    pub fn server(&self, name: &str) -> Option<&Server> {
        self.servers.iter().find(|s| s.name == name)
    }

    /// The server a request path names: `{path}/{server}` (a trailing `/`
    /// allowed); `None` for any other path. `Some(None)`: the path names
    /// no server this config has.
    pub fn server_of_path(&self, path: &str) -> Option<Option<&Server>> {
        let rest = path.strip_prefix(self.path.as_str())?;
        if rest.is_empty() {
            // The endpoint itself, no server named.
            return Some(None);
        }
        let name = rest.strip_prefix('/')?.trim_end_matches('/');
        if name.is_empty() || name.contains('/') {
            return Some(None);
        }
        Some(self.server(name))
    }
}

/// Whether `pattern` (`*`: any run of characters, possibly empty) matches
/// all of `name`. Linear in practice: on a mismatch it goes back to the
/// last `*` only.
pub fn matches(pattern: &str, name: &str) -> bool {
    let (p, n) = (pattern.as_bytes(), name.as_bytes());
    let (mut pi, mut ni) = (0usize, 0usize);
    let mut star: Option<(usize, usize)> = None;
    while ni < n.len() {
        match p.get(pi) {
            Some(b'*') => {
                star = Some((pi, ni));
                pi = pi.saturating_add(1);
            }
            Some(c) if n.get(ni) == Some(c) => {
                pi = pi.saturating_add(1);
                ni = ni.saturating_add(1);
            }
            _ => match star {
                Some((sp, sn)) => {
                    pi = sp.saturating_add(1);
                    ni = sn.saturating_add(1);
                    star = Some((sp, ni));
                }
                None => return false,
            },
        }
    }
    p.get(pi..)
        .is_some_and(|rest| rest.iter().all(|&c| c == b'*'))
}

impl Access {
    pub fn reaches(&self, server: &str) -> bool {
        self.servers
            .as_ref()
            .is_none_or(|s| s.iter().any(|n| n == server))
    }

    /// Whether it may call `tool` of `server`.
    pub fn calls(&self, server: &str, tool: &str) -> bool {
        if !self.reaches(server) {
            return false;
        }
        let Some(patterns) = &self.tools else {
            return true;
        };
        patterns.iter().any(|p| pair_matches(p, server, tool))
    }
}

/// Whether a tool pattern (`server__tool`, or `*` for every tool) matches
/// `tool` of `server`: the pattern's server part against the server's name
/// and its tool part against the tool's, each whole.
pub fn pair_matches(pattern: &str, server: &str, tool: &str) -> bool {
    match pattern.split_once(super::SEPARATOR) {
        Some((sp, tp)) => matches(sp, server) && matches(tp, tool),
        None => pattern == "*",
    }
}

/// Every level's access (the key's, the team's): a server or a tool passes
/// when each level allows it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Levels<'a>(pub [Option<&'a Access>; 2]);

impl Levels<'_> {
    pub fn reaches(&self, server: &str) -> bool {
        self.0.iter().flatten().all(|a| a.reaches(server))
    }

    pub fn calls(&self, server: &str, tool: &str) -> bool {
        self.0.iter().flatten().all(|a| a.calls(server, tool))
    }
}
