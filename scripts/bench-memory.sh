#!/usr/bin/env bash
# bench-memory.sh: does the gateway's memory stay flat under long mixed
# traffic? One Envoy with the filter (shipped plugin config: cache and request
# log on), a mock provider and a real collector on loopback; wrk sends a mix
# of cache hits, misses (every body new), streamed misses and refused
# requests (unknown key). Envoy's resident memory and its allocator's heap
# (admin /memory) are read after a warm-up and at cumulative request counts.
#   BENCH_MEMORY_SECONDS="15 150"  (traffic periods after the warm-up)
#   PORTCULLIS_BUILD=native  the native build (make native) instead of Wasm
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
command -v wrk >/dev/null || { apt-get install -y -qq wrk >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null); }
cargo build --release -q -p portcullis-tests --bin portcullis-mock
cargo build --release -q -p portcullis-collector --bin portcullis-collector
dir=$(mktemp -d /tmp/portcullis-mem.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 30)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench-memory: $* not ready" >&2; exit 1; }; sleep 0.1; done; }
MOCK=18201; COLL=18251; PORT=10201; ADMIN=9921
target/release/portcullis-collector --grpc 127.0.0.1:$COLL --http 127.0.0.1:18252 --db "$dir/log.db" >"$dir/collector.log" 2>&1 & pids+=($!)
target/release/portcullis-mock --port $MOCK --name mem --threads 1 --api-key sk-mem >"$dir/mock.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK/__mock/hits
wait_for http://127.0.0.1:18252/healthz
sed -e "s/port_value: 10000/port_value: $PORT/; s/port_value: 9901/port_value: $ADMIN/; s/port_value: 18001/port_value: $MOCK/; s/port_value: 50051/port_value: $COLL/; s|\.run/ecds|$dir/ecds|g" envoy/envoy.yaml >"$dir/envoy.yaml"
# BENCH_MEMORY_NOLOG=1: without the request log (its buffer's high-water
# mark then does not enter the Wasm VM's memory).
if [[ -n ${BENCH_MEMORY_NOLOG:-} ]]; then
  scripts/bench-plugin.sh | awk '/^log:/ {skip=1; next} skip && /^[^ ]/ {skip=0} !skip' >"$dir/plugin.yaml"
else
  scripts/bench-plugin.sh >"$dir/plugin.yaml"
fi
envoy/render-ecds.sh "$dir/plugin.yaml" "$dir/ecds/portcullis.yaml" "$WASM"
ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$PWD/target/native" OPENAI_API_KEY=sk-mem "$ENVOY" -c "$dir/envoy.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/envoy.log" 2>&1 & epid=$!; pids+=($epid)
wait_for http://127.0.0.1:$ADMIN/ready
cat >"$dir/mix.lua" <<'LUA'
local n = 0
request = function()
  n = n + 1
  local kind = n % 10
  local h = {["content-type"] = "application/json", ["authorization"] = "Bearer sk-portcullis-demo"}
  local body
  if kind < 5 then      -- cache hits: one fixed question
    body = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"the same question"}]}'
  elseif kind < 8 then  -- misses: every body new (the cache table stays bounded)
    body = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"question ' .. n .. '"}]}'
  elseif kind == 8 then -- streamed misses
    body = '{"model":"gpt-4o-mini","stream":true,"messages":[{"role":"user","content":"stream ' .. n .. '"}]}'
  else                  -- refused: an unknown key
    h["authorization"] = "Bearer sk-nobody"
    body = '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"x"}]}'
  end
  return wrk.format("POST", "/v1/chat/completions", h, body)
end
LUA
rss() { awk '/VmRSS/ {print $2}' "/proc/$epid/status"; }
heap() { curl -s "http://127.0.0.1:$ADMIN/memory" | sed -n 's/.*"allocated": *"\{0,1\}\([0-9]*\).*/\1/p' | head -1; }
stat() { curl -s "http://127.0.0.1:$ADMIN/stats?filter=^http.gateway.downstream_rq_$1$" | awk '{print $2}'; }
vm() { curl -s "http://127.0.0.1:$ADMIN/stats?filter=^wasmcustom.portcullis.vm_memory_bytes$" | awk '{print $2}'; }
total() { echo "$(stat total) ($(stat 2xx) 2xx, $(stat 4xx) 4xx, $(stat 5xx) 5xx)"; }
run() { taskset -c 1 wrk -t1 -c32 -d"$1s" -s "$dir/mix.lua" "http://127.0.0.1:$PORT/" >/dev/null; }
echo "| after | requests | Envoy RSS (KiB) | Envoy heap allocated (bytes) | Wasm VM linear memory (bytes) |"
echo "|---|---|---|---|---|"
run 10
echo "| warm-up | $(total) | $(rss) | $(heap) | $(vm) |"
for s in ${BENCH_MEMORY_SECONDS:-15 150}; do
  run "$s"
  echo "| +${s}s | $(total) | $(rss) | $(heap) | $(vm) |"
done
