//! A compiled config as the request path holds it: each request keeps the
//! snapshot it started with, so a reload never changes a request in flight.

use crate::host::Host;
use portcullis_core::config::Gateway;
use portcullis_core::providers;
use proxy_wasm::types::LogLevel;

/// A compiled config plus what it needs from the VM environment.
pub struct Loaded {
    pub gw: Gateway,
    /// Each provider's credential header (by its schema) with the key read
    /// from the VM environment at configure time (never from the plugin
    /// config), by provider index.
    pub credentials: Vec<Option<(&'static str, String)>>,
    /// Each provider's key as read, to scrub from what it answers
    /// (`portcullis_core::secrets`), by provider index.
    pub secrets: Vec<Option<String>>,
    /// `Bearer <token>` for the rate limit service, from the VM
    /// environment's `PORTCULLIS_LIMITER_TOKEN` (never the plugin config).
    pub limiter_credential: Option<Vec<u8>>,
}

impl Loaded {
    pub fn new(gw: Gateway, host: &impl Host) -> Self {
        let secrets: Vec<Option<String>> = gw
            .providers
            .iter()
            .map(|p| {
                let env = p.api_key_env.as_ref()?;
                match std::env::var(env) {
                    Ok(v) if !v.is_empty() => Some(v),
                    _ => {
                        host.log(
                            LogLevel::Warn,
                            &format!(
                                "provider `{}`: environment variable {env} is not set in the VM \
                                 (add it to vm_config.environment_variables.host_env_keys); requests go without a key",
                                p.name
                            ),
                        );
                        None
                    }
                }
            })
            .collect();
        let credentials = gw
            .providers
            .iter()
            .zip(&secrets)
            .map(|(p, key)| key.as_ref().map(|k| providers::credential(p, k)))
            .collect();
        let limiter_credential = std::env::var("PORTCULLIS_LIMITER_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .map(|t| format!("Bearer {}", t.trim()).into_bytes());
        Self {
            gw,
            credentials,
            secrets,
            limiter_credential,
        }
    }
}
