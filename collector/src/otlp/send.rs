//! The two OTLP transports: gRPC (OTLP's services by path over a tonic
//! channel, TLS and client certificates from flags) and HTTP/protobuf
//! (`POST {endpoint}/v1/traces` and `/v1/metrics`, HTTP/1.1 over one kept
//! connection).

use super::Config;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use prost::Message;
use tonic::codegen::http;

const TRACES_PATH: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";
const METRICS_PATH: &str = "/opentelemetry.proto.collector.metrics.v1.MetricsService/Export";

/// An export request encoded once: every try (gRPC or HTTP) sends these
/// same bytes, no copy of the spans per retry.
#[derive(Debug, Default, Clone)]
pub struct Encoded(pub Bytes);

impl Encoded {
    pub fn of(msg: &impl Message) -> Encoded {
        Encoded(Bytes::from(msg.encode_to_vec()))
    }
}

impl Message for Encoded {
    fn encode_raw(&self, buf: &mut impl prost::bytes::BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: prost::encoding::WireType,
        buf: &mut impl prost::bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Only ever sent, never read.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = Bytes::new();
    }
}

/// Why an export failed, and whether trying again may help.
#[derive(Debug)]
pub struct SendError {
    pub retryable: bool,
    pub message: String,
}

fn retryable(message: impl Into<String>) -> SendError {
    SendError {
        retryable: true,
        message: message.into(),
    }
}

fn fatal(message: impl Into<String>) -> SendError {
    SendError {
        retryable: false,
        message: message.into(),
    }
}

pub enum Transport {
    /// The endpoint, and its channel once the first export made it (a
    /// channel is made inside the exporter's runtime).
    Grpc {
        endpoint: Box<tonic::transport::Endpoint>,
        client: Option<tonic::client::Grpc<tonic::transport::Channel>>,
    },
    Http {
        /// `host:port` to connect to, the authority sent, the base path.
        addr: String,
        authority: String,
        base: String,
        conn: Option<hyper::client::conn::http1::SendRequest<Full<Bytes>>>,
    },
}

impl Transport {
    pub fn new(c: &Config) -> Result<Transport, String> {
        let url: http::Uri = c
            .endpoint
            .parse()
            .map_err(|e| format!("--otlp-endpoint `{}`: {e}", c.endpoint))?;
        let authority = url
            .authority()
            .map(|a| a.to_string())
            .ok_or_else(|| format!("--otlp-endpoint `{}` has no host", c.endpoint))?;
        if c.http {
            if url.scheme_str() != Some("http") {
                return Err("--otlp-protocol http takes an http:// endpoint (for TLS, export over gRPC with --otlp-ca)".into());
            }
            let port = url.port_u16().unwrap_or(80);
            let host = url.host().unwrap_or_default();
            return Ok(Transport::Http {
                addr: format!("{host}:{port}"),
                authority,
                base: url.path().trim_end_matches('/').to_string(),
                conn: None,
            });
        }
        let mut ep = tonic::transport::Endpoint::from_shared(c.endpoint.clone())
            .map_err(|e| format!("--otlp-endpoint: {e}"))?
            .timeout(c.timeout);
        if url.scheme_str() == Some("https") || c.ca.is_some() {
            let mut tls = tonic::transport::ClientTlsConfig::new()
                .domain_name(url.host().unwrap_or_default().to_string());
            if let Some(ca) = &c.ca {
                tls = tls.ca_certificate(tonic::transport::Certificate::from_pem(ca));
            }
            if let Some((cert, key)) = &c.identity {
                tls = tls.identity(tonic::transport::Identity::from_pem(cert, key));
            }
            ep = ep.tls_config(tls).map_err(|e| format!("--otlp TLS: {e}"))?;
        }
        Ok(Transport::Grpc {
            endpoint: Box::new(ep),
            client: None,
        })
    }

    /// Send one export request (traces or metrics, by `metrics`).
    pub async fn send(
        &mut self,
        c: &Config,
        msg: &Encoded,
        metrics: bool,
    ) -> Result<(), SendError> {
        match self {
            Transport::Grpc { endpoint, client } => {
                let grpc =
                    client.get_or_insert_with(|| tonic::client::Grpc::new(endpoint.connect_lazy()));
                grpc.ready()
                    .await
                    .map_err(|e| retryable(format!("not ready: {e}")))?;
                let mut req = tonic::Request::new(msg.clone());
                for (k, v) in &c.headers {
                    let (Ok(k), Ok(v)) = (
                        tonic::metadata::MetadataKey::from_bytes(k.as_bytes()),
                        tonic::metadata::MetadataValue::try_from(v.as_str()),
                    ) else {
                        continue;
                    };
                    req.metadata_mut().insert(k, v);
                }
                let path = http::uri::PathAndQuery::from_static(if metrics {
                    METRICS_PATH
                } else {
                    TRACES_PATH
                });
                let codec = tonic_prost::ProstCodec::<
                    Encoded,
                    crate::otlp_proto::ExportTraceServiceResponse,
                >::default();
                match grpc.unary(req, path, codec).await {
                    Ok(_) => Ok(()),
                    Err(s) => {
                        use tonic::Code::*;
                        // OTLP's retryable codes.
                        let again = matches!(
                            s.code(),
                            Cancelled
                                | DeadlineExceeded
                                | Aborted
                                | OutOfRange
                                | Unavailable
                                | DataLoss
                                | ResourceExhausted
                        );
                        let message = format!("{:?}: {}", s.code(), s.message());
                        Err(if again {
                            retryable(message)
                        } else {
                            fatal(message)
                        })
                    }
                }
            }
            Transport::Http {
                addr,
                authority,
                base,
                conn,
            } => {
                let path = format!(
                    "{base}{}",
                    if metrics { "/v1/metrics" } else { "/v1/traces" }
                );
                let mut b = http::Request::post(path)
                    .header("host", authority.as_str())
                    .header("content-type", "application/x-protobuf");
                for (k, v) in &c.headers {
                    b = b.header(k.as_str(), v.as_str());
                }
                let req = b
                    .body(Full::new(msg.0.clone()))
                    .map_err(|e| fatal(format!("request: {e}")))?;
                let sender = match conn.take() {
                    Some(s) if !s.is_closed() => s,
                    _ => {
                        let tcp = tokio::time::timeout(
                            c.timeout,
                            tokio::net::TcpStream::connect(addr.as_str()),
                        )
                        .await
                        .map_err(|_| retryable("connect timed out"))?
                        .map_err(|e| retryable(format!("connect: {e}")))?;
                        let (s, connection) = hyper::client::conn::http1::handshake(
                            hyper_util::rt::TokioIo::new(tcp),
                        )
                        .await
                        .map_err(|e| retryable(format!("handshake: {e}")))?;
                        tokio::spawn(connection);
                        s
                    }
                };
                let mut sender = sender;
                let resp = tokio::time::timeout(c.timeout, sender.send_request(req))
                    .await
                    .map_err(|_| retryable("timed out"))?
                    .map_err(|e| retryable(format!("send: {e}")))?;
                let status = resp.status().as_u16();
                // Read the body whole so the connection can be used again.
                tokio::time::timeout(c.timeout, resp.into_body().collect())
                    .await
                    .map_err(|_| retryable("the answer's body timed out"))?
                    .map_err(|e| retryable(format!("the answer's body: {e}")))?;
                *conn = Some(sender);
                match status {
                    200..=299 => Ok(()),
                    429 | 502 | 503 | 504 => Err(retryable(format!("HTTP {status}"))),
                    _ => Err(fatal(format!("HTTP {status}"))),
                }
            }
        }
    }
}
