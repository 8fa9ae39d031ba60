//! Every key the gateway keeps in Envoy's shared data, in one place. Keys
//! are stable names (provider, client, day), never indexes, so a config
//! reload keeps counters, buckets and breaker states.

/// A provider's circuit breaker.
pub fn breaker(provider: &str) -> String {
    ["portcullis:breaker:", provider].concat()
}

/// Whose limits a counter counts: a client key's or a team's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner<'a> {
    Key(&'a str),
    Team(&'a str),
    /// An end user of a key: `<key>/<user>` ([`user_owner`]).
    User(&'a str),
}

impl<'a> Owner<'a> {
    pub fn name(self) -> &'a str {
        match self {
            Owner::Key(n) | Owner::Team(n) | Owner::User(n) => n,
        }
    }

    /// `client` or `team` (also the rate limit descriptor's entry key).
    pub fn kind(self) -> &'static str {
        match self {
            Owner::Key(_) => "client",
            Owner::Team(_) => "team",
            Owner::User(_) => "user",
        }
    }

    /// In messages: "key `alice`", "team `research`".
    pub fn describe(self) -> String {
        match self {
            Owner::Key(n) => format!("key `{n}`"),
            Owner::Team(n) => format!("team `{n}`"),
            Owner::User(n) => format!("user `{n}`"),
        }
    }

    /// The start of its keys: a key's are the gateway's first ones, a
    /// team's have their own prefix (a client and a team may share a name).
    /// (Built on every limited request's path: joined, not formatted.)
    fn prefix(self, what: &str) -> String {
        let (kind, n) = match self {
            Owner::Key(n) => ("", n),
            Owner::Team(n) => ("team:", n),
            Owner::User(n) => ("user:", n),
        };
        ["portcullis:", kind, what, ":", n].concat()
    }
}

/// An end user's owner name: `<key>/<user>`, the user as sent when it is
/// 1 to 64 characters of `A-Za-z0-9._@+-`, else `~` and a hash of it (so a
/// key is never longer, and no user can name another key's).
pub fn user_owner(key: &str, user: &str) -> String {
    let plain = !user.is_empty()
        && user.len() <= 64
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._@+-".contains(&b));
    if plain {
        format!("{key}/{user}")
    } else {
        let mut h = fnv::FnvHasher::default();
        std::hash::Hasher::write(&mut h, user.as_bytes());
        format!("{key}/~{:016x}", std::hash::Hasher::finish(&h))
    }
}

/// The users beyond a key's `max_users_per_key` share this one.
pub fn overflow_user(key: &str) -> String {
    format!("{key}/~overflow")
}

/// How many end users of a key are tracked.
pub fn users(key: &str) -> String {
    format!("portcullis:users:{key}")
}

/// Set once an end user of a key is tracked.
pub fn user_seen(owner: &str) -> String {
    format!("portcullis:user:seen:{owner}")
}

/// What a limit counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    RequestsPerMinute,
    TokensPerMinute,
    Concurrency,
    /// MCP `tools/call` requests per minute (`mcp.calls_per_minute`).
    ToolCallsPerMinute,
    /// MCP `tools/call` requests in flight (`mcp.max_concurrent_calls`).
    ToolCalls,
}

/// A level's counters ([`crate::limits::counters::Counters`]): its request and
/// token buckets, requests in flight and budget spend, in one value.
pub fn counters(owner: Owner<'_>) -> String {
    owner.prefix("level")
}

/// One of a key's or a team's limit counters (the MCP gateway's tool calls;
/// a level's own limits are in [`counters`]).
pub fn limit(owner: Owner<'_>, what: Limit) -> String {
    let what = match what {
        Limit::RequestsPerMinute => "rpm",
        Limit::TokensPerMinute => "tpm",
        Limit::Concurrency => "conc",
        Limit::ToolCallsPerMinute => "mcp_cpm",
        Limit::ToolCalls => "mcp_conc",
    };
    [owner.prefix("rl").as_str(), ":", what].concat()
}

/// A provider's moving average latency for one model id (`fastest`).
pub fn latency(provider: &str, model_id: &str) -> String {
    format!("portcullis:latency:{provider}:{model_id}")
}

/// A provider's adaptive concurrency state.
pub fn aimd(provider: &str) -> String {
    format!("portcullis:aimd:{provider}")
}

/// One VM's requests in flight at a provider (`least_busy`; only that VM
/// writes it).
pub fn busy(provider: &str, vm: u64) -> String {
    format!("portcullis:busy:{provider}:{vm:016x}")
}

/// The VMs publishing requests in flight, with when each last said so.
pub const BUSY_VMS: &str = "portcullis:busy:vms";

/// One slot of the table of which provider made which response.
pub fn response_slot(slot: u32) -> String {
    format!("portcullis:resp:{slot}")
}

/// The client keys stamped so far (their hashes, 32 bytes each, sorted).
pub const CLIENT_STAMPS: &str = "portcullis:keys";

/// A client key's stamp: what the serving config says of it, in a few
/// bytes ([`crate::config::Gateway::client_stamp`]); empty once the key is revoked. An open
/// Realtime session compares it with the one it began with (#61).
pub fn client_stamp_key(hash: &[u8; 32]) -> String {
    let mut out = String::with_capacity(40);
    out.push_str("portcullis:key:");
    out.push_str(&crate::wire::text::hex(hash.get(..12).unwrap_or_default()));
    out
}

/// A batch whose cost was charged (once, when its usage was first seen).
pub fn batch_charged(provider: &str, id: &str) -> String {
    format!("portcullis:batch:{provider}:{id}")
}

/// The config generation shared by the workers.
pub const CONFIG_GENERATION: &str = "portcullis:config_generation";

/// A cache set's index.
pub fn cache_index(set: u32) -> String {
    format!("portcullis:cache:{set}")
}

/// One slot of a cache set.
pub fn cache_slot(set: u32, way: usize) -> String {
    format!("portcullis:cache:{set}:{way}")
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    /// These names are state that outlives a deploy: changing one resets it.
    #[test]
    fn key_names_are_stable() {
        assert_eq!(breaker("primary"), "portcullis:breaker:primary");
        let demo = Owner::Key("demo");
        assert_eq!(counters(demo), "portcullis:level:demo");
        assert_eq!(
            limit(demo, Limit::ToolCallsPerMinute),
            "portcullis:rl:demo:mcp_cpm"
        );
        let team = Owner::Team("demo");
        assert_eq!(counters(team), "portcullis:team:level:demo");
        assert_eq!(
            limit(team, Limit::ToolCalls),
            "portcullis:team:rl:demo:mcp_conc"
        );
        assert_eq!(
            user_owner("demo", "alice@example.com"),
            "demo/alice@example.com"
        );
        assert_eq!(
            counters(Owner::User("demo/alice")),
            "portcullis:user:level:demo/alice"
        );
        // Anything else is hashed: no user names another key's users.
        let odd = user_owner("demo", "../other/x");
        assert!(
            odd.starts_with("demo/~") && odd.len() == "demo/~".len() + 16,
            "{odd}"
        );
        assert_eq!(
            user_owner("demo", &"a".repeat(65)).len(),
            "demo/~".len() + 16
        );
        assert_ne!(user_owner("demo", ""), overflow_user("demo"));
        assert_eq!(cache_index(3), "portcullis:cache:3");
        assert_eq!(cache_slot(3, 1), "portcullis:cache:3:1");
    }
}
