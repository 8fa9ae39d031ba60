//! Every key the gateway keeps in Envoy's shared data, in one place. Keys
//! are stable names (provider, client, day), never indexes, so a config
//! reload keeps counters, buckets and breaker states.

/// A provider's circuit breaker.
pub fn breaker(provider: &str) -> String {
    format!("portcullis:breaker:{provider}")
}

/// What a client's limit counter counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    RequestsPerMinute,
    TokensPerMinute,
    Concurrency,
}

/// One of a client's limit counters.
pub fn limit(client: &str, what: Limit) -> String {
    let what = match what {
        Limit::RequestsPerMinute => "rpm",
        Limit::TokensPerMinute => "tpm",
        Limit::Concurrency => "conc",
    };
    format!("portcullis:rl:{client}:{what}")
}

/// A client's spend on one UTC day (days since the epoch).
pub fn budget(client: &str, day: u64) -> String {
    format!("portcullis:budget:{client}:{day}")
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
        assert_eq!(
            limit("demo", Limit::TokensPerMinute),
            "portcullis:rl:demo:tpm"
        );
        assert_eq!(
            limit("demo", Limit::RequestsPerMinute),
            "portcullis:rl:demo:rpm"
        );
        assert_eq!(limit("demo", Limit::Concurrency), "portcullis:rl:demo:conc");
        assert_eq!(budget("demo", 20_000), "portcullis:budget:demo:20000");
        assert_eq!(cache_index(3), "portcullis:cache:3");
        assert_eq!(cache_slot(3, 1), "portcullis:cache:3:1");
    }
}
