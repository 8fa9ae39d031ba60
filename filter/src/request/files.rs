//! A call on files or batches (`stored.rs`), as it goes.

/// What a files or batches call is and what it learned on its way.
#[derive(Debug, Default)]
pub struct StoredCall {
    /// The record's `api` ("files" or "batches").
    pub api: &'static str,
    /// The call needs its body first (an upload, a batch).
    pub upload: bool,
    pub batch: bool,
    /// An Anthropic Message Batch's creation.
    pub message_batch: bool,
    /// `{scheme}://{authority}` as the client called the gateway (a
    /// Message Batch's `results_url` points there).
    pub origin: String,
    /// A list of batches, kept to the owner's (their marks, one per key of
    /// the seal).
    pub keep: Option<Vec<String>>,
    /// The answer's ids are sealed (JSON answers; not a file's content).
    pub sealed: bool,
    /// The provider (by index) the call went to.
    pub provider: Option<usize>,
    /// An upload's batch model, the record's model.
    pub model: String,
    /// Requests a batch file holds (sealed into its id).
    pub requests: u64,
    pub request_bytes: u64,
    pub response_bytes: u64,
    /// The answer may report a finished batch's usage.
    pub reports_usage: bool,
    /// A Message Batch's results, read for their usage as they pass, and
    /// the batch's id at its provider.
    pub results: Option<Box<portcullis_core::api::files::ResultsUsage>>,
    pub batch_id: String,
    /// A finished batch's usage and cost, charged with this call.
    pub usage: Option<portcullis_core::usage::Usage>,
    pub cost_micros: i64,
    pub price_source: &'static str,
}
