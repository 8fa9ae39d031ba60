//! Envoy's rate limit service (`envoy.service.ratelimit.v3`) over Redis, for
//! limits that hold across a fleet of Envoys.
//!
//! The service holds no limits and no counters of its own: every descriptor
//! carries its limit (`RateLimitOverride`, from the gateway's plugin config)
//! and every counter lives in Redis, so any number of instances may serve
//! one Redis. One Lua script decides a whole request atomically: all of its
//! descriptors are admitted and counted, or none is (see [`counters`]).
//!
//! It also serves the prompt cache's fleet tier ([`cache`]): entries every
//! gateway replica reads and writes, in Redis.

pub mod cache;
pub mod counters;
pub mod redis_conn;
pub mod semantic;
pub mod service;

/// The protocol's messages and service (proto/rls.proto).
pub mod proto {
    #![allow(
        clippy::all,
        clippy::pedantic,
        clippy::unwrap_used,
        clippy::indexing_slicing
    )]
    tonic::include_proto!("envoy.service.ratelimit.v3");
}

/// The shared cache's messages and service (proto/cache.proto).
pub mod cache_proto {
    #![allow(
        clippy::all,
        clippy::pedantic,
        clippy::unwrap_used,
        clippy::indexing_slicing
    )]
    tonic::include_proto!("portcullis.cache.v1");
}
