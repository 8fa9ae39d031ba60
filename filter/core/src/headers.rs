//! Header names the gateway reads or writes: defined once.

/// Prefix of every gateway header; client-sent ones are dropped.
pub const PREFIX: &str = "x-portcullis-";
/// Route to the provider's Envoy cluster (`cluster_header` in the route).
pub const CLUSTER: &str = "x-portcullis-cluster";
pub const MODEL: &str = "x-portcullis-model";
pub const PROVIDER: &str = "x-portcullis-provider";

pub fn is_gateway_header(name: &str) -> bool {
    name.len() >= PREFIX.len()
        && name
            .get(..PREFIX.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(PREFIX))
}
pub const ATTEMPTS: &str = "x-portcullis-attempts";
pub const CACHE: &str = "x-portcullis-cache";
pub const EXPERIMENT: &str = "x-portcullis-experiment";
