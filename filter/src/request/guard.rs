//! The guardrails' state across a request: external guard calls in flight
//! (input), and the output checks across the answer.

use portcullis_core::guard::stream::StreamGuard;
use portcullis_core::request::Document;

/// Calls to external guards in flight, and the prompt they are about.
pub struct GuardCalls {
    pub calls: Vec<GuardCall>,
    pub doc: Document,
    pub changed: bool,
    /// What `doc` is.
    pub target: Target,
}

/// What the guards' calls are about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A model call's prompt.
    Prompt,
    /// An MCP `tools/call` message (its arguments), whose body has
    /// `body_size` bytes buffered.
    ToolArguments { body_size: usize },
    /// A whole answer in the client's API's shape (output checks).
    Answer(portcullis_core::guard::texts::Shape),
}

impl Target {
    pub fn stage(self) -> portcullis_core::guard::Stage {
        match self {
            Target::Answer(_) => portcullis_core::guard::Stage::Output,
            _ => portcullis_core::guard::Stage::Input,
        }
    }
}

impl GuardCalls {
    /// Replace every listed text where the guarded texts are; the number
    /// replaced.
    pub fn redact(&mut self, label: &str, targets: &[String]) -> u32 {
        let hits = match self.target {
            Target::Prompt => {
                portcullis_core::guard::external::apply_redactions(&mut self.doc, label, targets)
            }
            Target::ToolArguments { .. } => {
                portcullis_core::guard::vendor::redact_arguments(&mut self.doc, label, targets)
            }
            Target::Answer(shape) => {
                portcullis_core::guard::vendor::redact_answer(shape, &mut self.doc, label, targets)
            }
        };
        self.changed |= hits > 0;
        hits
    }
}

/// One call to an external guard or a vendor.
pub struct GuardCall {
    pub token: u32,
    /// The input check's index.
    pub check: usize,
    /// Sent at (ms).
    pub sent: u64,
    /// A vendor's call: the texts it carries.
    pub batch: Option<SentBatch>,
}

/// What a vendor's call carried: the text its offsets refer to, and the
/// messages it holds whole (their ids, for the verdicts kept per message).
pub struct SentBatch {
    pub joined: String,
    pub whole: Vec<([u8; 32], String)>,
    /// Messages whose kept verdict served, in this check (for the record).
    pub kept: u32,
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
    /// Indexes of the vendor checks that apply (a whole answer waits for
    /// them).
    pub vendors: Vec<usize>,
}

/// A whole answer held while vendor checks read it: the calls, and what is
/// sent to the client once they answered.
pub struct HeldAnswer {
    pub calls: GuardCalls,
    pub status: u16,
    /// The answer's headers as they were to go to the client (a pair per
    /// header, the gateway's own included).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl OutputGuard {
    pub fn new(active: Vec<usize>, json_wanted: bool) -> Self {
        Self {
            active,
            json_wanted,
            stream: None,
            touched: false,
            noted: false,
            vendors: Vec::new(),
        }
    }
}
