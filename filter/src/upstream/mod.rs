//! Requests to providers: the one request builder for every attempt (this
//! file) and the access tokens it signs with (`access_tokens`: OAuth and
//! cloud tokens fetched by callout, cached per worker).
//!
//! May use: `host`, `loaded`, `request`.
//!
//! One attempt's request to a provider, built the same way for the first
//! attempt (the client's request, rewritten in place for Envoy's router) and
//! for every fallback (sent by callout): the same client headers
//! ([`headers::forwarded_upstream`]), the provider's path, authority, model
//! id and credential, the same body. The builder is functions over the
//! parts a step hands it (the client's request, the routed request, the
//! attempt's `traceparent`); it never sees the request's holder.

pub mod access_tokens;

use crate::host::{Host, Part};
use crate::host::{LogLevel, Status};
use crate::loaded::Loaded;
use crate::request::flight::{Call, Flight};
use crate::request::ClientRequest;
use portcullis_core::api::Api;
use portcullis_core::credentials::sigv4;
use portcullis_core::error::GatewayError;
use portcullis_core::providers::{self, Auth};
use portcullis_core::translate;
use portcullis_core::wire::headers;
use std::borrow::Cow;

pub struct UpstreamRequest<'a> {
    pub cluster: &'a str,
    pub path: String,
    pub authority: &'a str,
    /// An answer sent whole: the longest it may take (each try); a stream:
    /// the longest until it starts.
    pub timeout_ms: u64,
    /// The client asked for a stream: no overall bound through the router
    /// (idle timeouts only); a fallback's (whole) stream is bounded by the
    /// provider's `stream_timeout_ms`.
    pub stream: bool,
    pub stream_timeout_ms: u64,
    /// The provider's credential header, when it has a key (or signs).
    pub credential: Option<(&'static str, Cow<'a, str>)>,
    /// The body for this provider; `None`: the client's bytes as they are.
    pub body: Option<Vec<u8>>,
    /// Headers the provider's API requires (e.g. `anthropic-version`).
    pub extra: Vec<(&'static str, String)>,
    /// Envoy's retries of this provider (first attempt only).
    pub retries: Option<&'a portcullis_core::config::Retries>,
    /// The provider takes an access token it does not have yet (fetched
    /// from this source): the first attempt waits for it, a fallback skips
    /// the provider.
    pub awaiting_token: Option<&'a portcullis_core::config::TokenSource>,
}

impl<'a> UpstreamRequest<'a> {
    /// A call to a provider as its config makes it (its cluster, host,
    /// timeouts, key and headers), without retries: a call on a kept
    /// answer, a file or batch, a Realtime session's upgrade.
    pub(crate) fn to_provider(
        loaded: &'a Loaded,
        provider: usize,
        path: String,
        stream: bool,
        body: Option<Vec<u8>>,
    ) -> Result<UpstreamRequest<'a>, GatewayError> {
        let p = loaded
            .gw
            .providers
            .get(provider)
            .ok_or_else(|| GatewayError::internal("no such provider"))?;
        Ok(UpstreamRequest {
            cluster: &p.cluster,
            path,
            authority: &p.host,
            timeout_ms: p.timeout_ms,
            stream,
            stream_timeout_ms: p.stream_timeout_ms,
            credential: loaded
                .credentials
                .get(provider)
                .and_then(Option::as_ref)
                .map(|(name, value)| (*name, Cow::Borrowed(value.as_str()))),
            body,
            extra: providers::extra_headers(p),
            retries: None,
            awaiting_token: None,
        })
    }
}

/// The request for one provider (by index) and its model id, for a routed
/// request in the inbound API `api` (the fields the provider cannot honour
/// noted in the flight).
pub(crate) fn for_attempt<'l>(
    host: &impl Host,
    loaded: &'l Loaded,
    api: Api,
    flight: &mut Flight,
    provider: usize,
    model_id: &str,
) -> Result<UpstreamRequest<'l>, GatewayError> {
    let p = loaded
        .gw
        .providers
        .get(provider)
        .ok_or_else(|| GatewayError::internal("routing chose a missing provider"))?;
    let prepared = translate::request_body(p, api, &flight.chat, model_id, flight.usage_chunk)?;
    flight.dropped = prepared.dropped;
    let mut up = UpstreamRequest {
        cluster: &p.cluster,
        path: translate::path(p, api, model_id, flight.chat.stream),
        authority: &p.host,
        timeout_ms: p.timeout_ms,
        stream: flight.chat.stream,
        stream_timeout_ms: p.stream_timeout_ms,
        credential: loaded
            .credentials
            .get(provider)
            .and_then(Option::as_ref)
            .map(|(name, value)| (*name, Cow::Borrowed(value.as_str()))),
        body: match prepared.body {
            // The client's bytes are not what the checks left.
            None if flight.rewritten => Some(flight.chat.body().to_vec()),
            body => body,
        },
        extra: providers::extra_headers(p),
        retries: p.retries.as_ref(),
        awaiting_token: None,
    };
    match providers::auth(p) {
        Auth::Key => {}
        Auth::Token(source) => {
            match crate::upstream::access_tokens::cached(host, &p.name, host.now_ms()) {
                Some(t) => {
                    let (name, value) = providers::credential(p, &t);
                    up.credential = Some((name, Cow::Owned(value)));
                }
                None => {
                    // No key of any kind goes with it: the token, or none.
                    up.credential = None;
                    up.awaiting_token = Some(source);
                }
            }
        }
        Auth::SigV4 { scope, .. } => {
            if let Some(keys) = loaded.signing.get(provider).and_then(Option::as_ref) {
                // Signed last, over the final body, as it is sent.
                let (path, query) = up.path.split_once('?').unwrap_or((&up.path, ""));
                let body = up.body.as_deref().unwrap_or(flight.chat.body());
                let req = sigv4::Request {
                    method: "POST",
                    path,
                    query,
                    host: &p.host,
                    body,
                };
                let now_s = host.now_ms() / 1000;
                let signed = match keys.day_key.try_borrow_mut() {
                    Ok(mut day_key) => {
                        sigv4::sign_with(&keys.keys, &scope, &req, now_s, &mut day_key)
                    }
                    Err(_) => sigv4::sign(&keys.keys, &scope, &req, now_s),
                };
                for (name, value) in signed {
                    if name == "authorization" {
                        up.credential = Some((name, Cow::Owned(value)));
                    } else {
                        up.extra.push((name, value));
                    }
                }
            }
        }
    }
    Ok(up)
}

/// The first attempt: rewrite the client's request (as read at its
/// headers) for Envoy's router, touching only what changes (each host call
/// costs); `traceparent`: the attempt's span.
pub(crate) fn through_router(
    host: &impl Host,
    up: &UpstreamRequest<'_>,
    request: &ClientRequest,
    traceparent: Option<String>,
    body_size: usize,
) -> Result<(), GatewayError> {
    let host_err = |s: Status| GatewayError::internal(format!("cannot rewrite the request: {s:?}"));
    let set = |k: &str, v: Option<&str>| host.set_header(Part::Request, k, v).map_err(host_err);
    if let Some(body) = &up.body {
        host.set_body(Part::Request, body_size, body)
            .map_err(host_err)?;
        set("content-length", Some(&body.len().to_string()))?;
    }
    if up.path != request.path {
        set(":path", Some(&up.path))?;
    }
    if up.authority != request.authority {
        set(":authority", Some(up.authority))?;
    }
    if !request.has_content_type {
        set("content-type", Some("application/json"))?;
    }
    set(headers::CLUSTER, Some(up.cluster))?;
    // A stream has no overall bound (only Envoy's idle timeouts): 0
    // turns the route's timeout off, and a per-try timeout bounds the
    // wait for the answer to start (Envoy ignores it once the answer
    // has reached the client).
    let (total, per_try) = match (up.retries, up.stream) {
        (None, false) => (up.timeout_ms, None),
        (None, true) => (0, Some(up.timeout_ms)),
        (Some(r), stream) => {
            // Each try gets the provider's timeout; the whole request
            // its tries plus the longest waits between them.
            let tries = u64::from(r.attempts).saturating_add(1);
            let total = up
                .timeout_ms
                .saturating_mul(tries)
                .saturating_add(u64::from(r.attempts).saturating_mul(10_000));
            (if stream { 0 } else { total }, Some(up.timeout_ms))
        }
    };
    set("x-envoy-upstream-rq-timeout-ms", Some(&total.to_string()))?;
    if let Some(per_try) = per_try {
        set(
            "x-envoy-upstream-rq-per-try-timeout-ms",
            Some(&per_try.to_string()),
        )?;
    }
    if let Some(r) = up.retries {
        set("x-envoy-max-retries", Some(&r.attempts.to_string()))?;
        set("x-envoy-retry-on", Some(&r.retry_on))?;
        if !r.status_codes.is_empty() {
            set("x-envoy-retriable-status-codes", Some(&r.status_codes))?;
        }
    }
    for (name, value) in &up.extra {
        set(name, Some(value))?;
    }
    if let Some(tp) = traceparent {
        set("traceparent", Some(&tp))?;
    }
    // The client's key never reaches a provider.
    match &up.credential {
        Some((name, value)) if *name == "authorization" => set(name, Some(value)),
        Some((name, value)) => set("authorization", None).and_then(|()| set(name, Some(value))),
        None => set("authorization", None),
    }
}

/// A fallback: the same request by callout to the provider's cluster,
/// with the client's headers (read at the first fallback and kept in the
/// flight for the next) and `traceparent` (the attempt's span).
pub(crate) fn fallback(
    host: &impl Host,
    up: &UpstreamRequest<'_>,
    request: &ClientRequest,
    flight: &mut Flight,
    traceparent: Option<String>,
) -> Result<Call, Status> {
    let forwarded = forwarded_headers(host, flight);
    let mut hdrs: Vec<(&str, &str)> = vec![
        (":method", "POST"),
        (":path", &up.path),
        (":authority", up.authority),
    ];
    if !request.has_content_type {
        hdrs.push(("content-type", "application/json"));
    }
    hdrs.extend(
        forwarded
            .iter()
            .filter(|(k, _)| traceparent.is_none() || k != "traceparent")
            .map(|(k, v)| (k.as_str(), v.as_str())),
    );
    if let Some(tp) = &traceparent {
        hdrs.push(("traceparent", tp));
    }
    if let Some((name, value)) = &up.credential {
        hdrs.push((name, value.as_ref()));
    }
    hdrs.extend(up.extra.iter().map(|(k, v)| (*k, v.as_str())));
    let body = match &up.body {
        Some(b) => b.as_slice(),
        None => flight.chat.body(),
    };
    // A callout's answer arrives whole, streams included.
    let timeout_ms = if up.stream {
        up.stream_timeout_ms
    } else {
        up.timeout_ms
    };
    let sent = host.dispatch(up.cluster, &hdrs, body, timeout_ms);
    drop(hdrs);
    flight.upstream.forwarded = Some(forwarded);
    let token = sent?;
    Ok(Call {
        token,
        started_ms: host.now_ms(),
        timeout_ms,
    })
}

/// The client's headers a fallback sends: read once, at the first
/// fallback (requests that never fall back pay nothing), and kept in the
/// flight for the next. Values that are not UTF-8 cannot go through a
/// callout and are left out (the log says so).
fn forwarded_headers(host: &impl Host, flight: &mut Flight) -> Vec<(String, String)> {
    if let Some(kept) = flight.upstream.forwarded.take() {
        return kept;
    }
    let all = host.headers(Part::Request).unwrap_or_default();
    let mut out = Vec::new();
    for (k, v) in all.iter().filter(|(k, _)| headers::forwarded_upstream(k)) {
        match std::str::from_utf8(v) {
            Ok(v) => out.push((k.to_string(), v.to_string())),
            Err(_) => host.log(
                LogLevel::Info,
                &format!("header `{k}` is not UTF-8: not sent with the fallback"),
            ),
        }
    }
    out
}
