//! Providers' health and the choice among them: a circuit breaker per
//! provider (`breaker`), adaptive concurrency (`aimd`), what an answer
//! means for fallback and the breaker (`attempt`), and the strategies that
//! spread a model's traffic by latency, load and price (`strategy`).
//!
//! May use: `error`, `limits`, `wire`.

pub mod aimd;
pub mod attempt;
pub mod breaker;
pub mod strategy;
