//! The request record (proto/portcullis.proto `RequestRecord`), encoded by
//! hand: a few dozen lines of protobuf wire format instead of a codegen
//! dependency in the wasm module. A round-trip test against the collector's
//! prost types (tests/tests/record_roundtrip.rs) pins the two together.
//! Also the bounded per-VM buffer records wait in until they are sent.

use std::collections::VecDeque;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Attempt {
    pub provider: String,
    pub status: u32,
    pub cause: String,
    /// The span id the attempt sent upstream (empty: skipped, or no trace).
    pub span_id: Vec<u8>,
    /// When it was sent and when it ended, ms since the Unix epoch (0: skipped).
    pub start_ms: u64,
    pub end_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Default)]
pub struct Record {
    pub request_id: String,
    pub time_ms: u64,
    pub client: String,
    pub requested_model: String,
    pub model: String,
    pub provider: String,
    pub experiment: String,
    pub arm: String,
    pub cache: String,
    pub attempts: Vec<Attempt>,
    pub status: u32,
    pub error: String,
    pub latency_ms: u64,
    pub ttfb_ms: u64,
    pub stream: bool,
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub cached_tokens: u64,
    pub reasoning_tokens: u64,
    pub cost_micros: i64,
    pub prompt: String,
    pub completion: String,
    pub limited_by: String,
    pub guardrails: String,
    pub team: String,
    pub usage_estimated: bool,
    pub price_source: String,
    pub budget_routed: bool,
    /// W3C trace context: the trace, the gateway's span, the client's span
    /// (empty when the gateway started the trace), the flags, `tracestate`.
    pub trace_id: Vec<u8>,
    pub span_id: Vec<u8>,
    pub parent_span_id: Vec<u8>,
    pub trace_flags: u32,
    pub tracestate: String,
    /// A stream's first body chunk, ms after the request started.
    pub ttft_ms: u64,
    /// The inbound API (`chat_completions`, `messages`, `responses`, ...).
    pub api: &'static str,
    /// The answering provider's format (`openai`, `anthropic`, ...).
    pub provider_format: &'static str,
    /// The answering provider's host.
    pub server_address: String,
    /// The request's completion cap and temperature, when given.
    pub max_tokens: u64,
    pub temperature: Option<f64>,
    /// What the answer said of itself, where the gateway read it.
    pub response_id: String,
    pub response_model: String,
    pub finish_reasons: Vec<String>,
    /// An MCP request (`api` "mcp"): its JSON-RPC method, the JSON-RPC
    /// error code it was answered with (0: none the gateway saw), its
    /// body's and its answer's sizes in bytes.
    pub mcp_method: String,
    pub rpc_error: i64,
    pub request_bytes: u64,
    pub response_bytes: u64,
}

use crate::wire::pb::{bytes, key, uint, varint};

impl Attempt {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.provider.len() + self.cause.len());
        bytes(&mut out, 1, self.provider.as_bytes());
        uint(&mut out, 2, u64::from(self.status));
        bytes(&mut out, 3, self.cause.as_bytes());
        bytes(&mut out, 4, &self.span_id);
        uint(&mut out, 5, self.start_ms);
        uint(&mut out, 6, self.end_ms);
        out
    }
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        let mut o = Vec::with_capacity(160 + self.prompt.len() + self.completion.len());
        bytes(&mut o, 1, self.request_id.as_bytes());
        uint(&mut o, 2, self.time_ms);
        bytes(&mut o, 3, self.client.as_bytes());
        bytes(&mut o, 4, self.requested_model.as_bytes());
        bytes(&mut o, 5, self.model.as_bytes());
        bytes(&mut o, 6, self.provider.as_bytes());
        bytes(&mut o, 7, self.experiment.as_bytes());
        bytes(&mut o, 8, self.arm.as_bytes());
        bytes(&mut o, 9, self.cache.as_bytes());
        for a in &self.attempts {
            let enc = a.encode();
            key(&mut o, 10, 2);
            varint(&mut o, enc.len() as u64);
            o.extend_from_slice(&enc);
        }
        uint(&mut o, 11, u64::from(self.status));
        bytes(&mut o, 12, self.error.as_bytes());
        uint(&mut o, 13, self.latency_ms);
        uint(&mut o, 14, self.ttfb_ms);
        uint(&mut o, 15, u64::from(self.stream));
        uint(&mut o, 16, self.prompt_tokens);
        uint(&mut o, 17, self.completion_tokens);
        uint(&mut o, 18, self.cached_tokens);
        uint(&mut o, 19, self.reasoning_tokens);
        // int64: negative values as 10-byte two's complement varints.
        uint(&mut o, 20, self.cost_micros as u64);
        bytes(&mut o, 21, self.prompt.as_bytes());
        bytes(&mut o, 22, self.completion.as_bytes());
        bytes(&mut o, 23, self.limited_by.as_bytes());
        bytes(&mut o, 24, self.guardrails.as_bytes());
        bytes(&mut o, 25, self.team.as_bytes());
        uint(&mut o, 26, u64::from(self.usage_estimated));
        bytes(&mut o, 27, self.price_source.as_bytes());
        uint(&mut o, 28, u64::from(self.budget_routed));
        bytes(&mut o, 29, &self.trace_id);
        bytes(&mut o, 30, &self.span_id);
        bytes(&mut o, 31, &self.parent_span_id);
        uint(&mut o, 32, u64::from(self.trace_flags));
        bytes(&mut o, 33, self.tracestate.as_bytes());
        uint(&mut o, 34, self.ttft_ms);
        bytes(&mut o, 35, self.api.as_bytes());
        bytes(&mut o, 36, self.provider_format.as_bytes());
        bytes(&mut o, 37, self.server_address.as_bytes());
        uint(&mut o, 38, self.max_tokens);
        if let Some(t) = self.temperature {
            // `optional double`: written whenever present, 0 included.
            key(&mut o, 39, 1);
            o.extend_from_slice(&t.to_le_bytes());
        }
        bytes(&mut o, 40, self.response_id.as_bytes());
        bytes(&mut o, 41, self.response_model.as_bytes());
        for f in &self.finish_reasons {
            // Repeated: every value written, empty ones too.
            crate::wire::pb::message(&mut o, 42, f.as_bytes());
        }
        bytes(&mut o, 43, self.mcp_method.as_bytes());
        // int64: negative values as 10-byte two's complement varints.
        uint(&mut o, 44, self.rpc_error as u64);
        uint(&mut o, 45, self.request_bytes);
        uint(&mut o, 46, self.response_bytes);
        o
    }
}

/// A `RecordBatch` of already-encoded records.
pub fn encode_batch(records: &[Vec<u8>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(records.iter().map(|r| r.len() + 6).sum());
    for r in records {
        key(&mut out, 1, 2);
        varint(&mut out, r.len() as u64);
        out.extend_from_slice(r);
    }
    out
}

/// Records waiting to be sent: bounded by count and bytes; what does not fit
/// is dropped and counted, never waited for.
#[derive(Debug)]
pub struct LogBuffer {
    queue: VecDeque<Vec<u8>>,
    bytes: usize,
    max_records: usize,
    max_bytes: usize,
    pub dropped: u64,
}

impl LogBuffer {
    pub fn new(max_records: usize, max_bytes: usize) -> Self {
        Self {
            queue: VecDeque::new(),
            bytes: 0,
            max_records,
            max_bytes,
            dropped: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.queue.len()
    }

    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn fits(&self, n: usize) -> bool {
        self.queue.len() < self.max_records && self.bytes + n <= self.max_bytes
    }

    /// Add a record; false (and counted) when the buffer is full.
    pub fn push(&mut self, record: Vec<u8>) -> bool {
        if !self.fits(record.len()) {
            self.dropped += 1;
            return false;
        }
        self.bytes += record.len();
        self.queue.push_back(record);
        true
    }

    /// Up to `n` records from the front, for one batch.
    pub fn take(&mut self, n: usize) -> Vec<Vec<u8>> {
        let k = n.min(self.queue.len());
        let batch: Vec<Vec<u8>> = self.queue.drain(..k).collect();
        self.bytes -= batch.iter().map(Vec::len).sum::<usize>();
        batch
    }

    /// A batch that failed goes back to the front, in order, as far as it
    /// fits; the rest is dropped and counted.
    pub fn requeue(&mut self, batch: Vec<Vec<u8>>) {
        for r in batch.into_iter().rev() {
            if self.fits(r.len()) {
                self.bytes += r.len();
                self.queue.push_front(r);
            } else {
                self.dropped += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(target_arch = "wasm32")]
    use wasm_bindgen_test::wasm_bindgen_test as test;

    #[test]
    fn varints_and_empty_fields() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xAC, 0x02]);
        assert!(
            Record::default().encode().is_empty(),
            "proto3 defaults are not written"
        );
        let r = Record {
            request_id: "a".into(),
            status: 200,
            ..Record::default()
        };
        assert_eq!(r.encode(), [0x0A, 1, b'a', 0x58, 0xC8, 0x01]);
        let neg = Record {
            cost_micros: -1,
            ..Record::default()
        }
        .encode();
        assert_eq!(
            neg.len(),
            12,
            "int64 -1 is a 10-byte varint after a 2-byte key"
        );
    }

    #[test]
    fn buffer_is_bounded_and_requeues_in_order() {
        let mut b = LogBuffer::new(3, 1000);
        for i in 0..5u8 {
            b.push(vec![i]);
        }
        assert_eq!((b.len(), b.dropped), (3, 2));
        let batch = b.take(2);
        assert_eq!(batch, vec![vec![0], vec![1]]);
        b.push(vec![9]);
        b.requeue(batch);
        assert_eq!(b.take(10), vec![vec![1], vec![2], vec![9]]);
        assert_eq!(b.dropped, 3, "one of the requeued records no longer fit");
        let mut small = LogBuffer::new(10, 4);
        assert!(small.push(vec![0; 4]));
        assert!(!small.push(vec![0]));
        assert_eq!(small.dropped, 1);
    }
}
