#!/usr/bin/env bash
# render-cds.sh DIR OUT: the providers' clusters for an Envoy without the
# control plane (make run CONTROL=0): every DIR/*.yaml holds one Envoy
# cluster (envoy.config.cluster.v3.Cluster, as under `clusters:` in a
# bootstrap, not indented), and OUT becomes the CDS file envoy/envoy.yaml
# reads (dynamic_resources.cds_config), written atomically so that Envoy
# picks it up whole. No file: no dynamic cluster. Adding a provider is a
# file in DIR and `make reload`; the bootstrap stays as shipped
# (docs/providers.md, "A provider's cluster").
set -euo pipefail
usage="usage: render-cds.sh DIR OUT"
dir=${1:?$usage}
out=${2:?$usage}
mkdir -p "$(dirname "$out")"
tmp=$(mktemp "$(dirname "$out")/.cds.XXXXXX")
{
  echo "# Rendered by envoy/render-cds.sh from $dir: edit the files there."
  echo "resources:"
  found=0
  shopt -s nullglob
  for f in "$dir"/*.yaml; do
    grep -q '^name:' "$f" || { echo "render-cds.sh: $f has no top-level \`name:\` (one cluster per file, not indented)" >&2; exit 1; }
    found=1
    echo "- \"@type\": type.googleapis.com/envoy.config.cluster.v3.Cluster"
    sed -e '/^[[:space:]]*#/d' -e '/^[[:space:]]*$/d' -e 's/^/  /' "$f"
  done
  ((found)) || echo "  []" 
} >"$tmp"
# `resources:` then `  []` is not YAML for an empty list: write it inline.
if grep -qx '  \[\]' "$tmp"; then
  sed -i -e '/^resources:$/d' -e 's/^  \[\]$/resources: []/' "$tmp"
fi
mv "$tmp" "$out"
