//! The providers' Envoy clusters, served over CDS (#46): a provider whose
//! config has an `upstream` gets a cluster named by its `cluster`, so adding
//! a provider is one config change through the API, with no edit of the
//! Envoy bootstrap. A cluster resolves its address by DNS (`LOGICAL_DNS`,
//! IPv4 first), speaks TLS with the provider's `host` as SNI and as the
//! name its certificate must carry (the system CA bundle), is checked by a
//! TCP connect every 15 s, and holds as many streams as the shipped
//! bootstrap's provider clusters (docs/sizing.md).

use crate::pb::cluster::{
    Address, CertificateValidationContext, CircuitBreakers, Cluster, ClusterLoadAssignment,
    CommonTlsContext, DataSource, Duration, Endpoint, HealthCheck, LbEndpoint, LocalityLbEndpoints,
    SocketAddress, StringMatcher, SubjectAltNameMatcher, TcpHealthCheck, Thresholds,
    TransportSocket, UInt32Value, UpstreamTlsContext,
};
use crate::pb::discovery::Any;
use portcullis_core::config::{Provider, Upstream};
use prost::Message;

pub const TYPE_CLUSTER: &str = "type.googleapis.com/envoy.config.cluster.v3.Cluster";
const TYPE_UPSTREAM_TLS: &str =
    "type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext";
/// Debian's CA bundle (the images and `make cacerts` install it).
pub const CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
const LOGICAL_DNS: i32 = 2;
const V4_PREFERRED: i32 = 3;
const SAN_DNS: i32 = 2;

fn secs(seconds: i64) -> Option<Duration> {
    Some(Duration { seconds, nanos: 0 })
}

fn count(value: u32) -> Option<UInt32Value> {
    Some(UInt32Value { value })
}

/// The cluster for a provider's `upstream`.
pub fn cluster(p: &Provider, u: &Upstream) -> Cluster {
    let transport_socket = u.tls.then(|| {
        let tls = UpstreamTlsContext {
            sni: p.host.clone(),
            common_tls_context: Some(CommonTlsContext {
                validation_context: Some(CertificateValidationContext {
                    trusted_ca: Some(DataSource {
                        filename: CA_BUNDLE.into(),
                    }),
                    match_typed_subject_alt_names: vec![SubjectAltNameMatcher {
                        san_type: SAN_DNS,
                        matcher: Some(StringMatcher {
                            exact: p.host.clone(),
                        }),
                    }],
                }),
            }),
        };
        TransportSocket {
            name: "envoy.transport_sockets.tls".into(),
            typed_config: Some(Any {
                type_url: TYPE_UPSTREAM_TLS.into(),
                value: tls.encode_to_vec(),
            }),
        }
    });
    Cluster {
        name: p.cluster.clone(),
        r#type: LOGICAL_DNS,
        connect_timeout: secs(5),
        dns_lookup_family: V4_PREFERRED,
        health_checks: vec![HealthCheck {
            timeout: secs(2),
            interval: secs(15),
            unhealthy_threshold: count(3),
            healthy_threshold: count(1),
            tcp_health_check: Some(TcpHealthCheck {}),
            no_traffic_interval: secs(60),
        }],
        circuit_breakers: Some(CircuitBreakers {
            thresholds: vec![Thresholds {
                max_connections: count(10_000),
                max_pending_requests: count(10_000),
                max_requests: count(10_000),
                max_retries: count(1_024),
            }],
        }),
        transport_socket,
        load_assignment: Some(ClusterLoadAssignment {
            cluster_name: p.cluster.clone(),
            endpoints: vec![LocalityLbEndpoints {
                lb_endpoints: vec![LbEndpoint {
                    endpoint: Some(Endpoint {
                        address: Some(Address {
                            socket_address: Some(SocketAddress {
                                address: u.address.clone(),
                                port_value: u32::from(u.port),
                            }),
                        }),
                    }),
                }],
            }],
        }),
    }
}

/// The clusters a plugin config asks for, one per cluster name (providers
/// sharing a cluster share it: the first one's `upstream` makes it). A
/// config that does not compile has none (the API refuses it before).
pub fn clusters(plugin_yaml: &str) -> Vec<Any> {
    let Ok(gw) = portcullis_core::compile::compile(plugin_yaml.as_bytes()) else {
        return Vec::new();
    };
    let mut seen = std::collections::BTreeSet::new();
    gw.providers
        .iter()
        .filter_map(|p| Some((p, p.upstream.as_ref()?)))
        .filter(|(p, _)| seen.insert(p.cluster.clone()))
        .map(|(p, u)| Any {
            type_url: TYPE_CLUSTER.into(),
            value: cluster(p, u).encode_to_vec(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = r#"
providers:
  - {name: openai, cluster: openai, host: api.openai.com, upstream: {}, models: [{name: m}]}
  - {name: local, cluster: local, host: local.test, upstream: {address: 127.0.0.1, port: 8080, tls: false}, models: [{name: m}]}
  - {name: again, cluster: openai, host: api.openai.com, upstream: {}, models: [{name: m}]}
  - {name: static, cluster: from_bootstrap, host: x.test, models: [{name: m}]}
clients: [{name: c, key_sha256: "a665a45920422f9d417e4867efdc4fb8a04a1f3fff1fa07e998e86f7f7a27ae3"}]
"#;

    #[test]
    fn a_cluster_per_provider_upstream_named_by_its_cluster() {
        let all = clusters(CONFIG);
        assert_eq!(
            all.len(),
            2,
            "one per cluster name; none without `upstream`"
        );
        let openai = Cluster::decode(all[0].value.as_slice()).unwrap();
        assert_eq!(all[0].type_url, TYPE_CLUSTER);
        assert_eq!(openai.name, "openai");
        assert_eq!(openai.r#type, LOGICAL_DNS);
        let addr = openai.load_assignment.as_ref().unwrap().endpoints[0].lb_endpoints[0]
            .endpoint
            .as_ref()
            .unwrap()
            .address
            .as_ref()
            .unwrap()
            .socket_address
            .clone()
            .unwrap();
        assert_eq!(
            (addr.address.as_str(), addr.port_value),
            ("api.openai.com", 443)
        );
        let ts = openai.transport_socket.unwrap();
        let tls = UpstreamTlsContext::decode(ts.typed_config.unwrap().value.as_slice()).unwrap();
        assert_eq!(tls.sni, "api.openai.com");
        let v = tls.common_tls_context.unwrap().validation_context.unwrap();
        assert_eq!(v.trusted_ca.unwrap().filename, CA_BUNDLE);
        assert_eq!(
            v.match_typed_subject_alt_names[0]
                .matcher
                .as_ref()
                .unwrap()
                .exact,
            "api.openai.com"
        );
        let local = Cluster::decode(all[1].value.as_slice()).unwrap();
        assert_eq!(local.name, "local");
        assert!(local.transport_socket.is_none(), "tls: false");
        assert!(clusters("not: [a config").is_empty());
    }
}
