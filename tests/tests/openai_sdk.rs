//! The official OpenAI Python SDK (pinned in the Makefile) talks to the
//! gateway as to OpenAI: completions, streams, models, and its exception
//! classes for the gateway's errors.
mod common;
use common::*;

#[test]
fn the_openai_python_sdk_works_unchanged_through_the_gateway() {
    let s = Stack::shipped(2);
    s.primary.default_step(serde_json::json!({"content": "one two three", "usage": {"prompt_tokens": 4, "completion_tokens": 3}}));
    let v = sdk_script(
        "openai_sdk_check.py",
        &[&s.envoy.url("/v1"), DEMO_KEY, MINI_KEY],
    );
    assert_eq!(v["completion"]["content"], "one two three");
    assert_eq!(v["completion"]["total_tokens"], 7);
    assert_eq!(v["completion"]["gateway_model_header"], "gpt-4o");
    assert_eq!(v["stream"]["text"], "one two three");
    assert_eq!(
        v["stream"]["chunks_without_choices"], 0,
        "no usage chunk the client did not ask for"
    );
    assert_eq!(v["stream_with_usage"]["usage_total"], 7);
    assert_eq!(
        v["models"],
        serde_json::json!(["auto", "fast", "gpt-4o-mini", "mini"])
    );
    assert_eq!(
        v["retrieved"],
        serde_json::json!({"id": "fast", "owned_by": "primary"})
    );
    let e = &v["errors"];
    assert_eq!(e["retrieve_hidden"]["class"], "NotFoundError");
    assert_eq!(e["bad_key"]["class"], "AuthenticationError");
    assert_eq!(e["unknown_model"]["class"], "NotFoundError");
    assert_eq!(e["unknown_model"]["code"], "model_not_found");
    assert_eq!(e["no_messages"]["class"], "BadRequestError");
    assert_eq!(e["not_allowed"]["class"], "PermissionDeniedError");
}
