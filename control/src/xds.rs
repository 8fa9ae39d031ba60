//! The xDS side: Envoy's Extension Config Discovery Service and Cluster
//! Discovery Service (the providers' clusters, `crate::cds`), state of the
//! world. Every subscribed Envoy gets the current config on subscribing
//! and each accepted change as it happens; its ACK or NACK of the filter's
//! config (the nonce it answers, and an error detail for a NACK) is kept
//! per node for the admin API.

use crate::pb::cluster::cluster_discovery_service_server::ClusterDiscoveryService;
use crate::pb::discovery::{
    value, Any, DiscoveryRequest, DiscoveryResponse, ListValue, Node, Struct, TypedExtensionConfig,
    TypedStruct, Value,
};
use crate::pb::extension::extension_config_discovery_service_server::ExtensionConfigDiscoveryService;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

pub const TYPE_EXTENSION_CONFIG: &str =
    "type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig";
const TYPE_TYPED_STRUCT: &str = "type.googleapis.com/xds.type.v3.TypedStruct";
const TYPE_STRING_VALUE: &str = "type.googleapis.com/google.protobuf.StringValue";

/// The filter's resource as Envoy takes it from a file (the output of
/// `envoy/render-ecds.sh`): the control plane serves the same resource with
/// the plugin config it manages in place of the file's.
#[derive(Debug, Clone)]
pub struct Template {
    pub name: String,
    /// The filter's config type (Wasm or the dynamic module filter).
    pub type_url: String,
    /// The typed config as JSON, without its `@type`.
    pub config: serde_json::Value,
}

impl Template {
    /// Read an ECDS resources file (YAML): its first resource.
    pub fn from_resources_yaml(text: &str) -> Result<Template, String> {
        let doc: serde_json::Value =
            serde_yaml::from_str(text).map_err(|e| format!("the resource does not parse: {e}"))?;
        let r = doc
            .get("resources")
            .and_then(|r| r.get(0))
            .ok_or("the file has no `resources[0]`")?;
        let name = r
            .get("name")
            .and_then(|n| n.as_str())
            .ok_or("resources[0] has no `name`")?
            .to_string();
        let mut config = r
            .get("typed_config")
            .cloned()
            .ok_or("resources[0] has no `typed_config`")?;
        let type_url = config
            .as_object_mut()
            .and_then(|o| o.remove("@type"))
            .and_then(|t| t.as_str().map(str::to_string))
            .ok_or("resources[0].typed_config has no `@type`")?;
        let t = Template {
            name,
            type_url,
            config,
        };
        if t.plugin_config().is_none() {
            return Err("resources[0].typed_config holds no google.protobuf.StringValue for the plugin config".into());
        }
        Ok(t)
    }

    /// The plugin config the file carries (what a file-based Envoy would
    /// serve), if any.
    pub fn plugin_config(&self) -> Option<String> {
        fn find(v: &serde_json::Value) -> Option<String> {
            match v {
                serde_json::Value::Object(o) => {
                    if o.get("@type").and_then(|t| t.as_str()) == Some(TYPE_STRING_VALUE) {
                        return o.get("value").and_then(|v| v.as_str()).map(str::to_string);
                    }
                    o.values().find_map(find)
                }
                serde_json::Value::Array(a) => a.iter().find_map(find),
                _ => None,
            }
        }
        find(&self.config)
    }

    /// Put `yaml` in the StringValue that carries the plugin config;
    /// whether there was one.
    fn with_plugin_config(&mut self, yaml: &mut String) -> bool {
        fn put(v: &mut serde_json::Value, yaml: &mut String) -> bool {
            match v {
                serde_json::Value::Object(o) => {
                    if o.get("@type").and_then(|t| t.as_str()) == Some(TYPE_STRING_VALUE) {
                        o.insert("value".into(), std::mem::take(yaml).into());
                        return true;
                    }
                    o.values_mut().any(|c| put(c, yaml))
                }
                serde_json::Value::Array(a) => a.iter_mut().any(|c| put(c, yaml)),
                _ => false,
            }
        }
        put(&mut self.config, yaml)
    }

    /// The resource for a plugin config, as an `Any` of a
    /// TypedExtensionConfig whose typed config is a TypedStruct (Envoy
    /// converts it to the filter's config type as it does YAML).
    pub fn resource(&self, plugin_yaml: &str) -> Any {
        let mut t = self.clone();
        t.with_plugin_config(&mut plugin_yaml.to_string());
        let typed = TypedStruct {
            type_url: t.type_url.clone(),
            value: Some(to_struct(&t.config)),
        };
        let tec = TypedExtensionConfig {
            name: t.name.clone(),
            typed_config: Some(Any {
                type_url: TYPE_TYPED_STRUCT.into(),
                value: typed.encode_to_vec(),
            }),
        };
        Any {
            type_url: TYPE_EXTENSION_CONFIG.into(),
            value: tec.encode_to_vec(),
        }
    }
}

impl Template {
    /// The resource's size on the wire, in bytes.
    pub fn resource_len(&self, plugin_yaml: &str) -> usize {
        self.resource(plugin_yaml).encoded_len()
    }
}

fn to_value(v: &serde_json::Value) -> Value {
    let kind = match v {
        serde_json::Value::Null => value::Kind::NullValue(0),
        serde_json::Value::Bool(b) => value::Kind::BoolValue(*b),
        serde_json::Value::Number(n) => value::Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => value::Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => value::Kind::ListValue(ListValue {
            values: a.iter().map(to_value).collect(),
        }),
        serde_json::Value::Object(_) => value::Kind::StructValue(to_struct(v)),
    };
    Value { kind: Some(kind) }
}

fn to_struct(v: &serde_json::Value) -> Struct {
    Struct {
        fields: v
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), to_value(v))).collect())
            .unwrap_or_default(),
    }
}

/// What every Envoy is served now.
#[derive(Debug)]
pub struct Snapshot {
    pub version: i64,
    /// None when there is no resource to serve (no `--resource`): the
    /// version is tracked, nothing is sent.
    pub resource: Option<Any>,
    /// The providers' clusters (CDS): those with an `upstream`.
    pub clusters: Vec<Any>,
}

/// What a stream serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// The filter's config (ECDS); its ACKs and NACKs are the node's status.
    Extension,
    /// The providers' clusters (CDS), sent even when there are none.
    Clusters,
}

/// One Envoy, as its xDS streams tell it.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct NodeStatus {
    pub node: String,
    pub cluster: String,
    /// Open streams from this node.
    pub streams: u32,
    /// The last version sent.
    pub sent_version: Option<String>,
    /// The last version it applied (ACK).
    pub acked_version: Option<String>,
    /// The last version it refused (NACK), and why.
    pub nacked_version: Option<String>,
    pub nack: Option<String>,
    /// When this node last sent a request (Unix ms).
    pub seen_ms: i64,
}

pub type Nodes = Arc<Mutex<BTreeMap<String, NodeStatus>>>;

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn with_node(nodes: &Nodes, id: &str, f: impl FnOnce(&mut NodeStatus)) {
    if let Ok(mut m) = nodes.lock() {
        let n = m.entry(id.to_string()).or_insert_with(|| NodeStatus {
            node: id.to_string(),
            ..NodeStatus::default()
        });
        n.seen_ms = now_ms();
        f(n);
    }
}

/// The ECDS service.
#[derive(Clone)]
pub struct Ecds {
    pub snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    pub nodes: Nodes,
    /// A shared secret every call must carry (`authorization: Bearer ...`).
    pub token: Option<String>,
}

fn response(s: &Snapshot, kind: Kind, nonce: u64) -> DiscoveryResponse {
    let (resources, type_url) = match kind {
        Kind::Extension => (
            s.resource.clone().into_iter().collect(),
            TYPE_EXTENSION_CONFIG,
        ),
        Kind::Clusters => (s.clusters.clone(), crate::cds::TYPE_CLUSTER),
    };
    DiscoveryResponse {
        version_info: s.version.to_string(),
        resources,
        type_url: type_url.into(),
        nonce: nonce.to_string(),
    }
}

/// One stream: answer its requests and push each new snapshot.
async fn serve_stream(
    kind: Kind,
    mut inbound: Streaming<DiscoveryRequest>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    nodes: Nodes,
) {
    // Only the filter's config stream says how a node stands.
    let nodes = match kind {
        Kind::Extension => nodes,
        Kind::Clusters => Nodes::default(),
    };
    let mut node: Option<Node> = None;
    let mut subscribed = false;
    let mut nonce: u64 = 0;
    // The versions of the last responses, by nonce: an answer to an older
    // response still says whether Envoy applied that version.
    let mut sent: std::collections::VecDeque<(String, String)> = Default::default();
    loop {
        let push = tokio::select! {
            msg = inbound.message() => {
                let Ok(Some(r)) = msg else { break };
                if node.is_none() {
                    if let Some(n) = r.node.clone() {
                        with_node(&nodes, &n.id, |s| {
                            s.cluster = n.cluster.clone();
                            s.streams = s.streams.saturating_add(1);
                        });
                        node = Some(n);
                    }
                }
                let id = node.as_ref().map(|n| n.id.clone()).unwrap_or_default();
                if r.response_nonce.is_empty() {
                    // A subscription (first, or after a reconnect).
                    subscribed = true;
                    with_node(&nodes, &id, |_| {});
                    true
                } else {
                    let version = sent
                        .iter()
                        .find(|(n, _)| *n == r.response_nonce)
                        .map(|(_, v)| v.clone());
                    match (&r.error_detail, version) {
                        (Some(e), Some(v)) => with_node(&nodes, &id, |s| {
                            s.nacked_version = Some(v);
                            s.nack = Some(e.message.clone());
                        }),
                        (None, Some(v)) => with_node(&nodes, &id, |s| {
                            // An older ACK never hides a newer one.
                            let newer = s
                                .acked_version
                                .as_ref()
                                .and_then(|a| a.parse::<i64>().ok())
                                .zip(v.parse::<i64>().ok())
                                .is_none_or(|(a, v)| v >= a);
                            if newer {
                                s.acked_version = Some(v);
                            }
                        }),
                        // A nonce this stream never sent (or long gone).
                        _ => {}
                    }
                    false
                }
            }
            changed = snapshots.changed(), if subscribed => {
                if changed.is_err() {
                    break;
                }
                true
            }
        };
        if !push {
            continue;
        }
        let snap = snapshots.borrow_and_update().clone();
        if let Some(s) = snap.filter(|s| kind == Kind::Clusters || s.resource.is_some()) {
            nonce = nonce.wrapping_add(1);
            if sent.len() >= 16 {
                sent.pop_front();
            }
            sent.push_back((nonce.to_string(), s.version.to_string()));
            if let Some(n) = &node {
                with_node(&nodes, &n.id, |st| {
                    st.sent_version = Some(s.version.to_string())
                });
            }
            if out.send(Ok(response(&s, kind, nonce))).await.is_err() {
                break;
            }
        }
    }
    if let Some(n) = node {
        with_node(&nodes, &n.id, |s| s.streams = s.streams.saturating_sub(1));
    }
}

#[tonic::async_trait]
impl ExtensionConfigDiscoveryService for Ecds {
    type StreamExtensionConfigsStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_extension_configs(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamExtensionConfigsStream>, Status> {
        self.serve(Kind::Extension, request)
    }
}

impl Ecds {
    /// One stream of `kind`, for a caller with the token.
    fn serve(
        &self,
        kind: Kind,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<ReceiverStream<Result<DiscoveryResponse, Status>>>, Status> {
        if !portcullis_service::call_authorized(self.token.as_deref(), &request) {
            return Err(Status::unauthenticated(
                "the control plane's xDS token is missing or wrong",
            ));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(serve_stream(
            kind,
            request.into_inner(),
            tx,
            self.snapshots.clone(),
            self.nodes.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The providers' clusters, from the same snapshots, with the same token.
#[tonic::async_trait]
impl ClusterDiscoveryService for Ecds {
    type StreamClustersStream = ReceiverStream<Result<DiscoveryResponse, Status>>;

    async fn stream_clusters(
        &self,
        request: Request<Streaming<DiscoveryRequest>>,
    ) -> Result<Response<Self::StreamClustersStream>, Status> {
        self.serve(Kind::Clusters, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WASM: &str = r#"resources:
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: portcullis
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: portcullis
      vm_config:
        code: {local: {filename: "x.wasm"}}
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: |
          old: 1
"#;

    #[test]
    fn a_file_resource_is_served_with_the_managed_config_in_place_of_its_own() {
        let t = Template::from_resources_yaml(WASM).unwrap();
        assert_eq!(t.name, "portcullis");
        assert_eq!(t.plugin_config().as_deref(), Some("old: 1\n"));
        assert_eq!(
            t.type_url,
            "type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm"
        );
        let any = t.resource("new: 2\n");
        assert_eq!(any.type_url, TYPE_EXTENSION_CONFIG);
        let tec = TypedExtensionConfig::decode(any.value.as_slice()).unwrap();
        assert_eq!(tec.name, "portcullis");
        let inner = tec.typed_config.unwrap();
        assert_eq!(inner.type_url, TYPE_TYPED_STRUCT);
        let ts = TypedStruct::decode(inner.value.as_slice()).unwrap();
        assert_eq!(ts.type_url, t.type_url);
        let config = ts.value.unwrap();
        let Some(value::Kind::StructValue(c)) = config.fields["config"].kind.clone() else {
            panic!("config is not a struct")
        };
        let Some(value::Kind::StructValue(v)) = c.fields["configuration"].kind.clone() else {
            panic!("configuration is not a struct")
        };
        assert_eq!(
            v.fields["value"].kind,
            Some(value::Kind::StringValue("new: 2\n".into()))
        );
        assert!(!config.fields.contains_key("@type"));
    }

    #[test]
    fn a_file_without_a_plugin_config_is_refused() {
        for (text, want) in [
            ("resources: []\n", "no `resources[0]`"),
            ("resources: [{typed_config: {}}]\n", "no `name`"),
            (
                "resources: [{name: p, typed_config: {a: 1}}]\n",
                "no `@type`",
            ),
            (
                "resources: [{name: p, typed_config: {\"@type\": x, a: 1}}]\n",
                "no google.protobuf.StringValue",
            ),
        ] {
            let e = Template::from_resources_yaml(text).unwrap_err();
            assert!(e.contains(want), "{text}: {e}");
        }
    }

    /// The protocol against a client speaking it the way Envoy does: the
    /// current version on subscribing, a push per new snapshot, ACKs and a
    /// NACK (with its detail) kept per node, an answer to an older
    /// response counted for the version it carried, and the token.
    #[test]
    fn subscribe_push_ack_and_nack_as_envoy_does() {
        use crate::pb::discovery::RpcStatus;
        use crate::pb::extension::extension_config_discovery_service_client::ExtensionConfigDiscoveryServiceClient;
        use crate::pb::extension::extension_config_discovery_service_server::ExtensionConfigDiscoveryServiceServer;
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let (tx, rx) = watch::channel(None);
            let nodes: Nodes = Default::default();
            let ecds = Ecds {
                snapshots: rx,
                nodes: nodes.clone(),
                token: Some("xds-secret".into()),
            };
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = listener.local_addr().unwrap();
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(ExtensionConfigDiscoveryServiceServer::new(ecds))
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            let t = Template::from_resources_yaml(WASM).unwrap();
            let publish = |v: i64| {
                tx.send_replace(Some(Arc::new(Snapshot {
                    clusters: Vec::new(),
                    version: v,
                    resource: Some(t.resource(&format!("v: {v}\n"))),
                })));
            };
            publish(1);
            let mut client =
                ExtensionConfigDiscoveryServiceClient::connect(format!("http://{addr}"))
                    .await
                    .unwrap();
            // No token: refused.
            let (_keep, reqs) = mpsc::channel::<DiscoveryRequest>(4);
            let refused = client
                .stream_extension_configs(ReceiverStream::new(reqs))
                .await
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::Unauthenticated);

            let (send, reqs) = mpsc::channel::<DiscoveryRequest>(4);
            let mut call = tonic::Request::new(ReceiverStream::new(reqs));
            call.metadata_mut()
                .insert("authorization", "Bearer xds-secret".parse().unwrap());
            let node = Some(Node {
                id: "gw".into(),
                cluster: "c".into(),
                ..Default::default()
            });
            send.send(DiscoveryRequest {
                node: node.clone(),
                type_url: TYPE_EXTENSION_CONFIG.into(),
                resource_names: vec!["portcullis".into()],
                ..Default::default()
            })
            .await
            .unwrap();
            let mut responses = client
                .stream_extension_configs(call)
                .await
                .unwrap()
                .into_inner();
            let first = responses.message().await.unwrap().unwrap();
            assert_eq!(first.version_info, "1");
            assert_eq!(first.type_url, TYPE_EXTENSION_CONFIG);
            assert_eq!(first.resources.len(), 1);
            // Two pushes before any answer; then the older one is ACKed,
            // the newer NACKed.
            publish(2);
            let second = responses.message().await.unwrap().unwrap();
            publish(3);
            let third = responses.message().await.unwrap().unwrap();
            assert_eq!(
                (second.version_info.as_str(), third.version_info.as_str()),
                ("2", "3")
            );
            assert_ne!(second.nonce, third.nonce);
            send.send(DiscoveryRequest {
                version_info: "2".into(),
                response_nonce: second.nonce.clone(),
                type_url: TYPE_EXTENSION_CONFIG.into(),
                ..Default::default()
            })
            .await
            .unwrap();
            send.send(DiscoveryRequest {
                version_info: "2".into(),
                response_nonce: third.nonce.clone(),
                type_url: TYPE_EXTENSION_CONFIG.into(),
                error_detail: Some(RpcStatus {
                    code: 3,
                    message: "refused".into(),
                }),
                ..Default::default()
            })
            .await
            .unwrap();
            let seen = {
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
                loop {
                    let n = nodes.lock().unwrap().get("gw").cloned().unwrap();
                    if n.nack.is_some() || std::time::Instant::now() > deadline {
                        break n;
                    }
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
            };
            assert_eq!(seen.cluster, "c");
            assert_eq!(seen.streams, 1);
            assert_eq!(seen.sent_version.as_deref(), Some("3"));
            assert_eq!(seen.acked_version.as_deref(), Some("2"));
            assert_eq!(seen.nacked_version.as_deref(), Some("3"));
            assert_eq!(seen.nack.as_deref(), Some("refused"));
            // The stream closed: the node has none open.
            drop(send);
            drop(responses);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
            while nodes.lock().unwrap().get("gw").unwrap().streams != 0 {
                assert!(
                    std::time::Instant::now() < deadline,
                    "the stream was not closed"
                );
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
        });
    }
}
