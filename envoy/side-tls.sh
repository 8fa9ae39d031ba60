#!/usr/bin/env bash
# side-tls.sh BOOTSTRAP CERT_DIR [COLLECTOR_NAME LIMITER_NAME [CONTROL_NAME]]:
# make Envoy reach the collector's ingest and the limiter (and the control
# plane, when BOOTSTRAP has its cluster: envoy/use-control.sh) over mutual
# TLS: adds a TLS transport socket to the clusters `portcullis_collector`,
# `portcullis_ratelimit` (and `portcullis_control`) of BOOTSTRAP (in place), presenting
# CERT_DIR/client.pem (key client-key.pem), trusting CERT_DIR/ca.pem and
# requiring the service's certificate to name COLLECTOR_NAME / LIMITER_NAME
# (default localhost; also sent as SNI). Start the services with
# --tls-cert, --tls-key and --tls-client-ca (scripts/make-certs.sh makes a
# demo CA and certificates). docker/render-replica.sh uses it for the
# compose fleet; the tests for their Envoys.
set -euo pipefail
file=${1:?usage: side-tls.sh BOOTSTRAP CERT_DIR [COLLECTOR_NAME LIMITER_NAME]}
dir=${2:?usage: side-tls.sh BOOTSTRAP CERT_DIR [COLLECTOR_NAME LIMITER_NAME]}
collector=${3:-localhost}
limiter=${4:-localhost}
control=${5:-localhost}
block() { # NAME: the transport socket for a service with that name
  cat <<YAML
    transport_socket:
      name: envoy.transport_sockets.tls
      typed_config:
        "@type": type.googleapis.com/envoy.extensions.transport_sockets.tls.v3.UpstreamTlsContext
        sni: $1
        common_tls_context:
          alpn_protocols: [h2]
          tls_certificates:
          - certificate_chain: {filename: $dir/client.pem}
            private_key: {filename: $dir/client-key.pem}
          validation_context:
            trusted_ca: {filename: $dir/ca.pem}
            match_typed_subject_alt_names:
            - san_type: DNS
              matcher: {exact: $1}
YAML
}
for c in portcullis_collector portcullis_ratelimit; do
  grep -q "^  - name: $c\$" "$file" || { echo "side-tls.sh: no cluster $c in $file" >&2; exit 1; }
done
tmp=$(mktemp)
awk -v c="$(block "$collector")" -v l="$(block "$limiter")" -v x="$(block "$control")" '
  { print }
  $0 == "  - name: portcullis_collector" { print c }
  $0 == "  - name: portcullis_ratelimit" { print l }
  $0 == "  - name: portcullis_control" { print x }
' "$file" >"$tmp"
cat "$tmp" >"$file"
rm -f "$tmp"
