//! The MCP gateway's core (#47): agents' tool calls over MCP's streamable
//! HTTP transport, under the same keys, teams, limits, budgets, guardrails
//! and request log as their LLM calls. Pure: what the host hands over is
//! bytes and names.
//!
//! - [`message`]: one JSON-RPC message as a client sends it, read once in
//!   place (batches, bad JSON and bad envelopes refused), and the
//!   gateway's own errors in JSON-RPC's shape.
//! - [`access`]: the config (`mcp:` servers; each key's and team's tools,
//!   limits and price) and who may call what.
//! - [`aggregate`]: the aggregated endpoint: the client's session over its
//!   servers' sessions, their answers merged, qualified names split.
//! - [`oauth`]: callers that log in: a verified JWT's claims to a client
//!   and a team, the Protected Resource Metadata.
//! - [`answer`]: a server's answer as it passes back: a `tools/list`
//!   filtered to the caller's tools, a tool's result read for the
//!   guardrails, whole (JSON) or event by event (SSE).
//!
//! May use: `credentials`, `error`, `guard`, `limits`, `wire`.

pub mod access;
pub mod aggregate;
pub mod answer;
pub mod message;
pub mod oauth;

#[cfg(test)]
mod tests;

pub use access::{Access, Credential, McpConfig, McpGateway, Server};
pub use message::{Message, Method};

/// The separator between a server's name and a tool's in a qualified tool
/// name (`alpha__echo`): the one Envoy's `mcp_router` writes, so a policy
/// reads the same on `/mcp/{server}` and on the aggregated endpoint.
pub const SEPARATOR: &str = "__";

/// A tool's qualified name: `server__tool`.
pub fn qualified(server: &str, tool: &str) -> String {
    let mut out = String::with_capacity(server.len() + SEPARATOR.len() + tool.len());
    out.push_str(server);
    out.push_str(SEPARATOR);
    out.push_str(tool);
    out
}
