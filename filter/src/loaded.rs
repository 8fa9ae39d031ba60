//! A compiled config as the request path holds it: each request keeps the
//! snapshot it started with, so a reload never changes a request in flight.

use crate::host::Host;
use crate::host::LogLevel;
use portcullis_core::config::{Gateway, Provider, Schema};
use portcullis_core::providers;
use portcullis_core::sigv4;

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
    /// Each AWS provider's credentials (SigV4 signs each request with
    /// them), from the VM environment, by provider index.
    pub aws: Vec<Option<Aws>>,
}

/// An AWS provider's credentials and the day's signing key derived from
/// them (kept: the key changes with the date only).
pub struct Aws {
    pub keys: sigv4::Keys,
    pub day_key: std::cell::RefCell<sigv4::DayKey>,
}

/// An AWS provider's credentials from the VM environment: its prefix's
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and (for temporary
/// credentials) `AWS_SESSION_TOKEN`; `Err` names what is missing.
fn aws_keys(p: &Provider) -> Option<Result<sigv4::Keys, String>> {
    let Schema::Bedrock { env_prefix, .. } = &p.schema else {
        return None;
    };
    let var = |name: &str| {
        let full = format!("{env_prefix}{name}");
        match std::env::var(&full) {
            Ok(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
            _ => Err(full),
        }
    };
    Some(
        match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Ok(access_key_id), Ok(secret_access_key)) => Ok(sigv4::Keys {
                access_key_id,
                secret_access_key,
                session_token: var("AWS_SESSION_TOKEN").ok(),
            }),
            (a, b) => Err([a.err(), b.err()]
                .into_iter()
                .flatten()
                .collect::<Vec<_>>()
                .join(" and ")),
        },
    )
}

impl Loaded {
    pub fn new(gw: Gateway, host: &impl Host) -> Self {
        let aws: Vec<Option<Aws>> = gw
            .providers
            .iter()
            .map(|p| match aws_keys(p)? {
                Ok(keys) => Some(Aws {
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
            })
            .collect();
        let secrets: Vec<Option<String>> = gw
            .providers
            .iter()
            .zip(&aws)
            .map(|(p, aws)| {
                if let Some(aws) = aws {
                    // Scrubbed from answers like a key.
                    return Some(aws.keys.secret_access_key.clone());
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
                    .filter(|_| !matches!(p.schema, Schema::Bedrock { .. } | Schema::Vertex { .. }))
                    .map(|k| providers::credential(p, k))
            })
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
            aws,
        }
    }
}
