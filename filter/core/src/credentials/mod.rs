//! Credentials: the gateway's own seal over what callers may hand back
//! (`seal`), the credentials it injects kept from ever going back to a
//! client (`secrets`), and AWS Signature Version 4 over a request it is
//! about to send (`sigv4`).
//!
//! May use: `limits`, `wire`.

pub mod seal;
pub mod secrets;
pub mod sigv4;
