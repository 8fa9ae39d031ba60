//! What each fuzz target asserts. Not only "no panic": a body the gateway
//! accepts has a cache key that covers its messages and a rewrite that keeps
//! them; two bodies with different messages never share a key; a stream read
//! in pieces reads as it does whole; a decoded header map encodes back.
//! Builds use debug assertions (`cargo fuzz run -a`), so arithmetic that
//! would wrap in release panics here and is found.

use portcullis_core::request::ChatRequest;
use portcullis_core::{cache, config, headers, ratelimit, sse, strict, usage};
use serde_json::Value;

#[path = "../../collector/src/since.rs"]
mod since_query;

/// Two inputs from one: split at the first NUL.
fn two(data: &[u8]) -> (&[u8], Option<&[u8]>) {
    match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    }
}

fn key(r: &ChatRequest) -> cache::Hash {
    cache::key("primary", "gpt-4o-mini", r, false, None).expect("an accepted body has a key")
}

/// The request parser, the cache key and the body rewrite.
pub fn request(data: &[u8]) {
    let (a, b) = two(data);
    // The one strict pass accepts what a JSON tree accepts, less duplicate
    // gateway fields (which it refuses on purpose).
    if let Ok(text) = std::str::from_utf8(a) {
        if text.trim_start().starts_with('{') {
            let tree = serde_json::from_str::<Value>(text).is_ok();
            match strict::read(text) {
                Ok(_) => assert!(tree, "the strict pass accepted what a tree refuses"),
                Err(e) if tree => assert!(e.to_string().contains("duplicate field"), "{e}"),
                Err(_) => {}
            }
        }
    }
    let Ok(ra) = ChatRequest::parse(a) else {
        return;
    };
    accepted_request(&ra);
    if let Some(Ok(rb)) = b.map(ChatRequest::parse) {
        accepted_request(&rb);
        let messages = |r: &ChatRequest| r.document().expect("accepted: a tree").get("messages").cloned();
        if messages(&ra) != messages(&rb) {
            assert_ne!(key(&ra), key(&rb), "different messages share a cache key");
        }
    }
}

fn accepted_request(r: &ChatRequest) {
    let doc = r.document().expect("an accepted body reads as a tree");
    let messages = doc.get("messages").expect("an accepted body has messages");
    assert!(messages.as_array().is_some_and(|m| !m.is_empty()));
    assert!(!r.model.is_empty());
    for ask_usage in [false, true] {
        let id = "provider/model \"2\"";
        let out = r.body_for_with(id, ask_usage).expect("an accepted body can be rewritten");
        let v: Value = serde_json::from_slice(&out).expect("the rewrite is JSON");
        assert_eq!(v.get("messages"), Some(messages), "the rewrite lost messages");
        assert_eq!(v["model"], id);
        for (k, val) in doc {
            if k == "model" || (ask_usage && k == "stream_options") {
                continue;
            }
            assert_eq!(v.get(k), Some(val), "the rewrite changed `{k}`");
        }
    }
    // The key follows the document, not its bytes...
    let again = serde_json::to_vec(doc).expect("a parsed tree serializes");
    let same = ChatRequest::parse(&again).expect("an accepted document, re-serialized, is accepted");
    assert_eq!(key(r), key(&same), "the key depends on bytes, not the document");
    // ...and covers every message: one more changes it.
    let mut more = doc.clone();
    if let Some(Value::Array(m)) = more.get_mut("messages") {
        m.push(serde_json::json!({"role": "user", "content": "one more"}));
    }
    let more = ChatRequest::parse(&serde_json::to_vec(&more).expect("serializes"))
        .expect("one more message is still a request");
    assert_ne!(key(r), key(&more), "a message was left out of the key");
    // The reservation estimate saturates on any size.
    let (prompt, completion) = ratelimit::reservation(r.body_len(), r.max_tokens, 1024);
    let _ = prompt.saturating_add(completion);
}

/// A stream read in pieces reads as it does whole: the same events on, the
/// same completion and usage.
pub fn sse(data: &[u8]) {
    let Some((&flags, stream)) = data.split_first() else {
        return;
    };
    let strip = flags & 1 == 1;
    let mut whole = sse::Relay::new(strip);
    let mut out_whole = whole.chunk(stream);
    out_whole.extend(whole.finish());
    let mut pieces = sse::Relay::new(strip);
    let mut out_pieces = Vec::new();
    let mut rest = stream;
    let mut step = usize::from(flags >> 1) + 1;
    while !rest.is_empty() {
        let n = step.min(rest.len());
        let (chunk, tail) = rest.split_at(n);
        out_pieces.extend(pieces.chunk(chunk));
        rest = tail;
        step = step % 7 + 1;
    }
    out_pieces.extend(pieces.finish());
    if strip {
        assert_eq!(out_whole, out_pieces, "stripped stream depends on chunking");
    }
    assert_eq!(whole.assembly, pieces.assembly, "assembly depends on chunking");
    if let Some(c) = whole.assembly.completion() {
        let _ = sse::completion_text(&c);
        let _ = sse::replay(&c, strip);
    }
    if let Some(u) = whole.assembly.usage.as_ref() {
        let _ = usage::Usage::from_usage(u).map(|u| u.total());
    }
}

/// The plugin config compiler: a config compiles, or is refused with a
/// message; the same bytes always give the same verdict.
pub fn config(data: &[u8]) {
    match config::compile(data) {
        Ok(_) => assert!(config::compile(data).is_ok()),
        Err(msg) => assert!(!msg.is_empty(), "a refusal without a message"),
    }
}

/// Header maps as the host passes them: what decodes encodes back to the
/// same pairs.
pub fn headers(data: &[u8]) {
    if let Some(pairs) = headers::decode_pairs(data) {
        let bytes = headers::encode_pairs(&pairs);
        assert_eq!(headers::decode_pairs(&bytes).as_ref(), Some(&pairs));
    }
}

/// The usage reader, whole and from an answer's tail, and the copy taken as
/// an answer passes: in pieces it keeps what it keeps whole.
pub fn usage(data: &[u8]) {
    let (keep_byte, body) = data.split_first().map_or((0, data), |(k, b)| (*k, b));
    let keep = usize::from(keep_byte) * 64;
    let whole = usage::Usage::from_body(body);
    let _ = usage::Usage::from_tail(body).map(|u| u.total());
    let mut copy = usage::AnswerCopy::new(keep);
    for chunk in body.chunks(usize::from(keep_byte % 13) + 1) {
        copy.push(chunk);
    }
    let (u, kept) = copy.finish();
    if keep == 0 {
        // Nobody keeps it: only its usage is read, from the tail.
        assert!(kept.is_none());
        if body.len() <= usage::TAIL {
            assert_eq!(u, usage::Usage::from_tail(body));
        }
    } else if body.len() <= keep.max(usage::TAIL) {
        assert_eq!(kept.as_deref(), Some(body), "a small answer is kept whole");
        assert_eq!(u, whole);
    } else {
        assert!(kept.is_none());
    }
}

/// The collector's `since` query value.
pub fn since(data: &[u8]) {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    let now = 1_764_000_000_000_i64;
    if let Ok(v) = since_query::parse_since(Some(s), now) {
        if s.trim().parse::<i64>().is_err() {
            assert!(v <= now, "a span back from now is in the past: {s:?} -> {v}");
        }
    }
}

/// The rate limit service's answer: whatever comes back is a verdict (an
/// admission only when the service said OK), and a request encodes for any
/// client name and numbers.
pub fn rls(data: &[u8]) {
    use portcullis_core::rls::{self, Limit, Verdict};
    let descriptors = usize::from(data.first().copied().unwrap_or(0) % 4);
    let answer = data.get(1..).unwrap_or_default();
    let v = rls::verdict(answer, descriptors);
    if let Verdict::Ok(_) = v {
        let r = rls::decode_response(answer).expect("an admission was a readable answer");
        assert_eq!(r.overall, rls::Code::Ok, "admitted without an OK");
    }
    let name = String::from_utf8_lossy(answer);
    let n = u32::from_le_bytes([0, 1, 2, 3].map(|i| data.get(i).copied().unwrap_or(0)));
    for limit in [Limit::RequestsPerMinute, Limit::TokensPerMinute, Limit::BudgetPerDay(u64::from(n))] {
        let m = rls::encode_request(&[limit.descriptor(&name, n)], n);
        assert!(m.len() > name.len());
    }
}

/// Guardrails on a request and on a stream: no panic on any prompt or
/// stream; a redacted prompt is still a request the gateway accepts; a
/// stream reads the same through the checks whole or split anywhere.
pub fn guard(data: &[u8]) {
    use portcullis_core::guard::{self, stream::StreamGuard, Stage};
    static GW: std::sync::OnceLock<config::Gateway> = std::sync::OnceLock::new();
    let gw = GW.get_or_init(|| {
        config::compile(GUARD_CONFIG.as_bytes()).expect("the fuzz guard config compiles")
    });
    let g = gw.guardrails.as_ref().expect("guardrails configured");
    let (a, b) = two(data);
    if let Ok(r) = ChatRequest::parse(a) {
        let active = g.active(Stage::Input, "c", 0);
        let out = guard::check_input(g, &active, 0, r.body());
        if let Some(doc) = &out.rewritten {
            ChatRequest::from_document(doc).expect("a redacted request is still accepted");
        }
        assert_eq!(out.rewritten.is_some(), out.changed && out.denied.is_none(), "a redaction always rewrites");
    }
    let stream = b.unwrap_or(a);
    let active = g.active(Stage::Output, "c", 0);
    let run = |split: usize| {
        let mut sg = StreamGuard::new(g, active.clone(), true);
        let (x, y) = stream.split_at(split.min(stream.len()));
        let mut out = sg.chunk(g, x);
        out.extend(sg.chunk(g, y));
        out.extend(sg.finish(g));
        out
    };
    let whole = run(stream.len());
    let split = usize::from(stream.first().copied().unwrap_or(0));
    assert_eq!(whole, run(split), "the checks read a split stream differently");
    let _ = guard::check_answer(g, &active, true, stream);
}

const GUARD_CONFIG: &str = r#"
providers: [{name: p, cluster: c, host: h, models: [{name: m}]}]
clients: [{name: c, key_sha256: "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3"}]
guardrails:
  lookbehind_bytes: 8
  input:
    - {name: pii, pii: [all], action: redact}
    - {name: words, max_words: 50, action: log}
    - {name: secret, regex: "(?i)top\\s+secret", action: redact}
  output:
    - {name: pii, pii: [all], action: redact}
    - {name: stop, regex: "forbidden", action: deny}
    - {name: size, max_words: 40, action: log}
    - {name: shape, json_schema: {type: object, required: [a]}, action: log}
"#;

/// Anthropic's Messages API both ways: any chat request translates or is
/// refused with a 400; any answer, error or stream reads or is refused
/// without a panic; a stream translates the same whole or split anywhere.
pub fn anthropic(data: &[u8]) {
    use portcullis_core::translate::anthropic::{self, Options, Stream};
    let (a, b) = two(data);
    if let Ok(r) = ChatRequest::parse(a) {
        for drop_unsupported in [false, true] {
            let opts = Options { default_max_tokens: 100, drop_unsupported };
            match anthropic::request(r.document().expect("accepted: a tree"), "claude", &opts) {
                Ok((body, _)) => {
                    let v: Value = serde_json::from_slice(&body).expect("the translation is JSON");
                    assert!(v["messages"].is_array() && v["max_tokens"].is_u64(), "{v}");
                }
                Err(e) => assert_eq!(e.status, 400, "{}", e.message),
            }
        }
    }
    let stream = b.unwrap_or(a);
    let _ = anthropic::answer(stream, 1);
    let _ = anthropic::error(stream, 400);
    let run = |split: usize| {
        let mut s = Stream::new(1, true);
        let (x, y) = stream.split_at(split.min(stream.len()));
        let mut out = s.push(x);
        out.extend(s.push(y));
        out.extend(s.finish());
        out
    };
    let whole = run(stream.len());
    let split = usize::from(stream.first().copied().unwrap_or(0));
    assert_eq!(whole, run(split), "a split stream translates differently");
}
