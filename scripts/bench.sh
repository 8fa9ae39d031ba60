#!/usr/bin/env bash
# make bench: bare Envoy vs Envoy with the Portcullis filter, same run, same
# mock provider answering at once. Envoy is pinned to core 0 with one worker;
# wrk and the mock share core 1. Rounds alternate so drift hits both sides.
# Many short alternating rounds and the median ratio: the machines are shared
# and noisy, and drift hits both sides of a round alike.
# Prints a markdown table (also saved to .run/bench-latest.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
DURATION="${BENCH_DURATION:-3}"
ROUNDS="${BENCH_ROUNDS:-10}"
CONNS=32
if ! command -v wrk >/dev/null; then
  echo "bench: installing wrk (Debian package)"
  (apt-get install -y -qq wrk >/dev/null 2>&1) || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)
fi
cargo build --release -q -p portcullis-tests --bin portcullis-mock
dir=$(mktemp -d /tmp/portcullis-bench.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 30)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench: $* not ready" >&2; exit 1; }; sleep 0.1; done; }

MOCK_PORT=18101; BARE_PORT=10101; GW_PORT=10100
taskset -c 1 target/release/portcullis-mock --port $MOCK_PORT --name bench --threads 1 --api-key sk-bench >"$dir/mock.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK_PORT/__mock/hits

sed -e "s/port_value: 10001/port_value: $BARE_PORT/; s/port_value: 9902/port_value: 9912/; s/port_value: 18001/port_value: $MOCK_PORT/" envoy/bare.yaml >"$dir/bare.yaml"
sed -e "s/port_value: 10000/port_value: $GW_PORT/; s/port_value: 9901/port_value: 9911/; s/port_value: 18001/port_value: $MOCK_PORT/; s|\.run/ecds|$dir/ecds|g" envoy/envoy.yaml >"$dir/gw.yaml"
envoy/render-ecds.sh envoy/plugin.yaml "$dir/ecds/portcullis.yaml" "$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm"

start_envoy() { # config log
  taskset -c 0 env OPENAI_API_KEY=sk-bench "$ENVOY" -c "$1" --disable-hot-restart --concurrency 1 -l error >"$2" 2>&1 &
  pids+=($!)
}
start_envoy "$dir/bare.yaml" "$dir/bare.log"; BARE_PID=$!
start_envoy "$dir/gw.yaml" "$dir/gw.log"; GW_PID=$!
wait_for http://127.0.0.1:9912/ready
wait_for http://127.0.0.1:9911/ready

# A 212-byte chat body, like the design's measurement.
body='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}'
cat >"$dir/post.lua" <<LUA
wrk.method = "POST"
wrk.body = '$body'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer BENCHKEY"
LUA
# Bare Envoy forwards the client's header as is; the mock wants its key.
sed "s/BENCHKEY/sk-bench/" "$dir/post.lua" >"$dir/bare.lua"
sed "s/BENCHKEY/${BENCH_GW_KEY:-sk-portcullis-demo}/" "$dir/post.lua" >"$dir/gw.lua"
for url in "http://127.0.0.1:$BARE_PORT/v1/chat/completions" "http://127.0.0.1:$GW_PORT/v1/chat/completions"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "$url" -H 'content-type: application/json' \
    -H "authorization: Bearer $([[ $url == *$BARE_PORT* ]] && echo sk-bench || echo ${BENCH_GW_KEY:-sk-portcullis-demo})" -d "$body")
  [[ $code == 200 ]] || { echo "bench: $url answered $code" >&2; exit 1; }
done

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run_wrk() { # lua url pid -> "rps p50 p99 non2xx cpu_us_per_request"
  local out c0 c1
  c0=$(cpu_ticks "$3")
  out=$(taskset -c 1 wrk -t1 -c$CONNS -d"${DURATION}s" --latency -s "$1" "$2")
  c1=$(cpu_ticks "$3")
  local rps p50 p99 errs n cpu
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {print $5}' <<<"$out"); errs=${errs:-0}
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  # Envoy's CPU time per request (clock ticks of 10 ms): steadier than
  # throughput when other tenants take the machine's time.
  cpu=$(awk -v t=$((c1 - c0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t * 1e6 / hz / n}')
  echo "$rps $p50 $p99 $errs $cpu"
}
# Warm up both (V8 compiles the module lazily and tiers it up under load).
run_wrk "$dir/bare.lua" "http://127.0.0.1:$BARE_PORT/v1/chat/completions" $BARE_PID >/dev/null
run_wrk "$dir/gw.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions" $GW_PID >/dev/null

table="| round | bare rps | bare p50 | bare p99 | bare CPU/req | filter rps | filter p50 | filter p99 | filter CPU/req | rps ratio | CPU ratio |
|---|---|---|---|---|---|---|---|---|---|---|"
ratios=(); cpus=()
for r in $(seq 1 "$ROUNDS"); do
  read -r brps bp50 bp99 berr bcpu < <(run_wrk "$dir/bare.lua" "http://127.0.0.1:$BARE_PORT/v1/chat/completions" $BARE_PID)
  read -r grps gp50 gp99 gerr gcpu < <(run_wrk "$dir/gw.lua" "http://127.0.0.1:$GW_PORT/v1/chat/completions" $GW_PID)
  [[ $berr == 0 && $gerr == 0 ]] || { echo "bench: non-2xx answers (bare $berr, filter $gerr)" >&2; exit 1; }
  ratio=$(awk -v g="$grps" -v b="$brps" 'BEGIN {printf "%.2f", g/b}')
  cratio=$(awk -v g="$gcpu" -v b="$bcpu" 'BEGIN {printf "%.2f", b/g}')
  ratios+=("$ratio"); cpus+=("$cratio")
  table+=$'\n'"| $r | $brps | $bp50 | $bp99 | ${bcpu}us | $grps | $gp50 | $gp99 | ${gcpu}us | ${ratio}x | ${cratio}x |"
done
median_of() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f", (a[NR/2]+a[NR/2+1])/2}'; }
median=$(median_of "${ratios[@]}")
cmedian=$(median_of "${cpus[@]}")
mkdir -p .run
{
  echo "Filter path vs bare Envoy: $CONNS connections, ${DURATION}s per run, $ROUNDS alternating rounds, $(date -u +%F)"
  echo
  echo "$table"
  echo
  echo "Median throughput ratio filter/bare: ${median}x"
  echo "Median CPU-efficiency ratio (bare CPU per request / filter CPU per request): ${cmedian}x"
} | tee .run/bench-latest.md
