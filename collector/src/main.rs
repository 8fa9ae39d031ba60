//! portcullis-collector: `--grpc ADDR --http ADDR --db PATH|postgres://... [--retention-days N]
//! [--retention-records N] [--queue N] [--read-token-file PATH] [--allowed-hosts NAME,...]
//! [--ingest-token-file PATH] [--tls-cert PATH --tls-key PATH [--tls-client-ca PATH]]
//! [--plugin-config PATH] [--otlp-endpoint URL ...]` (the gateway's plugin YAML: the dashboard's
//! budgets; the OTLP export's flags are in `otlp::Config` and docs/opentelemetry.md).
//! The TLS flags serve the gRPC ingest over TLS, with client certificates
//! signed by `--tls-client-ca` required when it is given
//! (`portcullis_service`).
//! Prints `portcullis-collector grpc=<addr> http=<addr>` once both listen.
//! HTTP answers only to its own host names, and with a read token file
//! only to requests that carry the token (`access`).

use portcullis_collector::access::{token_from_file, Access};
use portcullis_collector::api::{router_with, Api};
use portcullis_collector::db::{connect, migrate};
use portcullis_collector::grpc::Ingest;
use portcullis_collector::proto::collector_server::CollectorServer;
use portcullis_collector::store::{Retention, Writer};
use std::sync::{Arc, Mutex};

use portcullis_service::flag_value as arg;

fn main() {
    if let Err(e) = run() {
        eprintln!("portcullis-collector: {e}");
        std::process::exit(1);
    }
}

/// The database is opened before the async runtime starts: PostgreSQL's
/// sync client runs its own, which may not be started inside another.
fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let grpc_addr = arg(&args, "--grpc").unwrap_or_else(|| "127.0.0.1:50051".into());
    let http_addr = arg(&args, "--http").unwrap_or_else(|| "127.0.0.1:9090".into());
    let db = arg(&args, "--db").unwrap_or_else(|| "portcullis.db".into());
    let retention = Retention {
        days: arg(&args, "--retention-days")
            .map(|d| d.parse::<u64>())
            .transpose()?,
        max_records: arg(&args, "--retention-records")
            .map(|d| d.parse::<u64>())
            .transpose()?,
    };
    let queue: usize = arg(&args, "--queue")
        .map(|d| d.parse())
        .transpose()?
        .unwrap_or(256);

    let token = token_from_file("--read-token-file", arg(&args, "--read-token-file"))?;
    let ingest_token = token_from_file("--ingest-token-file", arg(&args, "--ingest-token-file"))?;
    let tls = portcullis_service::TlsFlags::from_args(&args)?;
    let tls = tls.server_config()?;
    let hosts = portcullis_service::AllowedHosts::names(arg(&args, "--allowed-hosts"));

    let export = portcullis_collector::otlp::Config::from_args(&args)?
        .map(portcullis_collector::otlp::start)
        .transpose()?;
    let mut conn = connect(&db)?;
    migrate(&mut conn)?;
    let otlp = export.as_ref().map(|s| s.stats.clone());
    let writer = Writer::start_with(conn, queue, retention, export);
    let reader = Arc::new(Mutex::new(connect(&db)?));
    let api = Api {
        reader,
        stats: writer.stats.clone(),
        otlp,
        plugin: arg(&args, "--plugin-config")
            .map(|p| Arc::new(portcullis_collector::budgets::PluginConfig::new(p.into()))),
    };
    tokio::runtime::Runtime::new()?.block_on(serve(
        grpc_addr,
        http_addr,
        writer,
        api,
        (hosts, token),
        (ingest_token, tls),
    ))
}

async fn serve(
    grpc_addr: String,
    http_addr: String,
    writer: Writer,
    api: Api,
    (hosts, token): (Vec<String>, Option<String>),
    (ingest_token, tls): (Option<String>, Option<tonic::transport::ServerTlsConfig>),
) -> Result<(), Box<dyn std::error::Error>> {
    let grpc_listener = tokio::net::TcpListener::bind(&grpc_addr).await?;
    let http_listener = tokio::net::TcpListener::bind(&http_addr).await?;
    println!(
        "portcullis-collector grpc={} http={}",
        grpc_listener.local_addr()?,
        http_listener.local_addr()?
    );

    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    let grpc = builder
        .add_service(CollectorServer::new(Ingest {
            writer,
            token: ingest_token,
        }))
        .serve_with_incoming(tonic::transport::server::TcpIncoming::from(grpc_listener));
    let access = Access::new(http_listener.local_addr()?, &hosts, token);
    let http = axum::serve(http_listener, router_with(api, access));
    tokio::select! {
        r = grpc => r?,
        r = http => r?,
        _ = tokio::signal::ctrl_c() => {}
    }
    Ok(())
}
