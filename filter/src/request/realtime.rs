//! A Realtime session (`realtime.rs`), as it goes.

use portcullis_core::error::GatewayError;
use portcullis_core::limits::ratelimit::Price;
use portcullis_core::usage::Usage;
use portcullis_core::wire::websocket::{Frames, Side, DEFAULT_CAP};

/// A session through the gateway: where it went, both directions' frames,
/// what its responses used, and how it ends.
#[derive(Debug)]
pub struct Session {
    /// The model (an index of `gw.models`), as asked and as the provider
    /// names it.
    pub model: usize,
    pub requested: String,
    pub model_id: String,
    pub provider: usize,
    pub price: Option<Price>,
    pub price_source: &'static str,
    pub client: Frames,
    pub server: Frames,
    /// Usage of every `response.done`, summed, and its cost.
    pub usage: Usage,
    pub cost_micros: i64,
    /// Each response's status (`completed`, `cancelled`, ...) and the last
    /// one's id.
    pub statuses: Vec<String>,
    pub last_response: String,
    /// The gateway ends the session: the error the client is told, the
    /// close code.
    pub ending: Option<(GatewayError, u16)>,
    /// The error event and the close frame went to the client; the close
    /// frame to the provider.
    pub told_client: bool,
    pub told_provider: bool,
    /// Output checks on the server's text as it passes.
    pub output: portcullis_core::api::realtime::OutputChecks,
    /// Events the gateway made (their ids).
    pub made: u64,
    /// The key's limits counted by the rate limit service (`scope:
    /// global`): each limit's descriptors, and the calls in flight.
    pub global: Vec<crate::limits::global::Ask>,
    pub global_calls: Vec<(u32, Vec<crate::limits::global::Ask>)>,
    /// The key's stamp when the session began
    /// (`portcullis_core::shared::keys::client_stamp`): another one later means
    /// the key was revoked or changed, and the session ends.
    pub stamp: Option<Vec<u8>>,
    /// `loaded::CONFIGS_APPLIED` when the stamp was last read.
    pub configs_seen: u64,
}

impl Session {
    pub fn new(
        requested: String,
        model: usize,
        provider: usize,
        model_id: String,
        key: [u8; 4],
        cap: usize,
    ) -> Session {
        Session {
            model,
            requested,
            model_id,
            provider,
            price: None,
            price_source: "",
            client: Frames::new(Side::Client, cap, key),
            server: Frames::new(Side::Server, cap.max(DEFAULT_CAP), key),
            stamp: None,
            configs_seen: 0,
            usage: Usage::default(),
            cost_micros: 0,
            statuses: Vec::new(),
            last_response: String::new(),
            ending: None,
            told_client: false,
            told_provider: false,
            output: Default::default(),
            made: 0,
            global: Vec::new(),
            global_calls: Vec::new(),
        }
    }

    /// End the session with this error (the first reason stands).
    pub fn end(&mut self, err: GatewayError, code: u16) {
        if self.ending.is_none() {
            self.ending = Some((err, code));
        }
    }
}

/// The headers of an upgrade the gateway reads.
pub(crate) struct Upgrade<'a> {
    pub query: &'a str,
    pub websocket: bool,
    pub protocols: Option<String>,
}
