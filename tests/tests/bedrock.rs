//! AWS Bedrock (#26) in real Envoy: the filter translates chat completions
//! (and Messages through the pivot) to Converse and signs each request
//! with SigV4 over its final body; the mock's Bedrock mode recomputes the
//! signature from the same secret and refuses a wrong one as AWS does, and
//! streams in AWS's binary event-stream framing. The official OpenAI SDK
//! and raw Anthropic-shaped requests are the clients; fallback crosses
//! between Bedrock and an OpenAI provider both ways, plain and streamed.
mod common;
use common::*;
use portcullis_tests::*;
use serde_json::{json, Value};

const KEY_ID: &str = "AKIDBEDROCKTEST";
const SECRET: &str = "bedrock/test+SECRET";
const TOKEN: &str = "session-token/for+tests=";
const MODEL_ID: &str = "anthropic.claude-3-haiku-20240307-v1:0";
const PATH: &str = "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse";

fn plugin(chain: &str) -> String {
    format!(
        "providers:
  - name: openai
    cluster: primary
    host: primary.mock
    api_key_env: OPENAI_API_KEY
    models:
      - {{name: both, id: gpt-4o-mini}}
  - name: bedrock
    cluster: backup
    schema: bedrock
    region: us-east-1
    drop_unsupported: true
    models:
      - {{name: claude-bedrock, id: \"{MODEL_ID}\"}}
      - {{name: both, id: \"{MODEL_ID}\"}}
      - {{name: cohere-embed, id: \"cohere.embed-v4:0\", apis: [embeddings]}}
      - {{name: titan-embed, id: \"amazon.titan-embed-text-v2:0\", apis: [embeddings]}}
routing:
  chain: {chain}
clients:
  - name: demo
    key_sha256: {}
",
        key_hash(DEMO_KEY)
    )
}

struct Bed {
    openai: Mock,
    bedrock: Mock,
    envoy: Envoy,
}

fn start(chain: &str, secret_given: &str) -> Bed {
    let openai = mock("openai", Some(PRIMARY_KEY));
    let bedrock = Mock::start_with_args(
        env!("CARGO_BIN_EXE_portcullis-mock"),
        "bedrock",
        None,
        &[
            "--aws-access-key-id",
            KEY_ID,
            "--aws-secret-access-key",
            SECRET,
            "--aws-session-token",
            TOKEN,
            "--aws-region",
            "us-east-1",
        ],
    );
    let plugin = plugin(chain);
    let envoy = Envoy::start(EnvoyOpts {
        plugin_yaml: &plugin,
        primary_port: openai.port,
        backup_port: bedrock.port,
        collector_port: dead_port(),
        ratelimit_port: dead_port(),
        workers: 2,
        env: vec![
            ("OPENAI_API_KEY", PRIMARY_KEY),
            ("AWS_ACCESS_KEY_ID", KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", secret_given),
            ("AWS_SESSION_TOKEN", TOKEN),
        ],
        side_tls: None,
        bootstrap_patch: Vec::new(),
        control: None,
        clusters: None,
    });
    Bed {
        openai,
        bedrock,
        envoy,
    }
}

fn converse_requests(m: &Mock) -> Vec<Value> {
    m.requests()
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.starts_with("/model/")))
        .collect()
}

#[test]
fn the_openai_sdk_and_messages_clients_use_a_bedrock_backed_model_without_noticing() {
    let b = start("[openai, bedrock]", SECRET);
    b.bedrock.script(backed_sdk_script());
    let v = sdk_script(
        "anthropic_backed_check.py",
        &[&b.envoy.url("/v1"), DEMO_KEY, "claude-bedrock"],
    );
    assert_backed_sdk_run(&v, 13, "ValidationException");
    assert_eq!(v["tool_stream"]["calls"]["0"]["name"], "get_weather");
    // What Bedrock got: Converse at the model's path, signed for the
    // regional host with the session token.
    let reqs = converse_requests(&b.bedrock);
    assert_eq!(reqs.len(), 6, "{reqs:?}");
    let first = &reqs[0];
    assert_eq!(first["path"], PATH);
    assert_eq!(
        first["headers"]["host"],
        "bedrock-runtime.us-east-1.amazonaws.com"
    );
    let auth = first["headers"]["authorization"].as_str().unwrap();
    assert!(
        auth.starts_with(&format!("AWS4-HMAC-SHA256 Credential={KEY_ID}/"))
            && auth.contains("/us-east-1/bedrock/aws4_request, SignedHeaders=host;x-amz-content-sha256;x-amz-date;x-amz-security-token, Signature="),
        "{auth}"
    );
    assert_eq!(first["headers"]["x-amz-security-token"], TOKEN);
    assert_eq!(first["body"]["system"], json!([{"text": "Be brief."}]));
    assert_eq!(first["body"]["inferenceConfig"]["maxTokens"], 50);
    assert_eq!(
        reqs[1]["path"],
        "/model/anthropic.claude-3-haiku-20240307-v1%3A0/converse-stream"
    );
    let turn = &reqs[4]["body"]["messages"];
    assert_eq!(turn[1]["content"][0]["toolUse"]["name"], "get_weather");
    assert_eq!(
        turn[2]["content"][0]["toolResult"]["content"],
        json!([{"text": "sunny"}])
    );
    assert_eq!(b.openai.hits(), 0);
    // /v1/messages reaches it through the pivot, in Anthropic's shape.
    b.bedrock
        .script(json!([{"content": "Hello there."}, {"content": "Hello there."}]));
    let r = post(
        &b.envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY)],
        &json!({"model": "claude-bedrock", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.json()["type"], "message");
    assert_eq!(r.json()["content"][0]["text"], "Hello there.");
    let r = post(
        &b.envoy.url("/v1/messages"),
        &[("x-api-key", DEMO_KEY)],
        &json!({"model": "claude-bedrock", "max_tokens": 5, "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(r.header("content-type"), Some("text/event-stream"));
    assert!(
        r.body.contains("event: message_start")
            && r.body.contains("\"text\":\"Hello \"")
            && r.body.contains("event: message_stop"),
        "{}",
        r.body
    );
}

#[test]
fn fallback_crosses_between_bedrock_and_openai_both_ways_plain_and_streamed() {
    for chain in ["[bedrock, openai]", "[openai, bedrock]"] {
        let b = start(chain, SECRET);
        let (failing, answering) = if chain.starts_with("[bedrock") {
            (&b.bedrock, &b.openai)
        } else {
            (&b.openai, &b.bedrock)
        };
        failing.default_step(json!({"status": 503}));
        answering.default_step(json!({"content": "from the other format"}));
        let auth = format!("Bearer {DEMO_KEY}");
        let chat = |body: Value| {
            post(
                &b.envoy.url("/v1/chat/completions"),
                &[("authorization", &auth)],
                &body.to_string(),
            )
        };
        let r = chat(json!({"model": "both", "messages": [{"role": "user", "content": "hi"}]}));
        assert_eq!(r.status, 200, "{chain}: {}", r.body);
        assert_eq!(
            r.json()["choices"][0]["message"]["content"],
            "from the other format"
        );
        assert_eq!(r.header("x-portcullis-attempts"), Some("2"));
        let r = chat(
            json!({"model": "both", "stream": true, "stream_options": {"include_usage": true},
            "messages": [{"role": "user", "content": "hi"}]}),
        );
        assert_eq!(r.status, 200, "{chain}: {}", r.body);
        assert_eq!(
            r.header("content-type"),
            Some("text/event-stream"),
            "{chain}"
        );
        let (text, error, usage) = stream_text(&r.body);
        assert_eq!(text, "from the other format", "{chain}");
        assert!(error.is_none(), "{chain}: {}", r.body);
        assert!(
            usage.is_some_and(|u| u["total_tokens"].as_u64().unwrap_or(0) > 0),
            "{chain}: {}",
            r.body
        );
        assert!(r.body.ends_with("data: [DONE]\n\n"), "{chain}");
        // Every Bedrock request passed the signature check (a fallback's
        // callout is signed like the router's request).
        let bedrock_seen = converse_requests(&b.bedrock);
        assert_eq!(bedrock_seen.len(), 2, "{chain}");
    }
}

#[test]
fn a_wrong_secret_is_refused_by_bedrock_and_a_broken_stream_ends_with_an_error() {
    let b = start("[bedrock, openai]", "not-the-secret");
    let auth = format!("Bearer {DEMO_KEY}");
    let r = post(
        &b.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        &json!({"model": "claude-bedrock", "messages": [{"role": "user", "content": "hi"}]})
            .to_string(),
    );
    assert_eq!(r.status, 403, "{}", r.body);
    assert_eq!(r.json()["error"]["code"], "AccessDeniedException");
    assert!(
        r.json()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("does not match the signature"),
        "{}",
        r.body
    );
    // The secret is not in what the client got.
    assert!(!r.body.contains("not-the-secret"));
    drop(b);
    let b = start("[bedrock, openai]", SECRET);
    b.bedrock
        .script(json!([{"content": "one two three", "stream_error": true}]));
    let r = post(
        &b.envoy.url("/v1/chat/completions"),
        &[("authorization", &auth)],
        &json!({"model": "claude-bedrock", "stream": true, "messages": [{"role": "user", "content": "hi"}]}).to_string(),
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let (text, error, _) = stream_text(&r.body);
    assert_eq!(text, "one two three");
    let error = error.expect("an error event");
    assert_eq!(
        error["error"]["code"], "ModelStreamErrorException",
        "{}",
        r.body
    );
    assert!(!r.body.contains("[DONE]"));
}

#[test]
fn the_openai_sdk_embeds_with_cohere_and_titan_on_bedrock() {
    let b = start("[openai, bedrock]", SECRET);
    let v = sdk_script(
        "embeddings_check.py",
        &[&b.envoy.url("/v1"), DEMO_KEY, "cohere-embed", "256"],
    );
    // Cohere reports no token count: the gateway's estimate ("hello there
    // world" 5; "one" and "two words" 1 + 3).
    assert_eq!(
        v["default"],
        json!({"model": "cohere-embed", "lengths": [1536], "indexes": [0], "prompt_tokens": 5, "total_tokens": 5})
    );
    assert_eq!(
        v["float"],
        json!({"model": "cohere-embed", "lengths": [256, 256], "indexes": [0, 1], "prompt_tokens": 4, "total_tokens": 4})
    );
    assert_eq!(v["base64_equals_float"], true, "{v}");
    assert_eq!(v["tokens"]["status"], 400, "{v}");
    assert_eq!(v["headers"]["x-portcullis-provider"], "bedrock");
    let sent = converse_requests(&b.bedrock);
    let batch = sent
        .iter()
        .find(|r| r["body"]["texts"] == json!(["one", "two words"]))
        .unwrap_or_else(|| panic!("no Cohere batch in {sent:?}"));
    assert_eq!(batch["path"], "/model/cohere.embed-v4%3A0/invoke");
    assert_eq!(
        batch["body"],
        json!({"texts": ["one", "two words"], "input_type": "search_document", "embedding_types": ["float"], "output_dimension": 256})
    );
    assert!(batch["headers"]["authorization"]
        .as_str()
        .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256 ")));
    // Titan: one text a request, its own token count.
    let auth = format!("Bearer {DEMO_KEY}");
    let embed = |input: Value| {
        post(
            &b.envoy.url("/v1/embeddings"),
            &[("authorization", &auth)],
            &json!({"model": "titan-embed", "input": input, "encoding_format": "float", "dimensions": 256}).to_string(),
        )
    };
    let r = embed(json!("hello there world"));
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(
        r.json()["data"][0]["embedding"].as_array().map(Vec::len),
        Some(256)
    );
    assert_eq!(
        r.json()["usage"]["prompt_tokens"],
        3,
        "Titan's inputTextTokenCount"
    );
    let r = embed(json!(["a", "b"]));
    assert_eq!(r.status, 400, "{}", r.body);
    assert!(r.body.contains("one text per request"), "{}", r.body);
}

#[test]
fn the_anthropic_sdk_uses_a_bedrock_backed_model() {
    let b = start("[openai, bedrock]", SECRET);
    b.bedrock.script(anthropic_sdk_script());
    let v = sdk_script(
        "anthropic_sdk_check.py",
        &[&b.envoy.url(""), DEMO_KEY, "claude-bedrock"],
    );
    assert_anthropic_sdk_run(&v);
    // Bedrock's counts are the gateway's estimate.
    assert_eq!(v["count"]["estimated"], "true", "{v}");
    assert_eq!(converse_requests(&b.bedrock).len(), 5);
}

#[test]
fn the_openai_sdk_uses_responses_with_a_bedrock_backed_model() {
    let b = start("[openai, bedrock]", SECRET);
    b.bedrock.script(responses_script());
    let v = sdk_script(
        "responses_check.py",
        &[&b.envoy.url("/v1"), DEMO_KEY, "claude-bedrock", "0"],
    );
    assert_responses_run(&v);
    // Two hops: Responses to chat to Converse; the structured request's
    // format, which Converse has not, dropped (the provider's
    // `drop_unsupported`).
    let reqs = converse_requests(&b.bedrock);
    assert_eq!(reqs[0]["body"]["system"], json!([{"text": "Be brief."}]));
    let turn = &reqs[3]["body"]["messages"];
    assert!(turn[1]["content"][0]["toolUse"].is_object(), "{turn}");
    assert!(turn[2]["content"][0]["toolResult"].is_object(), "{turn}");
}
