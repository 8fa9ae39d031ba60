#!/usr/bin/env bash
# make bench-global (also run by make bench): the cost of a limit scoped
# `global` on the routed path, and the limiter's own rate.
#   local   Envoy + filter, cache off, the demo key's limits counted locally
#   global  the same limits (never reached) counted by portcullis-limiter:
#           three limits (requests, tokens, budget) in one call (#34)
#   global1 only the request rate global (one limit in the call)
# Both Envoys pinned to core 0 with one worker; wrk, the mock, Redis and the
# limiter share core 1 (the limiter's work is on the same core as the load
# generator, which lowers both sides alike). Alternating rounds, medians of
# the per-round ratios, as in bench.sh. Then the limiter alone: limiter on
# core 0 (one worker thread), Redis and the load client on core 1.
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
DURATION="${BENCH_DURATION:-3}"
ROUNDS="${BENCH_ROUNDS:-8}"
CONNS=32
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
command -v wrk >/dev/null || (apt-get install -y -qq wrk >/dev/null 2>&1) || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)
cargo build --release -q -p portcullis-tests --bin portcullis-mock
cargo build --release -q -p portcullis-limiter --bins
dir=$(mktemp -d /tmp/portcullis-bench-global.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 30)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench: $* not ready" >&2; exit 1; }; sleep 0.1; done; }
port_open() { local d=$((SECONDS + 30)); until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do ((SECONDS < d)) || { echo "bench: port $1 not open" >&2; exit 1; }; sleep 0.1; done; }

MOCK_PORT=18201; REDIS_PORT=18279; LIMITER_PORT=18281
taskset -c 1 target/release/portcullis-mock --port $MOCK_PORT --name bench --threads 1 --api-key sk-bench >"$dir/mock.log" 2>&1 & pids+=($!)
taskset -c 1 redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no >"$dir/redis.log" 2>&1 & pids+=($!)
taskset -c 1 target/release/portcullis-limiter --listen 127.0.0.1:$LIMITER_PORT --redis redis://127.0.0.1:$REDIS_PORT --threads 1 >"$dir/limiter.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK_PORT/__mock/hits
port_open $REDIS_PORT; port_open $LIMITER_PORT

VARIANTS=(local global global1)
declare -A PORT=([local]=10201 [global]=10202 [global1]=10203) ADMIN=([local]=9921 [global]=9922 [global1]=9923) PID=()
base=$(scripts/bench-plugin.sh | sed 's/^  enabled: true/  enabled: false/' | sed '/^log:/,/^[a-z]/{/^log:/d;/^  /d}')
limits='limits: {requests_per_minute: 1000000000, tokens_per_minute: 4000000000, budget_usd_per_day: 400000}'
demo='    key_sha256: 1f39b34977fb885c1f5e66609a5a880cd58f383952eb98ce438069cc57aeccf8'
grep -q "^$demo\$" <<<"$base" || { echo "bench: demo key not found in envoy/plugin.yaml" >&2; exit 1; }
for v in "${VARIANTS[@]}"; do
  case $v in local) scope=local ;; global) scope=global ;; global1) scope='{requests_per_minute: global}' ;; esac
  plugin=$(awk -v d="$demo" -v l="    ${limits%\}}, scope: $scope}" '{print} $0==d {print l}' <<<"$base")
  [[ $v != local ]] && plugin=$(sed 's/^limits:$/limits:\n  global: {cluster: portcullis_ratelimit, timeout_ms: 200, failure_mode: deny}/' <<<"$plugin")
  echo "$plugin" >"$dir/plugin-$v.yaml"
  sed -e "s/port_value: 10000/port_value: ${PORT[$v]}/; s/port_value: 9901/port_value: ${ADMIN[$v]}/; s/port_value: 18001/port_value: $MOCK_PORT/; s/port_value: 8081/port_value: $LIMITER_PORT/; s|\.run/ecds|$dir/ecds-$v|g" envoy/envoy.yaml >"$dir/$v.yaml"
  envoy/render-ecds.sh "$dir/plugin-$v.yaml" "$dir/ecds-$v/portcullis.yaml" "$WASM"
  taskset -c 0 env OPENAI_API_KEY=sk-bench "$ENVOY" -c "$dir/$v.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/$v.log" 2>&1 &
  PID[$v]=$!; pids+=($!)
done
for v in "${VARIANTS[@]}"; do wait_for "http://127.0.0.1:${ADMIN[$v]}/ready"; done

body='{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}'
for v in "${VARIANTS[@]}"; do
  printf 'wrk.method = "POST"\nwrk.body = %s\nwrk.headers["content-type"] = "application/json"\nwrk.headers["authorization"] = "Bearer sk-portcullis-demo"\n' "'$body'" >"$dir/$v.lua"
  url="http://127.0.0.1:${PORT[$v]}/v1/chat/completions"
  code=$(curl -s -o /dev/null -w '%{http_code}' "$url" -H 'content-type: application/json' -H 'authorization: Bearer sk-portcullis-demo' -d "$body")
  [[ $code == 200 ]] || { echo "bench: $v answered $code" >&2; cat "$dir/$v.log" >&2; exit 1; }
done
stat() { curl -s "http://127.0.0.1:${ADMIN[$1]}/stats?filter=wasmcustom.portcullis.global.$2\$" | awk '{print $2}'; }

to_us() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); print v} else if (v ~ /ms$/) {sub(/ms$/,"",v); print v*1000} else {sub(/s$/,"",v); print v*1e6}}' <<<"$1"; }
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run_wrk() { # variant -> "rps p50_us p99_us envoy_cpu_us_per_request"
  local v=$1 out rps errs c0 c1 n
  c0=$(cpu_ticks "${PID[$v]}")
  out=$(taskset -c 1 wrk -t1 -c$CONNS -d"${DURATION}s" --latency -s "$dir/$v.lua" "http://127.0.0.1:${PORT[$v]}/v1/chat/completions")
  errs=$(awk '/Non-2xx/ {print $5}' <<<"$out"); errs=${errs:-0}
  [[ $errs == 0 ]] || { echo "bench: $v had $errs non-2xx answers" >&2; exit 1; }
  c1=$(cpu_ticks "${PID[$v]}")
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  echo "$rps $(to_us "$(awk '$1=="50%" {print $2}' <<<"$out")") $(to_us "$(awk '$1=="99%" {print $2}' <<<"$out")") $(awk -v t=$((c1 - c0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t * 1e6 / hz / n}')"
}
for v in "${VARIANTS[@]}"; do run_wrk $v >/dev/null; done
median_of() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f", (a[NR/2]+a[NR/2+1])/2}'; }
table="| round | local rps | local p50 / p99 (us) | global rps | global p50 / p99 (us) | global1 rps | global1 p50 / p99 (us) | global/local | global1/local |
|---|---|---|---|---|---|---|---|---|"
ratios=(); d50=(); d99=(); ratios1=(); ratios3=(); e50=(); e99=(); cl=(); cg=(); cg1=()
for r in $(seq 1 "$ROUNDS"); do
  read -r l_rps l50 l99 l_cpu < <(run_wrk local)
  read -r g_rps g50 g99 g_cpu < <(run_wrk global)
  read -r o_rps o50 o99 o_cpu < <(run_wrk global1)
  ratios+=("$(awk -v a="$g_rps" -v b="$l_rps" 'BEGIN {printf "%.2f", a/b}')")
  ratios1+=("$(awk -v a="$o_rps" -v b="$l_rps" 'BEGIN {printf "%.2f", a/b}')")
  ratios3+=("$(awk -v a="$g_rps" -v b="$o_rps" 'BEGIN {printf "%.2f", a/b}')")
  d50+=("$(awk -v a="$g50" -v b="$l50" 'BEGIN {printf "%.0f", a-b}')")
  d99+=("$(awk -v a="$g99" -v b="$l99" 'BEGIN {printf "%.0f", a-b}')")
  e50+=("$(awk -v a="$o50" -v b="$l50" 'BEGIN {printf "%.0f", a-b}')")
  e99+=("$(awk -v a="$o99" -v b="$l99" 'BEGIN {printf "%.0f", a-b}')")
  cl+=("$l_cpu"); cg+=("$g_cpu"); cg1+=("$o_cpu")
  table+=$'\n'"| $r | $l_rps | $l50 / $l99 | $g_rps | $g50 / $g99 | $o_rps | $o50 / $o99 | ${ratios[-1]}x | ${ratios1[-1]}x |"
done
checks=$(stat global checks); errors=$(stat global errors.deny); errors=${errors:-0}
# Envoy's histogram of the limiter cluster's calls: P50 and P99 over the run.
rq_quantiles() { curl -s "http://127.0.0.1:${ADMIN[$1]}/stats?filter=cluster.portcullis_ratelimit.upstream_rq_time\$" |
  sed -n 's/.*P50(\([^,]*\),\([^)]*\)).*P99(\([^,]*\),\([^)]*\)).*/p50 \2, p99 \4/p'; }
rq_time=$(rq_quantiles global); rq_time1=$(rq_quantiles global1)
# The limiter alone: restart it on core 0 with one worker thread.
kill "${pids[2]}" 2>/dev/null || true; wait "${pids[2]}" 2>/dev/null || true
taskset -c 0 target/release/portcullis-limiter --listen 127.0.0.1:$LIMITER_PORT --redis redis://127.0.0.1:$REDIS_PORT --threads 1 >"$dir/limiter2.log" 2>&1 & pids+=($!)
port_open $LIMITER_PORT
lpid=$!
t0=$(awk '{print $14 + $15}' "/proc/$lpid/stat")
decisions=$(taskset -c 1 target/release/limiter-bench 127.0.0.1:$LIMITER_PORT 5 64)
t1=$(awk '{print $14 + $15}' "/proc/$lpid/stat")
n=$(awk '{print $2}' <<<"$decisions")
mkdir -p .run
{
  echo "global vs local limits on the routed path (cache off; requests, tokens and budget limits never reached): $CONNS connections, ${DURATION}s per run, $ROUNDS alternating rounds, $(date -u +%F)"
  echo
  echo "$table"
  echo
  echo "Median global/local (3 limits, one call): $(median_of "${ratios[@]}")x; added latency p50 $(median_of "${d50[@]}") us, p99 $(median_of "${d99[@]}") us"
  echo "Median global1/local (1 limit): $(median_of "${ratios1[@]}")x; added latency p50 $(median_of "${e50[@]}") us, p99 $(median_of "${e99[@]}") us"
  echo "Median global/global1 (3 limits against 1): $(median_of "${ratios3[@]}")x"
  echo "The limiter's answer as Envoy saw it under this load (cluster upstream_rq_time, ms): global $rq_time; global1 $rq_time1"
  echo "Envoy CPU per request (median, us): local $(median_of "${cl[@]}"), global $(median_of "${cg[@]}"), global1 $(median_of "${cg1[@]}")"
  echo "Global checks counted by the global Envoy: $checks (errors: $errors)"
  echo "Limiter alone (core 0, one worker; Redis and the client on core 1): $decisions"
  echo "Limiter CPU per decision: $(awk -v t=$((t1 - t0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%.1f", t * 1e6 / hz / n}') us"
} | tee .run/bench-global-latest.md
