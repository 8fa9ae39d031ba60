//! The guardrails' state across a request: external guard calls in flight
//! (input), and the output checks across the answer.

use portcullis_core::guard::stream::StreamGuard;
use portcullis_core::request::Document;

/// Calls to external guards in flight, and the prompt they are about.
pub struct GuardCalls {
    /// (token, input check index, sent at).
    pub calls: Vec<(u32, usize, u64)>,
    pub doc: Document,
    pub changed: bool,
}

/// The output checks of a request, across its answer.
pub struct OutputGuard {
    /// Indexes of the output checks that apply.
    pub active: Vec<usize>,
    /// The client asked for JSON (schema checks apply).
    pub json_wanted: bool,
    /// A streamed answer's window.
    pub stream: Option<StreamGuard>,
    /// A check denied or redacted: the answer is not stored in the cache.
    pub touched: bool,
    /// The stream's verdicts went to the record.
    pub noted: bool,
}

impl OutputGuard {
    pub fn new(active: Vec<usize>, json_wanted: bool) -> Self {
        Self {
            active,
            json_wanted,
            stream: None,
            touched: false,
            noted: false,
        }
    }
}
