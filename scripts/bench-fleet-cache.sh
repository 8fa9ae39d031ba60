#!/usr/bin/env bash
# make bench-fleet-cache (also run by make bench): the prompt cache's fleet
# tier (#50), in one run.
# 1. Throughput and latency at 32 connections (wrk --latency), each variant
#    its own Envoy pinned to core 0 with one worker; wrk, the mock, Redis
#    and the limiter share core 1. Alternating rounds; medians of the
#    per-round ratios to bare Envoy, as in bench.sh.
#      bare        envoy/bare.yaml: router only
#      route       the filter, cache off: the routed request path
#      miss        cache on, this Envoy's tier only, every prompt new
#      sharedmiss  cache on with the fleet's tier, every prompt new: the
#                  lookup in Redis, then the provider, then the store
#      hit         cache on, every request the same prompt: a local hit
#      sharedhit   cache on with the fleet's tier, a table of one entry and
#                  no worker copies, 2,000 prompts in turn, all stored in
#                  Redis beforehand: every request a hit-shared
#      nmiss, nsharedmiss, nhit, nsharedhit  the same on the native build
#                  (BENCH_NATIVE=0 leaves them out)
# 2. A 4-replica fleet (four Envoys, one worker each) replaying 6,000
#    requests, prompts drawn from a Zipf distribution (s = 1.1) over 3,000
#    prompts, round-robin over the replicas: the share answered from a
#    cache, with and without the fleet's tier.
# 3. The semantic tier's index (limiter/src/bin/semantic-bench.rs): a
#    Nearest over 100, 1,000 and 10,000 stored prompts of 1,536 dimensions.
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
DURATION="${BENCH_DURATION:-3}"
ROUNDS="${BENCH_ROUNDS:-6}"
CONNS=32
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
command -v wrk >/dev/null || (apt-get install -y -qq wrk >/dev/null 2>&1) || (apt-get update -qq && apt-get install -y -qq wrk >/dev/null)
cargo build --release -q -p portcullis-tests --bin portcullis-mock
cargo build --release -q -p portcullis-limiter --bins
dir=$(mktemp -d /tmp/portcullis-bench-fleet-cache.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 60)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench: $* not ready" >&2; exit 1; }; sleep 0.1; done; }
port_open() { local d=$((SECONDS + 30)); until (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; do ((SECONDS < d)) || { echo "bench: port $1 not open" >&2; exit 1; }; sleep 0.1; done; }

MOCK_PORT=18301; REDIS_PORT=18379; LIMITER_PORT=18381
taskset -c 1 target/release/portcullis-mock --port $MOCK_PORT --name bench --threads 1 --api-key sk-bench >"$dir/mock.log" 2>&1 & pids+=($!)
taskset -c 1 redis-server --port $REDIS_PORT --bind 127.0.0.1 --save '' --appendonly no --maxmemory 256mb --maxmemory-policy allkeys-lru >"$dir/redis.log" 2>&1 & pids+=($!)
echo bench-token >"$dir/limiter-token"
taskset -c 1 target/release/portcullis-limiter --listen 127.0.0.1:$LIMITER_PORT --redis redis://127.0.0.1:$REDIS_PORT --threads 1 --token-file "$dir/limiter-token" >"$dir/limiter.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK_PORT/__mock/hits
port_open $REDIS_PORT; port_open $LIMITER_PORT

# The shipped config without the tour's sections (no fleet tier), log off;
# the fleet's replicas keep the log section (no collector answers it) for
# the shipped tick of 250 ms, when stores leave for the fleet's tier.
with_log=$(scripts/bench-plugin.sh)
base=$(sed '/^log:/,/^[a-z]/{/^log:/d;/^  /d}' <<<"$with_log")
shared='  shared: {cluster: portcullis_ratelimit, timeout_ms: 200}'
plugin_for() {
  case $1 in
    route) sed 's/^  enabled: true/  enabled: false/' <<<"$base" ;;
    miss | hit) echo "$base" ;;
    sharedmiss | writer) sed "s/^  scope: shared.*/&\n$shared/" <<<"$base" ;;
    fleetshared*) sed "s/^  scope: shared.*/&\n$shared/" <<<"$with_log" ;;
    fleetlocal*) echo "$with_log" ;;
    # One slot (max_bytes = max_entry_bytes) and no worker copies: the
    # local tiers cannot keep the 2,000 prompts, the fleet's can.
    sharedhit) sed -e "s/^  scope: shared.*/&\n$shared\n  worker_bytes: 0/" -e 's/^  max_bytes: .*/  max_bytes: 65536/' <<<"$base" ;;
  esac
}
start() { # variant port admin [core]
  local v=$1 port=$2 admin=$3 build=wasm
  if [[ $v == n* ]]; then build=native; fi
  if [[ $v == bare ]]; then
    sed -e "s/port_value: 10001/port_value: $port/; s/port_value: 9902/port_value: $admin/; s/port_value: 18001/port_value: $MOCK_PORT/" envoy/bare.yaml >"$dir/$v.yaml"
  else
    plugin_for "${v#n}" >"$dir/plugin-$v.yaml"
    grep -q "shared:" "$dir/plugin-$v.yaml" || [[ $v != shared* && $v != writer && $v != fleetshared* ]] || { echo "bench: no fleet tier in $v" >&2; exit 1; }
    sed -e "s/port_value: 10000/port_value: $port/; s/port_value: 9901/port_value: $admin/; s/port_value: 18001/port_value: $MOCK_PORT/; s/port_value: 8081/port_value: $LIMITER_PORT/; s|\.run/ecds|$dir/ecds-$v|g" envoy/envoy.yaml >"$dir/$v.yaml"
    if [[ $build == native ]]; then
      PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-$v.yaml" "$dir/ecds-$v/portcullis.yaml"
    else
      envoy/render-ecds.sh "$dir/plugin-$v.yaml" "$dir/ecds-$v/portcullis.yaml" "$WASM"
    fi
  fi
  taskset -c "${4:-0}" env ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$PWD/target/native" OPENAI_API_KEY=sk-bench PORTCULLIS_LIMITER_TOKEN=bench-token "$ENVOY" -c "$dir/$v.yaml" --disable-hot-restart --concurrency 1 -l error >"$dir/$v.log" 2>&1 &
  pids+=($!)
  wait_for "http://127.0.0.1:$admin/ready"
}
ask() { # port content -> the cache header
  curl -s -D - -o /dev/null "http://127.0.0.1:$1/v1/chat/completions" -H 'content-type: application/json' \
    -H 'authorization: Bearer sk-portcullis-demo' \
    -d "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"$2\"}],\"max_tokens\":16}" |
    tr -d '\r' | sed -n 's/^x-portcullis-cache: //Ip'
}

VARIANTS=(bare route miss sharedmiss hit sharedhit)
if [[ ${BENCH_NATIVE:-1} == 1 ]]; then
  [[ -f target/native/libportcullis.so ]] || { echo "bench: no native build (make native)" >&2; exit 1; }
  VARIANTS+=(nmiss nsharedmiss nhit nsharedhit)
fi
declare -A PORT ADMIN
i=0
for v in "${VARIANTS[@]}" writer; do
  PORT[$v]=$((10301 + i)); ADMIN[$v]=$((9931 + i)); i=$((i + 1))
  start "$v" "${PORT[$v]}" "${ADMIN[$v]}"
done
# The 2,000 prompts the sharedhit variant cycles through, answered once by
# the writer replica and so stored in Redis.
python3 - "${PORT[writer]}" <<'PY'
import http.client, json, sys
c = http.client.HTTPConnection("127.0.0.1", int(sys.argv[1]))
for i in range(2000):
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"prompt {i}"}], "max_tokens": 16})
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", "authorization": "Bearer sk-portcullis-demo"})
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
PY
deadline=$((SECONDS + 30))
until (($(redis-cli -p $REDIS_PORT dbsize) >= 2000)); do ((SECONDS < deadline)) || { echo "bench: the writer's entries did not reach Redis" >&2; exit 1; }; sleep 0.2; done
for v in sharedhit nsharedhit; do
  [[ -z ${PORT[$v]:-} || $(ask "${PORT[$v]}" 'prompt 7') == hit-shared ]] || { echo "bench: $v is not a shared hit" >&2; exit 1; }
done
for v in hit nhit; do
  [[ -z ${PORT[$v]:-} ]] && continue
  [[ $(ask "${PORT[$v]}" 'the same prompt') == miss && $(ask "${PORT[$v]}" 'the same prompt') == hit ]] || { echo "bench: $v is not a hit" >&2; exit 1; }
done

for v in "${VARIANTS[@]}"; do
  case $v in
    miss | sharedmiss | nmiss | nsharedmiss) # every request a prompt never seen
      printf 'local n = 0\nrequest = function()\n  n = n + 1\n  return wrk.format("POST", "/v1/chat/completions", {["content-type"] = "application/json", ["authorization"] = "Bearer sk-portcullis-demo"}, string.format([[{"model":"gpt-4o-mini","messages":[{"role":"user","content":"new %%d %%d"}],"max_tokens":16}]], math.random(1, 1000000000), n))\nend\n' >"$dir/$v.lua" ;;
    sharedhit | nsharedhit)
      printf 'local n = 0\nrequest = function()\n  n = (n + 1) %% 2000\n  return wrk.format("POST", "/v1/chat/completions", {["content-type"] = "application/json", ["authorization"] = "Bearer sk-portcullis-demo"}, string.format([[{"model":"gpt-4o-mini","messages":[{"role":"user","content":"prompt %%d"}],"max_tokens":16}]], n))\nend\n' >"$dir/$v.lua" ;;
    *) # bare Envoy forwards the client's header: the mock's own key
      key=sk-portcullis-demo; [[ $v == bare ]] && key=sk-bench
      printf 'wrk.method = "POST"\nwrk.body = [[{"model":"gpt-4o-mini","messages":[{"role":"user","content":"the same prompt"}],"max_tokens":16}]]\nwrk.headers["content-type"] = "application/json"\nwrk.headers["authorization"] = "Bearer %s"\n' "$key" >"$dir/$v.lua" ;;
  esac
done

declare -A RPS P50 P99
for v in "${VARIANTS[@]}"; do RPS[$v]=""; P50[$v]=""; P99[$v]=""; done
ms() { awk '{v=$1; if (v ~ /us$/) {sub(/us$/,"",v); v/=1000} else if (v ~ /ms$/) {sub(/ms$/,"",v)} else if (v ~ /s$/) {sub(/s$/,"",v); v*=1000}; printf "%.2f", v}' <<<"$1"; }
for r in $(seq "$ROUNDS"); do
  for v in "${VARIANTS[@]}"; do
    out=$(taskset -c 1 wrk -t1 -c$CONNS -d"${DURATION}s" --latency -s "$dir/$v.lua" "http://127.0.0.1:${PORT[$v]}/v1/chat/completions")
    grep -q "Non-2xx" <<<"$out" && { echo "bench: $v answered non-2xx" >&2; echo "$out" >&2; exit 1; }
    RPS[$v]+="$(awk '/Requests\/sec/ {print $2}' <<<"$out") "
    P50[$v]+="$(ms "$(awk '$1=="50%" {print $2}' <<<"$out")") "
    P99[$v]+="$(ms "$(awk '$1=="99%" {print $2}' <<<"$out")") "
  done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
ratio() { # variant -> the median of per-round ratios to bare
  paste -d' ' <(tr ' ' '\n' <<<"${RPS[$1]}" | grep -v '^$') <(tr ' ' '\n' <<<"${RPS[bare]}" | grep -v '^$') |
    awk '{printf "%.3f ", $1 / $2}' | median
}
report="$dir/report.md"
{
  echo "| variant | req/s (median) | × bare | p50 ms | p99 ms |"
  echo "|---|---|---|---|---|"
  for v in "${VARIANTS[@]}"; do
    printf '| %s | %.0f | %s | %s | %s |\n' "$v" "$(median <<<"${RPS[$v]}")" "$(ratio "$v")" "$(median <<<"${P50[$v]}")" "$(median <<<"${P99[$v]}")"
  done
} >"$report"

# 2. The fleet's hit rate, with and without its tier: four replicas each.
redis-cli -p $REDIS_PORT flushall >/dev/null
for set in local shared; do
  for n in 1 2 3 4; do
    v="fleet$set$n"; PORT[$v]=$((10320 + n + (${#set} == 6 ? 10 : 0))); ADMIN[$v]=$((9950 + n + (${#set} == 6 ? 10 : 0)))
    start "$v" "${PORT[$v]}" "${ADMIN[$v]}" 1
  done
done
for set in local shared; do
  ports=""; for n in 1 2 3 4; do ports+="${PORT[fleet$set$n]} "; done
  python3 - "$set" $ports >>"$dir/fleet.txt" <<'PY'
import http.client, json, random, sys
kind, ports = sys.argv[1], [int(p) for p in sys.argv[2:]]
conns = [http.client.HTTPConnection("127.0.0.1", p) for p in ports]
rng = random.Random(50)
prompts, s = 3000, 1.1
weights = [1 / (k ** s) for k in range(1, prompts + 1)]
draws = rng.choices(range(prompts), weights=weights, k=6000)
seen, counts = set(), {}
for i, p in enumerate(draws):
    c = conns[i % len(conns)]
    body = json.dumps({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": f"zipf {p}"}], "max_tokens": 16})
    c.request("POST", "/v1/chat/completions", body, {"content-type": "application/json", "authorization": "Bearer sk-portcullis-demo"})
    r = c.getresponse(); r.read()
    assert r.status == 200, r.status
    t = r.getheader("x-portcullis-cache")
    counts[t] = counts.get(t, 0) + 1
    seen.add(p)
hits = sum(v for k, v in counts.items() if k.startswith("hit"))
best = len(draws) - len(seen)
print(f"| {kind} | {len(draws)} | {len(seen)} | {hits} ({100 * hits / len(draws):.1f}%) | {best} ({100 * best / len(draws):.1f}%) | {json.dumps(counts, sort_keys=True)} |")
PY
done
{
  echo
  echo "A 4-replica fleet replaying 6,000 requests (Zipf s = 1.1 over 3,000 prompts, round-robin):"
  echo
  echo "| tiers | requests | distinct prompts | answered from a cache | the most any cache could (repeats) | by tier |"
  echo "|---|---|---|---|---|---|"
  cat "$dir/fleet.txt"
} >>"$report"
# 3. The semantic tier's index alone, in the limiter's process.
cargo build --release -q -p portcullis-limiter --bin semantic-bench
{ echo; taskset -c 1 target/release/semantic-bench; } >>"$report"
cat "$report"
mkdir -p .run && cp "$report" .run/bench-fleet-cache.md
