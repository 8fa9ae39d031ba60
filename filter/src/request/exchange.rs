//! What the request's steps (`pipeline`) hand each other, and how a step
//! ends: state types only (the context keeps a paused exchange), so the
//! context does not depend on the steps.

use crate::host::Action;
use portcullis_core::request::ChatRequest;

/// A step of the body phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Parse,
    Route,
    InputChecks,
    Cache,
    Admit,
    GlobalLimits,
    Dispatch,
}

/// The body phase, in order.
pub const BODY: [Step; 7] = [
    Step::Parse,
    Step::Route,
    Step::InputChecks,
    Step::Cache,
    Step::Admit,
    Step::GlobalLimits,
    Step::Dispatch,
];

/// What a pause waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The external guards' answers (`on_guard_answer`).
    Guards,
    /// The rate limit service's answers (`on_global_answer`).
    RateLimitService,
    /// The fleet cache tier's answer (`on_shared_answer`).
    SharedCache,
}

/// What a step decides.
#[derive(Debug, PartialEq, Eq)]
pub enum Next {
    /// On to the next step.
    Go,
    /// Wait; the request resumes at the step when the wait ends.
    Pause(Wait, Step),
    /// The request is answered (or on its way to a provider).
    Done(Action),
}

/// What the steps hand each other.
#[derive(Default)]
pub struct Exchange {
    /// The request body's size.
    pub body_size: usize,
    /// The clock, read once per run (cache expiry, limits).
    pub now: u64,
    /// The parsed body, from `Parse` to `Route` (the flight owns it after).
    pub chat: Option<ChatRequest>,
    /// A cached answer (content type, body), from `Cache` to `Dispatch`.
    pub hit: Option<(&'static str, Vec<u8>)>,
}
