//! The host bindings: how Envoy loads the filter and how each build puts
//! Envoy behind the [`Host`](crate::host::Host) trait. The Wasm build
//! (`wasm`: proxy-wasm's contexts; `abi_host`: the trait over the ABI;
//! `abi`: the raw imports; wasm32 only), the native build (`native`: the
//! dynamic module's hooks and its host; docs/native.md) and the fake host
//! the lifecycle tests drive the same request path with (`fake`).
//!
//! This is the top floor: nothing else in the crate uses it.
//!
//! May use: `host`, `request`, `root`, `loaded`, `telemetry`.

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod abi_host;
#[cfg(test)]
pub mod fake;
#[cfg(not(target_arch = "wasm32"))]
pub mod native;
#[cfg(target_arch = "wasm32")]
mod wasm;
