//! A compiled config as the request path holds it: each request keeps the
//! snapshot it started with, so a reload never changes a request in flight.
//!
//! May use: `host`.

use crate::host::Host;
use crate::host::LogLevel;
use portcullis_core::config::Gateway;
use portcullis_core::credentials::sigv4;
use portcullis_core::error::GatewayError;
use portcullis_core::mcp::Credential;
use portcullis_core::providers::{self, Auth};

/// A compiled config plus what it needs from the VM environment.
pub struct Loaded {
    pub gw: Gateway,
    /// Each provider's credential header (by its schema) with the key read
    /// from the VM environment at configure time (never from the plugin
    /// config), by provider index.
    pub credentials: Vec<Option<(&'static str, String)>>,
    /// Each provider's key as read, to scrub from what it answers
    /// (`portcullis_core::credentials::secrets`), by provider index.
    pub secrets: Vec<Option<String>>,
    /// `Bearer <token>` for the rate limit service, from the VM
    /// environment's `PORTCULLIS_LIMITER_TOKEN` (never the plugin config).
    pub limiter_credential: Option<Vec<u8>>,
    /// Each signing provider's keys ([`providers::Auth::SigV4`] signs each
    /// request with them), from the VM environment, by provider index.
    pub signing: Vec<Option<Signing>>,
    /// Each MCP server's credential header (`mcp.servers[].credential`),
    /// its value read from the VM environment at configure time, by server
    /// index.
    pub mcp_credentials: Vec<Option<(String, String)>>,
    /// Each input guardrail's vendor credential (`guard::vendor`), read
    /// from the VM environment at configure time, by check index.
    pub guard_credentials: Vec<GuardCredential>,
    /// The same for the output guardrails.
    pub guard_output_credentials: Vec<GuardCredential>,
    /// The gateway's seal over what callers hand back (MCP sessions, file
    /// and batch ids), from the VM environment's `PORTCULLIS_SEAL_SECRET`
    /// (and `_PREVIOUS` while rotating); without it those calls are
    /// refused, never sealed with something guessable.
    pub seal: Result<
        portcullis_core::credentials::seal::Seal,
        portcullis_core::credentials::seal::Missing,
    >,
}

impl Loaded {
    /// The secret the gateway sends MCP server `index` (its credential's
    /// value without its prefix), to scrub from what the server answers.
    pub fn mcp_secret(&self, index: usize) -> Option<&str> {
        let (_, value) = self.mcp_credentials.get(index)?.as_ref()?;
        let server = self.gw.mcp.as_ref()?.config.servers.get(index)?;
        match &server.credential {
            Credential::Header { prefix, .. } => value.strip_prefix(prefix.as_str()),
            Credential::None => None,
        }
    }

    /// Every MCP server's secret (for an answer the gateway makes from
    /// several servers' answers).
    pub fn mcp_secrets(&self) -> Vec<&str> {
        (0..self.mcp_credentials.len())
            .filter_map(|i| self.mcp_secret(i))
            .collect()
    }

    /// The gateway's seal, or the 503 that tells the operator what to set.
    pub fn sealer(&self) -> Result<&portcullis_core::credentials::seal::Seal, GatewayError> {
        self.seal.as_ref().map_err(|missing| {
            GatewayError::new(
                503,
                "server_error",
                "seal_secret_missing",
                format!(
                    "The gateway cannot seal the ids and sessions it hands out: {missing}. Its operator sets {} (16 bytes or more, the same on every Envoy) in Envoy's environment and lists it in host_env_keys.",
                    portcullis_core::credentials::seal::SECRET_ENV
                ),
            )
        })
    }
}

/// How a vendor check's calls are authorized.
pub enum GuardCredential {
    None,
    /// A header and its value (`authorization: Bearer …`, Azure's key header).
    Header(&'static str, String),
    /// AWS SigV4 (Bedrock Guardrails).
    Sign(Box<Signing>),
}

impl GuardCredential {
    /// The secret, to keep out of what a vendor's error quotes.
    pub fn secret(&self) -> Option<&str> {
        match self {
            GuardCredential::None => None,
            GuardCredential::Header(_, v) => Some(v.strip_prefix("Bearer ").unwrap_or(v)),
            GuardCredential::Sign(s) => Some(&s.keys.secret_access_key),
        }
    }
}

impl Loaded {
    /// A guardrail's vendor credential, by stage and index.
    pub fn guard_credential(
        &self,
        stage: portcullis_core::guard::Stage,
        i: usize,
    ) -> &GuardCredential {
        let list = match stage {
            portcullis_core::guard::Stage::Input => &self.guard_credentials,
            portcullis_core::guard::Stage::Output => &self.guard_output_credentials,
        };
        list.get(i).unwrap_or(&GuardCredential::None)
    }
}

/// Each check's vendor credential from the VM environment, for one stage
/// (a missing variable: a warning, and the vendor's refusal is the check's
/// failure).
fn guard_credentials(
    gw: &Gateway,
    host: &impl Host,
    stage: portcullis_core::guard::Stage,
) -> Vec<GuardCredential> {
    use portcullis_core::guard::{vendor, Kind};
    let Some(g) = gw.guardrails.as_ref() else {
        return Vec::new();
    };
    g.checks(stage)
        .iter()
        .map(|c| {
            let Kind::External(e) = &c.kind else {
                return GuardCredential::None;
            };
            let (Some(v), Some(env)) = (&e.vendor, &e.credential_env) else {
                return GuardCredential::None;
            };
            let warn = |what: &str| {
                host.log(
                    LogLevel::Warn,
                    &format!(
                        "guardrail `{}`: {what} not set in the VM (add it to \
                         vm_config.environment_variables.host_env_keys); its calls go without a credential",
                        c.name
                    ),
                );
            };
            let header = match v.auth() {
                vendor::Auth::SigV4 => {
                    return match sigv4::keys_from_env(env, |name| std::env::var(name).ok()) {
                        Ok(keys) => GuardCredential::Sign(Box::new(Signing {
                            keys,
                            day_key: std::cell::RefCell::new(None),
                        })),
                        Err(missing) => {
                            warn(&missing);
                            GuardCredential::None
                        }
                    };
                }
                vendor::Auth::Header(name) => (name, ""),
                vendor::Auth::Bearer | vendor::Auth::Optional => ("authorization", "Bearer "),
            };
            match std::env::var(env) {
                Ok(k) if !k.trim().is_empty() => {
                    GuardCredential::Header(header.0, format!("{}{}", header.1, k.trim()))
                }
                _ => {
                    warn(&format!("environment variable {env}"));
                    GuardCredential::None
                }
            }
        })
        .collect()
}

/// A signing provider's keys and the day's signing key derived from them
/// (kept: the key changes with the date only).
pub struct Signing {
    pub keys: sigv4::Keys,
    pub day_key: std::cell::RefCell<sigv4::DayKey>,
}

impl Loaded {
    pub fn new(gw: Gateway, host: &impl Host) -> Self {
        let signing: Vec<Option<Signing>> = gw
            .providers
            .iter()
            .map(|p| {
                let Auth::SigV4 { env_prefix, .. } = providers::auth(p) else {
                    return None;
                };
                match sigv4::keys_from_env(env_prefix, |name| std::env::var(name).ok()) {
                    Ok(keys) => Some(Signing {
                        keys,
                        day_key: std::cell::RefCell::new(None),
                    }),
                    Err(missing) => {
                        host.log(
                            LogLevel::Warn,
                            &format!(
                                "provider `{}`: {missing} not set in the VM (add to \
                                 vm_config.environment_variables.host_env_keys); requests go unsigned",
                                p.name
                            ),
                        );
                        None
                    }
                }
            })
            .collect();
        let secrets: Vec<Option<String>> = gw
            .providers
            .iter()
            .zip(&signing)
            .map(|(p, signing)| {
                if let Some(s) = signing {
                    // Scrubbed from answers like a key.
                    return Some(s.keys.secret_access_key.clone());
                }
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
            .map(|(p, key)| {
                key.as_ref()
                    .filter(|_| providers::auth(p) == Auth::Key)
                    .map(|k| providers::credential(p, k))
            })
            .collect();
        let limiter_credential = std::env::var("PORTCULLIS_LIMITER_TOKEN")
            .ok()
            .filter(|t| !t.trim().is_empty())
            .map(|t| format!("Bearer {}", t.trim()).into_bytes());
        let mcp_credentials = mcp_credentials(&gw, host);
        let guard_output_credentials =
            guard_credentials(&gw, host, portcullis_core::guard::Stage::Output);
        let guard_credentials = guard_credentials(&gw, host, portcullis_core::guard::Stage::Input);
        let seal =
            portcullis_core::credentials::seal::Seal::from_env(|name| std::env::var(name).ok());
        if let Err(missing) = &seal {
            host.log(
                LogLevel::Warn,
                &format!(
                    "{missing} (add it to vm_config.environment_variables.host_env_keys): \
                     MCP sessions, files and batches are refused until the gateway has a seal secret"
                ),
            );
        }
        Self {
            mcp_credentials,
            guard_credentials,
            guard_output_credentials,
            seal,
            gw,
            credentials,
            secrets,
            limiter_credential,
            signing,
        }
    }
}

/// Each MCP server's credential header with its value from the VM
/// environment (a missing variable: a warning, and the server gets none).
fn mcp_credentials(gw: &Gateway, host: &impl Host) -> Vec<Option<(String, String)>> {
    let Some(m) = gw.mcp.as_ref() else {
        return Vec::new();
    };
    m.config
        .servers
        .iter()
        .map(|s| {
            let Credential::Header { name, env, prefix } = &s.credential else {
                return None;
            };
            match std::env::var(env) {
                Ok(v) if !v.is_empty() => Some((name.clone(), format!("{prefix}{v}"))),
                _ => {
                    host.log(
                        LogLevel::Warn,
                        &format!(
                            "MCP server `{}`: environment variable {env} is not set in the VM \
                             (add it to vm_config.environment_variables.host_env_keys); calls go without a credential",
                            s.name
                        ),
                    );
                    None
                }
            }
        })
        .collect()
}

/// The rate limit service's call metadata: the limiter's credential, when
/// the gateway has one.
pub fn limiter_metadata(loaded: Option<&Loaded>) -> Vec<(&'static str, Vec<u8>)> {
    loaded
        .and_then(|l| l.limiter_credential.clone())
        .map(|c| vec![("authorization", c)])
        .unwrap_or_default()
}

/// Configs applied by this VM (Wasm: this worker's; native: the
/// process's): an open Realtime session reads its key's stamp again only
/// when this moved, not at every chunk (#61).
pub static CONFIGS_APPLIED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
