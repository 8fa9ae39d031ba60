use super::*;
use serde_json::json;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn t(role: Role, text: &str) -> Text {
    Text {
        role,
        text: text.into(),
    }
}

fn bedrock() -> Vendor {
    Vendor::Bedrock {
        guardrail_id: "gr1".into(),
        version: "DRAFT".into(),
        region: "eu-west-1".into(),
        env_prefix: String::new(),
    }
}

fn body_of(b: &Batch) -> Value {
    serde_json::from_slice(&b.body).unwrap()
}

#[test]
fn each_vendor_gets_its_documented_request() {
    let texts = [
        t(Role::System, "be kind"),
        t(Role::User, "hi"),
        t(Role::Tool, "doc text"),
    ];
    let b = batches(&bedrock(), Stage::Input, &texts);
    assert_eq!(b.len(), 1);
    assert_eq!(
        body_of(&b[0]),
        json!({"source": "INPUT", "content": [
            {"text": {"text": "be kind"}}, {"text": {"text": "hi"}}, {"text": {"text": "doc text"}}]})
    );
    assert_eq!(
        bedrock().path(Stage::Input),
        "/guardrail/gr1/version/DRAFT/apply"
    );
    assert_eq!(
        bedrock().default_authority("c"),
        "bedrock-runtime.eu-west-1.amazonaws.com"
    );

    let shields = Vendor::AzureShields {
        api_version: AZURE_API_VERSION.into(),
    };
    let b = batches(&shields, Stage::Input, &texts);
    assert_eq!(
        body_of(&b[0]),
        json!({"userPrompt": "be kind\n\nhi", "documents": ["doc text"]})
    );
    assert_eq!(
        shields.path(Stage::Input),
        "/contentsafety/text:shieldPrompt?api-version=2024-09-01"
    );

    let armor = Vendor::ModelArmor {
        project: "p".into(),
        location: "us-central1".into(),
        template: "t".into(),
    };
    let b = batches(&armor, Stage::Input, &texts);
    assert_eq!(
        body_of(&b[0]),
        json!({"userPromptData": {"text": "be kind\n\nhi\n\ndoc text"}})
    );
    assert_eq!(
        armor.path(Stage::Output),
        "/v1/projects/p/locations/us-central1/templates/t:sanitizeModelResponse"
    );

    let openai = Vendor::OpenAiModeration {
        model: OPENAI_MODERATION_MODEL.into(),
        thresholds: Vec::new(),
    };
    let b = batches(&openai, Stage::Input, &texts);
    assert_eq!(
        body_of(&b[0]),
        json!({"model": "omni-moderation-latest", "input": ["be kind", "hi", "doc text"]})
    );

    let lakera = Vendor::Lakera {
        project_id: Some("project-1".into()),
    };
    let b = batches(&lakera, Stage::Input, &texts);
    assert_eq!(
        body_of(&b[0]),
        json!({"messages": [
            {"role": "system", "content": "be kind"},
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "doc text"}],
            "project_id": "project-1", "breakdown": true, "payload": true})
    );

    let presidio = Vendor::Presidio {
        language: "en".into(),
        entities: vec!["EMAIL_ADDRESS".into()],
        score_threshold: Some(0.5),
    };
    let b = batches(&presidio, Stage::Input, &texts);
    assert_eq!(
        body_of(&b[0]),
        json!({"text": "be kind\n\nhi\n\ndoc text", "language": "en",
            "entities": ["EMAIL_ADDRESS"], "score_threshold": 0.5})
    );
    assert!(batches(&presidio, Stage::Input, &[]).is_empty());
}

#[test]
fn azure_calls_hold_at_most_ten_thousand_characters_and_a_split_text_is_not_kept() {
    let v = Vendor::AzureAnalyze {
        api_version: AZURE_API_VERSION.into(),
        thresholds: Vec::new(),
    };
    let long = "é".repeat(AZURE_MAX_CHARS + 5);
    let texts = [
        t(Role::User, &"a".repeat(6000)),
        t(Role::User, &"b".repeat(6000)),
        t(Role::User, &long),
    ];
    let b = batches(&v, Stage::Input, &texts);
    assert_eq!(b.len(), 4, "a, b, and the long text in two pieces");
    for batch in &b {
        let text = body_of(batch)["text"].as_str().unwrap().to_string();
        assert!(text.chars().count() <= AZURE_MAX_CHARS);
        assert_eq!(body_of(batch)["categories"], json!(AZURE_CATEGORIES));
    }
    assert_eq!(b[0].whole, vec![0]);
    assert_eq!(b[1].whole, vec![1]);
    assert!(b[2].whole.is_empty() && b[3].whole.is_empty());
    // Small texts share a call.
    let b = batches(&v, Stage::Input, &[t(Role::User, "x"), t(Role::User, "y")]);
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].whole, vec![0, 1]);
    assert_eq!(b[0].joined, "x\n\ny");
}

#[test]
fn bedrock_reads_blocks_as_denials_and_anonymized_pii_as_replacements() {
    let none = json!({"action": "NONE", "outputs": [], "assessments": [{}]});
    let f = read(&bedrock(), Some(200), none.to_string().as_bytes(), "").unwrap();
    assert!(!f.flagged);
    let pii = json!({"action": "GUARDRAIL_INTERVENED", "outputs": [{"text": "{EMAIL}"}],
        "assessments": [{"sensitiveInformationPolicy": {"piiEntities": [
            {"match": "a@b.co", "type": "EMAIL", "action": "ANONYMIZED", "detected": true}],
            "regexes": [{"name": "ids", "match": "ID-7", "regex": "ID-\\d", "action": "ANONYMIZED"}]}}]});
    let f = read(&bedrock(), Some(200), pii.to_string().as_bytes(), "").unwrap();
    assert!(f.flagged && !f.blocked);
    assert_eq!(f.redact, vec!["a@b.co", "ID-7"]);
    assert_eq!(f.categories, vec!["pii:EMAIL", "regex:ids"]);
    let blocked = json!({"action": "GUARDRAIL_INTERVENED", "assessments": [
        {"contentPolicy": {"filters": [{"type": "VIOLENCE", "confidence": "HIGH", "action": "BLOCKED"}]},
         "topicPolicy": {"topics": [{"name": "Investing", "type": "DENY", "action": "BLOCKED"}]}}]});
    let f = read(&bedrock(), Some(200), blocked.to_string().as_bytes(), "").unwrap();
    assert!(f.blocked);
    assert_eq!(f.categories, vec!["topic:Investing", "content:VIOLENCE"]);
    // Intervened with nothing named: still a block, never a pass.
    let bare = json!({"action": "GUARDRAIL_INTERVENED", "assessments": []});
    assert!(
        read(&bedrock(), Some(200), bare.to_string().as_bytes(), "")
            .unwrap()
            .blocked
    );
    // The guardrail says it intervened though no finding took an action:
    // it is believed (a block), never read as a pass.
    let detect = json!({"action": "GUARDRAIL_INTERVENED", "assessments": [
        {"contentPolicy": {"filters": [{"type": "HATE", "action": "NONE", "detected": true}]}}]});
    assert!(
        read(&bedrock(), Some(200), detect.to_string().as_bytes(), "")
            .unwrap()
            .blocked
    );
}

#[test]
fn azure_severities_meet_their_thresholds_and_shields_read_both_analyses() {
    let v = Vendor::AzureAnalyze {
        api_version: AZURE_API_VERSION.into(),
        thresholds: vec![("Hate".into(), 2)],
    };
    let answer = |hate: u64, violence: u64| {
        json!({"blocklistsMatch": [], "categoriesAnalysis": [
            {"category": "Hate", "severity": hate}, {"category": "SelfHarm", "severity": 0},
            {"category": "Sexual", "severity": 0}, {"category": "Violence", "severity": violence}]})
        .to_string()
    };
    assert!(
        !read(&v, Some(200), answer(0, 2).as_bytes(), "")
            .unwrap()
            .flagged
    );
    let f = read(&v, Some(200), answer(2, 4).as_bytes(), "").unwrap();
    assert_eq!(f.categories, vec!["Hate:2", "Violence:4"]);
    assert!(f.blocked);
    let bl = json!({"blocklistsMatch": [{"blocklistName": "words", "blocklistItemId": "1", "blocklistItemText": "x"}], "categoriesAnalysis": []});
    assert_eq!(
        read(&v, Some(200), bl.to_string().as_bytes(), "")
            .unwrap()
            .categories,
        vec!["blocklist:words"]
    );
    let s = Vendor::AzureShields {
        api_version: AZURE_API_VERSION.into(),
    };
    let a = json!({"userPromptAnalysis": {"attackDetected": false}, "documentsAnalysis": [{"attackDetected": false}, {"attackDetected": true}]});
    assert_eq!(
        read(&s, Some(200), a.to_string().as_bytes(), "")
            .unwrap()
            .categories,
        vec!["documentAttack"]
    );
    assert!(
        read(&s, Some(200), b"{}", "").is_err(),
        "no analysis is a failure"
    );
}

#[test]
fn model_armor_lakera_and_presidio_name_what_to_replace() {
    let armor = Vendor::ModelArmor {
        project: "p".into(),
        location: "l".into(),
        template: "t".into(),
    };
    let joined = "héllo a@b.co";
    let start = joined.find('a').unwrap();
    let sdp = json!({"sanitizationResult": {"filterMatchState": "MATCH_FOUND", "invocationResult": "SUCCESS", "filterResults": {
        "sdp": {"sdpFilterResult": {"inspectResult": {"matchState": "MATCH_FOUND", "findings": [
            {"infoType": "EMAIL_ADDRESS", "location": {"byteRange": {"start": start.to_string(), "end": joined.len().to_string()}}}]}}},
        "rai": {"raiFilterResult": {"matchState": "NO_MATCH_FOUND"}}}}});
    let f = read(&armor, Some(200), sdp.to_string().as_bytes(), joined).unwrap();
    assert_eq!(f.redact, vec!["a@b.co"]);
    assert!(!f.blocked);
    let rai = json!({"sanitizationResult": {"filterMatchState": "MATCH_FOUND", "filterResults": {
        "rai": {"raiFilterResult": {"matchState": "MATCH_FOUND"}}}}});
    assert!(
        read(&armor, Some(200), rai.to_string().as_bytes(), joined)
            .unwrap()
            .blocked
    );
    let clean = json!({"sanitizationResult": {"filterMatchState": "NO_MATCH_FOUND"}});
    assert!(
        !read(&armor, Some(200), clean.to_string().as_bytes(), joined)
            .unwrap()
            .flagged
    );

    let lakera = Vendor::Lakera { project_id: None };
    let pii = json!({"flagged": true, "payload": [{"start": 0, "end": 6, "text": "a@b.co", "detector_type": "pii/email", "labels": [], "message_id": 0}],
        "breakdown": [{"detector_type": "pii/email", "detected": true}, {"detector_type": "prompt_attack", "detected": false}]});
    let f = read(&lakera, Some(200), pii.to_string().as_bytes(), "").unwrap();
    assert_eq!(
        (f.redact.clone(), f.blocked),
        (vec!["a@b.co".to_string()], false)
    );
    let attack = json!({"flagged": true, "breakdown": [{"detector_type": "prompt_attack", "detected": true}]});
    let f = read(&lakera, Some(200), attack.to_string().as_bytes(), "").unwrap();
    assert_eq!(
        (f.categories.clone(), f.blocked),
        (vec!["prompt_attack".to_string()], true)
    );

    let presidio = Vendor::Presidio {
        language: "en".into(),
        entities: Vec::new(),
        score_threshold: None,
    };
    // Offsets are in characters, not bytes.
    let text = "née: a@b.co";
    let found = json!([{"entity_type": "EMAIL_ADDRESS", "start": 5, "end": 11, "score": 1.0}]);
    let f = read(&presidio, Some(200), found.to_string().as_bytes(), text).unwrap();
    assert_eq!(f.redact, vec!["a@b.co"]);
    let outside = json!([{"entity_type": "X", "start": 5, "end": 99, "score": 1.0}]);
    assert!(read(&presidio, Some(200), outside.to_string().as_bytes(), text).is_err());
    assert!(!read(&presidio, Some(200), b"[]", text).unwrap().flagged);
}

#[test]
fn openai_moderation_reads_flagged_or_the_scores_against_thresholds() {
    let answer = json!({"id": "modr-1", "model": "omni-moderation-latest", "results": [
        {"flagged": false, "categories": {"violence": false}, "category_scores": {"violence": 0.3}},
        {"flagged": true, "categories": {"violence": true, "hate": false}, "category_scores": {"violence": 0.9}}]})
    .to_string();
    let plain = Vendor::OpenAiModeration {
        model: "m".into(),
        thresholds: Vec::new(),
    };
    assert_eq!(
        read(&plain, Some(200), answer.as_bytes(), "")
            .unwrap()
            .categories,
        vec!["violence"]
    );
    let strict = Vendor::OpenAiModeration {
        model: "m".into(),
        thresholds: vec![("violence".into(), 0.95)],
    };
    assert!(
        !read(&strict, Some(200), answer.as_bytes(), "")
            .unwrap()
            .flagged
    );
    let lax = Vendor::OpenAiModeration {
        model: "m".into(),
        thresholds: vec![("violence".into(), 0.2)],
    };
    assert!(
        read(&lax, Some(200), answer.as_bytes(), "")
            .unwrap()
            .flagged
    );
}

#[test]
fn a_vendor_that_fails_or_answers_another_shape_is_a_failure_not_a_pass() {
    let lakera = Vendor::Lakera { project_id: None };
    assert!(read(&lakera, None, b"", "")
        .unwrap_err()
        .contains("no answer"));
    let e = read(&lakera, Some(503), b"busy", "").unwrap_err();
    assert!(e.contains("503") && e.contains("busy"), "{e}");
    assert!(read(&lakera, Some(200), b"<html>", "")
        .unwrap_err()
        .contains("not JSON"));
    assert!(read(&lakera, Some(200), b"{\"x\":1}", "")
        .unwrap_err()
        .contains("`flagged`"));
    let e = read(&bedrock(), Some(200), b"{\"action\":\"MAYBE\"}", "").unwrap_err();
    assert!(e.contains("MAYBE"), "{e}");
    let presidio = Vendor::Presidio {
        language: "en".into(),
        entities: Vec::new(),
        score_threshold: None,
    };
    assert!(read(&presidio, Some(200), b"{}", "").is_err());
    assert!(read(&presidio, Some(200), b"[{\"start\":1}]", "x").is_err());
}

#[test]
fn each_message_is_one_text_with_its_author_in_every_api() {
    let chat = json!({"messages": [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {"url": "x"}}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"q\":1}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "result"}]});
    let got = message_texts(chat.as_object().unwrap());
    assert_eq!(
        got,
        vec![
            t(Role::System, "sys"),
            t(Role::User, "a\nb"),
            t(Role::Assistant, "{\"q\":1}"),
            t(Role::Tool, "result")
        ]
    );
    let messages = json!({"system": [{"type": "text", "text": "s"}], "messages": [
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "x", "content": [{"type": "text", "text": "r"}]}, {"type": "text", "text": "q"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "x", "name": "f", "input": {"a": 1}}]}]});
    assert_eq!(
        message_texts(messages.as_object().unwrap()),
        vec![
            t(Role::System, "s"),
            t(Role::Tool, "r"),
            t(Role::User, "q"),
            t(Role::Assistant, "{\"a\":1}")
        ]
    );
    let responses = json!({"instructions": "i", "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "u"}]},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "out"}]});
    assert_eq!(
        message_texts(responses.as_object().unwrap()),
        vec![
            t(Role::System, "i"),
            t(Role::User, "u"),
            t(Role::Assistant, "{}"),
            t(Role::Tool, "out")
        ]
    );
    let embeddings = json!({"input": ["x", "y", [1, 2]]});
    assert_eq!(
        message_texts(embeddings.as_object().unwrap()),
        vec![t(Role::User, "x"), t(Role::User, "y")]
    );
}

#[test]
fn replacements_are_kept_per_message_only_when_each_lies_in_one() {
    let per = per_text(
        &["a@b.co".to_string()],
        &["mail a@b.co", "no", "again a@b.co"],
    )
    .unwrap();
    assert_eq!(
        per,
        vec![
            vec!["a@b.co".to_string()],
            vec![],
            vec!["a@b.co".to_string()]
        ]
    );
    assert!(per_text(&["co\n\nx".to_string()], &["a@b.co", "x"]).is_none());

    let id = kept::id(7, "hello");
    assert_ne!(id, kept::id(8, "hello"), "another check asks again");
    let entry = kept::encode(&id, 1_000, &["a@b.co".to_string()]).unwrap();
    assert_eq!(
        kept::decode(&entry, &id, 999),
        Some(vec!["a@b.co".to_string()])
    );
    assert_eq!(kept::decode(&entry, &id, 1_000), None, "expired");
    assert_eq!(
        kept::decode(&entry, &kept::id(7, "other"), 0),
        None,
        "a clash is no hit"
    );
    let clean = kept::encode(&id, 5, &[]).unwrap();
    assert_eq!(kept::decode(&clean, &id, 0), Some(vec![]));
    assert!(kept::encode(&id, 5, &["x".repeat(kept::MAX_KEPT_BYTES + 1)]).is_none());
    assert!(kept::encode(&id, 5, &["two\nlines".to_string()]).is_none());
    assert!(kept::key(&id).starts_with("portcullis.gv."));
}

#[test]
fn an_answers_texts_are_read_and_redacted_in_its_apis_shape() {
    use crate::guard::texts::Shape;
    let mut chat = json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "mail a@b.co",
        "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{\"to\":\"a@b.co\"}"}}]}}]})
    .as_object()
    .unwrap()
    .clone();
    let texts = answer_texts(Shape::Chat, &mut chat);
    assert!(texts.iter().all(|t| t.role == Role::Assistant));
    assert!(texts.iter().any(|t| t.text == "mail a@b.co"), "{texts:?}");
    assert_eq!(
        redact_answer(Shape::Chat, &mut chat, "x", &["a@b.co".to_string()]),
        2
    );
    assert_eq!(
        chat["choices"][0]["message"]["content"],
        "mail [REDACTED:x]"
    );
    let args: Value = serde_json::from_str(
        chat["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
            .as_str()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(args["to"], "[REDACTED:x]", "the arguments stay JSON");
    let mut msg = json!({"type": "message", "role": "assistant", "content": [{"type": "text", "text": "hi a@b.co"}]})
        .as_object()
        .unwrap()
        .clone();
    assert_eq!(answer_texts(Shape::Messages, &mut msg)[0].text, "hi a@b.co");
    assert_eq!(
        redact_answer(Shape::Messages, &mut msg, "x", &["a@b.co".to_string()]),
        1
    );
    assert_eq!(msg["content"][0]["text"], "hi [REDACTED:x]");
}

#[test]
fn a_tool_calls_argument_strings_are_texts_and_are_redacted_in_place() {
    let mut call =
        json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "send",
        "arguments": {"to": "a@b.co", "n": 3, "cc": ["a@b.co", "c@d.io"], "deep": {"note": ""}}}})
        .as_object()
        .unwrap()
        .clone();
    let texts: Vec<String> = argument_texts(&call).into_iter().map(|t| t.text).collect();
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(redact_arguments(&mut call, "x", &["a@b.co".to_string()]), 2);
    assert_eq!(call["params"]["arguments"]["to"], "[REDACTED:x]");
    assert_eq!(
        call["params"]["arguments"]["cc"],
        json!(["[REDACTED:x]", "c@d.io"])
    );
    assert_eq!(call["params"]["arguments"]["n"], 3);
    assert_eq!(read_message(&write_message(&call)), Some(call));
    assert_eq!(read_message(b"[1]"), None);
}
