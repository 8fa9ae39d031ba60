//! What each fuzz target asserts. Not only "no panic": a body the gateway
//! accepts has a cache key that covers its messages and a rewrite that keeps
//! them; two bodies with different messages never share a key; a stream read
//! in pieces reads as it does whole; a decoded header map encodes back.
//! Builds use debug assertions (`cargo fuzz run -a`), so arithmetic that
//! would wrap in release panics here and is found.

use portcullis_core::request::ChatRequest;
use portcullis_core::{cache, compile, config, wire::headers, limits::ratelimit, wire::sse, wire::strict, usage};
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

/// The plugin config compiler. A config that compiles resolves every name
/// its YAML gives: each client by its key hash, each model and alias to the
/// model that declares it. A config that is refused names every unknown key
/// of the top level, of each provider and of each client.
pub fn config(data: &[u8]) {
    let yaml = std::str::from_utf8(data)
        .ok()
        .and_then(|t| serde_yaml::from_str::<serde_yaml::Value>(t).ok());
    match compile::compile(data) {
        Ok(gw) => {
            assert!(compile::compile(data).is_ok(), "the same bytes, another verdict");
            if let Some(y) = &yaml {
                compiled_names_resolve(y, &gw);
            }
        }
        Err(msg) => {
            assert!(!msg.is_empty(), "a refusal without a message");
            if let Some(y) = &yaml {
                unknown_keys_are_named(y, &msg);
            }
        }
    }
}

fn compiled_names_resolve(y: &serde_yaml::Value, gw: &config::Gateway) {
    let seq = |v: &serde_yaml::Value, k: &str| v.get(k).and_then(|s| s.as_sequence()).cloned().unwrap_or_default();
    for c in seq(y, "clients") {
        let (Some(name), Some(hash)) = (c["name"].as_str(), c["key_sha256"].as_str()) else { continue };
        let hash = compile::parse_sha256_hex(hash).expect("a compiled client's key hash parses");
        assert_eq!(gw.clients.get(&hash).map(|c| c.name.as_str()), Some(name), "client {name} does not resolve");
    }
    for p in seq(y, "providers") {
        for m in seq(&p, "models") {
            let Some(name) = m["name"].as_str() else { continue };
            let model = gw.names.get(name).and_then(|&i| gw.models.get(i));
            assert_eq!(model.map(|m| m.name.as_str()), Some(name), "model {name} does not resolve");
            for a in seq(&m, "aliases") {
                let Some(alias) = a.as_str() else { continue };
                let by_alias = gw.names.get(alias).and_then(|&i| gw.models.get(i));
                assert!(by_alias.is_some_and(|m| m.name == alias || m.aliases.iter().any(|x| x == alias)),
                    "alias {alias} of {name} does not resolve");
            }
        }
    }
}

fn unknown_keys_are_named(y: &serde_yaml::Value, msg: &str) {
    let named = |at: &str, v: &serde_yaml::Value, allowed: &[&str]| {
        let Some(m) = v.as_mapping() else { return };
        for k in m.keys() {
            let Some(k) = k.as_str() else { continue };
            if !allowed.contains(&k) {
                assert!(msg.contains(&format!("{at}: unknown key `{k}`")), "unknown key {at}.{k} not named in: {msg}");
            }
        }
    };
    named("config", y, &compile::section_keys(&[]).expect("top-level keys"));
    for (list, section) in [("providers", "providers[]"), ("clients", "clients[]")] {
        let allowed = compile::section_keys(&[section]).expect("section keys");
        for (i, item) in y.get(list).and_then(|s| s.as_sequence()).into_iter().flatten().enumerate() {
            named(&format!("{list}[{i}]"), item, &allowed);
        }
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
        // Nobody keeps it: only its usage is read, from the tail; a small
        // answer without usage comes back whole (the gateway counts its
        // text instead).
        if body.len() <= usage::TAIL {
            assert_eq!(u, usage::Usage::from_tail(body));
            assert_eq!(kept.is_some(), u.is_none());
        } else {
            assert!(kept.is_none());
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

/// The rate limit service's protocol: whatever comes back is a verdict (an
/// admission only when the service said OK); a request encodes for any
/// client name and numbers, and decodes to the descriptors and hits it was
/// made of.
pub fn rls(data: &[u8]) {
    use portcullis_core::shared::keys::Owner;
    use portcullis_core::limits::period::Period;
    use portcullis_core::limits::rls::{self, Limit, Verdict};
    let descriptors = usize::from(data.first().copied().unwrap_or(0) % 4);
    let answer = data.get(1..).unwrap_or_default();
    let v = rls::verdict(answer, descriptors);
    if let Verdict::Ok(_) = v {
        let r = rls::decode_response(answer).expect("an admission was a readable answer");
        assert_eq!(r.overall, rls::Code::Ok, "admitted without an OK");
    }
    let name = String::from_utf8_lossy(answer);
    let n = u32::from_le_bytes([0, 1, 2, 3].map(|i| data.get(i).copied().unwrap_or(0)));
    let limits = [
        Limit::RequestsPerMinute,
        Limit::TokensPerMinute,
        Limit::Budget(Period::Day, u64::from(n)),
        Limit::Budget(Period::Week, u64::from(n)),
        Limit::Budget(Period::Month, u64::from(n)),
        Limit::Budget(Period::Total, 0),
    ];
    let owners = [Owner::Key(&name), Owner::Team(&name)];
    let sent: Vec<_> = limits
        .iter()
        .zip(owners.iter().cycle())
        .map(|(l, o)| l.descriptor(*o, n))
        .collect();
    let m = rls::encode_request(&sent, n);
    let (domain, got, hits) = decode_rls_request(&m).expect("an encoded request decodes");
    assert_eq!(domain, rls::DOMAIN.as_bytes());
    assert_eq!(hits, u64::from(n.max(1)), "hits_addend (at least 1)");
    let want: Vec<RlsDescriptor> = sent
        .iter()
        .map(|d| {
            let entries = d.entries.iter().map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec())).collect();
            (entries, u64::from(d.requests_per_unit), d.unit as u64)
        })
        .collect();
    assert_eq!(got, want, "the descriptors decode as they were encoded");
}

/// A descriptor as read back: entries (key, value), requests per unit, unit.
type RlsDescriptor = (Vec<(Vec<u8>, Vec<u8>)>, u64, u64);

/// `RateLimitRequest` read with the wire reader alone, independently of the
/// encoder: (domain, descriptors, hits_addend).
fn decode_rls_request(m: &[u8]) -> Option<(Vec<u8>, Vec<RlsDescriptor>, u64)> {
    use portcullis_core::wire::pb::{Reader, Value as W};
    fn fields(b: &[u8]) -> Option<Vec<(u64, W<'_>)>> {
        let mut r = Reader::new(b);
        let mut out = Vec::new();
        while let Some(f) = r.field().ok()? {
            out.push(f);
        }
        Some(out)
    }
    let (mut domain, mut descriptors, mut hits) = (Vec::new(), Vec::new(), 0);
    for (n, v) in fields(m)? {
        match (n, v) {
            (1, W::Bytes(b)) => domain = b.to_vec(),
            (3, W::Varint(h)) => hits = h,
            (2, W::Bytes(d)) => {
                let (mut entries, mut rpu, mut unit) = (Vec::new(), 0, 0);
                for (dn, dv) in fields(d)? {
                    match (dn, dv) {
                        (1, W::Bytes(e)) => {
                            let (mut k, mut v) = (Vec::new(), Vec::new());
                            for (en, ev) in fields(e)? {
                                match (en, ev) {
                                    (1, W::Bytes(b)) => k = b.to_vec(),
                                    (2, W::Bytes(b)) => v = b.to_vec(),
                                    _ => return None,
                                }
                            }
                            entries.push((k, v));
                        }
                        (2, W::Bytes(l)) => {
                            for (ln, lv) in fields(l)? {
                                match (ln, lv) {
                                    (1, W::Varint(x)) => rpu = x,
                                    (2, W::Varint(x)) => unit = x,
                                    _ => return None,
                                }
                            }
                        }
                        _ => return None,
                    }
                }
                descriptors.push((entries, rpu, unit));
            }
            _ => return None,
        }
    }
    Some((domain, descriptors, hits))
}

/// Guardrails on a request and on a stream: no panic on any prompt or
/// stream; a redacted prompt is still a request the gateway accepts; a
/// stream reads the same through the checks whole or split anywhere.
pub fn guard(data: &[u8]) {
    use portcullis_core::guard::{self, stream::StreamGuard, Stage};
    static GW: std::sync::OnceLock<config::Gateway> = std::sync::OnceLock::new();
    let gw = GW.get_or_init(|| {
        compile::compile(GUARD_CONFIG.as_bytes()).expect("the fuzz guard config compiles")
    });
    let g = gw.guardrails.as_ref().expect("guardrails configured");
    let (a, b) = two(data);
    if let Ok(r) = ChatRequest::parse(a) {
        let active = g.active(Stage::Input, "c", 0);
        let out = guard::check_input(g, &active, 0, r.body());
        if let Some(doc) = &out.rewritten {
            ChatRequest::from_document(portcullis_core::api::Api::ChatCompletions, doc).expect("a redacted request is still accepted");
        }
        assert_eq!(out.rewritten.is_some(), out.changed && out.denied.is_none(), "a redaction always rewrites");
    }
    let stream = b.unwrap_or(a);
    let active = g.active(Stage::Output, "c", 0);
    // The stream read in each API's events (chat, Messages, Responses).
    let shape = match stream.len() % 3 {
        0 => guard::texts::Shape::Chat,
        1 => guard::texts::Shape::Messages,
        _ => guard::texts::Shape::Responses,
    };
    let run = |split: usize| {
        let mut sg = StreamGuard::new(g, shape, active.clone(), true);
        let (x, y) = stream.split_at(split.min(stream.len()));
        let mut out = sg.chunk(g, x);
        out.extend(sg.chunk(g, y));
        out.extend(sg.finish(g));
        out
    };
    let whole = run(stream.len());
    let split = usize::from(stream.first().copied().unwrap_or(0));
    assert_eq!(whole, run(split), "the checks read a split stream differently");
    let _ = guard::check_answer_of(shape, g, &active, true, stream);
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
    use portcullis_core::providers::anthropic::{self, Options, Stream};
    let (a, b) = two(data);
    if let Ok(r) = ChatRequest::parse(a) {
        for drop_unsupported in [false, true] {
            let opts = Options { default_max_tokens: 100, drop_unsupported };
            match anthropic::request(r.body(), "claude", &opts) {
                Ok((body, _)) => {
                    let v: Value = serde_json::from_slice(&body).expect("the translation is JSON");
                    assert!(v["messages"].is_array() && v["max_tokens"].is_u64(), "{v}");
                }
                Err(e) => assert_eq!(e.status, 400, "{}", e.message),
            }
        }
    }
    let stream = b.unwrap_or(a);
    if let Some(out) = anthropic::answer(stream, 1) {
        answer_round_trips(stream, &out);
    }
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

/// Google's Gemini API both ways: any chat request translates to a
/// `generateContent` body with at least one turn or is refused with a 400;
/// any answer, error or stream reads or is refused without a panic, and
/// translates to JSON; a stream translates the same whole or split anywhere.
pub fn gemini(data: &[u8]) {
    use portcullis_core::providers::gemini::{self, Stream};
    let (a, b) = two(data);
    if let Ok(r) = ChatRequest::parse(a) {
        for drop_unsupported in [false, true] {
            match gemini::request(r.body(), drop_unsupported) {
                Ok((body, _)) => {
                    let v: Value = serde_json::from_slice(&body).expect("the translation is JSON");
                    assert!(v["contents"].as_array().is_some_and(|c| !c.is_empty()), "{v}");
                }
                Err(e) => assert_eq!(e.status, 400, "{}", e.message),
            }
        }
    }
    let stream = b.unwrap_or(a);
    if let Some(out) = gemini::answer(stream, 1) {
        let _: Value = serde_json::from_slice(&out).expect("the translated answer is JSON");
    }
    let _: Value = serde_json::from_slice(&gemini::error(stream, 400)).expect("the error is JSON");
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

/// A translated Anthropic answer keeps its text (the text blocks joined),
/// every tool call (id, name, input as JSON arguments, in order) and its
/// usage (prompt = input + cache reads + cache writes).
fn answer_round_trips(anthropic: &[u8], openai: &[u8]) {
    let a: Value = serde_json::from_slice(anthropic).expect("translated: it was JSON");
    let o: Value = serde_json::from_slice(openai).expect("the translation is JSON");
    let blocks = a["content"].as_array().expect("translated: it had content");
    let kind = |b: &&Value, t: &str| b.get("type").and_then(Value::as_str) == Some(t);
    let text: String = blocks.iter().filter(|b| kind(b, "text")).filter_map(|b| b["text"].as_str()).collect();
    let uses: Vec<&Value> = blocks.iter().filter(|b| kind(b, "tool_use")).collect();
    let message = &o["choices"][0]["message"];
    if !(text.is_empty() && !uses.is_empty()) {
        assert_eq!(message["content"].as_str(), Some(text.as_str()), "the text changed");
    }
    let calls = message.get("tool_calls").and_then(Value::as_array).cloned().unwrap_or_default();
    assert_eq!(calls.len(), uses.len(), "tool calls lost or made up");
    for (call, u) in calls.iter().zip(&uses) {
        assert_eq!(call["id"], u.get("id").cloned().unwrap_or(Value::Null));
        assert_eq!(call["function"]["name"], u.get("name").cloned().unwrap_or(Value::Null));
        let args: Value = serde_json::from_str(call["function"]["arguments"].as_str().expect("arguments are a string"))
            .expect("arguments are JSON");
        // A missing or null input is an empty object's arguments.
        let empty = serde_json::json!({});
        let input = u.get("input").filter(|i| !i.is_null()).unwrap_or(&empty);
        assert_eq!(&args, input, "a tool input changed");
    }
    let n = |k: &str| a["usage"].get(k).and_then(Value::as_u64).unwrap_or(0);
    let prompt = n("input_tokens").saturating_add(n("cache_read_input_tokens")).saturating_add(n("cache_creation_input_tokens"));
    assert_eq!(o["usage"]["prompt_tokens"].as_u64(), Some(prompt), "prompt tokens");
    assert_eq!(o["usage"]["completion_tokens"].as_u64(), Some(n("output_tokens")), "completion tokens");
    assert_eq!(o["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64(), Some(n("cache_read_input_tokens")));
}

/// Anthropic's Messages API through the pivot: any Messages request
/// translates to a chat completion the gateway accepts, or is a 400; any
/// chat answer reads as a message or is refused; a chat stream translates
/// the same whole or split anywhere, and always ends (stop or error).
pub fn messages(data: &[u8]) {
    use portcullis_core::api::messages::{self, FromChatStream};
    let (a, b) = two(data);
    if let Ok(doc) = serde_json::from_slice::<serde_json::Map<String, Value>>(a) {
        match messages::to_chat(a, "gpt-x") {
            Ok((body, _)) => {
                let chat = ChatRequest::parse(&body);
                let has_messages = doc.get("messages").and_then(Value::as_array).is_some_and(|m| !m.is_empty());
                if has_messages {
                    // Every message became at least one chat message, unless
                    // all its blocks were dropped reasoning.
                    let v: Value = serde_json::from_slice(&body).expect("the translation is JSON");
                    assert_eq!(v["model"], "gpt-x");
                    if let Ok(c) = chat {
                        assert_eq!(c.model, "gpt-x");
                    }
                }
            }
            Err(e) => assert_eq!(e.status, 400, "{}", e.message),
        }
    }
    let stream = b.unwrap_or(a);
    if let Some(out) = messages::answer_from_chat(stream) {
        let v: Value = serde_json::from_slice(&out).expect("the message is JSON");
        assert_eq!(v["type"], "message");
    }
    let _ = messages::error_from_chat(stream, 500);
    let run = |split: usize| {
        let mut s = FromChatStream::new();
        let (x, y) = stream.split_at(split.min(stream.len()));
        let mut out = s.push(x);
        out.extend(s.push(y));
        out.extend(s.finish());
        out
    };
    let whole = run(stream.len());
    let text = String::from_utf8(whole.clone()).expect("events are UTF-8");
    assert!(
        text.is_empty() || text.contains("event: message_stop") || text.contains("event: error"),
        "a stream that never ends: {text}"
    );
    if text.contains("event: message_stop") {
        assert!(text.starts_with("event: message_start"), "a message stopped before it started: {text}");
    }
    let split = usize::from(stream.first().copied().unwrap_or(0));
    assert_eq!(whole, run(split), "a split stream translates differently");
}

/// The Responses API through the pivot: any Responses request translates
/// to a chat completion the gateway accepts, or is a 400; any chat answer
/// reads as a response or is refused; a chat stream translates the same
/// whole or split anywhere, numbers its events in order and always ends
/// (completed, incomplete or failed).
pub fn responses(data: &[u8]) {
    use portcullis_core::api::responses::{self, FromChatStream};
    let (a, b) = two(data);
    if serde_json::from_slice::<serde_json::Map<String, Value>>(a).is_ok() {
        match responses::to_chat(a, "gpt-x") {
            Ok((body, _)) => {
                let v: Value = serde_json::from_slice(&body).expect("the translation is JSON");
                assert_eq!(v["model"], "gpt-x");
                assert!(v["messages"].is_array());
            }
            Err(e) => assert_eq!(e.status, 400, "{}", e.message),
        }
    }
    let stream = b.unwrap_or(a);
    // The request's settings, echoed whatever the request holds.
    let echo = responses::Echo::of(a);
    if let Some(out) = responses::answer_from_chat(stream, 2, &echo) {
        let v: Value = serde_json::from_slice(&out).expect("the response is JSON");
        assert_eq!(v["object"], "response");
        assert!(v["temperature"].is_number() && v["top_p"].is_number(), "{v}");
        assert!(v["tools"].is_array() && v["metadata"].is_object(), "{v}");
        assert!(v["model"].is_string(), "{v}");
    }
    let run = |split: usize| {
        let mut s = FromChatStream::new(1, &echo);
        let (x, y) = stream.split_at(split.min(stream.len()));
        let mut out = s.push(x);
        out.extend(s.push(y));
        out.extend(s.finish());
        out
    };
    let whole = run(stream.len());
    let text = String::from_utf8(whole.clone()).expect("events are UTF-8");
    let events: Vec<Value> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| serde_json::from_str(e.split_once("\ndata: ").expect("an event has data").1).expect("event data is JSON"))
        .collect();
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["sequence_number"], i as u64, "events out of order");
    }
    let last = events.last().and_then(|e| e["type"].as_str()).unwrap_or("");
    assert!(
        matches!(last, "response.completed" | "response.incomplete" | "response.failed"),
        "a stream that never ends: {text}"
    );
    let split = usize::from(stream.first().copied().unwrap_or(0));
    assert_eq!(whole, run(split), "a split stream translates differently");
}

/// Guardrails read a value wherever the model reads it: any text a check
/// finds as a whole user message is found too as two adjacent text parts
/// (split anywhere), a message's `name`, a tool call's JSON arguments, an
/// Anthropic `system` block, a `tool_use` input and a `tool_result`.
pub fn placements(data: &[u8]) {
    use portcullis_core::guard::{self, Stage};
    use serde_json::json;
    static GW: std::sync::OnceLock<config::Gateway> = std::sync::OnceLock::new();
    let gw = GW.get_or_init(|| {
        compile::compile(PLACEMENTS_CONFIG.as_bytes()).expect("the fuzz placements config compiles")
    });
    let g = gw.guardrails.as_ref().expect("guardrails configured");
    let Some((&split, rest)) = data.split_first() else { return };
    let Ok(text) = std::str::from_utf8(rest) else { return };
    let mut at = usize::from(split) % (text.len() + 1);
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let (a, b) = text.split_at(at);
    let active = g.active(Stage::Input, "c", 0);
    let found = |body: serde_json::Value| {
        let out = guard::check_input(g, &active, 0, &serde_json::to_vec(&body).expect("a body serializes"));
        out.verdicts.iter().any(|v| v.hits > 0)
    };
    let user = |content: serde_json::Value| json!({"model": "m", "messages": [{"role": "user", "content": content}]});
    if !found(user(json!(text))) {
        return;
    }
    let args = serde_json::to_string(&json!({"value": text})).expect("arguments serialize");
    let placements = [
        ("split parts", user(json!([{"type": "text", "text": a}, {"type": "text", "text": b}]))),
        ("name", json!({"model": "m", "messages": [{"role": "user", "name": text, "content": "hi"}]})),
        ("tool call arguments", json!({"model": "m", "messages": [
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": args}}]},
            {"role": "tool", "tool_call_id": "c", "content": "ok"}]})),
        ("system blocks", json!({"model": "m", "system": [{"type": "text", "text": a}, {"type": "text", "text": b}],
            "messages": [{"role": "user", "content": "hi"}]})),
        ("tool_use input", json!({"model": "m", "messages": [
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"deep": [text]}}]}]})),
        ("tool_result", json!({"model": "m", "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": [{"type": "text", "text": text}]}]}]})),
        // Split across boundaries the model reads across (#46).
        ("split messages", json!({"model": "m", "messages": [
            {"role": "user", "content": a}, {"role": "user", "content": [{"type": "text", "text": b}]}]})),
        ("split Responses items", json!({"model": "m", "input": [
            {"role": "user", "content": a},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": b}]}]})),
        ("instructions and input", json!({"model": "m", "instructions": a, "input": b})),
        ("system and a message", json!({"model": "m", "system": [{"type": "text", "text": a}],
            "messages": [{"role": "user", "content": b}]})),
    ];
    for (name, body) in placements {
        assert!(found(body), "found as a user message, missed in {name}: {text:?}");
    }
}

const PLACEMENTS_CONFIG: &str = r#"
providers: [{name: p, cluster: c, host: h, models: [{name: m}]}]
clients: [{name: c, key_sha256: "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3"}]
guardrails:
  input:
    - {name: pii, pii: [all], action: redact}
    - {name: secret, regex: "(?i)top\\s+secret", action: deny}
"#;

/// Bedrock: the Converse translation of any chat request is JSON with
/// messages or a 400; any bytes as a whole answer, an error, and an event
/// stream (as they are, and framed as events) translate without a panic,
/// the stream the same whether split or not.
pub fn bedrock(data: &[u8]) {
    use portcullis_core::wire::eventstream;
    use portcullis_core::providers::bedrock::{self, Stream};
    let (a, b) = two(data);
    if let Ok(r) = ChatRequest::parse(a) {
        for drop_unsupported in [false, true] {
            match bedrock::request(r.body(), drop_unsupported) {
                Ok((body, _)) => {
                    let v: Value = serde_json::from_slice(&body).expect("the translation is JSON");
                    assert!(v["messages"].as_array().is_some_and(|c| !c.is_empty()), "{v}");
                }
                Err(e) => assert_eq!(e.status, 400, "{}", e.message),
            }
        }
    }
    let tail = b.unwrap_or(a);
    if let Some(out) = bedrock::answer(tail, 1, "m") {
        let _: Value = serde_json::from_slice(&out).expect("the translated answer is JSON");
    }
    let _: Value = serde_json::from_slice(&bedrock::error(tail, 400)).expect("the error is JSON");
    // The bytes as they are (mostly bad frames), and the same bytes as the
    // payloads of well-framed events of each type.
    let mut framed = Vec::new();
    for (i, chunk) in tail.chunks(64).enumerate() {
        let kinds = ["messageStart", "contentBlockStart", "contentBlockDelta", "messageStop", "metadata"];
        let kind = kinds.get(i % kinds.len()).copied().unwrap_or("metadata");
        framed.extend(eventstream::encode(&[(":event-type", kind), (":message-type", "event")], chunk));
    }
    for stream in [tail, framed.as_slice()] {
        let run = |split: usize| {
            let mut s = Stream::new(1, true, "m");
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
}

/// An MCP message as a client POSTs it, and a server's answer as it passes
/// back (#47): reading never panics; a read message's method and name are
/// what its JSON says; a `tools/list` answer filtered keeps only allowed
/// tools and every one of them; an SSE answer rewritten in pieces reads as
/// it does whole; the gateway's error is a JSON-RPC error to the same id.
pub fn mcp(data: &[u8]) {
    use portcullis_core::mcp::answer::{keep_tools, rewrite_json, Events};
    use portcullis_core::mcp::message::{error_body, Message, Method};
    let (request, answer) = two(data);
    if let Ok(m) = Message::read(request) {
        let doc: Value = serde_json::from_slice(request).expect("a read message is JSON");
        assert_eq!(doc["jsonrpc"], "2.0");
        if let Method::ToolCall { name, .. } = &m.method {
            assert_eq!(doc["params"]["name"].as_str(), Some(name.as_ref()));
            assert!(!name.is_empty());
        }
        let e = portcullis_core::error::GatewayError::new(403, "permission_error", "tool_not_allowed", "no");
        let v: Value = serde_json::from_slice(&error_body(m.id, &e)).expect("the error is JSON");
        assert_eq!(v["id"], doc.get("id").cloned().unwrap_or(Value::Null));
    }
    let Some(answer) = answer else {
        return;
    };
    let allowed = |n: &str| n.len() % 2 == 0;
    if let Some(out) = rewrite_json(answer, &mut |m| keep_tools(m, &mut |n| allowed(n))) {
        let before: Value = serde_json::from_slice(answer).expect("rewritten: it was JSON");
        let after: Value = serde_json::from_slice(&out).expect("rewritten is JSON");
        let names = |v: &Value| -> Vec<String> {
            v["result"]["tools"]
                .as_array()
                .map(|t| t.iter().filter_map(|t| t["name"].as_str().map(String::from)).collect())
                .unwrap_or_default()
        };
        let kept: Vec<String> = names(&before).into_iter().filter(|n| allowed(n)).collect();
        assert_eq!(names(&after), kept);
    }
    let edit = |m: &mut portcullis_core::mcp::answer::Message| keep_tools(m, &mut |n| allowed(n));
    let mut whole = Events::default();
    let mut e1 = edit;
    let mut out_whole = whole.chunk(answer, &mut e1);
    out_whole.extend(whole.finish());
    let mut pieces = Events::default();
    let mut e2 = edit;
    let mut out_pieces = Vec::new();
    for chunk in answer.chunks(usize::from(answer.first().copied().unwrap_or(1) % 13) + 1) {
        out_pieces.extend(pieces.chunk(chunk, &mut e2));
    }
    out_pieces.extend(pieces.finish());
    assert_eq!(out_whole, out_pieces, "an SSE answer depends on chunking");
}

/// A multipart body (the first byte picks a boundary) reads or is refused
/// with a 400, never a panic; every part it reads lies inside the body;
/// the text fields rewritten with the same values give the same bytes, and
/// a request read from it splices a model id into the `model` part alone.
pub fn form(data: &[u8]) {
    use portcullis_core::api::Api;
    use portcullis_core::wire::form;
    use portcullis_core::request::ChatRequest;
    let boundary = match data.first().copied().unwrap_or(0) % 3 {
        0 => "b",
        1 => "xYz-123",
        _ => "----WebKitFormBoundary7MA4YWxkTrZu0gW",
    };
    let body = data.get(1..).unwrap_or_default();
    match form::parse(body, boundary) {
        Ok(f) => {
            for p in &f.parts {
                assert!(p.value.0 <= p.value.1 && p.value.1 <= body.len());
            }
            let fields = f.fields(body);
            assert_eq!(f.rewrite(body, &fields), body, "the same fields, the same bytes");
        }
        Err(e) => assert_eq!((e.status, e.code), (400, "invalid_multipart")),
    }
    let content_type = format!("multipart/form-data; boundary={boundary}");
    if let Ok(r) = ChatRequest::parse_form(Api::AudioTranscriptions, body.to_vec(), &content_type) {
        let sent = r.body_for("provider-model-id");
        let again = ChatRequest::parse_form(Api::AudioTranscriptions, sent, &content_type)
            .expect("a spliced body reads");
        assert_eq!(again.model, "provider-model-id");
    }
}

/// WebSocket frames in either direction (a Realtime session's): read or
/// refused as a protocol error, never a panic; the same bytes split
/// anywhere pass the same bytes and messages; every message passed is read
/// as an event without a panic.
pub fn websocket(data: &[u8]) {
    use portcullis_core::api::realtime;
    use portcullis_core::wire::websocket::{Frames, Message, Side, Verdict};
    let side = if data.first().copied().unwrap_or(0) & 1 == 0 {
        Side::Client
    } else {
        Side::Server
    };
    let body = data.get(2..).unwrap_or_default();
    let cut = usize::from(data.get(1).copied().unwrap_or(0)).min(body.len());
    let run = |chunks: &[&[u8]]| {
        let mut r = Frames::new(side, 256, [1, 2, 3, 4]);
        let mut out = Vec::new();
        let mut seen = Vec::new();
        for c in chunks {
            let o = r.feed(c, &mut |m| {
                match m {
                    Message::Text(t) => {
                        let _ = realtime::server_event(t);
                        seen.push(t.to_vec());
                    }
                    Message::Close(code) => seen.push(code.to_be_bytes().to_vec()),
                }
                Verdict::Pass
            });
            match o {
                Some(o) => out.extend(o),
                None => out.extend_from_slice(c),
            }
        }
        (out, seen, r.error)
    };
    let whole = run(&[body]);
    let split = run(&[&body[..cut], &body[cut..]]);
    assert_eq!(whole, split, "split at {cut}");
    assert!(whole.0.len() <= body.len(), "passing adds nothing");
}

/// The cache tiers' replies and the semantic tier's reading of a request
/// (#50): a reply is an answer only when whole, for the key or space asked,
/// unexpired, within the bound (and, for the semantic tier, at least as
/// similar as asked); an embedding read is of unit length; a body's prompt
/// is eligible only with text to embed.
pub fn cache_tiers(data: &[u8]) {
    use portcullis_core::cache::{fleet, semantic};
    let key = [7u8; 32];
    if let Some(f) = fleet::decode_get(data, &key, 1000, 4096) {
        assert!(f.expires_ms > 1000 && !f.answer.is_empty() && f.answer.len() <= 4096);
    }
    if let Some(n) = semantic::decode_nearest(data, &key, 900_000, 1000, 4096) {
        assert!((900_000..=1_000_000).contains(&n.similarity_ppm) && n.expires_ms > 1000);
        assert!(!n.answer.is_empty() && n.answer.len() <= 4096);
    }
    if let Some(v) = semantic::read_embedding(data) {
        let norm: f64 = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum();
        assert!((norm - 1.0).abs() < 1e-3, "an embedding of norm {norm}");
    }
    if let Ok(r) = ChatRequest::parse(data) {
        if let Some(p) = semantic::prompt(&r, data.len() % 2 == 0) {
            assert!(!p.text.trim().is_empty(), "an empty prompt was eligible");
        }
    }
}
