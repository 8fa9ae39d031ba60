//! State shared by Envoy's workers: one small key/value interface with
//! compare-and-swap (`store`) and every key kept there (`keys`).
//!
//! May use: `wire`.

pub mod keys;
pub mod store;
