//! The host: what the filter asks of Envoy, whichever build runs it. The
//! trait (this file), what a worker keeps between requests (`worker`),
//! counters summed per worker (`registry`) and every metric name
//! (`metrics`).
//!
//! The bottom floor: it uses nothing of the crate above it.
//!
//! May use: nothing.
//!
//! Everything the request path asks of Envoy, behind one trait: header maps,
//! bodies, local replies, callouts, shared data, the clock, metrics and the
//! request log. Envoy is behind it twice: `wasm::AbiHost` over the
//! proxy-wasm ABI and `native::NativeHost` over the dynamic-module ABI;
//! tests drive the same request path with [`crate::bindings::fake::FakeHost`].
//!
//! The values the steps and the host exchange ([`Action`], [`LogLevel`],
//! [`Status`]) are ours, so the request path depends on neither ABI.

pub mod metrics;
pub mod registry;
pub mod worker;

use portcullis_core::shared::store::Store;
use portcullis_core::telemetry::record::Record;

/// What a callback tells Envoy about the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Let it go on to the next filter.
    Continue,
    /// Hold it here until the filter resumes it (or answers).
    Pause,
}

/// The levels the gateway logs at; the numbers are both ABIs' levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum LogLevel {
    Info = 2,
    Warn = 3,
    Error = 4,
    Critical = 5,
}

/// Why a host call failed. The numbers are proxy-wasm's statuses; the
/// native host maps its own failures onto the same names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
// Some are proxy-wasm's alone.
#[cfg_attr(not(target_arch = "wasm32"), allow(dead_code))]
pub enum Status {
    NotFound = 1,
    BadArgument = 2,
    SerializationFailure = 3,
    ParseFailure = 4,
    Empty = 7,
    CasMismatch = 8,
    InternalFailure = 10,
    /// The native host has no stream to act on.
    #[cfg_attr(target_arch = "wasm32", allow(dead_code))]
    Unimplemented = 12,
}

/// A header map as read: names as text, values as bytes (HTTP allows values
/// that are not UTF-8, and those must pass through unchanged). Read once per
/// hook, so it is one buffer of names, one of values and their places,
/// three allocations whatever the count (a pair of owned strings per header
/// cost the native routed path about 10k instructions a request).
#[derive(Debug, Clone, Default)]
pub struct Headers {
    names: String,
    values: Vec<u8>,
    /// Each header's name and value, as ranges of `names` and `values`.
    places: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
}

impl Headers {
    /// Room for `count` headers whose names take `names` bytes in all and
    /// whose values take `values`.
    pub fn with_capacity(count: usize, names: usize, values: usize) -> Headers {
        Headers {
            names: String::with_capacity(names),
            values: Vec::with_capacity(values),
            places: Vec::with_capacity(count),
        }
    }

    /// Add a header at the end.
    pub fn push(&mut self, name: &str, value: &[u8]) {
        let n = self.names.len();
        self.names.push_str(name);
        let v = self.values.len();
        self.values.extend_from_slice(value);
        self.places
            .push((n..self.names.len(), v..self.values.len()));
    }

    /// A map over buffers already filled (Envoy's serialized map, copied
    /// once into the VM; the native build's copy): `places` are ranges of
    /// `names` and of `values`.
    pub fn over(
        values: Vec<u8>,
        names: String,
        places: Vec<(std::ops::Range<usize>, std::ops::Range<usize>)>,
    ) -> Headers {
        Headers {
            names,
            values,
            places,
        }
    }

    /// Every header, in order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            map: self,
            places: self.places.iter(),
        }
    }

    /// The first value of `name` (names as Envoy gives them: lower case).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    }

    pub fn is_empty(&self) -> bool {
        self.places.is_empty()
    }
}

/// A map's headers in order: name and value.
pub struct Iter<'a> {
    map: &'a Headers,
    places: std::slice::Iter<'a, (std::ops::Range<usize>, std::ops::Range<usize>)>,
}

impl<'a> Iterator for Iter<'a> {
    type Item = (&'a str, &'a [u8]);
    fn next(&mut self) -> Option<Self::Item> {
        let (n, v) = self.places.next()?;
        Some((
            self.map.names.get(n.clone()).unwrap_or_default(),
            self.map.values.get(v.clone()).unwrap_or_default(),
        ))
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a str, &'a [u8]);
    type IntoIter = Iter<'a>;
    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

impl<K: AsRef<str>, V: AsRef<[u8]>> FromIterator<(K, V)> for Headers {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(pairs: I) -> Headers {
        let mut out = Headers::default();
        for (k, v) in pairs {
            out.push(k.as_ref(), v.as_ref());
        }
        out
    }
}

/// Which header map or body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    Request,
    Response,
    /// The answer to a `dispatch` callout.
    CallResponse,
}

pub trait Host: Store {
    /// What this worker keeps between requests (one per worker, owned by
    /// the root context).
    fn worker(&self) -> &crate::host::worker::Worker;
    fn now_ms(&self) -> u64;
    fn log(&self, level: LogLevel, message: &str);

    fn headers(&self, part: Part) -> Result<Headers, Status>;
    /// Replace a header, or remove it with `None`.
    fn set_header(&self, part: Part, name: &str, value: Option<&str>) -> Result<(), Status>;
    fn add_header(&self, part: Part, name: &str, value: &str) -> Result<(), Status>;
    /// The first `size` bytes of a body (all that has arrived).
    fn body(&self, part: Part, size: usize) -> Result<Vec<u8>, Status>;
    /// Replace the first `size` bytes of a body.
    fn set_body(&self, part: Part, size: usize, bytes: &[u8]) -> Result<(), Status>;
    /// A stream property (e.g. `response.code_details`).
    fn property(&self, path: &[&str]) -> Option<Vec<u8>>;

    /// Answer the client from the filter.
    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), Status>;
    /// Send a request to an Envoy cluster; the answer arrives at the
    /// context's `on_http_call_response` with the returned token.
    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status>;

    /// A gRPC call to an Envoy cluster; the answer arrives at the context's
    /// `on_grpc_call_response` with the returned token.
    fn dispatch_grpc(
        &self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status>;
    /// The message of a gRPC answer (`size` bytes).
    fn grpc_answer(&self, size: usize) -> Result<Vec<u8>, Status>;
    /// Let a request paused at its body go on.
    fn resume_request(&self) -> Result<(), Status>;
    /// Let another request of this worker, paused for an access token, go
    /// on: its `authorization` set (none: left out) and its request resumed.
    fn wake(&self, context_id: u32, authorization: Option<&str>) -> Result<(), Status>;
    /// Queue a rate-limit message the root context sends on its next tick
    /// (a request's context may be gone before an answer would come); a
    /// message the full queue cannot take is counted as dropped.
    fn send_later(&self, message: Vec<u8>) {
        if !self.worker().queue_settlement(message) {
            self.count(crate::host::metrics::GLOBAL_SETTLE_DROPPED, 1);
        }
    }

    /// Add to a counter (summed in the VM, handed to Envoy at each tick).
    fn count(&self, name: &str, by: i64) {
        crate::host::registry::count(self.worker(), name, by);
    }
    /// Set a gauge.
    fn gauge(&self, name: &str, value: u64);
    /// Add to a gauge shared by the workers (each adds its own change;
    /// summed in the VM, handed to Envoy at each tick).
    fn add_to_gauge(&self, name: &str, by: i64);
    fn histogram(&self, name: &str, value: u64);
    /// Queue a request record for the collector (never blocks, may drop).
    fn emit_record(&self, record: &Record);
}

/// An answer's `:status`, when it is a number.
pub(crate) fn status_of(headers: &Headers) -> Option<u16> {
    std::str::from_utf8(headers.get(":status")?)
        .ok()?
        .parse()
        .ok()
}
