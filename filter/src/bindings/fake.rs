//! A host for unit tests: header maps, bodies and shared data in memory, a
//! settable clock, and every call the request path makes recorded (the
//! local reply, callouts, metrics, records, log lines). Clones share state,
//! so a test keeps a handle while the context owns the host.

use crate::host::{Headers, Host, Part};
use crate::host::{LogLevel, Status};
use portcullis_core::shared::store::{MemStore, Store, StoreError};
use portcullis_core::telemetry::record::Record;
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// A callout the request path sent.
#[derive(Debug, Clone)]
pub struct Callout {
    pub cluster: String,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub timeout_ms: u64,
}

impl Callout {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A header map as the fake keeps it (a test edits it in place).
pub type Pairs = Vec<(String, Vec<u8>)>;

#[derive(Default)]
pub struct State {
    pub now_ms: u64,
    pub maps: HashMap<&'static str, Pairs>,
    pub bodies: HashMap<&'static str, Vec<u8>>,
    pub properties: HashMap<String, Vec<u8>>,
    /// The local reply, if the filter answered.
    pub sent: Option<(u16, Pairs, Vec<u8>)>,
    pub callouts: Vec<Callout>,
    /// Refuse callouts (as Envoy does for an unknown cluster).
    pub refuse_callouts: bool,
    pub counters: HashMap<String, i64>,
    pub gauges: HashMap<String, i64>,
    pub histograms: Vec<(String, u64)>,
    pub records: Vec<Record>,
    pub logs: Vec<String>,
    /// The answer `grpc_answer` reads.
    pub grpc_answer: Vec<u8>,
    /// How many times the request was resumed.
    pub resumed: u32,
    /// Other requests woken (context id, `authorization`).
    pub woken: Vec<(u32, Option<String>)>,
    /// Messages queued for the root context.
    pub later: Vec<Vec<u8>>,
    /// Every call that crosses into Envoy (the ABI), in order, with what it
    /// names: what a request costs in host calls.
    pub trace: Vec<String>,
    /// Whether to keep `trace` (off: profiling runs leave it out).
    pub tracing: bool,
}

#[derive(Clone, Default)]
pub struct FakeHost {
    pub state: Rc<RefCell<State>>,
    pub store: Rc<MemStore>,
    /// The worker's state: fresh for each test's host, shared by the
    /// requests it makes.
    pub worker: Rc<crate::host::worker::Worker>,
}

fn key(part: Part) -> &'static str {
    match part {
        Part::Request => "request",
        Part::Response => "response",
        Part::CallResponse => "call",
    }
}

impl FakeHost {
    fn trace(&self, call: &str, what: &str) {
        let mut st = self.state.borrow_mut();
        if st.tracing {
            st.trace.push(format!("{call} {what}"));
        }
    }

    /// The calls into Envoy so far.
    pub fn host_calls(&self) -> Vec<String> {
        self.state.borrow().trace.clone()
    }

    pub fn set_headers(&self, part: Part, pairs: &[(&str, &str)]) {
        let map = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
            .collect();
        self.state.borrow_mut().maps.insert(key(part), map);
    }

    pub fn set_body_bytes(&self, part: Part, body: &[u8]) {
        self.state
            .borrow_mut()
            .bodies
            .insert(key(part), body.to_vec());
    }

    pub fn header(&self, part: Part, name: &str) -> Option<String> {
        let st = self.state.borrow();
        let (_, v) = st.maps.get(key(part))?.iter().find(|(k, _)| k == name)?;
        Some(String::from_utf8_lossy(v).into_owned())
    }

    pub fn body_of(&self, part: Part) -> Vec<u8> {
        self.state
            .borrow()
            .bodies
            .get(key(part))
            .cloned()
            .unwrap_or_default()
    }

    pub fn counter(&self, name: &str) -> i64 {
        self.state.borrow().counters.get(name).copied().unwrap_or(0)
    }

    pub fn sent(&self) -> Option<(u16, Pairs, Vec<u8>)> {
        self.state.borrow().sent.clone()
    }

    pub fn callouts(&self) -> Vec<Callout> {
        self.state.borrow().callouts.clone()
    }
}

impl Store for FakeHost {
    fn get(&self, key: &str) -> Result<(Option<Vec<u8>>, Option<u32>), StoreError> {
        self.trace("get_shared_data", key);
        self.store.get(key)
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<u32>) -> Result<(), StoreError> {
        self.trace("set_shared_data", key);
        self.store.set(key, value, cas)
    }
}

impl Host for FakeHost {
    fn worker(&self) -> &crate::host::worker::Worker {
        &self.worker
    }

    fn now_ms(&self) -> u64 {
        self.trace("get_current_time", "");
        self.state.borrow().now_ms
    }

    fn log(&self, level: LogLevel, message: &str) {
        self.trace("log", "");
        self.state
            .borrow_mut()
            .logs
            .push(format!("{level:?}: {message}"));
    }

    fn headers(&self, part: Part) -> Result<Headers, Status> {
        self.trace("get_map", key(part));
        Ok(self
            .state
            .borrow()
            .maps
            .get(key(part))
            .map(|m| m.iter().map(|(k, v)| (k, v)).collect())
            .unwrap_or_default())
    }

    fn set_header(&self, part: Part, name: &str, value: Option<&str>) -> Result<(), Status> {
        self.trace("set_map_value", name);
        let mut st = self.state.borrow_mut();
        let map = st.maps.entry(key(part)).or_default();
        map.retain(|(k, _)| k != name);
        if let Some(v) = value {
            map.push((name.to_string(), v.as_bytes().to_vec()));
        }
        Ok(())
    }

    fn add_header(&self, part: Part, name: &str, value: &str) -> Result<(), Status> {
        self.trace("add_map_value", name);
        let mut st = self.state.borrow_mut();
        let map = st.maps.entry(key(part)).or_default();
        map.push((name.to_string(), value.as_bytes().to_vec()));
        Ok(())
    }

    fn body(&self, part: Part, size: usize) -> Result<Vec<u8>, Status> {
        self.trace("get_buffer", key(part));
        let body = self.body_of(part);
        Ok(body
            .get(..size.min(body.len()))
            .unwrap_or_default()
            .to_vec())
    }

    fn set_body(&self, part: Part, _size: usize, bytes: &[u8]) -> Result<(), Status> {
        self.trace("set_buffer", key(part));
        self.set_body_bytes(part, bytes);
        Ok(())
    }

    fn property(&self, path: &[&str]) -> Option<Vec<u8>> {
        self.trace("get_property", &path.join("."));
        self.state.borrow().properties.get(&path.join(".")).cloned()
    }

    fn send_response(
        &self,
        status: u16,
        headers: &[(&str, &[u8])],
        body: &[u8],
    ) -> Result<(), Status> {
        self.trace("send_http_response", "");
        let headers = headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_vec()))
            .collect();
        self.state.borrow_mut().sent = Some((status, headers, body.to_vec()));
        Ok(())
    }

    fn dispatch(
        &self,
        cluster: &str,
        headers: &[(&str, &str)],
        body: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status> {
        self.trace("dispatch_http_call", cluster);
        let mut st = self.state.borrow_mut();
        if st.refuse_callouts {
            return Err(Status::BadArgument);
        }
        st.callouts.push(Callout {
            cluster: cluster.to_string(),
            headers: headers
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
            timeout_ms,
        });
        Ok(u32::try_from(st.callouts.len()).unwrap_or(u32::MAX))
    }

    fn dispatch_grpc(
        &self,
        cluster: &str,
        service: &str,
        method: &str,
        metadata: &[(&str, &[u8])],
        message: &[u8],
        timeout_ms: u64,
    ) -> Result<u32, Status> {
        let auth = metadata
            .iter()
            .find(|(k, _)| *k == "authorization")
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .unwrap_or_default();
        let mut headers = vec![("grpc-service", service), ("grpc-method", method)];
        if !auth.is_empty() {
            headers.push(("authorization", auth.as_str()));
        }
        self.dispatch(cluster, &headers, message, timeout_ms)
    }

    fn grpc_answer(&self, _size: usize) -> Result<Vec<u8>, Status> {
        self.trace("get_buffer", "grpc");
        Ok(self.state.borrow().grpc_answer.clone())
    }

    fn resume_request(&self) -> Result<(), Status> {
        self.trace("resume", "");
        self.state.borrow_mut().resumed += 1;
        Ok(())
    }

    fn wake(&self, context_id: u32, authorization: Option<&str>) -> Result<(), Status> {
        self.state
            .borrow_mut()
            .woken
            .push((context_id, authorization.map(str::to_string)));
        Ok(())
    }

    fn send_later(&self, message: Vec<u8>) {
        self.state.borrow_mut().later.push(message);
    }

    fn count(&self, name: &str, by: i64) {
        *self
            .state
            .borrow_mut()
            .counters
            .entry(name.to_string())
            .or_default() += by;
    }

    fn gauge(&self, name: &str, value: u64) {
        self.trace("record_metric", name);
        let v = i64::try_from(value).unwrap_or(i64::MAX);
        self.state.borrow_mut().gauges.insert(name.to_string(), v);
    }

    fn add_to_gauge(&self, name: &str, by: i64) {
        self.trace("increment_metric", name);
        *self
            .state
            .borrow_mut()
            .gauges
            .entry(name.to_string())
            .or_default() += by;
    }

    fn histogram(&self, name: &str, value: u64) {
        self.trace("record_metric", name);
        self.state
            .borrow_mut()
            .histograms
            .push((name.to_string(), value));
    }

    fn emit_record(&self, record: &Record) {
        self.state.borrow_mut().records.push(record.clone());
    }
}
