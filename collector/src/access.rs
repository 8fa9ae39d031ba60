//! Who may read the collector over HTTP. Two checks, before any handler:
//!
//! - **Host allow-list** (always on): a request whose `Host` names anything
//!   but this collector (loopback names, the address it listens on, and the
//!   names given with `--allowed-hosts`) is answered 421. A web page the
//!   operator opens cannot then read the API by DNS rebinding (its requests
//!   carry the attacker's host name).
//! - **Read token** (`--read-token-file`): every path but `/healthz` and
//!   `/login` needs `Authorization: Bearer <token>` or the `portcullis_token`
//!   cookie, else 401 (the dashboard shows a login form). `POST /login`
//!   with the form field `token` sets that cookie (HttpOnly, SameSite=Strict)
//!   and sends the browser to the dashboard.

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::Arc;

/// The cookie the dashboard keeps the token in.
pub const COOKIE: &str = "portcullis_token";

#[derive(Debug, Clone, Default)]
pub struct Access {
    /// Host names this collector answers to.
    hosts: AllowedHosts,
    token: Option<String>,
}

impl Access {
    /// `listen`: the HTTP address bound; `extra`: `--allowed-hosts`.
    pub fn new(listen: SocketAddr, extra: &[String], token: Option<String>) -> Self {
        Self {
            hosts: AllowedHosts::new(listen, extra),
            token: token.filter(|t| !t.is_empty()),
        }
    }

    /// A `Host` value (with or without port) this collector answers to; a
    /// request without one (HTTP/1.0 health probes) is not a browser's.
    pub fn host_allowed(&self, host: Option<&str>) -> bool {
        self.hosts.allows(host)
    }

    /// Whether the request carries the token (always, with none configured).
    pub fn authorized(&self, headers: &HeaderMap) -> bool {
        let Some(token) = self.token.as_deref() else {
            return true;
        };
        let bearer = headers
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let cookie = headers
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().strip_prefix(COOKIE)?.strip_prefix('='))
            .find(|c| same(c.as_bytes(), token.as_bytes()));
        bearer.is_some_and(|b| same(b.trim().as_bytes(), token.as_bytes())) || cookie.is_some()
    }

    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }
}

pub use portcullis_service::token_from_file;
use portcullis_service::{same, AllowedHosts};

fn refusal(status: StatusCode, message: &str) -> Response {
    (
        status,
        axum::Json(serde_json::json!({"error": {"message": message}})),
    )
        .into_response()
}

/// The two checks, for every route but `/healthz`.
pub async fn guard(State(access): State<Arc<Access>>, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/healthz" {
        return next.run(req).await;
    }
    let host = AllowedHosts::of_request(req.headers(), req.uri());
    if !access.host_allowed(host.as_deref()) {
        return refusal(
            StatusCode::MISDIRECTED_REQUEST,
            "This collector does not answer to that host name (start it with --allowed-hosts to add one).",
        );
    }
    if path == "/login" || access.authorized(req.headers()) {
        return next.run(req).await;
    }
    if path == "/dashboard" || path == "/" {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            LOGIN,
        )
            .into_response();
    }
    refusal(
        StatusCode::UNAUTHORIZED,
        "A read token is required: send `Authorization: Bearer <token>` (the collector's --read-token-file).",
    )
}

const LOGIN: &str = r#"<!doctype html><html><head><meta charset="utf-8"><title>Portcullis: sign in</title></head>
<body style="font-family: system-ui, sans-serif; margin: 4rem auto; max-width: 28rem">
<h1>Portcullis</h1><p id="login">This collector needs its read token.</p>
<form method="post" action="/login"><input name="token" type="password" autofocus placeholder="read token" style="width: 100%">
<button type="submit">Open the dashboard</button></form></body></html>"#;

/// `POST /login` with `token=<token>` (a form): the cookie, then the
/// dashboard; a wrong token is a 401 with the form again.
pub async fn login(State(access): State<Arc<Access>>, body: Bytes) -> Response {
    let token = form_value(&body, "token").unwrap_or_default();
    let mut headers = HeaderMap::new();
    if let Ok(v) = format!("Bearer {token}").parse() {
        headers.insert(header::AUTHORIZATION, v);
    }
    if !access.has_token() || token.is_empty() || !access.authorized(&headers) {
        return (
            StatusCode::UNAUTHORIZED,
            [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
            LOGIN,
        )
            .into_response();
    }
    let cookie = format!("{COOKIE}={token}; HttpOnly; SameSite=Strict; Path=/");
    (
        StatusCode::SEE_OTHER,
        [
            (header::SET_COOKIE, cookie),
            (header::LOCATION, "/dashboard".to_string()),
        ],
    )
        .into_response()
}

/// One field of an `application/x-www-form-urlencoded` body.
fn form_value(body: &[u8], name: &str) -> Option<String> {
    let text = std::str::from_utf8(body).ok()?;
    let raw = text
        .split('&')
        .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))?;
    let mut out = Vec::with_capacity(raw.len());
    let mut bytes = raw.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            b => out.push(b),
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn access(token: Option<&str>) -> Access {
        Access::new(
            "127.0.0.1:9090".parse().unwrap(),
            &["collector".into()],
            token.map(String::from),
        )
    }

    #[test]
    fn hosts_are_loopback_the_listen_address_and_the_listed_names() {
        let a = access(None);
        for ok in [
            "127.0.0.1:9090",
            "localhost",
            "LOCALHOST:1",
            "[::1]:9090",
            "[::1]",
            "collector:9090",
        ] {
            assert!(a.host_allowed(Some(ok)), "{ok}");
        }
        for bad in ["evil.example:9090", "127.0.0.2", "collector.evil", ""] {
            assert!(!a.host_allowed(Some(bad)), "{bad}");
        }
        assert!(a.host_allowed(None));
        let wide = Access::new("0.0.0.0:9090".parse().unwrap(), &[], None);
        assert!(!wide.host_allowed(Some("0.0.0.0:9090")));
        assert!(wide.host_allowed(Some("127.0.0.1:9090")));
    }

    #[test]
    fn the_token_comes_as_a_bearer_or_the_cookie() {
        let a = access(Some("s3cret-token"));
        let mut h = HeaderMap::new();
        assert!(!a.authorized(&h));
        h.insert(
            header::AUTHORIZATION,
            "Bearer s3cret-token".parse().unwrap(),
        );
        assert!(a.authorized(&h));
        h.insert(
            header::AUTHORIZATION,
            "Bearer s3cret-tokeN".parse().unwrap(),
        );
        assert!(!a.authorized(&h));
        h.insert(
            header::COOKIE,
            "a=b; portcullis_token=s3cret-token".parse().unwrap(),
        );
        assert!(a.authorized(&h));
        assert!(access(None).authorized(&HeaderMap::new()));
        assert_eq!(
            form_value(b"x=1&token=a%2Bb+c", "token").as_deref(),
            Some("a+b c")
        );
    }
}
