//! What the side services (collector, limiter) share: the shared-secret
//! token a gRPC caller presents, and TLS for their gRPC servers, with
//! client certificates as an option.
//!
//! Flags (both services): `--tls-cert PATH --tls-key PATH` serve gRPC over
//! TLS with that certificate chain and key (PEM); `--tls-client-ca PATH`
//! besides requires every caller to present a certificate signed by that
//! CA (mutual TLS). Envoy's cluster for the service then names a
//! `transport_socket` (docs/security.md).

use tonic::transport::{Certificate, Identity, ServerTlsConfig};

/// A token from a file (`flag` names it in errors): trimmed; an empty
/// file is an error, no file is no token.
pub fn token_from_file(flag: &str, path: Option<String>) -> Result<Option<String>, String> {
    let Some(p) = path else { return Ok(None) };
    let t = std::fs::read_to_string(&p).map_err(|e| format!("{flag} {p}: {e}"))?;
    let t = t.trim();
    if t.is_empty() {
        return Err(format!("{flag} {p}: the file is empty"));
    }
    Ok(Some(t.to_string()))
}

/// Equal, in time that does not depend on where they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Whether an `authorization` value carries the token as a bearer.
pub fn bearer_matches(authorization: Option<&[u8]>, token: &str) -> bool {
    authorization
        .and_then(|v| v.strip_prefix(b"Bearer "))
        .is_some_and(|s| same(s, token.as_bytes()))
}

/// Whether a gRPC call may be served: always without a token, else only
/// with it as a bearer in the call's `authorization` metadata.
pub fn call_authorized<T>(token: Option<&str>, request: &tonic::Request<T>) -> bool {
    let Some(token) = token else { return true };
    let sent = request
        .metadata()
        .get("authorization")
        .map(|v| v.as_bytes());
    bearer_matches(sent, token)
}

/// The value after `flag` in a command line, if the flag is there.
pub fn flag_value(args: &[String], flag: &str) -> Option<String> {
    args.iter()
        .position(|a| a == flag)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// The TLS flags of a service, as given.
#[derive(Debug, Default, Clone)]
pub struct TlsFlags {
    pub cert: Option<String>,
    pub key: Option<String>,
    pub client_ca: Option<String>,
}

impl TlsFlags {
    /// Take `--tls-cert`, `--tls-key`, `--tls-client-ca` and their value;
    /// `Ok(false)` when `flag` is none of them.
    pub fn take(&mut self, flag: &str, value: Option<String>) -> Result<bool, String> {
        let slot = match flag {
            "--tls-cert" => &mut self.cert,
            "--tls-key" => &mut self.key,
            "--tls-client-ca" => &mut self.client_ca,
            _ => return Ok(false),
        };
        *slot = Some(value.ok_or_else(|| format!("{flag} needs a value"))?);
        Ok(true)
    }

    /// The three flags from a command line (each one present needs a value).
    pub fn from_args(args: &[String]) -> Result<TlsFlags, String> {
        let mut tls = TlsFlags::default();
        for flag in ["--tls-cert", "--tls-key", "--tls-client-ca"] {
            if args.iter().any(|a| a == flag) {
                tls.take(flag, flag_value(args, flag))?;
            }
        }
        Ok(tls)
    }

    /// The server's TLS config: `None` without `--tls-cert`; every file
    /// read now, so a bad path or PEM stops the service at start with the
    /// flag named.
    pub fn server_config(&self) -> Result<Option<ServerTlsConfig>, String> {
        let read = |flag: &str, p: &str| {
            std::fs::read(p)
                .map_err(|e| format!("{flag} {p}: {e}"))
                .and_then(|b| {
                    if String::from_utf8_lossy(&b).contains("-----BEGIN") {
                        Ok(b)
                    } else {
                        Err(format!("{flag} {p}: not a PEM file"))
                    }
                })
        };
        let (cert, key) = match (&self.cert, &self.key) {
            (None, None) if self.client_ca.is_none() => return Ok(None),
            (Some(c), Some(k)) => (read("--tls-cert", c)?, read("--tls-key", k)?),
            _ => {
                return Err(
                    "TLS needs both --tls-cert and --tls-key (and --tls-client-ca for client certificates)"
                        .into(),
                )
            }
        };
        let mut config = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        if let Some(ca) = &self.client_ca {
            config = config.client_ca_root(Certificate::from_pem(read("--tls-client-ca", ca)?));
        }
        Ok(Some(config))
    }
}

/// The host names an HTTP service answers to: loopback names, the address
/// it listens on (unless that is unspecified), and the names an operator
/// adds (`--allowed-hosts`). A request naming any other host in its `Host`
/// is not for this service: a web page the operator opens could otherwise
/// read and change it by DNS rebinding (its requests carry the attacker's
/// host name). Both HTTP services (the collector, the control plane)
/// answer such a request 421.
#[derive(Debug, Clone, Default)]
pub struct AllowedHosts {
    /// Host names, without port, lower case.
    hosts: Vec<String>,
}

impl AllowedHosts {
    /// `listen`: the HTTP address bound; `extra`: the operator's names.
    pub fn new(listen: std::net::SocketAddr, extra: &[String]) -> Self {
        let mut hosts: Vec<String> = ["localhost", "127.0.0.1", "[::1]"]
            .iter()
            .map(|h| h.to_string())
            .collect();
        if !listen.ip().is_unspecified() {
            hosts.push(match listen {
                std::net::SocketAddr::V4(a) => a.ip().to_string(),
                std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
            });
        }
        hosts.extend(
            extra
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .filter(|h| !h.is_empty()),
        );
        Self { hosts }
    }

    /// The names of a comma-separated flag value (`a.example,b.example`).
    pub fn names(flag: Option<String>) -> Vec<String> {
        flag.map(|v| v.split(',').map(str::to_string).collect())
            .unwrap_or_default()
    }

    /// The host a request names: its `Host` header, else its URI's
    /// authority (HTTP/2); `None` when it names none.
    pub fn of_request(
        headers: &tonic::codegen::http::HeaderMap,
        uri: &tonic::codegen::http::Uri,
    ) -> Option<String> {
        headers
            .get("host")
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
            .or_else(|| uri.authority().map(|a| a.to_string()))
    }

    /// A `Host` value (with or without port) this service answers to; a
    /// request without one (HTTP/1.0 health probes) is not a browser's.
    pub fn allows(&self, host: Option<&str>) -> bool {
        let Some(host) = host else { return true };
        let host = host.trim().to_ascii_lowercase();
        let name = match host.rfind(':') {
            // `[::1]:9090`, `127.0.0.1:9090`, `name:9090`; not `[::1]`.
            Some(i) if !host.ends_with(']') => host.get(..i).unwrap_or(""),
            _ => host.as_str(),
        };
        self.hosts.iter().any(|h| h == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_match_exactly() {
        assert!(bearer_matches(Some(b"Bearer abc"), "abc"));
        assert!(!bearer_matches(Some(b"Bearer abd"), "abc"));
        assert!(!bearer_matches(Some(b"Bearer ab"), "abc"));
        assert!(!bearer_matches(Some(b"abc"), "abc"));
        assert!(!bearer_matches(None, "abc"));
    }

    #[test]
    fn tls_flags_need_a_pair_and_readable_pem() {
        let mut f = TlsFlags::default();
        assert!(matches!(f.server_config(), Ok(None)));
        assert_eq!(f.take("--listen", Some("x".into())), Ok(false));
        assert_eq!(
            f.take("--tls-key", None),
            Err("--tls-key needs a value".into())
        );
        assert_eq!(
            f.take("--tls-cert", Some("/nonexistent/cert.pem".into())),
            Ok(true)
        );
        let err = f.server_config().unwrap_err();
        assert!(err.contains("both --tls-cert and --tls-key"), "{err}");
        f.key = Some("/nonexistent/key.pem".into());
        let err = f.server_config().unwrap_err();
        assert!(
            err.starts_with("--tls-cert /nonexistent/cert.pem:"),
            "{err}"
        );
        let dir = std::env::temp_dir().join(format!("pc-service-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let not_pem = dir.join("cert.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        f.cert = Some(not_pem.display().to_string());
        let err = f.server_config().unwrap_err();
        assert!(err.ends_with("not a PEM file"), "{err}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
