//! portcullis-control
//!
//! `serve --db PATH|postgres://... [--admin ADDR] [--xds ADDR] [--resource FILE]
//!  [--import PLUGIN_YAML] [--grace-s N] [--xds-token-file PATH]
//!  [--tls-cert PATH --tls-key PATH [--tls-client-ca PATH]] [--write-config PATH]
//!  [--collector http://HOST:PORT [--collector-token-file PATH]]
//!  [--allowed-hosts NAME,...] [--max-config-bytes N]`
//!
//! Serves the admin API on `--admin` (127.0.0.1:9400) and ECDS on `--xds`
//! (127.0.0.1:18000), serving the resource of `--resource` (an ECDS file
//! as `envoy/render-ecds.sh` writes it) with the managed plugin config in
//! it. `--import` loads a plugin YAML when the database has no config yet
//! (without it, the plugin config the `--resource` file carries).
//! Prints `portcullis-control admin=<addr> xds=<addr>` once both listen.
//! xDS listens beyond loopback only with a token or client certificates.
//! `--write-config` writes each version served to a file (the collector's
//! `--plugin-config`); `--collector` is where the dashboard's spend comes
//! from (`/dashboard`, `/v1/spend`).
//!
//! `token create --db ... --name NAME --role read|write`: a new admin
//! token, printed once (only its SHA-256 is kept). `token add ... --token-file
//! PATH`: a token chosen elsewhere (a deployment's secret), idempotent.

use portcullis_control::api::{self, App};
use portcullis_control::pb::cluster::cluster_discovery_service_server::ClusterDiscoveryServiceServer;
use portcullis_control::pb::extension::extension_config_discovery_service_server::ExtensionConfigDiscoveryServiceServer;
use portcullis_control::store::{Change, Role, Store};
use portcullis_control::xds::{Ecds, Template};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use portcullis_service::flag_value as arg;

fn main() {
    if let Err(e) = run() {
        eprintln!("portcullis-control: {e}");
        std::process::exit(1);
    }
}

const USAGE: &str = "usage: portcullis-control serve --db PATH|postgres://... [--admin ADDR] [--xds ADDR] [--resource FILE] [--import PLUGIN_YAML] [--grace-s N] [--xds-token-file PATH] [--tls-cert PATH --tls-key PATH [--tls-client-ca PATH]] [--write-config PATH] [--collector http://HOST:PORT [--collector-token-file PATH]] [--allowed-hosts NAME,...] [--max-config-bytes N]\n       portcullis-control token create --db PATH|postgres://... --name NAME --role read|write\n       portcullis-control token add --db PATH|postgres://... --name NAME --role read|write --token-file PATH";

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let db = arg(&args, "--db").ok_or(USAGE)?;
    match (
        args.get(1).map(String::as_str),
        args.get(2).map(String::as_str),
    ) {
        (Some("token"), Some(verb @ ("create" | "add"))) => {
            let name = arg(&args, "--name").ok_or(format!("token {verb} needs --name"))?;
            let role = arg(&args, "--role")
                .as_deref()
                .and_then(Role::parse)
                .ok_or(format!("token {verb} needs --role read or --role write"))?;
            // `add`: a token chosen elsewhere (a secret of the deployment);
            // adding it again changes nothing. `create`: a new one, printed.
            let given = if verb == "add" {
                Some(
                    portcullis_service::token_from_file(
                        "--token-file",
                        arg(&args, "--token-file"),
                    )?
                    .ok_or("token add needs --token-file")?,
                )
            } else {
                None
            };
            let store = Store::open(&db)?;
            let token = store
                .call_blocking(move |inner| match given {
                    Some(t) => inner
                        .add_token(&t, &name, role, api::now_ms())
                        .map(|()| None),
                    None => inner.create_token(&name, role, api::now_ms()).map(Some),
                })
                .map_err(|r| r.message)?;
            if let Some(t) = token {
                println!("{t}");
            }
            Ok(())
        }
        (Some("serve"), _) => serve(&args, &db),
        _ => Err(USAGE.into()),
    }
}

fn serve(args: &[String], db: &str) -> Result<(), Box<dyn std::error::Error>> {
    let admin_addr: SocketAddr = arg(args, "--admin")
        .unwrap_or_else(|| "127.0.0.1:9400".into())
        .parse()?;
    let xds_addr: SocketAddr = arg(args, "--xds")
        .unwrap_or_else(|| "127.0.0.1:18000".into())
        .parse()?;
    let grace_s: u64 = arg(args, "--grace-s")
        .map(|g| g.parse())
        .transpose()?
        .unwrap_or(86_400);
    let xds_token =
        portcullis_service::token_from_file("--xds-token-file", arg(args, "--xds-token-file"))?;
    let tls = portcullis_service::TlsFlags::from_args(args)?;
    if !xds_addr.ip().is_loopback() && xds_token.is_none() && tls.client_ca.is_none() {
        return Err(format!(
            "--xds {xds_addr} is beyond loopback: give --xds-token-file or --tls-client-ca so that only your Envoys get the config"
        )
        .into());
    }
    let tls = tls.server_config()?;
    let template = match arg(args, "--resource") {
        Some(p) => {
            let text = std::fs::read_to_string(&p).map_err(|e| format!("--resource {p}: {e}"))?;
            Some(Arc::new(
                Template::from_resources_yaml(&text).map_err(|e| format!("--resource {p}: {e}"))?,
            ))
        }
        None => None,
    };
    let store = Store::open(db)?;
    // The first config: --import's file, else the one the resource carries.
    let first = match arg(args, "--import") {
        Some(p) => Some((
            std::fs::read_to_string(&p).map_err(|e| format!("--import {p}: {e}"))?,
            format!("--import {p}"),
        )),
        None => template
            .as_ref()
            .and_then(|t| t.plugin_config())
            .map(|c| (c, "the --resource file's plugin config".to_string())),
    };
    if let Some((text, p)) = first {
        let empty = store
            .call_blocking(|inner| inner.current())
            .map_err(|r| r.message)?
            .is_none();
        if empty {
            let state = portcullis_control::state::State::from_yaml(&text, api::now_ms())
                .map_err(|e| format!("{p}: {e}"))?;
            let change = Change {
                actor: "portcullis-control".into(),
                action: "config.import".into(),
                target: "config".into(),
                detail: p.clone(),
            };
            store
                .call_blocking(move |inner| {
                    inner.change(change, api::now_ms(), move |s| {
                        *s = state;
                        Ok(())
                    })
                })
                .map_err(|r| format!("{p}: {}", r.message))?;
        }
    }
    let (snapshots, watcher) = portcullis_control::snapshots();
    let app = App {
        store,
        snapshots,
        template,
        nodes: Default::default(),
        default_grace_s: grace_s,
        write_config: arg(args, "--write-config").map(Into::into),
        collector: match arg(args, "--collector") {
            Some(url) => Some(Arc::new(portcullis_control::collector::Collector::new(
                &url,
                portcullis_service::token_from_file(
                    "--collector-token-file",
                    arg(args, "--collector-token-file"),
                )?,
            )?)),
            None => None,
        },
        max_config_bytes: match arg(args, "--max-config-bytes") {
            Some(v) => v
                .trim()
                .parse()
                .ok()
                .filter(|&n: &usize| n > 0)
                .ok_or(format!("--max-config-bytes {v}: a number of bytes"))?,
            None => portcullis_core::config::DEFAULT_MAX_CONFIG_BYTES,
        },
    };
    tokio::runtime::Runtime::new()?.block_on(async move {
        let admin = tokio::net::TcpListener::bind(admin_addr).await?;
        let xds = tokio::net::TcpListener::bind(xds_addr).await?;
        println!(
            "portcullis-control admin={} xds={}",
            admin.local_addr()?,
            xds.local_addr()?
        );
        let ecds = Ecds {
            snapshots: watcher,
            nodes: app.nodes.clone(),
            token: xds_token,
        };
        let mut builder = tonic::transport::Server::builder()
            // Envoy keeps one stream open per subscription; keepalives
            // notice a peer that went away.
            .http2_keepalive_interval(Some(Duration::from_secs(30)));
        if let Some(tls) = tls {
            builder = builder.tls_config(tls)?;
        }
        let grpc = builder
            .add_service(ExtensionConfigDiscoveryServiceServer::new(ecds.clone()))
            // The providers' clusters (those with an `upstream`), over CDS.
            .add_service(ClusterDiscoveryServiceServer::new(ecds))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(xds));
        tokio::spawn(portcullis_control::follow_database(
            app.clone(),
            Duration::from_secs(1),
        ));
        tokio::spawn(portcullis_control::expire_previous_keys(
            app.clone(),
            Duration::from_secs(5),
        ));
        let hosts = portcullis_service::AllowedHosts::new(
            admin.local_addr()?,
            &portcullis_service::AllowedHosts::names(arg(args, "--allowed-hosts")),
        );
        let http = axum::serve(admin, api::router(app, hosts));
        tokio::select! {
            r = grpc => r?,
            r = http => r?,
            _ = tokio::signal::ctrl_c() => {}
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    })
}
