//! Limits and budgets: admission arithmetic (`ratelimit`), one level's
//! counters in one value (`counters`), budget periods (`period`), a
//! stream's completion held to its cap (`stream_cap`), Envoy's rate limit
//! service protocol (`rls`) and a replica's share of a global limit while
//! the service is away (`share`).
//!
//! May use: `shared`, `units`, `usage`, `wire`.

pub mod counters;
pub mod period;
pub mod ratelimit;
pub mod rls;
pub mod share;
pub mod stream_cap;
