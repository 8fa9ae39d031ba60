//! Portcullis collector: request records over gRPC into SQLite, with a query
//! API, Prometheus metrics and a dashboard.

pub mod access;
pub mod api;
pub mod budgets;
pub mod db;
pub mod grpc;
pub mod otlp;
pub mod pg;
pub mod rollup;
pub mod since;
pub mod sqlite;
pub mod store;
pub mod summary;
pub mod types;

#[allow(
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
pub mod proto {
    tonic::include_proto!("portcullis.v1");
}

#[allow(
    clippy::all,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing
)]
pub mod otlp_proto {
    tonic::include_proto!("portcullis.otlp");
}
