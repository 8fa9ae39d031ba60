#!/usr/bin/env bash
# make bench-sizes (also in make bench): what a request's size costs (#29).
# Chat requests padded to 1 KB, 10 KB, 100 KB, 1 MB and 10 MB (an earlier
# user turn of plain text, as agents resend their conversation), through
#   bare   envoy/bare.yaml: Envoy forwarding the same body, no filter
#   route  the gateway, prompt cache off: the routed path
#   hit    the gateway, prompt cache on: every request a hit
#   floor  the mechanism's floor (bench/floor: a filter that pauses, reads
#          the body and sets the route), instructions only
# Two measures, in one run:
# 1. Throughput: wrk, BENCH_SIZES_ROUNDS rounds alternating the three per
#    size (Envoys on core 0 with one worker, wrk and the mock on core 1),
#    requests per second and Envoy's CPU time per request; the ratios to
#    bare at each size are per-round medians.
# 2. Instructions per request (callgrind, the stable measure): one Envoy per
#    variant under callgrind, each size warmed, then exactly N requests
#    counted and dumped; the slope per KB between sizes says whether a step
#    grows faster than the body.
# Prints markdown (also .run/bench-sizes-latest.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
ENVOY_REAL="${ENVOY_BIN:-$(find .venv/lib -path '*/envoy/_bin/envoy' -type f 2>/dev/null | head -1)}"
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
SIZES=(${BENCH_SIZES:-1024 10240 102400 1048576 10485760})
ROUNDS="${BENCH_SIZES_ROUNDS:-3}"
DURATION="${BENCH_DURATION:-3}"
CONNS=8
INSTR="${BENCH_SIZES_INSTR:-1}"
# BENCH_SIZES_TPUT=0 skips the throughput rounds; BENCH_SIZES_VARIANTS picks
# the variants counted under callgrind (default: all three).
TPUT="${BENCH_SIZES_TPUT:-1}"
COUNTED=(${BENCH_SIZES_VARIANTS:-bare floor route hit})
[[ -x $ENVOY_REAL ]] || { echo "bench-sizes: no Envoy binary (make envoy)" >&2; exit 1; }
command -v wrk >/dev/null || (apt-get install -y -qq wrk >/dev/null 2>&1) || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
cargo build --release -q -p portcullis-tests --bin portcullis-mock --bin portcullis-load
dir=$(mktemp -d /tmp/portcullis-sizes.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 300)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench-sizes: $* not ready" >&2; exit 1; }; sleep 0.2; done; }

MOCK=18501
taskset -c 1 target/release/portcullis-mock --port $MOCK --name bench --threads 1 --api-key sk-bench >"$dir/mock.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK/__mock/hits

declare -A PORT=([bare]=10501 [route]=10502 [hit]=10503 [floor]=10504) ADMIN=([bare]=9951 [route]=9952 [hit]=9953 [floor]=9954) KEY=([bare]=sk-bench [route]=sk-portcullis-demo [hit]=sk-portcullis-demo [floor]=sk-portcullis-demo) PID=()
VARIANTS=(bare route hit)
# No request log: the sizes are compared, not the log's timer-driven flushes.
nolog() { awk '/^log:/ {skip=1; next} skip && /^[^ ]/ {skip=0} !skip' "$1"; }
nolog <(scripts/bench-plugin.sh) | sed 's/^  enabled: true/  enabled: false/' >"$dir/plugin-route.yaml"
grep -q '^  enabled: false' "$dir/plugin-route.yaml" || { echo "bench-sizes: cannot turn the cache off" >&2; exit 1; }
# Answers to 10 MB prompts are small: the cache's entry limit is not in play.
nolog <(scripts/bench-plugin.sh) >"$dir/plugin-hit.yaml"
sed -e "s/port_value: 10001/port_value: ${PORT[bare]}/; s/port_value: 9902/port_value: ${ADMIN[bare]}/; s/port_value: 18001/port_value: $MOCK/" envoy/bare.yaml >"$dir/bare.yaml"
(cd bench/floor && cargo build --release -q --target wasm32-wasip1)
echo route >"$dir/plugin-floor.yaml"
for v in route hit floor; do
  sed -e "s/port_value: 10000/port_value: ${PORT[$v]}/; s/port_value: 9901/port_value: ${ADMIN[$v]}/; s/port_value: 18001/port_value: $MOCK/; s/port_value: 18002/port_value: $MOCK/; s|\.run/ecds|$dir/ecds-$v|g" envoy/envoy.yaml >"$dir/$v.yaml"
  wasm=$WASM
  [[ $v != floor ]] || wasm=$PWD/bench/floor/target/wasm32-wasip1/release/portcullis_floor.wasm
  envoy/render-ecds.sh "$dir/plugin-$v.yaml" "$dir/ecds-$v/portcullis.yaml" "$wasm"
done
# Bare Envoy's listener gets the same buffer limit as the gateway's.
sed -i 's/^    filter_chains:/    per_connection_buffer_limit_bytes: 34603008\n    filter_chains:/' "$dir/bare.yaml"

# The bodies, one file per size (the same text portcullis-load sends).
for size in "${SIZES[@]}"; do
  python3 - "$size" >"$dir/body-$size.json" <<'PY'
import sys
size = int(sys.argv[1])
template = '{"model":"gpt-4o-mini","messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Say hello to the benchmark in five words or fewer, please."}],"temperature":0.2,"max_tokens":16}'
line = "Context line of a long agent conversation, resent every turn. "
turn = '{"role":"user","content":""},'
room = max(0, size - len(template) - len(turn))
filler = (line * (room // len(line) + 1))[:room]
sys.stdout.write(template.replace('"messages":[', '"messages":[{"role":"user","content":"%s"},' % filler, 1))
PY
done

human() { awk -v b="$1" 'BEGIN {if (b >= 1048576) printf "%g MB", b / 1048576; else printf "%g KB", b / 1024}'; }
median_of() { printf '%s\n' "$@" | sort -n | awk '{a[NR]=$1} END {if (NR%2) print a[(NR+1)/2]; else printf "%.2f", (a[NR/2]+a[NR/2+1])/2}'; }

# ---------------------------------------------------------------- throughput
for v in "${VARIANTS[@]}"; do
  taskset -c 0 env OPENAI_API_KEY=sk-bench BACKUP_API_KEY=sk-bench ANTHROPIC_API_KEY=sk-bench PORTCULLIS_SEAL_SECRET=bench-seal-secret-32-bytes-long "$ENVOY" -c "$dir/$v.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/$v.log" 2>&1 &
  PID[$v]=$!; pids+=($!)
done
for v in "${VARIANTS[@]}"; do wait_for "http://127.0.0.1:${ADMIN[$v]}/ready"; done
cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
run_wrk() { # variant size -> "rps cpu_us_per_request"
  local v=$1 size=$2 out c0 c1 rps errs n
  cat >"$dir/$v.lua" <<LUA
local f = io.open("$dir/body-$size.json", "rb")
wrk.body = f:read("*a")
f:close()
wrk.method = "POST"
wrk.headers["content-type"] = "application/json"
wrk.headers["authorization"] = "Bearer ${KEY[$v]}"
LUA
  c0=$(cpu_ticks "${PID[$v]}")
  out=$(taskset -c 1 wrk -t1 -c$CONNS -d"${DURATION}s" --timeout 30s -s "$dir/$v.lua" "http://127.0.0.1:${PORT[$v]}/v1/chat/completions")
  c1=$(cpu_ticks "${PID[$v]}")
  rps=$(awk '/Requests\/sec/ {print $2}' <<<"$out")
  errs=$(awk '/Non-2xx/ {print $5}' <<<"$out"); errs=${errs:-0}
  n=$(awk '/requests in/ {print $1}' <<<"$out")
  [[ $errs == 0 && $n -gt 0 ]] || { echo "bench-sizes: $v at $size bytes: $errs non-2xx of $n" >&2; exit 1; }
  awk -v r="$rps" -v t=$((c1 - c0)) -v n="$n" -v hz="$(getconf CLK_TCK)" 'BEGIN {printf "%s %.1f\n", r, t * 1e6 / hz / n}'
}
tput="| size | bare rps | route rps | hit rps | route/bare | hit/bare | Envoy CPU per request (us): bare / route / hit |
|---|---|---|---|---|---|---|"
for size in "${SIZES[@]}"; do
  [[ $TPUT == 1 ]] || break
  for v in "${VARIANTS[@]}"; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" -H 'content-type: application/json' -H "authorization: Bearer ${KEY[$v]}" --data-binary "@$dir/body-$size.json")
    [[ $code == 200 ]] || { echo "bench-sizes: $v answered $code at $size bytes" >&2; exit 1; }
  done
  curl -s -D - -o /dev/null "http://127.0.0.1:${PORT[hit]}/v1/chat/completions" -H 'content-type: application/json' \
    -H "authorization: Bearer ${KEY[hit]}" --data-binary "@$dir/body-$size.json" | grep -qi '^x-portcullis-cache: hit' \
    || { echo "bench-sizes: no cache hit at $size bytes" >&2; exit 1; }
  for v in "${VARIANTS[@]}"; do run_wrk "$v" "$size" >/dev/null; done
  rr=(); hr=(); declare -A rps=() cpu=()
  for r in $(seq 1 "$ROUNDS"); do
    for v in "${VARIANTS[@]}"; do read -r rps[$v] cpu[$v] < <(run_wrk "$v" "$size"); done
    rr+=("$(awk -v a="${rps[route]}" -v b="${rps[bare]}" 'BEGIN {printf "%.2f", a/b}')")
    hr+=("$(awk -v a="${rps[hit]}" -v b="${rps[bare]}" 'BEGIN {printf "%.2f", a/b}')")
  done
  tput+=$'\n'"| $(human "$size") | ${rps[bare]} | ${rps[route]} | ${rps[hit]} | $(median_of "${rr[@]}")x | $(median_of "${hr[@]}")x | ${cpu[bare]} / ${cpu[route]} / ${cpu[hit]} |"
  echo "bench-sizes: $(human "$size") throughput done" >&2
done
for v in "${VARIANTS[@]}"; do kill "${PID[$v]}"; wait "${PID[$v]}" 2>/dev/null || true; done

# ---------------------------------------------------------------- instructions
declare -A IPR
instr_n() { # size -> requests counted (fewer for big bodies: callgrind is slow)
  if (($1 >= 10485760)); then echo 6; elif (($1 >= 1048576)); then echo 30; elif (($1 >= 102400)); then echo 100; else echo 300; fi
}
if [[ $INSTR == 1 ]]; then
  for v in "${COUNTED[@]}"; do
    out="$dir/$v.callgrind"
    OPENAI_API_KEY=sk-bench BACKUP_API_KEY=sk-bench ANTHROPIC_API_KEY=sk-bench PORTCULLIS_SEAL_SECRET=bench-seal-secret-32-bytes-long valgrind --tool=callgrind --instr-atstart=no --smc-check=all-non-file \
      --callgrind-out-file="$out" "$ENVOY_REAL" -c "$dir/$v.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/$v-cg.log" 2>&1 &
    pid=$!
    wait_for "http://127.0.0.1:${ADMIN[$v]}/ready"
    # V8 tiers the module up under load: warm with small requests first.
    target/release/portcullis-load "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" 300 4 "${KEY[$v]}" >/dev/null
    k=0
    for size in "${SIZES[@]}"; do
      n=$(instr_n "$size")
      PORTCULLIS_LOAD_BYTES=$size target/release/portcullis-load "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" $((n / 2 + 2)) 2 "${KEY[$v]}" >/dev/null
      callgrind_control -i on $pid >/dev/null
      read -r got bad < <(PORTCULLIS_LOAD_BYTES=$size target/release/portcullis-load "http://127.0.0.1:${PORT[$v]}/v1/chat/completions" "$n" 2 "${KEY[$v]}")
      callgrind_control -i off $pid >/dev/null
      callgrind_control -d $pid >/dev/null
      k=$((k + 1))
      [[ $bad == 0 ]] || { echo "bench-sizes: $v at $size bytes: $bad of $got failed under callgrind" >&2; exit 1; }
      ir=$(awk '/^totals:/ {t += $2} /^summary:/ {s += $2} END {print (t > 0 ? t : s)}' "$out.$k")
      IPR[$v.$size]=$(awk -v ir="$ir" -v n="$got" 'BEGIN {printf "%.0f", ir / n}')
      echo "bench-sizes: $v $(human "$size"): ${IPR[$v.$size]} instructions per request" >&2
    done
    kill $pid; wait $pid 2>/dev/null || true
    [[ -z ${BENCH_SIZES_KEEP:-} ]] || cp "$out"* "$BENCH_SIZES_KEEP/"
  done
fi

mkdir -p .run
{
  echo "Request size against cost (#29), $(date -u +%F): chat requests padded with plain text; bare Envoy forwarding the same body; route = cache off, hit = every request a hit; no request log."
  echo
  echo "Throughput: $CONNS connections, ${DURATION}s per run, $ROUNDS alternating rounds per size, one worker; the last round's rps, ratios the median of the rounds."
  echo
  [[ $TPUT != 1 ]] || echo "$tput"
  if [[ $INSTR == 1 ]]; then
    echo
    echo "Instructions per request (callgrind, Envoy's whole process; N per size: $(for s in "${SIZES[@]}"; do printf '%s %s, ' "$(human "$s")" "$(instr_n "$s")"; done | sed 's/, $//')):"
    echo
    echo "| size |$(printf ' %s |' "${COUNTED[@]}")"
    echo "|---|$(printf -- '---|%.0s' "${COUNTED[@]}")"
    for size in "${SIZES[@]}"; do
      echo "| $(human "$size") |$(for v in "${COUNTED[@]}"; do printf ' %s |' "${IPR[$v.$size]}"; done)"
    done
    echo
    echo "Instructions per KB between sizes (the slope; linear when it stays flat):"
    echo
    echo "| from | to |$(printf ' %s per KB |' "${COUNTED[@]}")"
    echo "|---|---|$(printf -- '---|%.0s' "${COUNTED[@]}")"
    prev=
    for size in "${SIZES[@]}"; do
      if [[ -n $prev ]]; then
        kb=$(awk -v a="$size" -v b="$prev" 'BEGIN {print (a - b) / 1024}')
        row="| $(human "$prev") | $(human "$size") |"
        for v in "${COUNTED[@]}"; do
          row+=" $(awk -v a="${IPR[$v.$size]}" -v b="${IPR[$v.$prev]}" -v kb="$kb" 'BEGIN {printf "%.0f", (a - b) / kb}') |"
        done
        echo "$row"
      fi
      prev=$size
    done
  fi
} | tee .run/bench-sizes-latest.md
