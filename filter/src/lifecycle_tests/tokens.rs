//! Access tokens for Vertex AI: one fetch for every request that needs the
//! token meanwhile, each waiter rewritten for the router and woken with it;
//! a failed fetch wakes them without one and lets the next request try
//! again; a kept token serves later requests without a fetch.

use super::*;
use crate::host::metrics;

fn vertex() -> String {
    format!(
        "providers:
  - name: vertex
    cluster: vertex
    schema: vertex
    project: p1
    region: us-east5
    token_cluster: meta
    models:
      - name: gemini
        id: gemini-2.5-flash
clients:
  - name: demo
    key_sha256: {DEMO_HASH}
"
    )
}

const GEMINI_ANSWER: &str = r#"{"candidates":[{"content":{"role":"model","parts":[{"text":"hi"}]},"finishReason":"STOP"}],"usageMetadata":{"promptTokenCount":1,"candidatesTokenCount":1}}"#;

const CHAT: &str = r#"{"model":"gemini","messages":[{"role":"user","content":"hi"}]}"#;

/// A chat request from a context with Envoy's id `id`.
fn request(g: &Gateway, id: u32) -> (RequestContext<FakeHost>, Action) {
    let mut ctx = g.context();
    ctx.id = id;
    let auth = format!("Bearer {DEMO_KEY}");
    ctx.host.set_headers(
        Part::Request,
        &[
            (":method", "POST"),
            (":path", "/v1/chat/completions"),
            (":authority", "gateway.local"),
            ("authorization", auth.as_str()),
        ],
    );
    ctx.host.set_body_bytes(Part::Request, CHAT.as_bytes());
    assert_eq!(ctx.on_request_headers(false), Action::Pause);
    let a = ctx.on_request_body(CHAT.len(), true);
    (ctx, a)
}

fn token_answer(ctx: &mut RequestContext<FakeHost>, status: &str, body: &str) {
    ctx.host
        .set_headers(Part::CallResponse, &[(":status", status)]);
    ctx.host.set_body_bytes(Part::CallResponse, body.as_bytes());
    ctx.on_call_response(1, body.len());
}

#[test]
fn one_fetch_serves_every_waiter_and_the_token_is_kept() {
    let g = Gateway::new(&vertex());
    let (mut a, act) = request(&g, 11);
    assert_eq!(act, Action::Pause, "waits for the token");
    let calls = a.host.callouts();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0].cluster, "meta");
    assert_eq!(calls[0].header(":method"), Some("GET"));
    assert_eq!(
        calls[0].header(":authority"),
        Some("metadata.google.internal")
    );
    assert_eq!(
        calls[0].header(":path"),
        Some("/computeMetadata/v1/instance/service-accounts/default/token")
    );
    assert_eq!(calls[0].header("metadata-flavor"), Some("Google"));
    // Rewritten for the router, the client's key taken out, no token yet.
    assert_eq!(
        a.host.header(Part::Request, ":path").as_deref(),
        Some("/v1/projects/p1/locations/us-east5/publishers/google/models/gemini-2.5-flash:generateContent")
    );
    assert_eq!(a.host.header(Part::Request, "authorization"), None);
    // A second request meanwhile waits without a fetch of its own.
    let (b, act) = request(&g, 12);
    assert_eq!(act, Action::Pause);
    assert!(b.host.callouts().is_empty());
    token_answer(
        &mut a,
        "200",
        r#"{"access_token":"ya29.t1","expires_in":3600,"token_type":"Bearer"}"#,
    );
    let woken = a.host.state.borrow().woken.clone();
    assert_eq!(
        woken,
        vec![
            (12, Some("Bearer ya29.t1".to_string())),
            (11, Some("Bearer ya29.t1".to_string()))
        ],
        "the other waiter first, the fetching request last"
    );
    assert_eq!(a.host.counter(metrics::TOKEN_FETCHES), 1);
    // The next request finds it kept: through at once, with it.
    let (c, act) = request(&g, 13);
    assert_eq!(act, Action::Continue);
    assert!(c.host.callouts().is_empty());
    assert_eq!(
        c.host.header(Part::Request, "authorization").as_deref(),
        Some("Bearer ya29.t1")
    );
}

/// The fetched token is in shared data before the fetch lock is let go: a
/// request of another worker that takes the lock in between would find no
/// token and fetch a second (vertex.rs's fifty concurrent requests, under
/// load, made two metadata calls when the lock went first).
#[test]
fn the_token_is_kept_before_the_fetch_lock_is_let_go() {
    let g = Gateway::new(&vertex());
    let (mut a, act) = request(&g, 11);
    assert_eq!(act, Action::Pause);
    a.host.state.borrow_mut().tracing = true;
    token_answer(
        &mut a,
        "200",
        r#"{"access_token":"ya29.t1","expires_in":3600,"token_type":"Bearer"}"#,
    );
    let calls = a.host.host_calls();
    let at = |call: &str| calls.iter().position(|c| c == call);
    let kept = at("set_shared_data portcullis.token.vertex");
    let unlocked = at("set_shared_data portcullis.token_lock.vertex");
    assert!(
        kept.is_some() && unlocked.is_some() && kept < unlocked,
        "{calls:#?}"
    );
}

#[test]
fn a_failed_fetch_wakes_the_waiters_without_a_token_and_the_next_request_tries_again() {
    let g = Gateway::new(&vertex());
    let (mut a, _) = request(&g, 21);
    let (_b, _) = request(&g, 22);
    token_answer(&mut a, "500", "metadata server down");
    let woken = a.host.state.borrow().woken.clone();
    assert_eq!(woken, vec![(22, None), (21, None)]);
    assert_eq!(a.host.counter(metrics::TOKEN_FAILURES), 1);
    // The lock is free again: the next request fetches.
    let (c, act) = request(&g, 23);
    assert_eq!(act, Action::Pause);
    assert_eq!(c.host.callouts().len(), 1);
    // An answer without a usable token is a failure too.
    let mut c = c;
    token_answer(&mut c, "200", r#"{"access_token":"has space"}"#);
    assert_eq!(c.host.state.borrow().woken, vec![(23, None)]);
}

#[test]
fn a_fetching_request_that_goes_away_frees_the_lock() {
    let g = Gateway::new(&vertex());
    let (mut a, _) = request(&g, 31);
    a.on_log();
    let (c, act) = request(&g, 32);
    assert_eq!(act, Action::Pause);
    assert_eq!(c.host.callouts().len(), 1, "the next request fetches");
}

/// The tick: a waiter whose token another worker kept is woken with it; a
/// waiter left past twice the token source's timeout goes on without one,
/// counted.
#[test]
fn the_tick_wakes_waiters_with_another_workers_token_or_at_the_timeout() {
    let g = Gateway::new(&vertex());
    let (mut a, _) = request(&g, 41);
    let (_b, act) = request(&g, 42);
    assert_eq!(act, Action::Pause);
    let now = g.host.now_ms();
    // Nothing kept yet, not yet timed out: nobody woken.
    assert!(!crate::upstream::access_tokens::wake_ready(
        &g.host,
        &g.loaded,
        now + 1_000
    ));
    assert!(g.host.state.borrow().woken.is_empty());
    // Another worker kept a token: both waiters go on with it.
    let expires = now + 3_600_000;
    g.host
        .set(
            "portcullis.token.vertex",
            format!("{} {expires} ya29.other", expires - 300_000).as_bytes(),
            None,
        )
        .unwrap();
    assert!(crate::upstream::access_tokens::wake_ready(
        &g.host,
        &g.loaded,
        now + 1_000
    ));
    assert_eq!(
        g.host.state.borrow().woken,
        vec![
            (41, Some("Bearer ya29.other".to_string())),
            (42, Some("Bearer ya29.other".to_string()))
        ]
    );
    // The fetching request, already let go, is not woken again by its own
    // answer, and the router's answer to it is read as any first attempt's.
    token_answer(
        &mut a,
        "200",
        r#"{"access_token":"ya29.late","expires_in":3600}"#,
    );
    assert!(a.host.state.borrow().woken.is_empty());
    // Held whole for its translation: its body follows.
    assert_eq!(router_answers(&mut a, "200", GEMINI_ANSWER), Action::Pause);
    a.host
        .set_body_bytes(Part::Response, GEMINI_ANSWER.as_bytes());
    a.on_response_body(GEMINI_ANSWER.len(), true);
    let v: Value = serde_json::from_slice(&a.host.body_of(Part::Response)).unwrap();
    assert_eq!(v["object"], "chat.completion", "translated: {v}");
    assert_eq!(v["choices"][0]["message"]["content"], "hi");
    // A waiter whose fetch never answers goes on without a token after
    // twice the source's 5 s timeout, not before.
    let g = Gateway::new(&vertex());
    let (_c, _) = request(&g, 43);
    let now = g.host.now_ms();
    assert!(!crate::upstream::access_tokens::wake_ready(
        &g.host,
        &g.loaded,
        now + 10_000
    ));
    assert!(crate::upstream::access_tokens::wake_ready(
        &g.host,
        &g.loaded,
        now + 10_001
    ));
    assert_eq!(g.host.state.borrow().woken, vec![(43, None)]);
    assert_eq!(g.host.counter(metrics::TOKEN_FAILURES), 1);
}
