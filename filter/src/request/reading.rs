//! How an answer is read as it passes to the client: a stream's events are
//! parsed (usage, the completion; the usage chunk only the gateway asked for
//! is dropped), a whole answer is copied (whole up to `keep` bytes, past
//! that only its tail, where `usage` is). Nothing is held back.

use portcullis_core::translate::EventUsage;
use portcullis_core::usage::{AnswerCopy, Usage};
use portcullis_core::wire::sse::Relay;

pub enum Reader {
    Stream(Relay),
    Whole(AnswerCopy),
    /// A stream in the client's API's own events, read for its usage only.
    Events(EventUsage),
}

impl Reader {
    /// A reader for a successful, plain-encoded answer, or `None` when
    /// nothing needs it. `store`: the cache wants the answer; `usage_chunk`:
    /// the gateway asked a stream for its usage chunk; `wants_usage`:
    /// reservations to settle or a record to fill; `keep`: bytes of a whole
    /// answer to keep whole.
    pub fn for_answer(
        stream: bool,
        usage_chunk: bool,
        store: bool,
        wants_usage: bool,
        keep: usize,
    ) -> Option<Reader> {
        if stream && (store || usage_chunk || wants_usage) {
            Some(Reader::Stream(Relay::new(usage_chunk)))
        } else if !stream && (store || wants_usage) {
            Some(Reader::Whole(AnswerCopy::new(keep)))
        } else {
            None
        }
    }

    /// Bytes as they pass; `Some` when what the client gets differs.
    pub fn chunk(&mut self, bytes: &[u8], end: bool) -> Option<Vec<u8>> {
        match self {
            Reader::Stream(relay) => {
                let mut out = relay.chunk(bytes);
                if end {
                    out.extend(relay.finish());
                }
                relay.strip_usage.then_some(out)
            }
            Reader::Whole(copy) => {
                copy.push(bytes);
                None
            }
            Reader::Events(usage) => {
                usage.push(bytes);
                None
            }
        }
    }

    /// What a stream of Chat Completions said of itself (others: read from
    /// the whole answer, when it is kept).
    pub fn facts(&self) -> Option<portcullis_core::usage::AnswerFacts> {
        match self {
            Reader::Stream(relay) => Some(relay.assembly.facts()),
            _ => None,
        }
    }

    /// The usage the answer reported, and the answer in the non-streamed
    /// format when it could be kept whole.
    pub fn finish(self) -> (Option<Usage>, Option<Vec<u8>>) {
        match self {
            Reader::Stream(relay) => (
                relay.assembly.usage.as_ref().and_then(Usage::from_usage),
                relay.assembly.completion(),
            ),
            Reader::Whole(copy) => copy.finish(),
            Reader::Events(usage) => (usage.usage(), None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_read_when_nothing_needs_it() {
        assert!(Reader::for_answer(true, false, false, false, 0).is_none());
        assert!(Reader::for_answer(false, true, false, false, 0).is_none());
        assert!(matches!(
            Reader::for_answer(true, true, false, false, 0),
            Some(Reader::Stream(_))
        ));
        assert!(matches!(
            Reader::for_answer(false, false, true, false, 10),
            Some(Reader::Whole(_))
        ));
    }

    #[test]
    fn a_stream_loses_only_the_usage_chunk_the_gateway_asked_for() {
        let stream = concat!(
            r#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#,
            "\n\n",
            r#"data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":1}}"#,
            "\n\ndata: [DONE]\n\n"
        )
        .as_bytes();
        let mut r = Reader::for_answer(true, true, false, false, 0).unwrap();
        let (a, b) = stream.split_at(30);
        let mut out = r.chunk(a, false).unwrap();
        out.extend(r.chunk(b, true).unwrap());
        let text = String::from_utf8(out).unwrap();
        assert!(!text.contains("usage") && text.contains("hi") && text.ends_with("[DONE]\n\n"));
        let (usage, whole) = r.finish();
        assert_eq!(usage.map(|u| u.total()), Some(3));
        assert!(whole.is_some());
    }
}
