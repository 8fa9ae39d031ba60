#!/usr/bin/env bash
# The gateway replica's bootstrap for containers, from envoy/envoy.yaml (one
# source of truth): listen on all interfaces, reach every service by its
# compose name through DNS (the demo's MCP servers: the mocks' MCP mode),
# watch the mounted ECDS directory, reach the collector and the limiter over
# mutual TLS (certificates mounted at /etc/portcullis/tls; envoy/side-tls.sh).
# With CONTROL (HOST:PORT), the filter's config comes from the control plane
# over xDS (envoy/use-control.sh), over mutual TLS too.
#   usage: docker/render-replica.sh OUT_FILE [CONTROL]
set -euo pipefail
cd "$(dirname "$0")/.."
out="$1"
control="${2:-}"
sed -e 's/socket_address: {address: 127.0.0.1, port_value: 9901}/socket_address: {address: 0.0.0.0, port_value: 9901}/' \
    -e 's/socket_address: {address: 127.0.0.1, port_value: 10000}/socket_address: {address: 0.0.0.0, port_value: 10000}/' \
    -e 's/address: 127.0.0.1, port_value: 18001/address: primary, port_value: 18001/' \
    -e 's/address: 127.0.0.1, port_value: 18002/address: backup, port_value: 18002/' \
    -e 's/address: 127.0.0.1, port_value: 18011/address: primary, port_value: 18001/' \
    -e 's/address: 127.0.0.1, port_value: 18012/address: backup, port_value: 18002/' \
    -e 's/address: 127.0.0.1, port_value: 50051/address: collector, port_value: 50051/' \
    -e 's/address: 127.0.0.1, port_value: 8081/address: limiter, port_value: 8081/' \
    -e 's/type: STATIC/type: STRICT_DNS/' \
    -e 's|\.run/ecds|/etc/portcullis/ecds|g' \
    -e 's/id: portcullis-local/id: portcullis-replica/' \
    envoy/envoy.yaml >"$out"
if grep -q '127\.0\.0\.1' "$out"; then
  echo "render-replica.sh: envoy/envoy.yaml has a loopback address this script does not map:" >&2
  grep -n '127\.0\.0\.1' "$out" >&2
  exit 1
fi
if [[ -n $control ]]; then
  envoy/use-control.sh "$out" "$control"
  envoy/side-tls.sh "$out" /etc/portcullis/tls collector limiter "${control%:*}"
else
  envoy/side-tls.sh "$out" /etc/portcullis/tls collector limiter
fi
