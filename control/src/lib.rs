//! portcullis-control: the fleet's control plane. Keys, teams and budgets
//! are managed through an admin API (`api`), kept in SQLite or PostgreSQL
//! (`db`, `store`) with an audit log, compiled by the filter's own core
//! before they are accepted, and served to every Envoy over xDS (`xds`,
//! ECDS) as the plugin config a file-based Envoy would read.

pub mod api;
pub mod cds;
pub mod collector;
pub mod db;
pub mod secret;
pub mod state;
pub mod store;
pub mod xds;

/// The xDS messages (proto/xds.proto) and services (proto/ecds.proto,
/// proto/cds.proto, with the cluster messages the control plane writes).
pub mod pb {
    #![allow(
        clippy::all,
        clippy::pedantic,
        clippy::unwrap_used,
        clippy::indexing_slicing
    )]
    pub mod envoy {
        pub mod service {
            pub mod discovery {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.discovery.v3");
                }
            }
            pub mod extension {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.extension.v3");
                }
            }
            pub mod cluster {
                pub mod v3 {
                    tonic::include_proto!("envoy.service.cluster.v3");
                }
            }
        }
    }
    pub use envoy::service::cluster::v3 as cluster;
    pub use envoy::service::discovery::v3 as discovery;
    pub use envoy::service::extension::v3 as extension;
}

use std::sync::Arc;
use store::{Change, Refusal};

/// Serve the newest version in the database when it is newer than the one
/// served: at start, and after another control plane sharing the database
/// made a change.
pub async fn follow_database(app: api::App, every: std::time::Duration) {
    loop {
        if let Ok(Some(v)) = app.store.call(|inner| inner.current()).await {
            app.publish(&v);
        }
        tokio::time::sleep(every).await;
    }
}

/// Drop rotated-out keys whose grace period has ended (the filter already
/// refuses them; this keeps the config tidy). A change only when one did.
pub async fn expire_previous_keys(app: api::App, every: std::time::Duration) {
    loop {
        tokio::time::sleep(every).await;
        let now_s = u64::try_from(api::now_ms() / 1000).unwrap_or(0);
        let due = app
            .store
            .call(move |inner| {
                inner.read(|_, s| {
                    s.clients
                        .iter()
                        .any(|c| c.previous.iter().any(|p| p.until <= now_s))
                })
            })
            .await
            .unwrap_or(false);
        if !due {
            continue;
        }
        let change = Change {
            actor: "portcullis-control".into(),
            action: "key.expire".into(),
            target: "previous_keys".into(),
            detail: String::new(),
        };
        let result = app
            .store
            .call(move |inner| {
                inner.change(change, api::now_ms(), |s| {
                    for c in &mut s.clients {
                        c.previous.retain(|p| p.until > now_s);
                    }
                    Ok::<(), Refusal>(())
                })
            })
            .await;
        if let Ok(((), v)) = result {
            app.publish(&v);
        }
    }
}

/// Where a new snapshot is published, and read.
pub type Publisher = tokio::sync::watch::Sender<Option<Arc<xds::Snapshot>>>;
pub type Subscriber = tokio::sync::watch::Receiver<Option<Arc<xds::Snapshot>>>;

/// The snapshot channel the API publishes to and every xDS stream reads.
pub fn snapshots() -> (Arc<Publisher>, Subscriber) {
    let (tx, rx) = tokio::sync::watch::channel(None);
    (Arc::new(tx), rx)
}
