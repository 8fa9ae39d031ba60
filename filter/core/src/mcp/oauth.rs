//! MCP clients that log in (OAuth 2.1, #47): Envoy's `jwt_authn` in front
//! verifies the token against the operator's issuer and forwards its
//! payload in a header (after a `header_mutation` that removes any copy the
//! client sent: `envoy/snippets/mcp-oauth.yaml`); the gateway maps its
//! claims to a client and a team, and serves the Protected Resource
//! Metadata (RFC 9728) MCP clients read to find where to log in.

use base64::Engine as _;
use serde_json::{json, Map, Value};

/// `mcp.oauth`, compiled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oauth {
    /// The header `jwt_authn` writes the verified payload to.
    pub payload_header: String,
    /// The client (`clients[].name`) whose limits and MCP access a logged-in
    /// caller gets, and its key hash (its handle in `Gateway::clients`).
    pub client: String,
    pub client_key: [u8; 32],
    /// The claim naming the caller's team (a string, or a list of which the
    /// first that is a team counts), over the client's own.
    pub team_claim: String,
    /// The claim naming the end user (records).
    pub user_claim: String,
    /// The MCP endpoint's canonical URI (`https://gateway.example.com/mcp`).
    pub resource: String,
    /// Where clients log in: the issuers' URLs.
    pub authorization_servers: Vec<String>,
    /// Scopes a client may ask for (advertised only).
    pub scopes: Vec<String>,
}

/// A verified payload's claims (`None`: it does not decode as a JSON
/// object).
pub fn claims(header: &str) -> Option<Map<String, Value>> {
    let text = header.trim().trim_end_matches('=');
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(text)
        .ok()?;
    serde_json::from_slice(&bytes).ok()
}

impl Oauth {
    /// The team a caller's claims name, among `teams` (by name); the first
    /// of a list that is one.
    pub fn team(&self, claims: &Map<String, Value>, teams: &[&str]) -> Option<usize> {
        let named = |v: &Value| v.as_str().and_then(|n| teams.iter().position(|t| *t == n));
        match claims.get(&self.team_claim)? {
            Value::Array(list) => list.iter().find_map(named),
            Value::String(s) => s
                .split(' ')
                .find_map(|n| teams.iter().position(|t| *t == n)),
            _ => None,
        }
    }

    /// The end user a caller's claims name.
    pub fn user(&self, claims: &Map<String, Value>) -> Option<String> {
        claims.get(&self.user_claim)?.as_str().map(String::from)
    }

    /// The path of the metadata document (RFC 9728: the well-known prefix
    /// before the resource's path).
    pub fn metadata_path(&self) -> String {
        let path = self
            .resource
            .split_once("://")
            .and_then(|(_, rest)| rest.find('/').and_then(|i| rest.get(i..)))
            .unwrap_or("")
            .trim_end_matches('/');
        format!("/.well-known/oauth-protected-resource{path}")
    }

    /// The metadata document's URL, for `WWW-Authenticate`.
    pub fn metadata_url(&self) -> String {
        let origin = self
            .resource
            .split_once("://")
            .map(|(scheme, rest)| {
                let host = rest.split('/').next().unwrap_or(rest);
                format!("{scheme}://{host}")
            })
            .unwrap_or_default();
        format!("{origin}{}", self.metadata_path())
    }

    /// The Protected Resource Metadata document.
    pub fn metadata(&self) -> Vec<u8> {
        let mut doc = json!({
            "resource": self.resource,
            "authorization_servers": self.authorization_servers,
            "bearer_methods_supported": ["header"],
            "resource_name": "Portcullis MCP gateway",
        });
        if !self.scopes.is_empty() {
            if let Some(o) = doc.as_object_mut() {
                o.insert("scopes_supported".into(), json!(self.scopes));
            }
        }
        serde_json::to_vec(&doc).unwrap_or_default()
    }

    /// What a 401 at the MCP endpoint tells a client: where the metadata is.
    pub fn www_authenticate(&self) -> String {
        format!("Bearer resource_metadata=\"{}\"", self.metadata_url())
    }
}
