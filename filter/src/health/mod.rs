//! Providers' health, in shared data across workers: circuit breakers
//! (`breakers`), adaptive concurrency per provider (`concurrency`, AIMD)
//! and the load strategies read: latencies and requests in flight
//! (`load`).
//!
//! May use: `host`.

pub mod breakers;
pub mod concurrency;
pub mod load;
