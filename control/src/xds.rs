//! The xDS side: Envoy's Extension Config Discovery Service, state of the
//! world. Every subscribed Envoy gets the current config on subscribing
//! and each accepted change as it happens; its ACK or NACK (the nonce it
//! answers, and an error detail for a NACK) is kept per node for the admin
//! API.

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
        let mut t = Template {
            name,
            type_url,
            config,
        };
        if !t.with_plugin_config(&mut String::new()) {
            return Err("resources[0].typed_config holds no google.protobuf.StringValue for the plugin config".into());
        }
        Ok(t)
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
    pub resource: Any,
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

fn response(s: &Snapshot, nonce: u64) -> DiscoveryResponse {
    DiscoveryResponse {
        version_info: s.version.to_string(),
        resources: vec![s.resource.clone()],
        type_url: TYPE_EXTENSION_CONFIG.into(),
        nonce: nonce.to_string(),
    }
}

/// One stream: answer its requests and push each new snapshot.
async fn serve_stream(
    mut inbound: Streaming<DiscoveryRequest>,
    out: mpsc::Sender<Result<DiscoveryResponse, Status>>,
    mut snapshots: watch::Receiver<Option<Arc<Snapshot>>>,
    nodes: Nodes,
) {
    let mut node: Option<Node> = None;
    let mut subscribed = false;
    let mut nonce: u64 = 0;
    let mut sent: Option<String> = None;
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
                } else if r.response_nonce == nonce.to_string() {
                    match &r.error_detail {
                        Some(e) => with_node(&nodes, &id, |s| {
                            s.nacked_version = sent.clone();
                            s.nack = Some(e.message.clone());
                        }),
                        None => with_node(&nodes, &id, |s| {
                            s.acked_version = Some(r.version_info.clone());
                        }),
                    }
                    false
                } else {
                    // An answer to an older response: superseded.
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
        if let Some(s) = snap {
            nonce = nonce.wrapping_add(1);
            sent = Some(s.version.to_string());
            if let Some(n) = &node {
                with_node(&nodes, &n.id, |st| st.sent_version = sent.clone());
            }
            if out.send(Ok(response(&s, nonce))).await.is_err() {
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
        if !portcullis_service::call_authorized(self.token.as_deref(), &request) {
            return Err(Status::unauthenticated(
                "the control plane's xDS token is missing or wrong",
            ));
        }
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(serve_stream(
            request.into_inner(),
            tx,
            self.snapshots.clone(),
            self.nodes.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
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
}
