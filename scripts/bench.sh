#!/usr/bin/env bash
# make bench: bare Envoy vs Envoy with the Portcullis filter, in one run, with
# the same mock provider answering at once. Three Envoys, each pinned to core 0
# with one worker (only one is under load at a time); wrk and the mock share
# core 1.
#   bare   envoy/bare.yaml: router only
#   nroute, nhit  the native build (libportcullis.so) on route's and hit's
#          configs (BENCH_NATIVE=0 leaves them out)
#   route  envoy/envoy.yaml + filter, prompt cache off: the routed request path
#   hit    envoy/envoy.yaml + filter, prompt cache on: every request a hit
#   prod, nprod  a production-like config (#49, scripts/bench-prod-plugin.sh):
#          the key's and its team's limits and budgets, five input checks
#          and one output check, the log (BENCH_PROD=0 leaves them out)
#   baremcp, mcp, nmcp  an MCP tools/call (#47): bare Envoy to the mock's MCP
#          mode, our filter at /mcp/tools (Wasm, native); BENCH_MCP=0 leaves
#          them out
#   vendor1, vendor3, nvendor1, nvendor3  the routed config with one and with
#          three vendor guardrails (#63), the mock's fakes answering at once;
#          BENCH_VENDORS=1 adds them
# Many short rounds alternate bare/route/hit and we report the median of the
# per-round ratios: the machines are shared and noisy, and drift hits all
# sides of a round alike. Prints a markdown table (also .run/bench-latest.md).
# The mechanism's floor runs in the same rounds (BENCH_FLOOR=0 skips it):
# bench/floor, a minimal filter that only pauses, reads the body and sets the
# routing headers (floor) or answers locally (floorhit); we report
# route/floor and hit/floorhit beside the ratios to bare Envoy.
# BENCH_BASELINE_WASM=path adds route0/hit0: the same two gateways with an
# earlier build, in the same rounds, so a change is measured against its
# predecessor in one run (route/route0, hit/hit0).
# The tail (#67): every run's p50, p99 and p99.9 (wrk's whole histogram,
# read by the script's done()), and per variant the median over the rounds
# of its p99 over bare Envoy's p99 in the same round (MCP variants: over
# baremcp's). The request log goes to a real collector, which runs on
# core 1 beside wrk and the mock; it is scheduled SCHED_IDLE there
# (BENCH_COLLECTOR=shared gives it a normal share), so its work does not
# delay wrk's requests or the mock's answers, as a collector on its own
# machine would not. BENCH_LOG=0 takes the `log:` section out of every
# plugin config (to measure what the log costs). BENCH_MAIN=idle runs each
# Envoy's main thread SCHED_IDLE (what its work does to the worker's tail).
# BENCH_RATE=n holds every
# run to about n requests a second (each connection waits 32000/n ms on
# average between its requests, wrk's delay()): the tail at a load every variant
# carries, where saturated runs (the default) show each variant's queue at
# its own capacity, so that their latencies follow their throughput.
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
DURATION="${BENCH_DURATION:-3}"
ROUNDS="${BENCH_ROUNDS:-10}"
CONNS=32
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
if ! command -v wrk >/dev/null; then
  echo "bench: installing wrk (Debian package)"
  (apt-get install -y -qq wrk >/dev/null 2>&1) || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)
fi
cargo build --release -q -p portcullis-tests --bin portcullis-mock
cargo build --release -q -p portcullis-collector --bin portcullis-collector
dir=$(mktemp -d /tmp/portcullis-bench.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 120)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench: $* not ready" >&2; exit 1; }; sleep 0.1; done; }

MOCK_PORT=18101; COLLECTOR_PORT=18151
# The request log goes to a real collector, as in a real deployment.
# SCHED_IDLE: the collector runs when wrk and the mock leave core 1 idle.
COLLECTOR_SCHED=(chrt --idle 0)
[[ ${BENCH_COLLECTOR:-idle} == shared ]] && COLLECTOR_SCHED=()
taskset -c 1 "${COLLECTOR_SCHED[@]}" target/release/portcullis-collector --grpc 127.0.0.1:$COLLECTOR_PORT --http 127.0.0.1:18152 --db "$dir/log.db" >"$dir/collector.log" 2>&1 & pids+=($!)
taskset -c 1 target/release/portcullis-mock --port $MOCK_PORT --name bench --threads 1 --api-key sk-bench >"$dir/mock.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK_PORT/__mock/hits
wait_for http://127.0.0.1:18152/healthz

declare -A PORT=([bare]=10101 [route]=10100 [hit]=10102 [route0]=10103 [hit0]=10104 [floor]=10105 [floorhit]=10106 [miss]=10107 [nroute]=10108 [nhit]=10109 [baremcp]=10110 [mcp]=10111 [nmcp]=10112 [prod]=10113 [nprod]=10114 [vendor1]=10115 [vendor3]=10116 [nvendor1]=10117 [nvendor3]=10118) ADMIN=([bare]=9912 [route]=9911 [hit]=9913 [route0]=9914 [hit0]=9915 [floor]=9916 [floorhit]=9917 [miss]=9918 [nroute]=9919 [nhit]=9920 [baremcp]=9921 [mcp]=9922 [nmcp]=9923 [prod]=9924 [nprod]=9925 [vendor1]=9926 [vendor3]=9927 [nvendor1]=9928 [nvendor3]=9929) PID=() KEY=([bare]=sk-bench [route]=sk-portcullis-demo [hit]=sk-portcullis-demo [route0]=sk-portcullis-demo [hit0]=sk-portcullis-demo [floor]=sk-portcullis-demo [floorhit]=sk-portcullis-demo [miss]=sk-portcullis-demo [nroute]=sk-portcullis-demo [nhit]=sk-portcullis-demo [baremcp]=sk-bench [mcp]=sk-portcullis-demo [nmcp]=sk-portcullis-demo [prod]=sk-portcullis-demo [nprod]=sk-portcullis-demo [vendor1]=sk-portcullis-demo [vendor3]=sk-portcullis-demo [nvendor1]=sk-portcullis-demo [nvendor3]=sk-portcullis-demo)
# What each variant is sent to (chat completions unless said here).
declare -A URLPATH=([baremcp]=/mcp [mcp]=/mcp/tools [nmcp]=/mcp/tools)
BASE_WASM="${BENCH_BASELINE_WASM:-}"
# miss: the cache on and every request a new prompt (a lookup that misses
# and a store each: the target's "cache miss").
VARIANTS=(bare route hit miss)
FILTERS=(route hit miss)
if [[ -n $BASE_WASM ]]; then VARIANTS+=(route0 hit0); FILTERS+=(route0 hit0); fi
FLOOR="${BENCH_FLOOR:-1}"
FLOOR_WASM="$PWD/bench/floor/target/wasm32-wasip1/release/portcullis_floor.wasm"
if [[ $FLOOR == 1 ]]; then
  (cd bench/floor && cargo build --release -q --target wasm32-wasip1)
  VARIANTS+=(floor floorhit); FILTERS+=(floor floorhit)
fi
# The native build (make native), same configs: nroute, nhit (BENCH_NATIVE=0 skips).
NATIVE="${BENCH_NATIVE:-1}"
if [[ $NATIVE == 1 ]]; then
  [[ -f target/native/libportcullis.so ]] || { echo "bench: no native build (make native)" >&2; exit 1; }
  VARIANTS+=(nroute nhit); FILTERS+=(nroute nhit)
fi
PROD="${BENCH_PROD:-1}"
if [[ $PROD == 1 ]]; then
  VARIANTS+=(prod); FILTERS+=(prod)
  if [[ $NATIVE == 1 ]]; then VARIANTS+=(nprod); FILTERS+=(nprod); fi
fi
# Vendor guardrails (#63; BENCH_VENDORS=1): the routed config with one
# vendor check (Lakera Guard's API) and with three (Lakera, Azure AI Content
# Safety, Presidio), the mock's fakes answering at once, each asked on every
# request (vendor_verdict_ttl_s: 0).
VENDORS="${BENCH_VENDORS:-0}"
if [[ $VENDORS == 1 ]]; then
  VARIANTS+=(vendor1 vendor3); FILTERS+=(vendor1 vendor3)
  if [[ $NATIVE == 1 ]]; then VARIANTS+=(nvendor1 nvendor3); FILTERS+=(nvendor1 nvendor3); fi
fi
MCP="${BENCH_MCP:-1}"
if [[ $MCP == 1 ]]; then
  VARIANTS+=(baremcp mcp); FILTERS+=(mcp)
  if [[ $NATIVE == 1 ]]; then VARIANTS+=(nmcp); FILTERS+=(nmcp); fi
fi
sed -e "s/port_value: 10001/port_value: ${PORT[bare]}/; s/port_value: 9902/port_value: ${ADMIN[bare]}/; s/port_value: 18001/port_value: $MOCK_PORT/" envoy/bare.yaml >"$dir/bare.yaml"
sed -e "s/port_value: 10001/port_value: ${PORT[baremcp]}/; s/port_value: 9902/port_value: ${ADMIN[baremcp]}/; s/port_value: 18001/port_value: $MOCK_PORT/" envoy/bare.yaml >"$dir/baremcp.yaml"
for v in "${FILTERS[@]}"; do
  sed -e "s/port_value: 10000/port_value: ${PORT[$v]}/; s/port_value: 9901/port_value: ${ADMIN[$v]}/; s/port_value: 18001/port_value: $MOCK_PORT/; s/port_value: 18011/port_value: $MOCK_PORT/; s/port_value: 50051/port_value: $COLLECTOR_PORT/; s|\.run/ecds|$dir/ecds-$v|g" envoy/envoy.yaml >"$dir/$v.yaml"
done
scripts/bench-plugin.sh >"$dir/shipped.yaml"   # the shipped config without the tour's sections
if [[ ${BENCH_LOG:-1} == 0 ]]; then
  # Without the request log: the top-level `log:` section out.
  awk '/^log:/ { skip = 1; next } skip && /^[^ #]/ { skip = 0 } !skip' "$dir/shipped.yaml" >"$dir/shipped-nolog.yaml"
  mv "$dir/shipped-nolog.yaml" "$dir/shipped.yaml"
  ! grep -q '^log:' "$dir/shipped.yaml" || { echo "bench: cannot take the log out" >&2; exit 1; }
fi
sed 's/^  enabled: true/  enabled: false/' "$dir/shipped.yaml" >"$dir/plugin-route.yaml"
grep -q '^  enabled: false' "$dir/plugin-route.yaml" || { echo "bench: cannot turn the cache off in envoy/plugin.yaml" >&2; exit 1; }
cp "$dir/shipped.yaml" "$dir/plugin-hit.yaml"
envoy/render-ecds.sh "$dir/plugin-route.yaml" "$dir/ecds-route/portcullis.yaml" "$WASM"
envoy/render-ecds.sh "$dir/plugin-hit.yaml" "$dir/ecds-hit/portcullis.yaml" "$WASM"
envoy/render-ecds.sh "$dir/plugin-hit.yaml" "$dir/ecds-miss/portcullis.yaml" "$WASM"
if [[ $FLOOR == 1 ]]; then
  echo route >"$dir/plugin-floor.yaml"; echo answer >"$dir/plugin-floorhit.yaml"
  envoy/render-ecds.sh "$dir/plugin-floor.yaml" "$dir/ecds-floor/portcullis.yaml" "$FLOOR_WASM"
  envoy/render-ecds.sh "$dir/plugin-floorhit.yaml" "$dir/ecds-floorhit/portcullis.yaml" "$FLOOR_WASM"
fi
if [[ $NATIVE == 1 ]]; then
  PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-route.yaml" "$dir/ecds-nroute/portcullis.yaml"
  PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-hit.yaml" "$dir/ecds-nhit/portcullis.yaml"
fi
if [[ $PROD == 1 ]]; then
  scripts/bench-prod-plugin.sh prod "$dir/plugin-route.yaml" >"$dir/plugin-prod.yaml"
  envoy/render-ecds.sh "$dir/plugin-prod.yaml" "$dir/ecds-prod/portcullis.yaml" "$WASM"
  [[ $NATIVE != 1 ]] || PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-prod.yaml" "$dir/ecds-nprod/portcullis.yaml"
fi
if [[ $VENDORS == 1 ]]; then
  vendor_checks() { # checks...
    printf 'guardrails:\n  vendor_verdict_ttl_s: 0\n  input:\n'
    for c in "$@"; do
      case $c in
        lakera) echo "    - {name: lakera, vendor: {kind: lakera_guard, cluster: primary, api_key_env: OPENAI_API_KEY}}" ;;
        azure) echo "    - {name: azure, vendor: {kind: azure_content_safety, cluster: primary, api_key_env: OPENAI_API_KEY}}" ;;
        presidio) echo "    - {name: presidio, vendor: {kind: presidio, cluster: primary}}" ;;
      esac
    done
  }
  { cat "$dir/plugin-route.yaml"; vendor_checks lakera; } >"$dir/plugin-vendor1.yaml"
  { cat "$dir/plugin-route.yaml"; vendor_checks lakera azure presidio; } >"$dir/plugin-vendor3.yaml"
  for n in 1 3; do
    envoy/render-ecds.sh "$dir/plugin-vendor$n.yaml" "$dir/ecds-vendor$n/portcullis.yaml" "$WASM"
    [[ $NATIVE != 1 ]] || PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-vendor$n.yaml" "$dir/ecds-nvendor$n/portcullis.yaml"
  done
fi
if [[ $MCP == 1 ]]; then
  # One MCP server, the mock, which takes its key as the server's credential.
  cat "$dir/plugin-route.yaml" - >"$dir/plugin-mcp.yaml" <<'YAML'
mcp:
  servers:
    - {name: tools, cluster: mcp_tools, credential: {header: authorization, env: OPENAI_API_KEY, prefix: "Bearer "}}
YAML
  envoy/render-ecds.sh "$dir/plugin-mcp.yaml" "$dir/ecds-mcp/portcullis.yaml" "$WASM"
  [[ $NATIVE != 1 ]] || PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-mcp.yaml" "$dir/ecds-nmcp/portcullis.yaml"
fi
if [[ -n $BASE_WASM ]]; then
  envoy/render-ecds.sh "$dir/plugin-route.yaml" "$dir/ecds-route0/portcullis.yaml" "$BASE_WASM"
  envoy/render-ecds.sh "$dir/plugin-hit.yaml" "$dir/ecds-hit0/portcullis.yaml" "$BASE_WASM"
fi

for v in "${VARIANTS[@]}"; do
  taskset -c 0 env ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$PWD/target/native" OPENAI_API_KEY=sk-bench PORTCULLIS_SEAL_SECRET=bench-seal-secret-32-bytes-long "$ENVOY" -c "$dir/$v.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/$v.log" 2>&1 &
  PID[$v]=$!; pids+=($!)
done
for v in "${VARIANTS[@]}"; do wait_for "http://127.0.0.1:${ADMIN[$v]}/ready"; done
if [[ ${BENCH_MAIN:-} == idle ]]; then
  # Envoy's main thread (its pid; the workers are threads of their own,
  # started before this) runs SCHED_IDLE: only when the worker leaves core
  # 0 idle. A probe of what the main thread's work does to the tail.
  for v in "${VARIANTS[@]}"; do chrt --idle -p 0 "${PID[$v]}"; done
fi

# A 212-byte chat body, like the design's measurement.
body='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}'
# An MCP tools/call, in a session made here for each MCP variant.
mcp_body='{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"echo","arguments":{"text":"Say hello to the benchmark in five words or fewer, please."}}}'
mcp_session() { # variant
  curl -s -D - -o /dev/null "http://127.0.0.1:${PORT[$1]}${URLPATH[$1]}" -H "authorization: Bearer ${KEY[$1]}" \
    -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
    -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}' |
    tr -d '\r' | sed -n 's/^mcp-session-id: //Ip'
}
RATE_LUA=""; LOAD=saturated
if [[ -n ${BENCH_RATE:-} ]]; then
  LOAD="about $BENCH_RATE requests a second"
  # Each wait drawn at random (uniform, mean 32000/n ms): fixed waits would
  # lock the connections in step and send them in bursts of 32.
  RATE_LUA="delay = function() return math.random(0, $((2 * CONNS * 1000 / BENCH_RATE))) end"
fi
for v in "${VARIANTS[@]}"; do
  vbody=$body
  [[ -z ${URLPATH[$v]:-} ]] || vbody=$mcp_body
  cat >"$dir/$v.lua" <<LUA
wrk.method = "POST"
wrk.body = '$vbody'
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer ${KEY[$v]}"
${RATE_LUA}
done = function(summary, latency, requests)
  io.write(string.format("TAIL %d %d %d\\n", latency:percentile(50), latency:percentile(99), latency:percentile(99.9)))
end
LUA
  if [[ -n ${URLPATH[$v]:-} ]]; then
    session=$(mcp_session "$v")
    [[ -n $session ]] || { echo "bench: $v gave no MCP session" >&2; exit 1; }
    printf 'wrk.headers["accept"] = "application/json, text/event-stream"\nwrk.headers["mcp-session-id"] = "%s"\n' "$session" >>"$dir/$v.lua"
  fi
  if [[ $v == miss ]]; then
    # A new prompt each request (same length): a 10-digit number, from a
    # start that differs between runs.
    cat >>"$dir/$v.lua" <<'LUA'
local n = (os.time() % 100000) * 100000
request = function()
  n = n + 1
  local b = string.gsub(wrk.body, "please%.", string.format("please %010d.", n))
  return wrk.format(nil, nil, nil, b)
end
LUA
  fi
  url="http://127.0.0.1:${PORT[$v]}${URLPATH[$v]:-/v1/chat/completions}"
  extra=()
  [[ -z ${URLPATH[$v]:-} ]] || extra=(-H 'accept: application/json, text/event-stream' -H "mcp-session-id: $session")
  code=$(curl -s -o /dev/null -w '%{http_code}' "$url" -H 'content-type: application/json' -H "authorization: Bearer ${KEY[$v]}" "${extra[@]}" -d "$vbody")
  [[ $code == 200 ]] || { echo "bench: $v answered $code" >&2; exit 1; }
done
# The hit gateway now holds the answer: check that it says so.
curl -s -D - -o /dev/null "http://127.0.0.1:${PORT[hit]}/v1/chat/completions" -H 'content-type: application/json' \
  -H "authorization: Bearer ${KEY[hit]}" -d "$body" | grep -qi '^x-portcullis-cache: hit' || { echo "bench: no cache hit" >&2; exit 1; }
cache_stat() { curl -s "http://127.0.0.1:${ADMIN[${2:-hit}]}/stats?filter=wasmcustom.portcullis.cache.$1\$" | awk '{print $2}'; }

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run_wrk() { # variant -> "rps p50 p99 non2xx cpu_us_per_request"
  local v=$1 out c0 c1 rps p50 p99 errs n cpu
  c0=$(cpu_ticks "${PID[$v]}")
  out=$(taskset -c 1 wrk -t1 -c$CONNS -d"${DURATION}s" --latency -s "$dir/$v.lua" "http://127.0.0.1:${PORT[$v]}${URLPATH[$v]:-/v1/chat/completions}")
  c1=$(cpu_ticks "${PID[$v]}")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  p50=$(awk '$1=="50%" {print $2}' <<<"$out")
  p99=$(awk '$1=="99%" {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {print $5}' <<<"$out"); errs=${errs:-0}
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  # Envoy's CPU time per request (clock ticks): a cross-check of throughput.
  cpu=$(awk -v t=$((c1 - c0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t * 1e6 / hz / n}')
  [[ $errs == 0 ]] || { echo "bench: $v had $errs non-2xx answers" >&2; exit 1; }
  # p50, p99, p99.9 in microseconds and the rate, one line per run (the
  # tail table).
  awk -v rps="$rps" '$1=="TAIL" {print $2, $3, $4, rps}' <<<"$out" >>"$dir/tail-$v"
  echo "$rps $p50 $p99 $cpu"
}
# Warm up (V8 compiles the module lazily and tiers it up under load).
for v in "${VARIANTS[@]}"; do run_wrk $v >/dev/null; done
rm -f "$dir"/tail-*   # the warm-up's runs are not the rounds'

table="| round | bare rps | bare p50 / p99 | route rps | route p50 / p99 | hit rps | hit p50 / p99 | miss rps | miss p50 / p99 | route/bare | hit/bare | miss/bare |
|---|---|---|---|---|---|---|---|---|---|---|---|"
mr=(); fm=(); p99r=(); p99h=(); p99m=()
# wrk's latency (e.g. 850.00us, 1.10ms) in microseconds; added = ours - bare.
to_us() { awk -v x="$1" 'BEGIN {v = x + 0; if (x ~ /us$/) print v; else if (x ~ /ms$/) print v * 1000; else if (x ~ /s$/) print v * 1e6; else print v}'; }
p99_added() { awk -v a="$(to_us "$1")" -v b="$(to_us "$2")" 'BEGIN {printf "%.0f", a - b}'; }
rr=(); hr=(); rc=(); hc=(); vr=(); vh=(); br=(); bh=(); fr=(); fh=(); fb=(); fhb=()
nr=(); nh=(); nrc=(); nhc=(); nrw=(); nhw=(); p99nr=(); p99nh=()
mcpr=(); nmcpr=(); pr=(); npr=(); prc=(); nprc=()
ptable="| round | prod rps | prod p50 / p99 | prod/bare | prod/route | nprod rps | nprod p50 / p99 | nprod/bare | nprod/nroute |
|---|---|---|---|---|---|---|---|---|"
mtable="| round | baremcp rps | mcp rps | mcp/baremcp | route/bare (same round) | nmcp rps | nmcp/baremcp |
vtable=
|---|---|---|---|---|---|---|"
ntable="| round | nroute rps | nroute p50 / p99 | nhit rps | nhit p50 / p99 | nroute/bare | nhit/bare | nroute/route | nhit/hit |
|---|---|---|---|---|---|---|---|---|"
vs="| round | route0 rps | hit0 rps | route/route0 | hit/hit0 |
|---|---|---|---|---|"
for r in $(seq 1 "$ROUNDS"); do
  read -r b_rps b_p50 b_p99 b_cpu < <(run_wrk bare)
  read -r r_rps r_p50 r_p99 r_cpu < <(run_wrk route)
  read -r h_rps h_p50 h_p99 h_cpu < <(run_wrk hit)
  read -r m_rps m_p50 m_p99 m_cpu < <(run_wrk miss)
  mr+=("$(awk -v a="$m_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
  p99r+=("$(p99_added "$r_p99" "$b_p99")"); p99h+=("$(p99_added "$h_p99" "$b_p99")"); p99m+=("$(p99_added "$m_p99" "$b_p99")")
  ratio_r=$(awk -v a="$r_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')
  ratio_h=$(awk -v a="$h_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')
  rr+=("$ratio_r"); hr+=("$ratio_h")
  rc+=("$(awk -v a="$r_cpu" -v b="$b_cpu" 'BEGIN {printf "%.2f", b/a}')")
  hc+=("$(awk -v a="$h_cpu" -v b="$b_cpu" 'BEGIN {printf "%.2f", b/a}')")
  if [[ $FLOOR == 1 ]]; then
    read -r f_rps _ _ _ < <(run_wrk floor)
    read -r fh_rps _ _ _ < <(run_wrk floorhit)
    fr+=("$(awk -v a="$r_rps" -v b="$f_rps" 'BEGIN {printf "%.2f", a/b}')")
    fm+=("$(awk -v a="$m_rps" -v b="$f_rps" 'BEGIN {printf "%.2f", a/b}')")
    fh+=("$(awk -v a="$h_rps" -v b="$fh_rps" 'BEGIN {printf "%.2f", a/b}')")
    fb+=("$(awk -v a="$f_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
    fhb+=("$(awk -v a="$fh_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
  fi
  if [[ $NATIVE == 1 ]]; then
    read -r nr_rps nr_p50 nr_p99 nr_cpu < <(run_wrk nroute)
    read -r nh_rps nh_p50 nh_p99 nh_cpu < <(run_wrk nhit)
    nr+=("$(awk -v a="$nr_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
    nh+=("$(awk -v a="$nh_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
    nrc+=("$(awk -v a="$nr_cpu" -v b="$b_cpu" 'BEGIN {printf "%.2f", b/a}')")
    nhc+=("$(awk -v a="$nh_cpu" -v b="$b_cpu" 'BEGIN {printf "%.2f", b/a}')")
    nrw+=("$(awk -v a="$nr_rps" -v b="$r_rps" 'BEGIN {printf "%.2f", a/b}')")
    nhw+=("$(awk -v a="$nh_rps" -v b="$h_rps" 'BEGIN {printf "%.2f", a/b}')")
    p99nr+=("$(p99_added "$nr_p99" "$b_p99")"); p99nh+=("$(p99_added "$nh_p99" "$b_p99")")
    ntable+=$'\n'"| $r | $nr_rps | $nr_p50 / $nr_p99 | $nh_rps | $nh_p50 / $nh_p99 | ${nr[-1]}x | ${nh[-1]}x | ${nrw[-1]}x | ${nhw[-1]}x |"
  fi
  if [[ -n $BASE_WASM ]]; then
    read -r r0_rps _ _ _ < <(run_wrk route0)
    read -r h0_rps _ _ _ < <(run_wrk hit0)
    vr+=("$(awk -v a="$r_rps" -v b="$r0_rps" 'BEGIN {printf "%.3f", a/b}')")
    vh+=("$(awk -v a="$h_rps" -v b="$h0_rps" 'BEGIN {printf "%.3f", a/b}')")
    br+=("$(awk -v a="$r0_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
    bh+=("$(awk -v a="$h0_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
    vs+=$'\n'"| $r | $r0_rps | $h0_rps | ${vr[-1]}x | ${vh[-1]}x |"
  fi
  if [[ $PROD == 1 ]]; then
    read -r p_rps p_p50 p_p99 p_cpu < <(run_wrk prod)
    pr+=("$(awk -v a="$p_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
    prc+=("$(awk -v a="$p_cpu" -v b="$b_cpu" 'BEGIN {printf "%.2f", b/a}')")
    rowp="| $r | $p_rps | $p_p50 / $p_p99 | ${pr[-1]}x | $(awk -v a="$p_rps" -v b="$r_rps" 'BEGIN {printf "%.2f", a/b}')x |"
    if [[ $NATIVE == 1 ]]; then
      read -r np_rps np_p50 np_p99 np_cpu < <(run_wrk nprod)
      npr+=("$(awk -v a="$np_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')")
      nprc+=("$(awk -v a="$np_cpu" -v b="$b_cpu" 'BEGIN {printf "%.2f", b/a}')")
      rowp+=" $np_rps | $np_p50 / $np_p99 | ${npr[-1]}x | $(awk -v a="$np_rps" -v b="$nr_rps" 'BEGIN {printf "%.2f", a/b}')x |"
    else
      rowp+=" | | | |"
    fi
    ptable+=$'\n'"$rowp"
  fi
  table+=$'\n'"| $r | $b_rps | $b_p50 / $b_p99 | $r_rps | $r_p50 / $r_p99 | $h_rps | $h_p50 / $h_p99 | $m_rps | $m_p50 / $m_p99 | ${ratio_r}x | ${ratio_h}x | ${mr[-1]}x |"
  if [[ $MCP == 1 ]]; then
    read -r bm_rps _ bm_p99 _ < <(run_wrk baremcp)
    read -r cm_rps _ cm_p99 _ < <(run_wrk mcp)
    mcpr+=("$(awk -v a="$cm_rps" -v b="$bm_rps" 'BEGIN {printf "%.2f", a/b}')")
    rowm="| $r | $bm_rps | $cm_rps | ${mcpr[-1]}x | ${ratio_r}x |"
    if [[ $NATIVE == 1 ]]; then
      read -r nm_rps _ _ _ < <(run_wrk nmcp)
      nmcpr+=("$(awk -v a="$nm_rps" -v b="$bm_rps" 'BEGIN {printf "%.2f", a/b}')")
      rowm+=" $nm_rps | ${nmcpr[-1]}x |"
    fi
    mtable+=$'\n'"$rowm"
  fi
  if [[ $VENDORS == 1 ]]; then
    vlist=(vendor1 vendor3); [[ $NATIVE != 1 ]] || vlist+=(nvendor1 nvendor3)
    rowv="| $r |"
    for v in "${vlist[@]}"; do
      read -r v_rps _ v_p99 _ < <(run_wrk "$v")
      rowv+=" $v_rps | $v_p99 | $(awk -v a="$v_rps" -v b="$b_rps" 'BEGIN {printf "%.2f", a/b}')x |"
    done
    vtable+=$'\n'"$rowv"
  fi
done
misses=$(cache_stat misses); hits=$(cache_stat hits)
median_of() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f", (a[NR/2]+a[NR/2+1])/2}'; }
mkdir -p .run
{
  echo "bare vs filter (route: cache off; hit: cache hits; miss: cache on, a new prompt each request): $CONNS connections, ${DURATION}s per run, $ROUNDS alternating rounds, $(date -u +%F)"
  echo
  echo "$table"
  echo
  echo "Median route/bare: $(median_of "${rr[@]}")x (CPU per request: $(median_of "${rc[@]}")x)"
  echo "Median hit/bare:   $(median_of "${hr[@]}")x (CPU per request: $(median_of "${hc[@]}")x)"
  echo "Median miss/bare:  $(median_of "${mr[@]}")x"
  echo "Median p99 added over bare (us): route $(median_of "${p99r[@]}"), hit $(median_of "${p99h[@]}"), miss $(median_of "${p99m[@]}")"
  if [[ $FLOOR == 1 ]]; then
    echo "Floors (bench/floor, same rounds): routed floor/bare $(median_of "${fb[@]}")x, local-answer floor/bare $(median_of "${fhb[@]}")x"
    echo "Median route/floor: $(median_of "${fr[@]}")x, miss/floor: $(median_of "${fm[@]}")x, hit/floorhit: $(median_of "${fh[@]}")x"
  fi
  if [[ $NATIVE == 1 ]]; then
    echo
    echo "The native build (dynamic module), same rounds:"
    echo
    echo "$ntable"
    echo
    echo "Median nroute/bare: $(median_of "${nr[@]}")x (CPU per request: $(median_of "${nrc[@]}")x), nhit/bare: $(median_of "${nh[@]}")x (CPU per request: $(median_of "${nhc[@]}")x)"
    echo "Median native over Wasm: nroute/route $(median_of "${nrw[@]}")x, nhit/hit $(median_of "${nhw[@]}")x"
    echo "Median p99 added over bare (us): nroute $(median_of "${p99nr[@]}"), nhit $(median_of "${p99nh[@]}")"
  fi
  if [[ $PROD == 1 ]]; then
    echo
    echo "A production-like config (#49: key and team limits and budgets, six guardrails, the log), same rounds:"
    echo
    echo "$ptable"
    echo
    echo "Median prod/bare: $(median_of "${pr[@]}")x (CPU per request: $(median_of "${prc[@]}")x)${npr[0]:+, nprod/bare: $(median_of "${npr[@]}")x (CPU per request: $(median_of "${nprc[@]}")x)}"
  fi
  if [[ $MCP == 1 ]]; then
    echo
    echo "MCP tools/call (#47), same rounds: bare Envoy to the mock's MCP mode (baremcp), our filter at /mcp/tools:"
    echo
    echo "$mtable"
    echo
    echo "Median mcp/baremcp: $(median_of "${mcpr[@]}")x (route/bare $(median_of "${rr[@]}")x)${nmcpr[0]:+, nmcp/baremcp: $(median_of "${nmcpr[@]}")x}"
  fi
  if [[ $VENDORS == 1 ]]; then
    echo
    echo "Vendor guardrails (#63), one check and three, each asked on every request (the mock's fakes), same rounds:"
    echo
    vhead="| round |"; vsep="|---|"
    for v in "${vlist[@]}"; do vhead+=" $v rps | $v p99 | $v/bare |"; vsep+="---|---|---|"; done
    echo "$vhead"
    echo "$vsep$vtable"
  fi
  if [[ -n $BASE_WASM ]]; then
    echo
    echo "Against the baseline build ($BASE_WASM), same rounds:"
    echo
    echo "$vs"
    echo
    echo "Median route/route0: $(median_of "${vr[@]}")x, hit/hit0: $(median_of "${vh[@]}")x (baseline: route0/bare $(median_of "${br[@]}")x, hit0/bare $(median_of "${bh[@]}")x)"
  fi
  echo
  echo "The tail, every variant (ms; medians over the rounds; p99/bare: the median of each round's p99 over bare Envoy's in the same round, MCP variants over baremcp's; added: the same for p99 minus bare's). Collector: ${BENCH_COLLECTOR:-idle}; Envoy's main thread: ${BENCH_MAIN:-normal}; request log: $([[ ${BENCH_LOG:-1} == 0 ]] && echo off || echo on); load: $LOAD."
  echo
  echo "| variant | rps | p50 | p99 | p99.9 | p99/bare | p99 added | p99.9/bare |"
  echo "|---|---|---|---|---|---|---|---|"
  for v in "${VARIANTS[@]}"; do
    b=bare; [[ -z ${URLPATH[$v]:-} ]] || b=baremcp
    [[ -s $dir/tail-$v && -s $dir/tail-$b ]] || continue
    paste -d' ' "$dir/tail-$v" "$dir/tail-$b" | awk -v v="$v" '
      function med(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
      { n++; p50[n] = $1; p99[n] = $2; p999[n] = $3; q[n] = $4; r[n] = $2 / $6; d[n] = $2 - $6; r9[n] = $3 / $7 }
      END { printf "| %s | %.0f | %.2f | %.2f | %.2f | %.2fx | %+.2f | %.2fx |\n", v, med(q, n), med(p50, n) / 1000, med(p99, n) / 1000, med(p999, n) / 1000, med(r, n), med(d, n) / 1000, med(r9, n) }'
  done
  echo
  echo "Hit gateway over the whole run: $hits cache hits, $misses misses (the first request)"
  echo "Miss gateway over the whole run: $(cache_stat misses miss) misses, $(cache_stat hits miss | grep . || echo 0) hits, $(cache_stat stores miss) stores"
  echo "Request records in the collector: $(curl -s 'http://127.0.0.1:18152/v1/metrics/summary?since=0' | sed 's/.*"total":\([0-9]*\).*/\1/')"
} | tee .run/bench-latest.md
