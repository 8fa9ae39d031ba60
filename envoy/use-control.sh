#!/usr/bin/env bash
# use-control.sh BOOTSTRAP HOST:PORT [TOKEN_FILE]: make Envoy take the
# filter's config from the control plane (portcullis-control) over xDS
# instead of the ECDS file, and the providers' clusters over CDS instead of
# the CDS file: replaces both `path_config_source`s of BOOTSTRAP (in place)
# with gRPC `api_config_source`s and adds the cluster `portcullis_control`
# (HTTP/2) at HOST:PORT. With TOKEN_FILE, every xDS
# stream carries its token (`--xds-token-file` of the control plane).
# Without the control plane, Envoy keeps serving the last config it
# applied; at start it waits for the first one (initial_fetch_timeout).
# `make run` uses it (CONTROL=0 keeps the file); the tests and the compose
# fleet too (docs/control-plane.md).
set -euo pipefail
usage="usage: use-control.sh BOOTSTRAP HOST:PORT [TOKEN_FILE]"
file=${1:?$usage}
addr=${2:?$usage}
token_file=${3:-}
host=${addr%:*}
port=${addr##*:}
[[ $port =~ ^[0-9]+$ ]] || { echo "use-control.sh: $addr is not HOST:PORT" >&2; exit 1; }
grep -q '^                path_config_source:$' "$file" || { echo "use-control.sh: no path_config_source in $file" >&2; exit 1; }
grep -q '^    path_config_source:$' "$file" || { echo "use-control.sh: no dynamic_resources.cds_config.path_config_source in $file" >&2; exit 1; }
metadata=""
cds_metadata=""
if [[ -n $token_file ]]; then
  token=$(tr -d ' \n' <"$token_file")
  [[ -n $token ]] || { echo "use-control.sh: $token_file is empty" >&2; exit 1; }
  metadata="
                    initial_metadata:
                    - {key: authorization, value: \"Bearer $token\"}"
  cds_metadata="
        initial_metadata:
        - {key: authorization, value: \"Bearer $token\"}"
fi
# The providers' clusters: from the control plane too (it serves one for
# every provider with an \`upstream\`); until they come, none.
cds_block="    initial_fetch_timeout: 15s
    api_config_source:
      api_type: GRPC
      transport_api_version: V3
      set_node_on_first_message_only: true
      grpc_services:
      - envoy_grpc: {cluster_name: portcullis_control}$cds_metadata"
source_block="                resource_api_version: V3
                # Up to 15 s for the first config at start; the listener
                # waits for it (no request is served without the filter).
                initial_fetch_timeout: 15s
                api_config_source:
                  api_type: GRPC
                  transport_api_version: V3
                  set_node_on_first_message_only: true
                  grpc_services:
                  - envoy_grpc: {cluster_name: portcullis_control}$metadata"
cluster_block="  # The control plane's xDS (portcullis-control; gRPC needs HTTP/2).
  - name: portcullis_control
    type: STRICT_DNS
    connect_timeout: 1s
    typed_extension_protocol_options:
      envoy.extensions.upstreams.http.v3.HttpProtocolOptions:
        \"@type\": type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions
        explicit_http_config:
          http2_protocol_options:
            connection_keepalive: {interval: 30s, timeout: 5s}
    load_assignment:
      cluster_name: portcullis_control
      endpoints:
      - lb_endpoints:
        - endpoint: {address: {socket_address: {address: $host, port_value: $port}}}"
tmp=$(mktemp)
awk -v src="$source_block" -v cl="$cluster_block" -v cds="$cds_block" '
  skip && /^                  (path|watched_directory):/ { next }
  cdsskip && /^      (path|watched_directory):/ { next }
  { skip = 0; cdsskip = 0 }
  $0 == "                path_config_source:" { print src; skip = 1; next }
  $0 == "    path_config_source:" { print cds; cdsskip = 1; next }
  { print }
  $0 == "  clusters:" { print cl }
' "$file" >"$tmp"
cat "$tmp" >"$file"
rm -f "$tmp"
