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
}

impl Loaded {
    pub fn new(gw: Gateway, host: &impl Host) -> Self {
        let credentials = gw
            .providers
            .iter()
            .map(|p| {
                let env = p.api_key_env.as_ref()?;
                match std::env::var(env) {
                    Ok(v) if !v.is_empty() => Some(providers::credential(p, &v)),
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
        Self { gw, credentials }
    }
}
