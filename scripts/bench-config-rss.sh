#!/usr/bin/env bash
# make bench-config-rss: Envoy's memory when plugin configs over the size
# limit are pushed again and again (#25). One Envoy (one worker) loads the
# shipped config by ECDS; then ROUNDS times a 5 MiB config (the shipped one
# with an unknown key, padded with a comment) replaces it, is refused, and
# the old one keeps serving. BENCH_WASM: another build to compare. Prints Envoy's RSS at the start, its peak and at the end (from
# /proc, sampled after each refusal), and the end against the start, right
# after the last refusal and settled (the allocator returns free memory in
# the background; the start is settled the same way).
set -euo pipefail
cd "$(dirname "$0")/.."
ROUNDS="${BENCH_CONFIG_ROUNDS:-10}"
ENVOY="${ENVOY:-.venv/bin/envoy}"
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
dir=$(mktemp -d /tmp/portcullis-cfgrss.XXXX)
pid=
cleanup() { [[ -z $pid ]] || kill "$pid" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
PORT=10471; ADMIN=9971
sed -e "s/port_value: 10000/port_value: $PORT/; s/port_value: 9901/port_value: $ADMIN/; s|\.run/ecds|$dir/ecds|g" envoy/envoy.yaml >"$dir/envoy.yaml"
scripts/bench-plugin.sh >"$dir/shipped.yaml"
envoy/render-ecds.sh "$dir/shipped.yaml" "$dir/ecds/portcullis.yaml" "$WASM"
"$ENVOY" -c "$dir/envoy.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/envoy.log" 2>&1 &
pid=$!
stat() { curl -fsS "http://127.0.0.1:$ADMIN/stats" 2>/dev/null | sed -n "s/^$1: //p"; }
rss() { awk '/^VmRSS:/ {print $2}' "/proc/$pid/status"; }
deadline=$((SECONDS + 60))
until [[ "$(stat extension_config_discovery.http_filter.portcullis.config_reload)" -ge 1 ]] 2>/dev/null; do
  ((SECONDS < deadline)) || { echo "bench-config-rss: Envoy did not load the config" >&2; exit 1; }
  sleep 0.2
done
# Settled: the allocator returns free memory in the background
# (memory_allocator_manager in envoy/envoy.yaml); RSS sampled each second
# until three samples in a row are within 1% of each other (at most 60 s).
settle() {
  local samples=() n a b c hi lo deadline=$((SECONDS + 60))
  samples+=("$(rss)")
  while ((SECONDS < deadline)); do
    sleep 1
    samples+=("$(rss)")
    n=${#samples[@]}
    ((n >= 3)) || continue
    a=${samples[n-3]}; b=${samples[n-2]}; c=${samples[n-1]}
    hi=$(printf '%s\n' "$a" "$b" "$c" | sort -n | tail -1); lo=$(printf '%s\n' "$a" "$b" "$c" | sort -n | head -1)
    ((hi - lo <= hi / 100)) && break
  done
  echo "${samples[-1]}"
}
start=$(settle); peak=$start; rounds=()
# Invalid as well as large (an unknown key), so a build without the size
# limit refuses it too, after reading it: the two can be compared.
{ cat "$dir/shipped.yaml"; echo "not_a_key: 1"; printf '# %s\n' "$(head -c $((5 << 20)) /dev/zero | tr '\0' x)"; } >"$dir/big.yaml"
for i in $(seq 1 "$ROUNDS"); do
  before=$(stat extension_config_discovery.http_filter.portcullis.config_fail); before=${before:-0}
  # Each round's config differs (Envoy skips a resource it already has).
  { cat "$dir/big.yaml"; echo "# round $i"; } >"$dir/round.yaml"
  envoy/render-ecds.sh "$dir/round.yaml" "$dir/ecds/portcullis.yaml" "$WASM"
  deadline=$((SECONDS + 60))
  until [[ "$(stat extension_config_discovery.http_filter.portcullis.config_fail)" -gt "$before" ]] 2>/dev/null; do
    ((SECONDS < deadline)) || { echo "bench-config-rss: round $i was not refused" >&2; exit 1; }
    sleep 0.1
  done
  r=$(rss); ((r > peak)) && peak=$r
  rounds+=("$r")
done
end=$(rss)
settled=$(settle)
pct() { awk -v a="$1" -v b="$start" 'BEGIN {printf "%+.1f%%", (a - b) * 100 / b}'; }
echo "Envoy RSS (KiB) after each refusal: ${rounds[*]}"
echo "Envoy RSS (KiB): start $start, peak $peak, right after $ROUNDS refused 5 MiB configs $end ($(pct "$end")), settled $settled ($(pct "$settled"))"
