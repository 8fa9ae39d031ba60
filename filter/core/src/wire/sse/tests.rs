//! Tests of `sse`.

use super::*;
#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

const STREAM: &str = "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hél\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo wörld\"},\"finish_reason\":null}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"c1\",\"created\":7,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n\
data: [DONE]\n\n";

fn assemble(bytes: &[u8], chunk: usize) -> Assembly {
    let mut p = SseParser::default();
    let mut a = Assembly::default();
    for c in bytes.chunks(chunk) {
        p.push(c);
        while let Some(d) = p.next_data() {
            a.feed(&d);
        }
    }
    a
}

#[test]
fn assembly_is_the_same_whatever_the_chunking() {
    let whole = assemble(STREAM.as_bytes(), STREAM.len());
    for size in [1, 2, 7, 64] {
        assert_eq!(
            assemble(STREAM.as_bytes(), size),
            whole,
            "chunk size {size}"
        );
    }
    let v: Value = serde_json::from_slice(&whole.completion().unwrap()).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "Héllo wörld");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["total_tokens"], 5);
    assert_eq!(v["id"], "c1");
}

#[test]
fn crlf_and_multiline_data_and_comments() {
    let mut p = SseParser::default();
    p.push(b": keep-alive\r\n\r\ndata: a\r\ndata: b\r\n\r\nevent: x\ndata: c\n\n");
    assert_eq!(p.next_data().as_deref(), Some("a\nb"));
    assert_eq!(p.next_data().as_deref(), Some("c"));
    assert_eq!(p.next_data(), None);
}

#[test]
fn unfinished_or_tool_call_streams_are_not_assembled() {
    let cut = &STREAM[..STREAM.find("data: [DONE]").unwrap()];
    assert!(assemble(cut.as_bytes(), 5).completion().is_none());
    let tools = STREAM.replace("{\"content\":\"Hél\"}", "{\"tool_calls\":[{\"index\":0}]}");
    assert!(assemble(tools.as_bytes(), 5).completion().is_none());
}

#[test]
fn replay_reproduces_the_content_and_usage_only_when_asked() {
    let completion = assemble(STREAM.as_bytes(), 9).completion().unwrap();
    let with = replay(&completion, true).unwrap();
    let again = assemble(&with, 3);
    assert_eq!(again.completion().unwrap(), completion);
    let text = String::from_utf8(with.clone()).unwrap();
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.last(), Some(&"data: [DONE]"));
    for e in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk", "{e}");
        assert_eq!(chunk["id"], "c1");
        assert_eq!(chunk["created"], 7);
        assert!(chunk["choices"].is_array());
    }
    let without = replay(&completion, false).unwrap();
    let a = assemble(&without, 3);
    assert!(a.usage.is_none());
    assert!(String::from_utf8(without)
        .unwrap()
        .ends_with("data: [DONE]\n\n"));
}

#[test]
fn replay_refuses_what_a_text_stream_cannot_say() {
    let msg = |m: &str| {
        format!(r#"{{"id":"c","choices":[{{"index":0,"message":{m},"finish_reason":"stop"}}]}}"#)
    };
    let ok = msg(r#"{"role":"assistant","content":"hi","refusal":null,"annotations":[]}"#);
    assert!(replay(ok.as_bytes(), false).is_some());
    for m in [
        r#"{"role":"assistant","content":null,"tool_calls":[{"id":"t","type":"function","function":{"name":"f","arguments":"{}"}}]}"#,
        r#"{"role":"assistant","content":"hi","tool_calls":[{"id":"t"}]}"#,
        r#"{"role":"assistant","content":null,"refusal":"no"}"#,
        r#"{"role":"assistant","content":"hi","annotations":[{"type":"url_citation"}]}"#,
        r#"{"role":"assistant"}"#,
    ] {
        assert!(replay(msg(m).as_bytes(), false).is_none(), "{m}");
    }
    let two = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},"finish_reason":"stop"},
        {"index":1,"message":{"role":"assistant","content":"b"},"finish_reason":"stop"}]}"#;
    assert!(replay(two.as_bytes(), false).is_none());
    let logprobs = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":"a"},
        "logprobs":{"content":[]},"finish_reason":"stop"}]}"#;
    assert!(replay(logprobs.as_bytes(), false).is_none());
}

#[test]
fn relay_strips_only_the_usage_chunk_and_keeps_everything_else_byte_for_byte() {
    for size in [1, 3, 50, STREAM.len()] {
        let mut relay = Relay::new(true);
        let mut out = Vec::new();
        for c in STREAM.as_bytes().chunks(size) {
            out.extend(relay.chunk(c));
        }
        out.extend(relay.finish());
        let expected = STREAM.replace(
            "data: {\"id\":\"c1\",\"created\":7,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2,\"total_tokens\":5}}\n\n",
            "",
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            expected,
            "chunk size {size}"
        );
        assert_eq!(
            relay.assembly.usage.as_ref().unwrap()["total_tokens"],
            5,
            "usage still read"
        );
    }
    let mut keep = Relay::new(false);
    assert_eq!(keep.chunk(STREAM.as_bytes()), STREAM.as_bytes());
}

#[test]
fn long_content_is_split_on_char_boundaries() {
    let s = "ééééé".repeat(20);
    let p = pieces(&s, 7);
    assert!(p.len() > 5);
    assert_eq!(p.concat(), s);
}

#[test]
fn oversized_event_stops_assembly() {
    let mut p = SseParser::default();
    p.push(&vec![b'x'; MAX_EVENT_BYTES + 1]);
    assert!(p.overflowed);
    assert_eq!(p.next_data(), None);
}
