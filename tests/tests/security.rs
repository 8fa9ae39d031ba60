//! What the gateway never hands back: the credential it injected for a
//! provider, echoed by that provider in an error body or a header, arrives
//! at the client as `[REDACTED]`, on the first attempt (through Envoy's
//! router) and on a fallback (by callout); echoed in a success, whole or
//! streamed, as a mask of its own length.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::json;

#[test]
fn a_provider_that_echoes_its_key_has_it_redacted_in_bodies_and_headers() {
    let s = Stack::start(&test_plugin(), 1);
    let echo = |key: &str| {
        json!({
            "status": 401,
            "body": format!(r#"{{"error":{{"message":"Incorrect API key provided: {key}. Key {key} is invalid.","type":"invalid_request_error","code":"invalid_api_key"}}}}"#),
            "note_latin1": format!("debug key={key}"),
        })
    };
    // The first attempt, through Envoy's router: a 401 passes through.
    s.primary.script(json!([echo(PRIMARY_KEY)]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", "hi"));
    assert_eq!(r.status, 401, "{}", r.body);
    assert!(!r.body.contains(PRIMARY_KEY), "{}", r.body);
    assert_eq!(
        r.json()["error"]["message"],
        "Incorrect API key provided: [REDACTED]. Key [REDACTED] is invalid."
    );
    assert_eq!(r.header("x-provider-note"), Some("debug key=[REDACTED]"));
    // A fallback (by callout) that echoes its own key.
    s.primary.script(json!([{"status": 503}]));
    s.backup.script(json!([echo(BACKUP_KEY)]));
    let r = s.chat(DEMO_KEY, &chat_body("mini", "hi"));
    assert_eq!(r.status, 401, "{}", r.body);
    assert_eq!(r.header("x-portcullis-provider"), Some("backup"));
    assert!(!r.body.contains(BACKUP_KEY), "{}", r.body);
    assert!(r.body.contains("[REDACTED]"), "{}", r.body);
    assert_eq!(r.header("x-provider-note"), Some("debug key=[REDACTED]"));
    // A successful answer that mentions nothing secret passes untouched.
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", "hi"));
    assert_eq!(r.status, 200);
    assert!(!r.body.contains("REDACTED"));
    // A success that quotes the key (#61), whole and streamed: scrubbed as
    // it passes, each key by as many bytes, so a `Content-Length` stays
    // true.
    let masked = format!("[REDACTED{}]", "*".repeat(PRIMARY_KEY.len() - 10));
    assert_eq!(masked.len(), PRIMARY_KEY.len());
    let said = format!("your key is {PRIMARY_KEY} indeed");
    s.primary
        .script(json!([{"content": said}, {"content": said}]));
    let r = s.chat(DEMO_KEY, &chat_body("gpt-4o", "hi"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(PRIMARY_KEY), "{}", r.body);
    assert_eq!(
        r.json()["choices"][0]["message"]["content"],
        format!("your key is {masked} indeed")
    );
    if let Some(n) = r.header("content-length") {
        assert_eq!(n.parse::<usize>().unwrap(), r.body.len());
    }
    let stream =
        json!({"model": "gpt-4o", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let r = s.chat(DEMO_KEY, &stream.to_string());
    assert_eq!(r.status, 200, "{}", r.body);
    assert!(!r.body.contains(PRIMARY_KEY), "{}", r.body);
    assert!(r.body.contains(&masked), "{}", r.body);
}
