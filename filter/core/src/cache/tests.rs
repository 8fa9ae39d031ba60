//! Tests of `cache`.

use super::*;

/// The key of an accepted request (always one).
fn key(p: &str, m: &str, r: &ChatRequest, normalize: bool, client: Option<&str>) -> Hash {
    super::key(p, m, r, normalize, client).unwrap()
}
use crate::shared::store::MemStore;
use sha2::{Digest, Sha256};
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

/// A parsed request (a `model` is added when the text has none: the
/// key ignores it).
fn doc(s: &str) -> ChatRequest {
    let body = if s.contains(r#""model""#) {
        s.to_string()
    } else {
        s.replacen('{', r#"{"model":"x","#, 1)
    };
    ChatRequest::parse(body.as_bytes()).unwrap()
}

const CFG: CacheConfig = CacheConfig {
    sets: 4,
    ways: 2,
    ttl_ms: 1_000,
    max_entry_bytes: 100,
    normalize: false,
    per_client: false,
    worker_bytes: 0,
    worker_ttl_ms: 0,
    shared: None,
    semantic: None,
};

#[test]
fn key_is_the_hash_of_the_canonical_document() {
    let d = doc(
        r#"{"temperature":0.5,"model":"x","messages":[{"role":"user","content":"hi"}],"stream":true}"#,
    );
    let mut h = blake3::Hasher::new();
    h.update(b"portcullis-cache-v2\0p\0m\0\0");
    h.update(br#"{"messages":[{"content":"hi","role":"user"}],"temperature":0.5}"#);
    let want: Hash = *h.finalize().as_bytes();
    assert_eq!(key("p", "m", &d, false, None), want);
}

/// The key read in place (#29: texts not copied) is the key of the
/// document tree the gateway used before: the same bytes are hashed, for
/// escapes, non-ASCII text, nested objects out of order, repeated keys,
/// numbers in every spelling and whitespace between tokens.
#[test]
fn the_key_read_in_place_equals_the_key_of_the_document_tree() {
    fn tree_key(r: &ChatRequest) -> Hash {
        let mut h = blake3::Hasher::new();
        h.update(b"portcullis-cache-v2\0p\0m\0\0");
        let doc: serde_json::Map<String, Value> = serde_json::from_slice(r.body()).unwrap();
        let kept: serde_json::Map<String, Value> = doc
            .into_iter()
            .filter(|(k, _)| !IGNORED_FIELDS.contains(&k.as_str()))
            .collect();
        h.update(&serde_json::to_vec(&kept).unwrap());
        *h.finalize().as_bytes()
    }
    for body in [
        r#"{"model":"x","messages":[{"role":"user","content":"hi"}]}"#,
        r#"{ "model" : "x" , "messages" : [ { "content" : "tab\there \"quoted\" \u00e9 caf\u00e9 \ud83d\ude00 \/" , "role" : "user" } ] }"#,
        r#"{"model":"x","messages":[{"role":"user","content":"café 😀 <b>&amp;</b>"}],"metadata":{"z":1,"a":{"y":[1,2,{"c":null,"b":true}],"x":false}}}"#,
        r#"{"model":"x","messages":[{"role":"user","content":"a"}],"temperature":1.0,"top_p":1e-2,"seed":18446744073709551615,"n":-0,"logit_bias":{"50256":-100,"11":2.5e3},"presence_penalty":-1.25}"#,
        r#"{"model":"x","messages":[{"role":"user","content":"first"}],"temperature":0.1,"temperature":0.9,"stop":null}"#,
        r#"{"model":"x","messages":[{"role":"user","content":[{"type":"text","text":"x"},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBO+/="}}]}],"user":"u","stream":false}"#,
    ] {
        let r = ChatRequest::parse(body.as_bytes()).unwrap();
        assert_eq!(key("p", "m", &r, false, None), tree_key(&r), "{body}");
    }
}

#[test]
fn key_ignores_field_order_and_non_answer_fields() {
    let a = doc(
        r#"{"model":"x","messages":[{"role":"user","content":"hi"}],"temperature":0.5,"stream":true,"user":"u1"}"#,
    );
    let b = doc(
        r#"{"temperature":0.5,"messages":[{"content":"hi","role":"user"}],"model":"y","stream_options":{"include_usage":true}}"#,
    );
    assert_eq!(
        key("p", "m", &a, false, None),
        key("p", "m", &b, false, None)
    );
}

#[test]
fn key_changes_with_every_answer_field_provider_model_and_scope() {
    let base = r#"{"messages":[{"role":"user","content":"hi"}]}"#;
    let k = key("p", "m", &doc(base), false, None);
    assert_ne!(k, key("q", "m", &doc(base), false, None));
    assert_ne!(k, key("p", "n", &doc(base), false, None));
    assert_ne!(k, key("p", "m", &doc(base), false, Some("client-a")));
    for extra in [
        r#""temperature":1"#,
        r#""top_p":0.9"#,
        r#""max_tokens":5"#,
        r#""seed":1"#,
        r#""stop":["x"]"#,
        r#""tools":[]"#,
        r#""tool_choice":"none""#,
        r#""response_format":{"type":"json_object"}"#,
    ] {
        let d = format!(r#"{{"messages":[{{"role":"user","content":"hi"}}],{extra}}}"#);
        assert_ne!(k, key("p", "m", &doc(&d), false, None), "{extra}");
    }
}

#[test]
fn normalization_folds_case_and_whitespace_only_when_on() {
    let a = doc(r#"{"messages":[{"role":"user","content":"Hello   World\n"}]}"#);
    let b = doc(r#"{"messages":[{"role":"user","content":"hello world"}]}"#);
    assert_ne!(
        key("p", "m", &a, false, None),
        key("p", "m", &b, false, None)
    );
    assert_eq!(key("p", "m", &a, true, None), key("p", "m", &b, true, None));
    let parts =
        doc(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"HELLO  world"}]}]}"#);
    let parts2 =
        doc(r#"{"messages":[{"role":"user","content":[{"type":"text","text":"hello world"}]}]}"#);
    assert_eq!(
        key("p", "m", &parts, true, None),
        key("p", "m", &parts2, true, None)
    );
}

#[test]
fn sizing() {
    assert_eq!(CacheConfig::sized(1 << 20, 1 << 14, 4), (16, 4));
    assert_eq!(CacheConfig::sized(100, 1000, 4), (1, 1));
    assert_eq!(CacheConfig::sized(3000, 1000, 4), (1, 3));
}

fn h(n: u8, set: u32) -> Hash {
    // A hash landing in `set` of CFG.sets.
    let mut x = [n; 32];
    x[..8].copy_from_slice(&u64::from(set).to_le_bytes());
    x
}

#[test]
fn miss_store_hit_then_expiry() {
    let s = MemStore::default();
    let k = h(1, 0);
    assert_eq!(lookup(&s, &CFG, &k, 0).unwrap(), None);
    assert!(matches!(
        insert(&s, &CFG, &k, b"answer", 0).unwrap(),
        StoreOutcome::Stored(_)
    ));
    assert_eq!(
        lookup(&s, &CFG, &k, 999).unwrap().as_deref(),
        Some(&b"answer"[..])
    );
    assert_eq!(lookup(&s, &CFG, &k, 1_000).unwrap(), None, "expired at ttl");
}

#[test]
fn full_set_evicts_its_oldest_slot_and_other_sets_are_untouched() {
    let s = MemStore::default();
    let other = h(9, 1);
    insert(&s, &CFG, &other, b"other", 0).unwrap();
    let (a, b, c) = (h(1, 0), h(2, 0), h(3, 0));
    insert(&s, &CFG, &a, b"a", 10).unwrap();
    insert(&s, &CFG, &b, b"bb", 20).unwrap();
    let out = insert(&s, &CFG, &c, b"ccc", 30).unwrap();
    assert_eq!(
        out,
        StoreOutcome::Stored(Stored {
            evicted: true,
            bytes_delta: 2
        }),
        "replaced `a` (1 byte)"
    );
    assert_eq!(lookup(&s, &CFG, &a, 31).unwrap(), None);
    assert_eq!(lookup(&s, &CFG, &b, 31).unwrap().unwrap(), b"bb");
    assert_eq!(lookup(&s, &CFG, &c, 31).unwrap().unwrap(), b"ccc");
    assert_eq!(lookup(&s, &CFG, &other, 31).unwrap().unwrap(), b"other");
}

#[test]
fn expired_slots_are_reused_before_live_ones_and_refresh_replaces_in_place() {
    let s = MemStore::default();
    let (a, b, c) = (h(1, 0), h(2, 0), h(3, 0));
    insert(&s, &CFG, &a, b"a", 0).unwrap();
    insert(&s, &CFG, &b, b"b", 500).unwrap();
    // At 1200 `a` has expired (ttl 1000) though `b` is live.
    let out = insert(&s, &CFG, &c, b"c", 1_200).unwrap();
    assert_eq!(
        out,
        StoreOutcome::Stored(Stored {
            evicted: false,
            bytes_delta: 0
        })
    );
    assert_eq!(lookup(&s, &CFG, &b, 1_201).unwrap().unwrap(), b"b");
    let out = insert(&s, &CFG, &b, b"b2", 1_300).unwrap();
    assert_eq!(
        out,
        StoreOutcome::Stored(Stored {
            evicted: false,
            bytes_delta: 1
        })
    );
    assert_eq!(lookup(&s, &CFG, &b, 1_301).unwrap().unwrap(), b"b2");
}

#[test]
fn filling_far_past_capacity_keeps_the_table_bounded() {
    let s = MemStore::default();
    let mut held: i64 = 0;
    for i in 0..(CFG.sets * CFG.ways * 10) {
        let mut k = [0u8; 32];
        k[..4].copy_from_slice(&i.to_le_bytes());
        let k: Hash = Sha256::digest(k).into();
        if let StoreOutcome::Stored(st) = insert(&s, &CFG, &k, &[7u8; 90], u64::from(i)).unwrap() {
            held += st.bytes_delta;
        }
    }
    assert!(held <= (CFG.sets * CFG.ways) as i64 * 90, "{held}");
    assert!(held as usize <= CFG.capacity_bytes());
    assert_eq!(
        insert(&s, &CFG, &h(1, 0), &[0u8; 101], 0).unwrap(),
        StoreOutcome::TooLarge
    );
}

#[test]
fn slot_reused_by_a_racing_writer_reads_as_a_miss() {
    let s = MemStore::default();
    let (a, b) = (h(1, 0), h(2, 0));
    insert(&s, &CFG, &a, b"a", 0).unwrap();
    // Another worker wrote b's data into a's slot but lost the index race.
    let mut slot = b.to_vec();
    slot.extend_from_slice(b"b");
    s.set(&slot_key(0, 0), &slot, None).unwrap();
    assert_eq!(lookup(&s, &CFG, &a, 1).unwrap(), None);
}

#[test]
fn cache_control_directives() {
    assert_eq!(directive(None), Directive::Normal);
    assert_eq!(directive(Some("no-cache")), Directive::Refresh);
    assert_eq!(directive(Some("max-age=0, No-Store")), Directive::Bypass);
    assert_eq!(directive(Some("max-age=10")), Directive::Normal);
}

#[test]
fn a_store_from_the_index_its_lookup_read_keeps_what_others_stored_since() {
    let s = MemStore::default();
    let (a, b) = (h(1, 0), h(2, 0));
    // The set's index exists (a set never written has no CAS token to
    // guard a stale write, so its first store reads again).
    insert(&s, &CFG, &h(9, 0), b"x", 0).unwrap();
    let (found, seen) = lookup_seen(&s, &CFG, &a, 0).unwrap();
    assert_eq!(found, None);
    // Another worker stores b in the same set while a's answer is awaited.
    insert(&s, &CFG, &b, b"b", 5).unwrap();
    // a's store starts from the stale index: its CAS fails, it reads again
    // and takes another way, so b survives.
    assert!(matches!(
        insert_seen(&s, &CFG, &a, b"a", 10, Some(seen)).unwrap(),
        StoreOutcome::Stored(_)
    ));
    assert_eq!(
        lookup(&s, &CFG, &a, 11).unwrap().as_deref(),
        Some(&b"a"[..])
    );
    assert_eq!(
        lookup(&s, &CFG, &b, 11).unwrap().as_deref(),
        Some(&b"b"[..])
    );
    // With nothing in between, the index the lookup read is the one stored
    // over (in another set, with one way taken).
    let (c, d) = (h(3, 1), h(4, 1));
    insert(&s, &CFG, &c, b"c", 12).unwrap();
    let (_, seen) = lookup_seen(&s, &CFG, &d, 12).unwrap();
    insert_seen(&s, &CFG, &d, b"d", 12, Some(seen)).unwrap();
    for (k, v) in [(&a, &b"a"[..]), (&b, b"b"), (&c, b"c"), (&d, b"d")] {
        assert_eq!(lookup(&s, &CFG, k, 13).unwrap().as_deref(), Some(v));
    }
}

#[test]
fn an_index_claimed_before_its_slot_is_written_reads_as_a_miss() {
    let s = MemStore::default();
    let (a, b) = (h(1, 0), h(2, 0));
    insert(&s, &CFG, &a, b"a", 0).unwrap();
    // b's writer claimed way 0 (a's, as if a had expired) and has not yet
    // written the slot, which still holds a's answer.
    let (idx, cas) = s.get(&index_key(0)).unwrap();
    let mut index = decode_index(idx.as_deref(), CFG.ways);
    index[0].hash = b;
    s.set(&index_key(0), &encode_index(&index), cas).unwrap();
    assert_eq!(lookup(&s, &CFG, &b, 1).unwrap(), None);
}

#[test]
fn prepare_gives_every_set_an_index_and_keeps_those_there() {
    let s = MemStore::default();
    let a = h(1, 2);
    insert(&s, &CFG, &a, b"a", 0).unwrap();
    prepare(&s, &CFG).unwrap();
    for set in 0..CFG.sets {
        let (idx, cas) = s.get(&index_key(set)).unwrap();
        assert_eq!(idx.map(|b| b.len()), Some(CFG.ways as usize * WAY_LEN));
        assert!(cas.is_some(), "set {set} has a CAS token");
    }
    assert_eq!(lookup(&s, &CFG, &a, 1).unwrap().as_deref(), Some(&b"a"[..]));
}
