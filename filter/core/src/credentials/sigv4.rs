//! AWS Signature Version 4 over a request the gateway is about to send:
//! the canonical request (method, the path's segments encoded once more as
//! every service but S3 expects, the sorted query, the signed headers, the
//! body's SHA-256), the string to sign with its credential scope, the
//! signing key derived from the secret by the HMAC-SHA256 chain, and the
//! headers that carry the result (`authorization`, `x-amz-date`,
//! `x-amz-content-sha256`, `x-amz-security-token` for session
//! credentials).
//!
//! HMAC-SHA256 is written here over `sha2` (RFC 2104, a dozen lines): it
//! runs five times per signed request, on the request path, and the RFC
//! 4231 vectors test it.

use crate::wire::text::{hex, push_hex, push_padded};
use sha2::{Digest, Sha256};

/// An AWS identity's credentials, read from the VM's environment (never
/// from the plugin config).
#[derive(Clone, PartialEq, Eq)]
pub struct Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
    /// For temporary (session) credentials.
    pub session_token: Option<String>,
}

/// An identity's keys from environment variables under `prefix`:
/// `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY` and (for temporary
/// credentials) `AWS_SESSION_TOKEN`, read through `var` (blank counts as
/// unset); `Err` names the variables missing.
pub fn keys_from_env(prefix: &str, var: impl Fn(&str) -> Option<String>) -> Result<Keys, String> {
    let read = |name: &str| {
        let full = format!("{prefix}{name}");
        match var(&full) {
            Some(v) if !v.trim().is_empty() => Ok(v.trim().to_string()),
            _ => Err(full),
        }
    };
    match (read("AWS_ACCESS_KEY_ID"), read("AWS_SECRET_ACCESS_KEY")) {
        (Ok(access_key_id), Ok(secret_access_key)) => Ok(Keys {
            access_key_id,
            secret_access_key,
            session_token: read("AWS_SESSION_TOKEN").ok(),
        }),
        (a, b) => Err([a.err(), b.err()]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" and ")),
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The secret and the token never reach a log.
        f.debug_struct("Keys")
            .field("access_key_id", &self.access_key_id)
            .finish_non_exhaustive()
    }
}

/// What is signed: a request as it will be sent.
pub struct Request<'a> {
    pub method: &'a str,
    /// The path as sent (already percent-encoded), without the query.
    pub path: &'a str,
    /// The query as sent, without `?` (empty when none).
    pub query: &'a str,
    pub host: &'a str,
    pub body: &'a [u8],
}

/// Where the signature is valid: the region and the service's signing
/// name (`bedrock` for Bedrock's runtime).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scope<'a> {
    pub region: &'a str,
    pub service: &'a str,
}

/// An HMAC-SHA256 key made ready (RFC 2104 with a 64-byte block): the
/// hash states after its inner and outer padded blocks, so each message
/// signed with a kept key costs two compressions less.
#[derive(Clone)]
pub struct HmacKey {
    inner: Sha256,
    outer: Sha256,
}

impl HmacKey {
    pub fn new(key: &[u8]) -> HmacKey {
        const BLOCK: usize = 64;
        let mut k = [0u8; BLOCK];
        if key.len() > BLOCK {
            let digest = Sha256::digest(key);
            for (dst, src) in k.iter_mut().zip(digest.iter()) {
                *dst = *src;
            }
        } else {
            for (dst, src) in k.iter_mut().zip(key.iter()) {
                *dst = *src;
            }
        }
        let mut inner = Sha256::new();
        inner.update(k.map(|b| b ^ 0x36));
        let mut outer = Sha256::new();
        outer.update(k.map(|b| b ^ 0x5c));
        HmacKey { inner, outer }
    }

    /// The MAC of `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 32] {
        let mut inner = self.inner.clone();
        inner.update(message);
        let mut outer = self.outer.clone();
        outer.update(inner.finalize());
        outer.finalize().into()
    }
}

/// HMAC-SHA256 of `message` under `key`.
pub fn hmac_sha256(key: &[u8], message: &[u8]) -> [u8; 32] {
    HmacKey::new(key).sign(message)
}

/// `YYYYMMDDTHHMMSSZ` for a Unix time in seconds.
pub fn amz_date(now_s: u64) -> String {
    let (y, m, d) = crate::limits::period::civil(now_s / 86_400);
    let s = now_s % 86_400;
    // Built by hand: `format!` cost more than the date's hash (#49).
    let mut out = String::with_capacity(16);
    push_padded(y, 4, &mut out);
    push_padded(m, 2, &mut out);
    push_padded(d, 2, &mut out);
    out.push('T');
    for n in [s / 3600, s % 3600 / 60, s % 60] {
        push_padded(n, 2, &mut out);
    }
    out.push('Z');
    out
}

/// The signing key: the secret through the HMAC chain of the date, the
/// region, the service and `aws4_request`.
pub fn signing_key(secret: &str, date: &str, scope: &Scope<'_>) -> [u8; 32] {
    let k_secret = ["AWS4", secret].concat();
    let k_date = hmac_sha256(k_secret.as_bytes(), date.as_bytes());
    let k_region = hmac_sha256(&k_date, scope.region.as_bytes());
    let k_service = hmac_sha256(&k_region, scope.service.as_bytes());
    hmac_sha256(&k_service, b"aws4_request")
}

/// Every byte but the unreserved ones (`A-Z a-z 0-9 - _ . ~`)
/// percent-encoded with upper-case hex, as SigV4's `UriEncode` (and a
/// model id inside a provider's path).
pub fn uri_encode(s: &str, out: &mut String) {
    for b in s.bytes() {
        const DIGITS: &[u8; 16] = b"0123456789ABCDEF";
        if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
            out.push(char::from(b));
        } else {
            out.push('%');
            for nibble in [b >> 4, b & 0x0f] {
                if let Some(&d) = DIGITS.get(usize::from(nibble)) {
                    out.push(char::from(d));
                }
            }
        }
    }
}

/// The canonical URI of a path as sent, for every service but S3: each
/// segment encoded once more (so a model id's `%3A` is signed as `%253A`).
pub fn canonical_uri(path: &str) -> String {
    if path.is_empty() {
        return "/".into();
    }
    let mut out = String::with_capacity(path.len().saturating_add(16));
    for (i, segment) in path.split('/').enumerate() {
        if i > 0 {
            out.push('/');
        }
        uri_encode(segment, &mut out);
    }
    out
}

/// The canonical query: its parameters sorted by name, then value (a name
/// without `=` has an empty value).
pub fn canonical_query(query: &str) -> String {
    let mut pairs: Vec<(&str, &str)> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| p.split_once('=').unwrap_or((p, "")))
        .collect();
    pairs.sort_unstable();
    let mut out = String::with_capacity(query.len());
    for (i, (k, v)) in pairs.into_iter().enumerate() {
        if i > 0 {
            out.push('&');
        }
        out.push_str(k);
        out.push('=');
        out.push_str(v);
    }
    out
}

/// The day's signing key, kept: the key depends only on the secret, the
/// date, the region and the service, so four of the five HMACs of a
/// signature are done once a day, not per request, and the last one
/// starts from the key's padded blocks already hashed.
#[derive(Clone)]
pub struct Kept {
    /// `YYYYMMDD`.
    pub date: String,
    key: HmacKey,
}

/// The signing key kept for its day, if one was derived (one per
/// credentials and scope).
pub type DayKey = Option<Kept>;

/// The signature of a canonical request already built (the lower half of
/// [`sign`], where the published test vectors enter).
pub fn signature(
    secret: &str,
    amz_date: &str,
    scope: &Scope<'_>,
    canonical_request: &str,
) -> (String, String) {
    signature_with(secret, amz_date, scope, canonical_request, &mut None)
}

fn signature_with(
    secret: &str,
    amz_date: &str,
    scope: &Scope<'_>,
    canonical_request: &str,
    day_key: &mut DayKey,
) -> (String, String) {
    let date = amz_date.get(..8).unwrap_or(amz_date);
    let mut credential_scope = String::with_capacity(
        date.len()
            .saturating_add(scope.region.len())
            .saturating_add(scope.service.len())
            .saturating_add(16),
    );
    for part in [date, "/", scope.region, "/", scope.service, "/aws4_request"] {
        credential_scope.push_str(part);
    }
    let mut string_to_sign = String::with_capacity(credential_scope.len().saturating_add(104));
    for part in [
        "AWS4-HMAC-SHA256\n",
        amz_date,
        "\n",
        &credential_scope,
        "\n",
    ] {
        string_to_sign.push_str(part);
    }
    push_hex(
        &Sha256::digest(canonical_request.as_bytes()),
        &mut string_to_sign,
    );
    let key = match day_key {
        Some(k) if k.date == date => &k.key,
        _ => {
            let key = HmacKey::new(&signing_key(secret, date, scope));
            &day_key
                .insert(Kept {
                    date: date.to_string(),
                    key,
                })
                .key
        }
    };
    (credential_scope, hex(&key.sign(string_to_sign.as_bytes())))
}

/// The headers that sign a request at `now_s` (Unix seconds): add them
/// all to the request as it is sent.
pub fn sign(
    keys: &Keys,
    scope: &Scope<'_>,
    req: &Request<'_>,
    now_s: u64,
) -> Vec<(&'static str, String)> {
    sign_with(keys, scope, req, now_s, &mut None)
}

/// [`sign`] with the day's signing key kept between calls (one per
/// credentials and scope).
pub fn sign_with(
    keys: &Keys,
    scope: &Scope<'_>,
    req: &Request<'_>,
    now_s: u64,
    day_key: &mut DayKey,
) -> Vec<(&'static str, String)> {
    let date = amz_date(now_s);
    let payload = hex(&Sha256::digest(req.body));
    let mut headers: Vec<(&'static str, &str)> = vec![
        ("host", req.host),
        ("x-amz-content-sha256", &payload),
        ("x-amz-date", &date),
    ];
    if let Some(t) = &keys.session_token {
        headers.push(("x-amz-security-token", t));
    }
    let signed: Vec<&str> = headers.iter().map(|(k, _)| *k).collect();
    let signed = signed.join(";");
    let mut canonical = String::with_capacity(256);
    canonical.push_str(req.method);
    canonical.push('\n');
    canonical.push_str(&canonical_uri(req.path));
    canonical.push('\n');
    canonical.push_str(&canonical_query(req.query));
    canonical.push('\n');
    for (k, v) in &headers {
        canonical.push_str(k);
        canonical.push(':');
        canonical.push_str(v.trim());
        canonical.push('\n');
    }
    canonical.push('\n');
    canonical.push_str(&signed);
    canonical.push('\n');
    canonical.push_str(&payload);
    let (credential_scope, sig) =
        signature_with(&keys.secret_access_key, &date, scope, &canonical, day_key);
    let mut authorization = String::with_capacity(256);
    for part in [
        "AWS4-HMAC-SHA256 Credential=",
        &keys.access_key_id,
        "/",
        &credential_scope,
        ", SignedHeaders=",
        &signed,
        ", Signature=",
        &sig,
    ] {
        authorization.push_str(part);
    }
    let mut out = vec![
        ("authorization", authorization),
        ("x-amz-date", date.clone()),
        ("x-amz-content-sha256", payload.clone()),
    ];
    if let Some(t) = &keys.session_token {
        out.push(("x-amz-security-token", t.clone()));
    }
    out
}

#[cfg(test)]
mod tests;
