use super::stream::StreamGuard;
use super::*;
use crate::compile::compile;
use serde_json::json;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const KEY_A: &str = "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3";
const KEY_B: &str = "b3a8e0e1f9ab1bfe3a36f231f676f78bb30a519d2b21e6c530c0eee8ebb4a5d0";

pub(super) fn gateway(guardrails: &str) -> crate::config::Gateway {
    let yaml = format!(
        r#"
providers:
  - name: p
    cluster: c
    host: h
    models: [{{name: m}}, {{name: big}}]
clients:
  - {{name: alice, key_sha256: "{KEY_A}"}}
  - {{name: bob, key_sha256: "{KEY_B}"}}
guardrails:
{guardrails}
"#
    );
    compile(yaml.as_bytes()).unwrap_or_else(|e| panic!("{e}"))
}

fn doc(v: Value) -> Map<String, Value> {
    v.as_object().unwrap().clone()
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).unwrap()
}

#[test]
fn an_email_is_denied_for_one_client_and_redacted_for_another() {
    let gw = gateway(
        r#"
  input:
    - {name: no-email, pii: [email], action: deny, clients: [alice]}
    - {name: scrub-email, pii: [email], action: redact, clients: [bob]}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "write to jane@example.com"},
        {"role": "user", "content": [{"type": "text", "text": "or bob@ex.io"}, {"type": "image_url", "image_url": {"url": "x@y.io"}}]}]});
    let out = check_input(g, &g.active(Stage::Input, "alice", 0), 0, &bytes(&body));
    let err = out.denied.unwrap();
    assert_eq!((err.status, err.code), (400, "guardrail_denied"));
    assert!(err.message.contains("no-email") && !err.message.contains("jane"));
    assert_eq!(out.verdicts[0].hits, 2);
    assert!(
        out.verdicts[0].matched.is_empty(),
        "no content unless asked"
    );

    let out = check_input(g, &g.active(Stage::Input, "bob", 0), 0, &bytes(&body));
    assert!(out.denied.is_none() && out.changed);
    let d = out.rewritten.clone().unwrap();
    assert_eq!(d["messages"][0]["content"], "write to [REDACTED:email]");
    assert_eq!(
        d["messages"][1]["content"][0]["text"],
        "or [REDACTED:email]"
    );
    assert_eq!(d["messages"][1]["content"][1]["image_url"]["url"], "x@y.io");
    assert_eq!(
        record_json(&out.verdicts),
        r#"[{"stage":"input","check":"scrub-email","action":"redact","hits":2}]"#
    );
}

#[test]
fn bounds_models_and_scopes() {
    let gw = gateway(
        r#"
  input:
    - {name: short, max_words: 3}
    - {name: no-big, deny_models: [big], action: log}
    - {name: only-m, allow_models: [m], models: [big]}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let d = json!({"messages": [{"role": "user", "content": "one two three four"}]});
    let out = check_input(g, &g.active(Stage::Input, "bob", 0), 0, &bytes(&d));
    assert!(out
        .denied
        .unwrap()
        .message
        .contains("4 words, above the limit of 3"));
    let d = json!({"messages": [{"role": "user", "content": "hi"}]});
    let big = gw.names["big"];
    let out = check_input(g, &g.active(Stage::Input, "bob", big), big, &bytes(&d));
    assert_eq!(out.verdicts.len(), 2, "{:?}", out.verdicts);
    assert_eq!(out.verdicts[0].action, Act::Log);
    assert!(out.denied.unwrap().message.contains("only-m"));
    assert_eq!(
        g.active(Stage::Input, "bob", 0),
        [0, 1],
        "only-m applies to big only"
    );
}

#[test]
fn answers_are_redacted_or_denied_and_schemas_apply_to_json_requests() {
    let gw = gateway(
        r#"
  output:
    - {name: keys, pii: [api_key], action: redact}
    - {name: secret, regex: "(?i)top secret", action: deny, clients: [alice]}
    - {name: shape, json_schema: {type: object, required: [ok]}}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let answer = |content: &str| {
        serde_json::to_vec(&json!({"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})).unwrap()
    };
    let (out, body) = check_answer(
        g,
        &g.active(Stage::Output, "bob", 0),
        false,
        &answer("use sk-abcdefghijklmnopqrstuv now, Top Secret"),
    );
    assert!(out.denied.is_none());
    let v: Value = serde_json::from_slice(&body.unwrap()).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "use [REDACTED:api_key] now, Top Secret"
    );
    let (out, body) = check_answer(
        g,
        &g.active(Stage::Output, "alice", 0),
        false,
        &answer("TOP SECRET"),
    );
    assert!(out.denied.unwrap().message.contains("secret") && body.is_none());
    let bob = g.active(Stage::Output, "bob", 0);
    assert!(check_answer(g, &bob, true, &answer(r#"{"ok":1}"#))
        .0
        .denied
        .is_none());
    let denied = check_answer(g, &bob, true, &answer(r#"{"no":1}"#))
        .0
        .denied
        .unwrap();
    assert!(
        denied.message.contains("missing required `ok`"),
        "{}",
        denied.message
    );
    assert!(
        check_answer(g, &bob, false, &answer("not json"))
            .0
            .denied
            .is_none(),
        "no JSON asked"
    );
    assert!(check_answer(g, &bob, true, b"not a json answer")
        .0
        .verdicts
        .is_empty());
}

#[test]
fn bad_checks_are_all_reported() {
    let yaml = format!(
        r#"
providers: [{{name: p, cluster: c, host: h, models: [{{name: m}}]}}]
clients: [{{name: alice, key_sha256: "{KEY_A}"}}]
guardrails:
  deny_status: 200
  input:
    - {{name: bad, regex: "([a-z]"}}
    - {{name: two, regex: "x", pii: [email]}}
    - {{name: who, pii: [email, ssn], clients: [carol], models: [nope], action: redact}}
    - {{name: words, max_words: 2, action: redact}}
    - {{name: ext, external: {{cluster: "", failure_mode: maybe}}}}
    - {{name: schema, json_schema: {{type: object}}}}
  output:
    - {{name: bad, regex: "x", action: block}}
    - {{name: bad, regex: "y"}}
    - {{name: ext2, external: {{cluster: g}}}}
"#
    );
    let err = compile(yaml.as_bytes()).unwrap_err();
    for want in [
        "deny_status must be an error status",
        "input[0] (bad).regex: not a valid regular expression",
        "exactly one of regex, pii",
        "`ssn` is not a built-in pattern",
        "`carol` is not a client",
        "models: `nope` is not a model",
        "`redact` needs text to replace",
        "external.cluster is empty",
        "`maybe` is not allow or deny",
        "json_schema checks run on output only",
        "duplicate check name",
        "`block` is not an action",
        "external checks run on input only",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

#[test]
fn bad_vendor_checks_are_all_reported_and_good_ones_compile() {
    let yaml = format!(
        r#"
providers: [{{name: p, cluster: c, host: h, models: [{{name: m}}]}}]
clients: [{{name: alice, key_sha256: "{KEY_A}"}}]
guardrails:
  vendor_verdict_ttl_s: 100000
  input:
    - {{name: a, vendor: {{kind: bedrock_guardrails, cluster: g, api_key_env: K, model: x}}}}
    - {{name: b, action: redact, vendor: {{kind: azure_content_safety, cluster: g, thresholds: {{Gore: 2, Hate: 9}}}}}}
    - {{name: c, vendor: {{kind: model_armor, cluster: "", api_key_env: "1x", timeout_ms: 0, failure_mode: maybe}}}}
    - {{name: d, vendor: {{kind: acme, cluster: g}}}}
    - {{name: e, vendor: {{kind: openai_moderation, cluster: g, api_key_env: K, thresholds: {{violence: 2}}, colour: red}}}}
    - {{name: f, vendor: {{kind: presidio, cluster: g}}, regex: x}}
    - {{name: h, action: redact, vendor: {{kind: openai_moderation, cluster: g, api_key_env: K}}}}
  output:
    - {{name: g, vendor: {{kind: presidio, cluster: g, language: en}}, action: redact}}
    - {{name: g2, vendor: {{kind: model_armor, cluster: g}}}}
"#
    );
    let err = compile(yaml.as_bytes()).unwrap_err();
    for want in [
        "vendor_verdict_ttl_s must be at most 86400",
        "input[0] (a).vendor.guardrail_id is required for `bedrock_guardrails`",
        "input[0] (a).vendor.region is required",
        "signs with AWS credentials",
        "input[0] (a).vendor.model does not apply to `bedrock_guardrails`",
        "`Gore` is not a category",
        "thresholds.Hate: a severity is a whole number from 0 to 7",
        "input[1] (b).vendor.api_key_env is required for `azure_content_safety`",
        "input[2] (c).vendor.project is required for `model_armor`",
        "`1x` is not an environment variable name",
        "input[2] (c).vendor.cluster is empty",
        "input[2] (c).vendor.timeout_ms must be at least 1",
        "`maybe` is not allow or deny",
        "`acme` is not a vendor",
        "output[1] (g2).vendor.project is required for `model_armor`",
        "thresholds.violence: a score is between 0 and 1",
        "colour",
        "exactly one of regex, pii, min_words/max_words/max_tokens, allow_models/deny_models, json_schema, external, vendor",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
    // `redact` on a vendor that names nothing to replace.
    assert!(
        err.contains("input[6] (h): `redact` needs text to replace"),
        "{err}"
    );

    let gw = gateway(
        r#"  input:
    - {name: shields, vendor: {kind: azure_prompt_shields, cluster: az, api_key_env: AZ, authority: x.cognitiveservices.azure.com}}
    - {name: pii, action: redact, vendor: {kind: presidio, cluster: pr, entities: [EMAIL_ADDRESS]}}
    - {name: aws, action: log, vendor: {kind: bedrock_guardrails, cluster: b, guardrail_id: g1, guardrail_version: '2', region: us-west-2, aws_env_prefix: GUARD_}}"#,
    );
    let g = gw.guardrails.unwrap();
    assert_eq!(g.verdict_ttl_ms, 600_000);
    let Kind::External(e) = &g.input[0].kind else {
        panic!()
    };
    assert_eq!(
        e.path,
        "/contentsafety/text:shieldPrompt?api-version=2024-09-01"
    );
    assert_eq!(e.authority, "x.cognitiveservices.azure.com");
    assert_eq!(e.credential_env.as_deref(), Some("AZ"));
    assert_eq!(e.timeout_ms, 500);
    let Kind::External(p) = &g.input[1].kind else {
        panic!()
    };
    assert_eq!(
        (p.authority.as_str(), p.credential_env.as_deref()),
        ("pr", None)
    );
    let Kind::External(b) = &g.input[2].kind else {
        panic!()
    };
    assert_eq!(b.authority, "bedrock-runtime.us-west-2.amazonaws.com");
    assert_eq!(b.path, "/guardrail/g1/version/2/apply");
    assert_eq!(b.credential_env.as_deref(), Some("GUARD_"));
    let out = gateway(
        r#"  output:
    - {name: armor, vendor: {kind: model_armor, cluster: m, api_key_env: T, project: p, location: l, template: t}}"#,
    );
    let Kind::External(o) = &out.guardrails.unwrap().output[0].kind else {
        panic!()
    };
    assert_eq!(
        o.path,
        "/v1/projects/p/locations/l/templates/t:sanitizeModelResponse"
    );
    assert_ne!(e.fingerprint, p.fingerprint);
}

#[test]
fn a_team_gets_its_own_action_for_a_check_or_none() {
    let yaml = format!(
        r#"
providers: [{{name: p, cluster: c, host: h, models: [{{name: m}}]}}]
clients:
  - {{name: alice, key_sha256: "{KEY_A}", team: pilots}}
  - {{name: bob, key_sha256: "{KEY_B}"}}
teams:
  - {{name: pilots, guardrails: {{aws: log, mail: off, cards: redact}}}}
guardrails:
  input:
    - {{name: aws, vendor: {{kind: openai_moderation, cluster: l, api_key_env: K}}}}
    - {{name: mail, pii: [email]}}
  output:
    - {{name: cards, pii: [card]}}
"#
    );
    let gw = compile(yaml.as_bytes()).unwrap_or_else(|e| panic!("{e}"));
    let g = gw.guardrails.unwrap();
    let acts = |stage: Stage, client: &str| -> Vec<(String, Act)> {
        g.active(stage, client, 0)
            .into_iter()
            .map(|i| (g.checks(stage)[i].name.clone(), g.checks(stage)[i].act))
            .collect()
    };
    assert_eq!(
        acts(Stage::Input, "bob"),
        vec![("aws".into(), Act::Deny), ("mail".into(), Act::Deny)]
    );
    assert_eq!(acts(Stage::Input, "alice"), vec![("aws".into(), Act::Log)]);
    assert_eq!(
        acts(Stage::Output, "alice"),
        vec![("cards".into(), Act::Redact)]
    );
    assert_eq!(
        acts(Stage::Output, "bob"),
        vec![("cards".into(), Act::Deny)]
    );
    // A key the config does not list (an MCP login) keeps the check's own.
    assert_eq!(acts(Stage::Input, "someone").len(), 2);
    let (Kind::External(a), Kind::External(b)) = (&g.input[0].kind, &g.input[1].kind) else {
        panic!("the copy follows the check")
    };
    assert_ne!(
        a.fingerprint, b.fingerprint,
        "a verdict kept under one action is not used under another"
    );

    let bad = yaml
        .replace("aws: log", "aws: redact, nope: log")
        .replace("cards: redact", "cards: maybe");
    let err = compile(bad.as_bytes()).unwrap_err();
    for want in [
        "teams[0] (pilots).guardrails.aws: `redact` needs text to replace",
        "teams[0] (pilots).guardrails.nope: `nope` is not a guardrail check",
        "teams[0] (pilots).guardrails.cards: `maybe` is not an action",
    ] {
        assert!(err.contains(want), "missing {want:?} in:\n{err}");
    }
}

fn chunk_event(content: &str) -> String {
    format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": null}]})
    )
}

fn stream_of(words: &[&str]) -> String {
    let mut s: String = words.iter().map(|w| chunk_event(w)).collect();
    s.push_str(&format!(
        "data: {}\n\n",
        json!({"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "m",
               "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    ));
    s.push_str("data: [DONE]\n\n");
    s
}

/// What a client would read: the contents joined, and whether an error
/// event came.
fn client_view(out: &[u8]) -> (String, Option<Value>) {
    let text = String::from_utf8(out.to_vec()).unwrap();
    let mut content = String::new();
    let mut error = None;
    for ev in text.split("\n\n").filter(|e| !e.is_empty()) {
        let data = ev.strip_prefix("data: ").unwrap();
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(data).unwrap();
        if v.get("error").is_some() {
            error = Some(v);
            continue;
        }
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    (content, error)
}

fn run_stream(
    g: &Guardrails,
    client: &str,
    stream: &str,
    split: &[usize],
) -> (Vec<u8>, StreamGuard) {
    let mut guard = StreamGuard::new(
        g,
        super::texts::Shape::Chat,
        g.active(Stage::Output, client, 0),
        false,
    );
    let bytes = stream.as_bytes();
    let mut out = Vec::new();
    let mut last = 0;
    for &at in split.iter().chain(std::iter::once(&bytes.len())) {
        out.extend(guard.chunk(g, &bytes[last..at]));
        last = at;
    }
    out.extend(guard.finish(g));
    (out, guard)
}

#[test]
fn a_streamed_match_split_across_chunks_is_redacted_before_it_is_sent() {
    let gw = gateway(
        r#"
  lookbehind_bytes: 16
  output:
    - {name: code, regex: "open sesame", action: redact}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let stream = stream_of(&[
        "The words are ",
        "open ",
        "ses",
        "ame and then ",
        "more text follows here.",
    ]);
    for split in 0..stream.len() {
        let (out, guard) = run_stream(g, "bob", &stream, &[split]);
        let (content, error) = client_view(&out);
        assert_eq!(
            content, "The words are [REDACTED:code] and then more text follows here.",
            "split at {split}"
        );
        assert!(error.is_none());
        assert!(guard.changed);
        assert_eq!(guard.verdicts[0].hits, 1);
        assert!(String::from_utf8(out)
            .unwrap()
            .ends_with("data: [DONE]\n\n"));
    }
}

#[test]
fn a_streamed_deny_ends_with_an_error_event() {
    let gw = gateway(
        r#"
  output:
    - {name: secret, regex: "top secret"}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let stream = stream_of(&["This is ", "top ", "secret", " stuff"]);
    let (out, guard) = run_stream(g, "bob", &stream, &[40]);
    let (content, error) = client_view(&out);
    assert!(!content.contains("secret"), "{content}");
    assert_eq!(error.unwrap()["error"]["code"], "guardrail_denied");
    assert!(guard.denied.is_some());
    assert!(!String::from_utf8(out).unwrap().contains("[DONE]"));
}

#[test]
fn a_streamed_json_answer_is_checked_at_its_end() {
    let gw = gateway(
        r#"
  output:
    - {name: shape, json_schema: {type: object, required: [ok]}}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let mut guard = StreamGuard::new(
        g,
        super::texts::Shape::Chat,
        g.active(Stage::Output, "bob", 0),
        true,
    );
    let out = guard.chunk(g, stream_of(&["{\"no\"", ":1}"]).as_bytes());
    let (content, error) = client_view(&out);
    assert_eq!(content, "{\"no\":1}");
    assert!(error.unwrap()["error"]["message"]
        .as_str()
        .unwrap()
        .contains("missing required `ok`"));
}

#[test]
fn external_contract_reads_every_verdict_and_refuses_the_rest() {
    use super::external::{answer, apply_redactions, Answer};
    assert_eq!(
        answer(Some(200), br#"{"verdict":"allow"}"#),
        Ok(Answer::Allow)
    );
    assert_eq!(
        answer(Some(200), br#"{"verdict":"deny","reason":"toxic"}"#),
        Ok(Answer::Deny("toxic".into()))
    );
    assert_eq!(
        answer(Some(200), br#"{"verdict":"redact","redact":["x",""]}"#),
        Ok(Answer::Redact(vec!["x".into()]))
    );
    assert!(answer(Some(503), b"").is_err());
    assert!(answer(None, b"").is_err());
    assert!(answer(Some(200), b"{").is_err());
    assert!(answer(Some(200), br#"{"verdict":"maybe"}"#).is_err());
    let mut d = doc(json!({"messages": [{"role": "user", "content": "a secret and a secret"}]}));
    assert_eq!(apply_redactions(&mut d, "guard", &["secret".into()]), 2);
    assert_eq!(
        d["messages"][0]["content"],
        "a [REDACTED:guard] and a [REDACTED:guard]"
    );
}

#[test]
fn redaction_merges_overlapping_spans() {
    let mut spans = vec![
        Span {
            start: 2,
            end: 6,
            label: "a",
        },
        Span {
            start: 0,
            end: 3,
            label: "b",
        },
        Span {
            start: 8,
            end: 9,
            label: "c",
        },
    ];
    assert_eq!(
        redact("0123456789", &mut spans),
        "[REDACTED:b]45[REDACTED:c]9".replace("45", "67")
    );
}

fn scrubber() -> crate::config::Gateway {
    gateway(
        r#"
  input:
    - {name: scrub, pii: [email, card], action: redact}
"#,
    )
}

fn scrubbed(body: Value) -> Map<String, Value> {
    let gw = scrubber();
    let g = gw.guardrails.as_ref().unwrap();
    let out = check_input(g, &g.active(Stage::Input, "bob", 0), 0, &bytes(&body));
    assert!(out.changed, "nothing found in {body}");
    out.rewritten.unwrap()
}

#[test]
fn a_value_split_across_adjacent_text_parts_is_redacted_in_each_part() {
    let d = scrubbed(
        json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "mail alice@exa"}, {"type": "text", "text": "mple.com now, card 41111111"},
        {"type": "text", "text": "11111111 thanks"}]}]}),
    );
    let parts = &d["messages"][0]["content"];
    assert_eq!(parts[0]["text"], "mail [REDACTED:email]");
    assert_eq!(parts[1]["text"], " now, card [REDACTED:card]");
    assert_eq!(parts[2]["text"], " thanks");
    let joined: String = (0..3).map(|i| parts[i]["text"].as_str().unwrap()).collect();
    assert_eq!(
        joined,
        "mail [REDACTED:email] now, card [REDACTED:card] thanks"
    );
}

/// A value split across messages or Responses items, in every API, is
/// one match: each fragment redacted (#46 item 3).
#[test]
fn a_value_split_across_messages_and_items_is_redacted_in_each_fragment() {
    let card = |d: &Map<String, Value>, a: &str, b: &str| {
        let at = |p: &str| d_str(d, p);
        assert_eq!(at(a), "pay with [REDACTED:card]", "{d:?}");
        assert_eq!(at(b), " please", "{d:?}");
    };
    // Responses: two message items, as strings and as input_text parts.
    let d = scrubbed(json!({"model": "m", "input": [
        {"role": "user", "content": "pay with 4111 1111"},
        {"role": "user", "content": "1111 1111 please"}]}));
    card(&d, "/input/0/content", "/input/1/content");
    let d = scrubbed(json!({"model": "m", "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "pay with 4111 1111"}]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "1111 1111 please"}]}]}));
    card(&d, "/input/0/content/0/text", "/input/1/content/0/text");
    // From the instructions into the first item.
    let d = scrubbed(
        json!({"model": "m", "instructions": "pay with 4111 1111", "input": "1111 1111 please"}),
    );
    card(&d, "/instructions", "/input");
    // Chat: two messages.
    let d = scrubbed(json!({"model": "m", "messages": [
        {"role": "user", "content": "pay with 4111 1111"},
        {"role": "user", "content": [{"type": "text", "text": "1111 1111 please"}]}]}));
    card(&d, "/messages/0/content", "/messages/1/content/0/text");
    // Messages: from the system blocks into a message, and across messages.
    let d = scrubbed(
        json!({"model": "m", "system": [{"type": "text", "text": "pay with 4111 1111"}],
        "messages": [{"role": "user", "content": "1111 1111 please"}]}),
    );
    card(&d, "/system/0/text", "/messages/0/content");
    let d = scrubbed(json!({"model": "m", "messages": [
        {"role": "user", "content": [{"type": "text", "text": "pay with 4111 1111"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "1111 1111 please"}]}]}));
    card(
        &d,
        "/messages/0/content/0/text",
        "/messages/1/content/0/text",
    );
}

/// A value whole in one message is found as it would be alone, whatever
/// the next message starts with; the next message loses nothing.
#[test]
fn a_value_whole_in_a_message_is_not_extended_into_the_next() {
    let d = scrubbed(json!({"model": "m", "messages": [
        {"role": "user", "content": "write to jane@example.com"},
        {"role": "user", "content": "or to 4111111111111111"},
        {"role": "user", "content": "2 apples"}]}));
    assert_eq!(
        d_str(&d, "/messages/0/content"),
        "write to [REDACTED:email]"
    );
    assert_eq!(d_str(&d, "/messages/1/content"), "or to [REDACTED:card]");
    assert_eq!(d_str(&d, "/messages/2/content"), "2 apples");
}

/// A tool call between two texts ends the run: they are not adjacent.
#[test]
fn texts_split_by_a_tool_call_are_read_apart() {
    let gw = scrubber();
    let g = gw.guardrails.as_ref().unwrap();
    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "alice@exa"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c", "content": "mple.com"}]});
    let out = check_input(g, &g.active(Stage::Input, "bob", 0), 0, &bytes(&body));
    assert!(!out.changed, "{:?}", out.rewritten);
}

fn d_str<'a>(d: &'a Map<String, Value>, pointer: &str) -> &'a str {
    let (first, rest) = pointer
        .trim_start_matches('/')
        .split_once('/')
        .unwrap_or((pointer.trim_start_matches('/'), ""));
    let v = &d[first];
    let v = if rest.is_empty() {
        v
    } else {
        v.pointer(&format!("/{rest}")).unwrap_or(&Value::Null)
    };
    v.as_str().unwrap_or_else(|| panic!("{pointer}: {v}"))
}

#[test]
fn parts_split_by_an_image_are_read_apart() {
    let gw = scrubber();
    let g = gw.guardrails.as_ref().unwrap();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "alice@exa"}, {"type": "image_url", "image_url": {"url": "u"}},
        {"type": "text", "text": "mple.com"}]}]});
    let out = check_input(g, &g.active(Stage::Input, "bob", 0), 0, &bytes(&body));
    assert!(
        !out.changed,
        "not adjacent: the model does not read them as one"
    );
}

#[test]
fn names_tool_call_arguments_and_anthropic_blocks_are_read() {
    let d = scrubbed(json!({"model": "m", "messages": [
        {"role": "user", "name": "alice@example.com", "content": "hi"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "send", "arguments": "{\"to\":\"bob\\u0040example.com\",\"n\":[1,\"4111 1111 1111 1111\"]}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sent to bob@example.com"}]}));
    assert_eq!(d["messages"][0]["name"], "[REDACTED:email]");
    let args: Value = serde_json::from_str(
        d["messages"][1]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        args,
        json!({"to": "[REDACTED:email]", "n": [1, "[REDACTED:card]"]})
    );
    assert_eq!(d["messages"][2]["content"], "sent to [REDACTED:email]");

    let d = scrubbed(
        json!({"model": "m", "system": [{"type": "text", "text": "admin is root@exa"}, {"type": "text", "text": "mple.com"}],
        "messages": [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "f", "input": {"deep": {"to": ["x@example.com"]}}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "ok y@example.com"}]}]}]}),
    );
    assert_eq!(d["system"][0]["text"], "admin is [REDACTED:email]");
    assert_eq!(d["system"][1]["text"], "");
    assert_eq!(
        d["messages"][0]["content"][0]["input"]["deep"]["to"][0],
        "[REDACTED:email]"
    );
    assert_eq!(
        d["messages"][1]["content"][0]["content"][0]["text"],
        "ok [REDACTED:email]"
    );
}

#[test]
fn arguments_that_are_not_json_are_read_as_text() {
    let d = scrubbed(
        json!({"model": "m", "messages": [{"role": "assistant", "content": null, "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "to: a@example.com"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "ok"}]}),
    );
    assert_eq!(
        d["messages"][0]["tool_calls"][0]["function"]["arguments"],
        "to: [REDACTED:email]"
    );
}

#[test]
fn answers_are_read_in_their_shape_tool_calls_included() {
    use super::texts::Shape;
    let gw = gateway(
        r#"
  output:
    - {name: cards, pii: [card], action: redact}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let active = g.active(Stage::Output, "bob", 0);
    let resp = json!({"object": "response", "output": [
        {"type": "function_call", "arguments": "{\"n\":\"4111 1111 1111 1111\"}"},
        {"type": "message", "content": [{"type": "output_text", "text": "card 4111 1111 1111 1111"}]}]});
    let (out, rewritten) = check_answer_of(Shape::Responses, g, &active, false, &bytes(&resp));
    assert!(out.changed);
    assert_eq!(out.verdicts[0].hits, 2);
    let v: Value = serde_json::from_slice(&rewritten.unwrap()).unwrap();
    assert_eq!(v["output"][1]["content"][0]["text"], "card [REDACTED:card]");
    assert_eq!(v["output"][0]["arguments"], r#"{"n":"[REDACTED:card]"}"#);
    let msg = json!({"type": "message", "content": [
        {"type": "text", "text": "4111 1111 "}, {"type": "text", "text": "1111 1111"},
        {"type": "tool_use", "id": "t", "name": "f", "input": {"to": ["4111 1111 1111 1111"]}}]});
    let (out, rewritten) = check_answer_of(Shape::Messages, g, &active, false, &bytes(&msg));
    assert_eq!(out.verdicts[0].hits, 2);
    let v: Value = serde_json::from_slice(&rewritten.unwrap()).unwrap();
    assert_eq!(v["content"][0]["text"], "[REDACTED:card]");
    assert_eq!(v["content"][1]["text"], "");
    assert_eq!(v["content"][2]["input"]["to"][0], "[REDACTED:card]");
    // A chat completion's tool-call arguments (escapes decoded), read
    // without a tree first, rewritten from one.
    let chat = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": null,
        "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{\"n\": \"4111 1111 1111 \\u0031111\"}"}}]}}]});
    let (out, rewritten) = check_answer_of(Shape::Chat, g, &active, false, &bytes(&chat));
    assert_eq!(out.verdicts[0].hits, 1);
    let v: Value = serde_json::from_slice(&rewritten.unwrap()).unwrap();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"],
        r#"{"n":"[REDACTED:card]"}"#
    );
}

#[test]
fn bounds_and_schema_read_the_answers_own_text_not_tool_arguments() {
    use super::texts::Shape;
    let gw = gateway(
        r#"
  output:
    - {name: short, max_words: 3, action: deny}
"#,
    );
    let g = gw.guardrails.as_ref().unwrap();
    let active = g.active(Stage::Output, "bob", 0);
    let chat = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "two words",
        "tool_calls": [{"id": "c", "type": "function",
            "function": {"name": "f", "arguments": "{\"a\": \"one two three four five\"}"}}]}}]});
    let (out, _) = check_answer_of(Shape::Chat, g, &active, false, &bytes(&chat));
    assert!(out.denied.is_none(), "{:?}", out.verdicts);
    let long = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "one two three four"}}]});
    let (out, _) = check_answer_of(Shape::Chat, g, &active, false, &bytes(&long));
    assert!(out.denied.is_some());
}

/// The new endpoints' texts: an image's or a transcription's `prompt`, a
/// rerank's `query` and `documents` (strings or `text`), speech's `input`.
#[test]
fn prompts_queries_and_documents_are_read_and_redacted() {
    let g = gateway("  input:\n    - {name: email, pii: [email], action: redact}\n");
    let g = g.guardrails.expect("guardrails");
    let active = g.active(Stage::Input, "alice", 0);
    for (body, at) in [
        (json!({"model": "m", "prompt": "draw a@b.co"}), "/prompt"),
        (
            json!({"model": "m", "query": "find a@b.co", "documents": ["x"]}),
            "/query",
        ),
        (
            json!({"model": "m", "query": "q", "documents": ["x", {"text": "mail a@b.co"}]}),
            "/documents/1/text",
        ),
        (
            json!({"model": "m", "query": "q", "documents": ["mail a@b.co"]}),
            "/documents/0",
        ),
        (
            json!({"model": "m", "voice": "alloy", "input": "say a@b.co"}),
            "/input",
        ),
    ] {
        let out = check_input_doc(&g, &active, 0, Some(doc(body.clone())));
        let rewritten = Value::Object(out.rewritten.expect("redacted"));
        let text = rewritten.pointer(at).and_then(Value::as_str).unwrap();
        assert!(!text.contains("a@b.co"), "{body}: {text}");
    }
}
