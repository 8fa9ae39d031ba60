//! What an MCP request (`mcp`) keeps across its life, and the tool-call
//! counters created ahead; the request path's MCP steps are `mcp`.

use crate::host::Host;
use portcullis_core::config::Gateway;
use portcullis_core::limits::ratelimit::Bucket;
use portcullis_core::mcp::answer::Events;
use portcullis_core::mcp::message::RawValue;
use portcullis_core::shared::keys::{self, Limit, Owner};

/// One MCP request across its life.
#[derive(Default)]
pub struct McpCall {
    /// The server's index in `mcp.servers` (none: refused before one was
    /// known).
    pub server: Option<usize>,
    /// The request's JSON-RPC id, for the errors the gateway answers.
    pub id: Option<Box<RawValue>>,
    /// The JSON-RPC method (`GET` / `DELETE` for a stream or a session's end).
    pub method: String,
    /// A `tools/call`'s qualified tool name.
    pub tool: String,
    /// The vendor checks' calls over a `tools/call`'s arguments, while the
    /// call waits for them.
    pub guarding: Option<crate::request::guard::GuardCalls>,
    /// The answer is a `tools/list` to filter.
    pub list: bool,
    /// The output checks over a tool's result.
    pub output: Vec<usize>,
    /// The answer is SSE (rewritten event by event), else JSON (whole).
    pub sse: bool,
    /// The answer is read and rewritten as it passes.
    pub rewriting: bool,
    /// The server's credential may be echoed: the answer's bytes are
    /// scrubbed of it as they pass.
    pub scrubbing: bool,
    pub scrubber: portcullis_core::credentials::secrets::Scrubber,
    pub events: Events,
    /// Tool-call counters held until the call ends.
    pub concurrency: Vec<String>,
    /// The request's and the answer's body sizes.
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// The JSON-RPC error code the answer carried (0: none).
    pub rpc_error: i64,
    /// The call's price was counted in the caller's budgets.
    pub charged: bool,
    /// A request to the aggregated endpoint (`{mcp.path}` itself).
    pub aggregate: bool,
    /// A login's team (`mcp.oauth.team_claim`), over its client's own.
    pub team: Option<usize>,
    /// When the request went on to its server or servers (0: it did not).
    pub sent_ms: u64,
    /// How many servers a fanned-out message went to.
    pub fanout_servers: usize,
    /// The client's `Mcp-Session-Id` and `MCP-Protocol-Version`, as sent.
    pub session: Option<String>,
    pub protocol_version: Option<String>,
    /// The aggregated endpoint's callouts in flight: (token, server index).
    pub fanout: Vec<(u32, usize)>,
    /// Their answers: (server index, status, the server's session, body).
    pub answers: Vec<(usize, u16, Option<String>, Vec<u8>)>,
}

/// Create the tool-call counters every key and team will take from (see
/// `admission::prepare`: shared data has no atomic create).
pub fn prepare(host: &impl Host, gw: &Gateway) {
    let Some(m) = gw.mcp.as_ref() else {
        return;
    };
    let keys = m.keys.iter().map(|(n, a)| (Owner::Key(n), a));
    let teams = m.teams.iter().map(|(n, a)| (Owner::Team(n), a));
    for (owner, a) in keys.chain(teams) {
        let create = |key: String, initial: &[u8]| {
            if let Ok((None, _)) = host.get(&key) {
                let _ = host.set(&key, initial, None);
            }
        };
        if a.calls_per_minute.is_some() {
            create(
                keys::limit(owner, Limit::ToolCallsPerMinute),
                &Bucket::default().encode(),
            );
        }
        if a.max_concurrent_calls.is_some() {
            create(keys::limit(owner, Limit::ToolCalls), &0u32.to_le_bytes());
        }
    }
}

/// What a 401 tells an MCP client: the scheme the gateway takes (with
/// `mcp.oauth`, where its metadata is).
pub const WWW_AUTHENTICATE: &str = "Bearer realm=\"portcullis\"";
