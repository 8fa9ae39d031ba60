use super::*;
use crate::api::Api;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

fn tier() -> SemanticTier {
    SemanticTier {
        embedding_model: "emb".into(),
        threshold_ppm: 900_000,
        models: vec!["m".into()],
        multi_turn: false,
        cluster: "self".into(),
        timeout_ms: 1000,
        scope: crate::cache::SemanticScope::default(),
    }
}

/// The default keeps each key's near-duplicates its own; a team scope
/// joins a team's keys; only `shared` crosses keys (and then only as the
/// exact tiers do). Keys and teams never share an owner.
#[test]
fn a_semantic_scope_names_whose_prompts_are_compared() {
    use crate::cache::SemanticScope::*;
    assert_eq!(crate::cache::SemanticScope::default(), Client);
    let owner =
        |s: crate::cache::SemanticScope, c: &str, t: Option<&str>, per: bool| s.owner(c, t, per);
    assert_eq!(
        owner(Client, "a", Some("t"), false).as_deref(),
        Some("key:a")
    );
    assert_ne!(
        owner(Client, "a", None, false),
        owner(Client, "b", None, false)
    );
    assert_eq!(
        owner(Team, "a", Some("t"), false),
        owner(Team, "b", Some("t"), false)
    );
    assert_ne!(
        owner(Team, "a", Some("t"), false),
        owner(Team, "a", Some("u"), false)
    );
    assert_eq!(owner(Team, "a", None, false).as_deref(), Some("key:a"));
    assert_ne!(
        owner(Team, "x", Some("x"), false),
        owner(Client, "x", None, false)
    );
    assert_eq!(owner(Shared, "a", Some("t"), false), None);
    assert_eq!(
        owner(Shared, "a", Some("t"), true).as_deref(),
        Some("key:a")
    );
}

fn req(body: &str) -> ChatRequest {
    ChatRequest::parse(body.as_bytes()).unwrap()
}

fn p(body: &str) -> Option<Prompt> {
    prompt(&req(body), false)
}

#[test]
fn only_a_single_turn_of_text_without_tools_is_eligible() {
    let one = p(r#"{"model":"m","messages":[{"role":"system","content":"Be terse."},{"role":"user","content":"What is 2 + 2?"}]}"#).unwrap();
    assert_eq!(one.text, "What is 2 + 2?");
    let parts =
        p(r#"{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}"#)
            .unwrap();
    assert_eq!(parts.text, "hi");
    for refused in [
        // A conversation, a tool call, a tool's answer.
        r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"c"}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":null,"tool_calls":[]}]}"#,
        r#"{"model":"m","messages":[{"role":"tool","content":"a","tool_call_id":"x"}]}"#,
        // Tools offered, an image, several choices, audio out.
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],"tools":[]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}]}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],"n":2}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"a"}],"modalities":["audio"]}"#,
        // Nothing to embed.
        r#"{"model":"m","messages":[{"role":"user","content":"  "}]}"#,
    ] {
        assert_eq!(p(refused), None, "{refused}");
    }
    // A conversation when the config allows it.
    let conv = r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"assistant","content":"b"},{"role":"user","content":"c"}]}"#;
    assert!(prompt(&req(conv), true).is_some());
    // Other APIs never.
    let mut other = req(r#"{"model":"m","messages":[{"role":"user","content":"a"}]}"#);
    other.api = Api::Messages;
    assert_eq!(prompt(&other, true), None);
}

#[test]
fn prompts_share_a_space_only_when_all_but_the_users_words_agree() {
    let space_of = |body: &str| space("primary", "m", None, &tier(), &p(body).unwrap());
    let base = space_of(
        r#"{"model":"m","messages":[{"role":"user","content":"What is the capital of France?"}],"temperature":0}"#,
    );
    // Other words, the same numbers (none): the same space; `stream` and
    // `user` do not count.
    assert_eq!(
        base,
        space_of(
            r#"{"model":"m","messages":[{"role":"user","content":"Tell me France's capital"}],"temperature":0,"stream":true,"user":"u"}"#
        )
    );
    // Another temperature, a system prompt, a number: another space.
    for other in [
        r#"{"model":"m","messages":[{"role":"user","content":"What is the capital of France?"}],"temperature":1}"#,
        r#"{"model":"m","messages":[{"role":"system","content":"Lie."},{"role":"user","content":"What is the capital of France?"}],"temperature":0}"#,
        r#"{"model":"m","messages":[{"role":"user","content":"What was the capital of France in 1500?"}],"temperature":0}"#,
    ] {
        assert_ne!(base, space_of(other), "{other}");
    }
    // Numbers compare exactly, decimals included.
    let n = |t: &str| numbers(t);
    assert_eq!(n("17 times 23"), "17,23,");
    assert_eq!(n("3.5 kg, not 3.50."), "3.5,3.50,");
    assert_ne!(n("17 times 23"), n("17 times 24"));
    // Another scope or route: another space.
    let pr = p(r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#).unwrap();
    assert_ne!(
        space("primary", "m", Some("a"), &tier(), &pr),
        space("primary", "m", Some("b"), &tier(), &pr)
    );
    assert_ne!(
        space("primary", "m", None, &tier(), &pr),
        space("backup", "m", None, &tier(), &pr)
    );
}

#[test]
fn an_embedding_is_read_normalized_or_not_at_all() {
    let v = read_embedding(br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[3.0,4.0]}],"model":"emb"}"#).unwrap();
    assert_eq!(v, vec![0.6, 0.8]);
    for bad in [
        br#"{"data":[]}"#.as_slice(),
        br#"{"data":[{"embedding":[0.0,0.0]}]}"#,
        br#"{"data":[{"embedding":[]}]}"#,
        br#"{"error":{"message":"no"}}"#,
        b"not json",
    ] {
        assert_eq!(read_embedding(bad), None);
    }
}

#[test]
fn nearest_answers_are_served_only_whole_for_their_space_and_threshold() {
    let space_a = [1u8; 32];
    let answer = |found: bool, space: &[u8], sim: u64, expires: u64| {
        let mut m = Vec::new();
        pb::uint(&mut m, 1, u64::from(found));
        pb::bytes(&mut m, 2, space);
        pb::bytes(&mut m, 3, b"{\"ok\":1}");
        pb::uint(&mut m, 4, sim);
        pb::uint(&mut m, 5, 100);
        pb::uint(&mut m, 6, expires);
        m
    };
    let ok = answer(true, &space_a, 950_000, 5_000);
    let near = decode_nearest(&ok, &space_a, 900_000, 1_000, 100).unwrap();
    assert_eq!(
        (near.similarity_ppm, near.stored_ms, near.expires_ms),
        (950_000, 100, 5_000)
    );
    assert_eq!(
        decode_nearest(&ok, &[2; 32], 900_000, 1_000, 100),
        None,
        "another space"
    );
    assert_eq!(
        decode_nearest(&ok, &space_a, 960_000, 1_000, 100),
        None,
        "below the threshold"
    );
    assert_eq!(
        decode_nearest(&ok, &space_a, 900_000, 5_000, 100),
        None,
        "expired"
    );
    assert_eq!(
        decode_nearest(&ok, &space_a, 900_000, 1_000, 4),
        None,
        "too large"
    );
    assert_eq!(
        decode_nearest(
            &answer(true, &space_a, 2_000_000, 5_000),
            &space_a,
            0,
            1_000,
            100
        ),
        None
    );
    assert_eq!(
        decode_nearest(
            &answer(false, &space_a, 950_000, 5_000),
            &space_a,
            0,
            1_000,
            100
        ),
        None
    );
    for cut in 0..ok.len() {
        assert_eq!(
            decode_nearest(&ok[..cut], &space_a, 900_000, 1_000, 100),
            None,
            "cut at {cut}"
        );
    }
    // The request carries the vector as packed little-endian floats.
    let req = encode_nearest(&space_a, &[0.5, -1.0], 900_000);
    let mut r = Reader::new(&req);
    assert_eq!(r.field().unwrap(), Some((1, Value::Bytes(&space_a[..]))));
    let mut floats = Vec::new();
    floats.extend_from_slice(&0.5f32.to_le_bytes());
    floats.extend_from_slice(&(-1.0f32).to_le_bytes());
    assert_eq!(r.field().unwrap(), Some((2, Value::Bytes(&floats[..]))));
    assert_eq!(r.field().unwrap(), Some((3, Value::Varint(900_000))));
    let _ = tier();
}

#[test]
fn the_embeddings_path_is_the_apis() {
    assert_eq!(Api::of_path(EMBEDDINGS_PATH), Some(Api::Embeddings));
}
