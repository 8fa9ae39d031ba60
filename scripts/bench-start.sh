#!/usr/bin/env bash
# make bench-start (#49): how long an Envoy takes from its start to the
# filter's first answer, the replica's readiness in a rolling restart. Each
# variant starts BENCH_START_RUNS times (default 3) with the shipped
# envoy/envoy.yaml and plugin config, BENCH_START_WORKERS workers (default
# 2), the machine otherwise idle; the clock stops at the first answer that
# only the loaded filter gives:
#   floor   bench/floor's Wasm module answering locally (the ABI's floor:
#           a module of a few KB)
#   wasm    our Wasm module: a keyless chat request answered 401
#   native  our native build: the same 401
# BENCH_WASM names another module to time as `wasm` (an earlier build, or
# one built with other settings); BENCH_START_OTHER adds it as `other`
# beside this build's. Prints a markdown table and the module sizes.
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS="${BENCH_START_RUNS:-3}"
WORKERS="${BENCH_START_WORKERS:-2}"
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
OTHER="${BENCH_START_OTHER:-}"
ENVOY="${ENVOY:-.venv/bin/envoy}"
[[ -f $WASM ]] || { echo "bench-start: no Wasm module at $WASM (make wasm)" >&2; exit 1; }
[[ -f target/native/libportcullis.so ]] || { echo "bench-start: no native build (make native)" >&2; exit 1; }
(cd bench/floor && cargo build --release -q --target wasm32-wasip1)
FLOOR_WASM="$PWD/bench/floor/target/wasm32-wasip1/release/portcullis_floor.wasm"
dir=$(mktemp -d /tmp/portcullis-start.XXXX)
pid=""
cleanup() { [[ -z $pid ]] || { kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; }; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
PORT=10461 ADMIN=9961
scripts/bench-plugin.sh >"$dir/plugin.yaml"
echo answer >"$dir/plugin-floor.yaml"
variants=(floor wasm native)
[[ -z $OTHER ]] || variants+=(other)
for v in "${variants[@]}"; do
  sed -e "s/port_value: 10000/port_value: $PORT/; s/port_value: 9901/port_value: $ADMIN/; s|\.run/ecds|$dir/ecds-$v|g" envoy/envoy.yaml >"$dir/$v.yaml"
  case $v in
    floor) envoy/render-ecds.sh "$dir/plugin-floor.yaml" "$dir/ecds-$v/portcullis.yaml" "$FLOOR_WASM" ;;
    wasm) envoy/render-ecds.sh "$dir/plugin.yaml" "$dir/ecds-$v/portcullis.yaml" "$WASM" ;;
    other) envoy/render-ecds.sh "$dir/plugin.yaml" "$dir/ecds-$v/portcullis.yaml" "$OTHER" ;;
    native) PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin.yaml" "$dir/ecds-$v/portcullis.yaml" ;;
  esac
done
# The status only the loaded filter gives: 401 to a keyless request, 200
# from the floor's local answer (Envoy's own answers before the filter is
# in place are 500s and 503s, or no connection).
want() { [[ $1 == floor ]] && echo 200 || echo 401; }
declare -A took
for ((r = 1; r <= RUNS; r++)); do
  for v in "${variants[@]}"; do
    start=$(date +%s%N)
    env ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$PWD/target/native" OPENAI_API_KEY=sk-bench "$ENVOY" -c "$dir/$v.yaml" \
      --disable-hot-restart --concurrency "$WORKERS" -l error >"$dir/$v.log" 2>&1 &
    pid=$!
    deadline=$((SECONDS + 120)) code=""
    until [[ $code == "$(want "$v")" ]]; do
      ((SECONDS < deadline)) || { echo "bench-start: $v gave no answer in 120 s (last: $code)" >&2; tail -5 "$dir/$v.log" >&2; exit 1; }
      kill -0 "$pid" 2>/dev/null || { echo "bench-start: $v's Envoy exited" >&2; tail -5 "$dir/$v.log" >&2; exit 1; }
      code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "http://127.0.0.1:$PORT/v1/chat/completions" \
        -H 'content-type: application/json' -d '{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}]}' || true)
      [[ $code == "$(want "$v")" ]] || sleep 0.02
    done
    end=$(date +%s%N)
    took[$v]+="$(awk -v ns=$((end - start)) 'BEGIN { printf "%.2f", ns / 1e9 }') "
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    pid=""
  done
done
size() { stat -c %s "$1"; }
echo "| variant | module bytes | start to first answer, s ($RUNS starts, $WORKERS workers) |"
echo "|---|---|---|"
for v in "${variants[@]}"; do
  case $v in
    floor) b=$(size "$FLOOR_WASM") ;; wasm) b=$(size "$WASM") ;; other) b=$(size "$OTHER") ;;
    native) b=$(size target/native/libportcullis.so) ;;
  esac
  echo "| $v | $b | ${took[$v]}|"
done
