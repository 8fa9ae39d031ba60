//! A client's limits: its key's, team's and end user's counters in this
//! Envoy's shared data, taken at admission and settled at the end
//! (`admission`, with `admission::prepare` and `admission::room`), and
//! what a request asks the fleet's rate limit service (`global`). The
//! steps that take them run on the request path (`llm::body`,
//! `llm::limit_service`, `realtime`, `mcp`, `files`).
//!
//! May use: `host`.

pub mod admission;
pub mod global;

use crate::host::Host;
use admission::{Finish, Held, Shown};

/// What one request holds of its client's limits, from its headers to its
/// end: the request-rate take, the `x-ratelimit-*` headers every answer
/// carries, the reservations to settle and the rate limit service's call
/// in flight. Only this folder reads its fields; the steps tell it what
/// happened.
#[derive(Default)]
pub struct RequestLimits {
    /// The request-rate take at headers (for the rate-limit headers).
    req_take: Option<Shown>,
    /// `x-ratelimit-*` headers for every answer to this request.
    headers: Vec<(&'static str, String)>,
    /// What the request holds of its client's limits until it finishes.
    held: Option<Held>,
    /// The call to the rate limit service in flight.
    pending: Option<global::Pending>,
}

impl RequestLimits {
    /// The request rate was taken at the headers (`None`: no rate limit).
    pub fn took_rate(&mut self, take: Option<Shown>) {
        self.req_take = take;
    }

    /// The request rate refused the request: its state for the headers.
    pub fn rate_refused(&mut self, take: Shown) {
        self.headers = admission::headers(Some(take), None);
    }

    /// The headers with the request rate and the token bucket as it
    /// stands (`None`: no token limit).
    pub fn show_tokens(&mut self, tokens: Option<Shown>) {
        self.headers = admission::headers(self.req_take, tokens);
    }

    /// Admitted at every level: hold `held` until the end, and show the
    /// tightest request rate (the key's or its end user's), tokens and
    /// budget.
    pub fn admitted(&mut self, held: Held, shown: admission::Admitted) {
        let requests = shown
            .requests
            .map_or(self.req_take, |u| admission::tighter(self.req_take, u));
        self.headers = admission::headers(requests, shown.tokens);
        if let Some(left) = shown.budget {
            admission::budget_headers(&mut self.headers, left);
        }
        self.held = Some(held);
    }

    /// A session admitted: hold `held`, show the tokens as they stand.
    pub fn hold(&mut self, held: Held, tokens: Option<Shown>) {
        self.held = Some(held);
        self.show_tokens(tokens);
    }

    /// One more header for every answer (`x-portcullis-max-tokens-clamped`).
    pub fn add_header(&mut self, name: &'static str, value: String) {
        self.headers.push((name, value));
    }

    /// The headers every answer carries.
    pub fn headers(&self) -> &[(&'static str, String)] {
        &self.headers
    }

    /// The same, for an answer that is the last to carry them.
    pub fn take_headers(&mut self) -> Vec<(&'static str, String)> {
        std::mem::take(&mut self.headers)
    }

    /// The headers, to be changed by the rate limit service's answer.
    pub fn headers_mut(&mut self) -> &mut Vec<(&'static str, String)> {
        &mut self.headers
    }

    /// The reservations, to be filled by the asks of the fleet's limits.
    pub fn held_mut(&mut self) -> &mut Held {
        self.held.get_or_insert_with(Held::default)
    }

    /// The reservations held so far, if any.
    pub fn held(&mut self) -> Option<&mut Held> {
        self.held.as_mut()
    }

    /// Whether an answer's usage must be read to settle a reservation.
    pub fn wants_usage(&self) -> bool {
        self.held.as_ref().is_some_and(Held::wants_usage)
    }

    /// End the request's hold on its client's limits (once).
    pub fn finish(&mut self, host: &impl Host, how: Finish) {
        if let Some(h) = self.held.as_mut() {
            h.finish(host, how, host.now_ms());
        }
    }

    /// The rate limit service's call now in flight.
    pub fn wait_for(&mut self, pending: global::Pending) {
        self.pending = Some(pending);
    }

    /// The call in flight, taken to read an answer (given back with
    /// [`Self::wait_for`] while calls remain).
    pub fn take_pending(&mut self) -> Option<global::Pending> {
        self.pending.take()
    }
}
