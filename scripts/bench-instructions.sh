#!/usr/bin/env bash
# make bench-instructions (also in make bench): the stable measure beside
# requests per second. Envoy's instructions per request, counted by
# valgrind's callgrind: the same build, config and request give the same
# count whatever the neighbours do (perf counters are not available on
# these VMs). For each variant (bare Envoy, our routed path, our cache hit,
# the mechanism's two floors, and the native build's routed path, miss and
# hit and its two floors: nroute, nmiss, nhit, nfloor, nfloorhit; by name
# also the native twins of the translated variants: nanthropic, ngemini,
# nbedrock, nmessages_openai, nresponses_anthropic, nguard; and `prod` /
# `nprod`, a production-like config: key and team limits and budgets, the
# guard variant's checks, the log; and by name the endpoints of #48 on the
# routed config: images, speech, rerank, transcription (a 16 KB WAV) and
# transcription1m (1 MB), upload1m and upload10m (a batch file to
# POST /v1/files; run them with a small BENCH_INSTR_N), with their native
# twins; realtime, nrealtime and barerealtime: a Realtime session per
# connection, each request one event of 1 KB sent and the mock's two
# events of about 1 KB back; floorstream and nfloorstream their floors;
# floorshared, the routed floor with the 12 shared-data calls of limits at
# a key and its team (a read and a CAS per level at three steps);
# and by name the prompt cache's fleet tier (#50), through a real
# portcullis-limiter and Redis: sharedmiss (every prompt new: the lookup
# that finds nothing, the provider, the store) and sharedhit (a table of one
# slot, no worker copies, 300 prompts stored by the warm-up and asked again:
# every request a hit-shared), with nsharedmiss and nsharedhit; and by
# name the vendor guardrails (#63): vendor1, vendor3 and vendorkept, with
# nvendor1, nvendor3 and nvendorkept),
# Envoy (one worker) starts under
# callgrind with instrumentation off, takes WARM requests, then counts the
# instructions of exactly N requests (portcullis-load, 4 keep-alive
# connections); each variant runs twice, to show how repeatable it is.
# BENCH_WASM and BENCH_NATIVE_DIR name another build (an earlier commit's)
# to count it in the same sitting.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${BENCH_INSTR_N:-2000}"
WARM="${BENCH_INSTR_WARM:-300}"
RUNS="${BENCH_INSTR_RUNS:-2}"
WASM="${BENCH_WASM:-$PWD/target/wasm32-wasip1/release/portcullis_filter.wasm}"
# The native build's directory (another build's, to compare in one sitting).
NATIVE_DIR="${BENCH_NATIVE_DIR:-$PWD/target/native}"
ENVOY_REAL="${ENVOY_BIN:-$(find .venv/lib -path '*/envoy/_bin/envoy' -type f 2>/dev/null | head -1)}"
[[ -x $ENVOY_REAL ]] || { echo "bench-instructions: no Envoy binary (make envoy)" >&2; exit 1; }
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
cargo build --release -q -p portcullis-tests --bin portcullis-mock --bin portcullis-load
cargo build --release -q -p portcullis-collector --bin portcullis-collector
(cd bench/floor && cargo build --release -q --target wasm32-wasip1)
FLOOR_WASM="$PWD/bench/floor/target/wasm32-wasip1/release/portcullis_floor.wasm"
# The native floors (bench/floor-native), beside the native build.
(cd bench/floor-native && cargo build --release -q)
mkdir -p "$NATIVE_DIR"
cp bench/floor-native/target/release/libportcullis_floor.so "$NATIVE_DIR/"
dir=$(mktemp -d /tmp/portcullis-instr.XXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
wait_for() { local d=$((SECONDS + 300)); until curl -fsS -o /dev/null "$@" 2>/dev/null; do ((SECONDS < d)) || { echo "bench-instructions: $* not ready" >&2; exit 1; }; sleep 0.2; done; }

MOCK=18401; MOCK_OPEN=18402; COLLECTOR=18451; PORT=10401; ADMIN=9941
target/release/portcullis-mock --port $MOCK --name bench --api-key sk-bench \
  --aws-access-key-id AKIDBENCH --aws-secret-access-key bench/secret --aws-region us-east-1 >"$dir/mock.log" 2>&1 & pids+=($!)
target/release/portcullis-collector --grpc 127.0.0.1:$COLLECTOR --http 127.0.0.1:18452 --db "$dir/log.db" >"$dir/collector.log" 2>&1 & pids+=($!)
# Envoy's mcp_router forwards no header to its servers (docs/mcp-gateway.md),
# so its servers are a mock that takes no credential.
target/release/portcullis-mock --port $MOCK_OPEN --name open >"$dir/mock-open.log" 2>&1 & pids+=($!)
# The fleet cache tier's variants: Redis and the limiter (with its token).
REDIS=18479; LIMITER=18481
cargo build --release -q -p portcullis-limiter --bin portcullis-limiter
redis-server --port $REDIS --bind 127.0.0.1 --save '' --appendonly no >"$dir/redis.log" 2>&1 & pids+=($!)
echo bench-token >"$dir/limiter-token"
target/release/portcullis-limiter --listen 127.0.0.1:$LIMITER --redis redis://127.0.0.1:$REDIS --token-file "$dir/limiter-token" >"$dir/limiter.log" 2>&1 & pids+=($!)
wait_for http://127.0.0.1:$MOCK/__mock/hits
wait_for http://127.0.0.1:$MOCK_OPEN/__mock/hits
wait_for http://127.0.0.1:18452/healthz

sed -e "s/port_value: 10001/port_value: $PORT/; s/port_value: 9902/port_value: $ADMIN/; s/port_value: 18001/port_value: $MOCK/" envoy/bare.yaml >"$dir/bare.yaml"
# Both providers' clusters reach the mock (a strategy may pick the backup).
sed -e "s/port_value: 10000/port_value: $PORT/; s/port_value: 9901/port_value: $ADMIN/; s/port_value: 18001/port_value: $MOCK/; s/port_value: 18002/port_value: $MOCK/; s/port_value: 18011/port_value: $MOCK/; s/port_value: 18012/port_value: $MOCK/; s/port_value: 50051/port_value: $COLLECTOR/; s/port_value: 8081/port_value: $LIMITER/; s|\.run/ecds|$dir/ecds|g" envoy/envoy.yaml >"$dir/filter.yaml"
scripts/bench-plugin.sh >"$dir/shipped.yaml"   # the shipped config without the tour's sections
sed 's/^  enabled: true/  enabled: false/' "$dir/shipped.yaml" >"$dir/plugin-route.yaml"
cp "$dir/shipped.yaml" "$dir/plugin-hit.yaml"
# The routed path with the cache on and every request a new prompt: a miss
# (key, lookup) and a store each.
cp "$dir/shipped.yaml" "$dir/plugin-miss.yaml"
echo route >"$dir/plugin-floor.yaml"; echo answer >"$dir/plugin-floorhit.yaml"
# The floor of a session whose every byte a filter sees (floorstream,
# nfloorstream): route at the headers, read each body chunk both ways.
echo stream >"$dir/plugin-floorstream.yaml"
# The floor of limits counted exactly across workers (#49): floor, and a
# read and a CAS write of two 119-byte shared-data values at the headers,
# the body and the answer's end (12 calls, as prod's key and team make).
echo shared >"$dir/plugin-floorshared.yaml"
# The fleet's tier (#50): the shipped config with `cache.shared`; for
# sharedhit, a table of one slot and no worker copies, so every request of
# the 300 prompts is a local miss and a hit in the fleet's tier.
shared='  shared: {cluster: portcullis_ratelimit, timeout_ms: 200}'
sed "s/^  scope: shared.*/&\n$shared/" "$dir/shipped.yaml" >"$dir/plugin-sharedmiss.yaml"
sed -e "s/^  scope: shared.*/&\n$shared\n  worker_bytes: 0/" -e 's/^  max_bytes: .*/  max_bytes: 65536/' "$dir/shipped.yaml" >"$dir/plugin-sharedhit.yaml"
grep -q "^  shared:" "$dir/plugin-sharedhit.yaml" || { echo "bench-instructions: no cache section to share" >&2; exit 1; }
# The routed path with five input checks and one output check (#18).
scripts/bench-prod-plugin.sh guard "$dir/plugin-route.yaml" >"$dir/plugin-guard.yaml"
# The routed path to a provider speaking Anthropic's Messages API: the
# request and the answer translated (#17); the mock answers it too.
# (The embedding model keeps no `apis: [embeddings]`: an Anthropic provider
# cannot serve embeddings, and listing it is a config error.)
awk '/^ +apis: \[embeddings\]/ {next} {print} /^  - name: primary$/ {print "    schema: anthropic"}' "$dir/plugin-route.yaml" >"$dir/plugin-anthropic.yaml"
grep -q "schema: anthropic" "$dir/plugin-anthropic.yaml" || { echo "bench-instructions: no primary provider to make Anthropic" >&2; exit 1; }
# The routed path to a provider speaking Google's Gemini API (#26): the
# request and the answer translated; the mock's Gemini mode answers it.
awk '/^ +apis: \[embeddings\]/ {next} /^  - name: primary$/ {p=1} p && /^    base_path: \/v1$/ {print "    base_path: /v1beta"; print "    schema: gemini"; p=0; next} {print}' "$dir/plugin-route.yaml" >"$dir/plugin-gemini.yaml"
grep -q "schema: gemini" "$dir/plugin-gemini.yaml" || { echo "bench-instructions: no primary provider to make Gemini" >&2; exit 1; }
# The routed path to AWS Bedrock's Converse (#26): translated both ways and
# signed (SigV4 over the final body); the mock's Bedrock mode checks each
# signature.
awk '/^ +apis: \[embeddings\]/ {next} /^  - name: primary$/ {p=1} p && /^    models:/ {p=0} p && /^    api_key_env:/ {next} p && /^    base_path: \/v1$/ {print "    base_path: \"\""; print "    schema: bedrock"; print "    region: us-east-1"; next} {print}' "$dir/plugin-route.yaml" >"$dir/plugin-bedrock.yaml"
grep -q "schema: bedrock" "$dir/plugin-bedrock.yaml" || { echo "bench-instructions: no primary provider to make Bedrock" >&2; exit 1; }
# The routed path with the whole answer held (an output check that never
# matches): what every whole-answer translation pays for Envoy buffering the
# answer and the body being replaced, before any translation (#24).
cat "$dir/plugin-route.yaml" - >"$dir/plugin-held.yaml" <<'YAML'
guardrails:
  output:
    - {name: never, regex: 'zq-never-matches-qz', action: redact}
YAML
# The routed path under each routing strategy (#14), against weighted
# (the route variant). Both providers are the one mock; `fastest` explores
# nothing here, so every variant routes the same way but for its strategy.
for st in cheapest fastest least_busy; do
  awk -v st="$st" '{print} /^  chain: / {print "  strategy: " st; if (st == "fastest") print "  fastest: {explore: 0}"}' \
    "$dir/plugin-route.yaml" >"$dir/plugin-$st.yaml"
  grep -q "strategy: $st" "$dir/plugin-$st.yaml" || { echo "bench-instructions: no routing chain to add a strategy to" >&2; exit 1; }
done
# Without the request log (what the log costs), on request.
for v in route hit; do
  awk '/^log:/ {skip=1; next} skip && /^[^ ]/ {skip=0} !skip' "$dir/plugin-$v.yaml" >"$dir/plugin-${v}nolog.yaml"
done

# The routed path (without the log) with 10 and with 10,000 client keys
# (#30): what a fleet-sized key table costs a request.
for n in 10 10000; do
  python3 - "$n" "$dir/plugin-routenolog.yaml" >"$dir/plugin-keys$n.yaml" <<'PY'
import hashlib, sys
n, text = int(sys.argv[1]), open(sys.argv[2]).read()
extra = "".join("  - name: bench-%d\n    key_sha256: %s\n" % (i, hashlib.sha256(b"sk-bench-%d" % i).hexdigest()) for i in range(n - 2))
sys.stdout.write(text.replace("clients:\n", "clients:\n" + extra, 1))
PY
done

# Limits at the key's level only, and at the key's and its team's (#27):
# requests, tokens, concurrency and two budgets each, far above what the run
# reaches, so every request is admitted and counted at every level.
for v in keylimits teamlimits; do
  scripts/bench-prod-plugin.sh $v "$dir/plugin-route.yaml" >"$dir/plugin-$v.yaml"
done
# The same without the request log, whose timer-driven flushes make the
# counts vary between sittings (compare with routenolog).
for v in keylimits teamlimits; do
  awk '/^log:/ {skip=1; next} skip && /^[^ ]/ {skip=0} !skip' "$dir/plugin-$v.yaml" >"$dir/plugin-${v}nolog.yaml"
done

# A production-like config (#49): the key's and its team's limits and
# budgets (teamlimits), the guard variant's five input checks and one
# output check, the request log on.
# (scripts/bench-prod-plugin.sh, which make bench uses too.)
scripts/bench-prod-plugin.sh prod "$dir/plugin-route.yaml" >"$dir/plugin-prod.yaml"

# Vendor guardrails (#63): one vendor check (Lakera Guard's API) and three
# (Lakera, Azure AI Content Safety, Bedrock Guardrails signed with SigV4),
# the mock's fakes answering at once, each asked on every request
# (vendor_verdict_ttl_s: 0), and the three with each message's verdict kept
# (vendorkept: after the warm-up no vendor is called).
vendor_checks() { # ttl checks...
  printf 'guardrails:\n  vendor_verdict_ttl_s: %s\n  input:\n' "$1"; shift
  for c in "$@"; do
    case $c in
      lakera) echo "    - {name: lakera, vendor: {kind: lakera_guard, cluster: primary, api_key_env: OPENAI_API_KEY}}" ;;
      azure) echo "    - {name: azure, vendor: {kind: azure_content_safety, cluster: primary, api_key_env: OPENAI_API_KEY}}" ;;
      bedrock) echo "    - {name: aws, vendor: {kind: bedrock_guardrails, cluster: primary, guardrail_id: gr1, guardrail_version: '1', region: us-east-1}}" ;;
    esac
  done
}
{ cat "$dir/plugin-route.yaml"; vendor_checks 0 lakera; } >"$dir/plugin-vendor1.yaml"
{ cat "$dir/plugin-route.yaml"; vendor_checks 0 lakera azure bedrock; } >"$dir/plugin-vendor3.yaml"
{ cat "$dir/plugin-route.yaml"; vendor_checks 600 lakera azure bedrock; } >"$dir/plugin-vendorkept.yaml"

# Trace context (#31): the routed path (with the log) when the client sends
# a `traceparent` (traced: continued, a child per attempt upstream, ids in
# the record), and when none comes and the gateway starts one for every
# request (tracestart: `tracing.sample_rate: 1`); against `route`.
cp "$dir/plugin-route.yaml" "$dir/plugin-traced.yaml"
cat "$dir/plugin-route.yaml" - >"$dir/plugin-tracestart.yaml" <<'YAML'
tracing:
  sample_rate: 1.0
YAML

# Other inbound APIs (#24): Responses passed through to the OpenAI-shaped
# mock and translated twice for an Anthropic-shaped one; Messages through
# the pivot to the OpenAI-shaped mock and direct to an Anthropic-shaped one.
cp "$dir/plugin-route.yaml" "$dir/plugin-responses.yaml"
cp "$dir/plugin-anthropic.yaml" "$dir/plugin-responses_anthropic.yaml"
cp "$dir/plugin-route.yaml" "$dir/plugin-messages_openai.yaml"
cp "$dir/plugin-anthropic.yaml" "$dir/plugin-messages.yaml"

# MCP (#47): a tools/call of one server's tool (mcp: /mcp/tools), a
# tools/list over three servers (mcplist: /mcp, fanned out by callouts),
# the mock's MCP mode behind each; against the same through bare Envoy
# (baremcp: routed straight to the mock) and through Envoy's own MCP
# filters alone (envoymcp, envoymcplist: mcp + mcp_router, three servers).
# Each server takes a credential, as in production (the mock's key).
cat "$dir/plugin-route.yaml" - >"$dir/plugin-mcp.yaml" <<'YAML'
mcp:
  servers:
    - {name: tools, cluster: mcp_tools, credential: {header: authorization, env: OPENAI_API_KEY, prefix: "Bearer "}}
    - {name: notes, cluster: mcp_notes, credential: {header: authorization, env: OPENAI_API_KEY, prefix: "Bearer "}}
    - {name: third, cluster: primary, credential: {header: authorization, env: OPENAI_API_KEY, prefix: "Bearer "}}
YAML
cp "$dir/plugin-mcp.yaml" "$dir/plugin-mcplist.yaml"
mcp_cluster() { echo "  - {name: $1, type: STATIC, connect_timeout: 2s, load_assignment: {cluster_name: $1, endpoints: [{lb_endpoints: [{endpoint: {address: {socket_address: {address: 127.0.0.1, port_value: $MOCK_OPEN}}}}]}]}}"; }
cat >"$dir/envoymcp.yaml" <<YAML
admin: {address: {socket_address: {address: 127.0.0.1, port_value: $ADMIN}}}
static_resources:
  listeners:
  - name: mcp
    address: {socket_address: {address: 127.0.0.1, port_value: $PORT}}
    filter_chains:
    - filters:
      - name: envoy.filters.network.http_connection_manager
        typed_config:
          "@type": type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager
          stat_prefix: mcp
          route_config: {name: r, virtual_hosts: [{name: v, domains: ["*"], routes: [{match: {prefix: /}, route: {cluster: tools, timeout: 0s}}]}]}
          http_filters:
          - name: envoy.filters.http.mcp
            typed_config: {"@type": type.googleapis.com/envoy.extensions.filters.http.mcp.v3.Mcp}
          - name: envoy.filters.http.mcp_router
            typed_config:
              "@type": type.googleapis.com/envoy.extensions.filters.http.mcp_router.v3.McpRouter
              servers:
              - {name: tools, mcp_cluster: {cluster: tools, path: /mcp}}
              - {name: notes, mcp_cluster: {cluster: notes, path: /mcp}}
              - {name: third, mcp_cluster: {cluster: third, path: /mcp}}
  clusters:
$(mcp_cluster tools)
$(mcp_cluster notes)
$(mcp_cluster third)
YAML
# A session at the MCP endpoint under test, for the load's requests.
mcp_session() { # url key
  curl -s -D - -o /dev/null "$1" -H "authorization: Bearer $2" -H 'content-type: application/json' \
    -H 'accept: application/json, text/event-stream' \
    -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}' |
    tr -d '\r' | sed -n 's/^mcp-session-id: //Ip'
}

measure() { # variant -> instructions per request
  local v=$1 cfg=filter.yaml key=sk-portcullis-demo out unique=0 path=/v1/chat/completions api=chat tp=
  [[ $v != miss && $v != nmiss && $v != sharedmiss && $v != nsharedmiss ]] || unique=1
  local cycle=
  [[ $v != sharedhit && $v != nsharedhit ]] || cycle=$WARM
  [[ $v != *shared* ]] || redis-cli -p $REDIS flushall >/dev/null
  [[ $v != traced && $v != baretraced ]] || tp=00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
  local tool=echo
  case $v in
    responses|responses_anthropic|nresponses_anthropic) path=/v1/responses; api=responses ;;
    messages|messages_openai|nmessages_openai) path=/v1/messages; api=messages ;;
    mcp|nmcp) path=/mcp/tools; api=mcp ;;
    mcplist|nmcplist) path=/mcp; api=mcp_list ;;
    baremcp) path=/mcp; api=mcp ;;
    envoymcp) path=/mcp; api=mcp; tool=tools__echo ;;
    envoymcplist) path=/mcp; api=mcp_list ;;
    images|nimages) path=/v1/images/generations; api=images ;;
    speech|nspeech) path=/v1/audio/speech; api=speech ;;
    rerank|nrerank) path=/v1/rerank; api=rerank ;;
    transcription|ntranscription) path=/v1/audio/transcriptions; api=transcription; export PORTCULLIS_LOAD_BYTES=16000 ;;
    transcription1m|ntranscription1m) path=/v1/audio/transcriptions; api=transcription; export PORTCULLIS_LOAD_BYTES=1000000 ;;
    upload1m|nupload1m) path=/v1/files; api=upload; export PORTCULLIS_LOAD_BYTES=1000000 ;;
    upload10m|nupload10m) path=/v1/files; api=upload; export PORTCULLIS_LOAD_BYTES=10000000 ;;
    realtime|nrealtime|barerealtime|floorstream|nfloorstream) path='/v1/realtime?model=gpt-4o-mini'; api=realtime; export PORTCULLIS_LOAD_BYTES=1000 ;;
    *) unset PORTCULLIS_LOAD_BYTES ;;
  esac
  case $v in
    bare|baretraced|baremcp|barerealtime) cfg=bare.yaml; key=sk-bench ;;
    envoymcp|envoymcplist) cfg=envoymcp.yaml; key=sk-bench ;;
    images|speech|rerank|transcription|transcription1m|upload1m|upload10m|realtime) envoy/render-ecds.sh "$dir/plugin-route.yaml" "$dir/ecds/portcullis.yaml" "$WASM" ;;
    nimages|nspeech|nrerank|ntranscription|ntranscription1m|nupload1m|nupload10m|nrealtime) PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-route.yaml" "$dir/ecds/portcullis.yaml" ;;
    route|hit|miss|guard|held|anthropic|gemini|bedrock|cheapest|fastest|least_busy|routenolog|hitnolog|responses|responses_anthropic|messages|messages_openai|keylimits|teamlimits|keylimitsnolog|teamlimitsnolog|keys10|keys10000|traced|tracestart|prod|mcp|mcplist|sharedmiss|sharedhit|vendor1|vendor3|vendorkept) envoy/render-ecds.sh "$dir/plugin-$v.yaml" "$dir/ecds/portcullis.yaml" "$WASM" ;;
    floor|floorhit|floorstream|floorshared) envoy/render-ecds.sh "$dir/plugin-$v.yaml" "$dir/ecds/portcullis.yaml" "$FLOOR_WASM" ;;
    # The native build (make native) on the same configs.
    nroute|nhit|nmiss|nanthropic|ngemini|nbedrock|nmessages_openai|nresponses_anthropic|nguard|nprod|nmcp|nmcplist|nsharedmiss|nsharedhit|nvendor1|nvendor3|nvendorkept) PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-${v#n}.yaml" "$dir/ecds/portcullis.yaml" ;;
    nfloor|nfloorhit|nfloorstream) PORTCULLIS_BUILD=native envoy/render-ecds.sh "$dir/plugin-${v#n}.yaml" "$dir/ecds/portcullis.yaml.tmp"
      sed 's/{name: portcullis,/{name: portcullis_floor,/' "$dir/ecds/portcullis.yaml.tmp" >"$dir/ecds/.floor" && mv "$dir/ecds/.floor" "$dir/ecds/portcullis.yaml" ;;
    # An unknown name would measure the config of the variant before it.
    *) echo "bench-instructions: unknown variant $v" >&2; exit 1 ;;
  esac
  out="$dir/$v.callgrind"
  rm -f "$out"*
  ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$NATIVE_DIR" PORTCULLIS_LIMITER_TOKEN=bench-token PORTCULLIS_SEAL_SECRET=bench-seal-secret-32-bytes-long OPENAI_API_KEY=sk-bench BACKUP_API_KEY=sk-bench AWS_ACCESS_KEY_ID=AKIDBENCH AWS_SECRET_ACCESS_KEY=bench/secret valgrind --tool=callgrind --instr-atstart=no --smc-check=all-non-file \
    --callgrind-out-file="$out" "$ENVOY_REAL" -c "$dir/$cfg" --disable-hot-restart --concurrency 1 -l error \
    >"$dir/$v.log" 2>&1 &
  local pid=$!
  wait_for "http://127.0.0.1:$ADMIN/ready"
  local session=
  if [[ $api == mcp* ]]; then
    local d=$((SECONDS + 300))
    until session=$(mcp_session "http://127.0.0.1:$PORT$path" "$key") && [[ -n $session ]]; do
      ((SECONDS < d)) || { echo "bench-instructions: $v: no MCP session" >&2; kill $pid; exit 1; }
      sleep 0.2
    done
  fi
  export PORTCULLIS_LOAD_MCP_SESSION=$session PORTCULLIS_LOAD_MCP_TOOL=$tool
  PORTCULLIS_LOAD_CYCLE=$cycle PORTCULLIS_LOAD_TRACEPARENT=$tp PORTCULLIS_LOAD_API=$api PORTCULLIS_LOAD_UNIQUE=$unique target/release/portcullis-load "http://127.0.0.1:$PORT$path" "$WARM" 4 "$key" >/dev/null
  if [[ -n $cycle ]]; then
    # Every prompt of the cycle stored in the fleet's tier before the count.
    local d=$((SECONDS + 120))
    until (($(redis-cli -p $REDIS dbsize) >= cycle)); do
      ((SECONDS < d)) || { echo "bench-instructions: $v: the warm-up's entries did not reach Redis" >&2; kill $pid; exit 1; }
      sleep 0.2
    done
  fi
  callgrind_control -i on $pid >/dev/null
  read -r n bad < <(PORTCULLIS_LOAD_CYCLE=$cycle PORTCULLIS_LOAD_TRACEPARENT=$tp PORTCULLIS_LOAD_API=$api PORTCULLIS_LOAD_UNIQUE=$unique target/release/portcullis-load "http://127.0.0.1:$PORT$path" "$N" 4 "$key")
  callgrind_control -i off $pid >/dev/null
  if [[ -n $cycle ]]; then
    # The count is of shared hits: the tier answered (nearly) every one.
    local d=$((SECONDS + 30)) hits=0
    while ((SECONDS < d)); do
      hits=$(curl -s "http://127.0.0.1:$ADMIN/stats" | sed -n 's/.*cache\.shared_hits: //p' | head -1)
      ((${hits:-0} * 100 >= n * 95)) && break
      sleep 0.5
    done
    ((${hits:-0} * 100 >= n * 95)) || { echo "bench-instructions: $v: only ${hits:-0} of $n requests were shared hits" >&2; kill $pid; exit 1; }
  fi
  callgrind_control -d $pid >/dev/null
  kill $pid; wait $pid 2>/dev/null || true
  [[ -z ${BENCH_INSTR_KEEP:-} ]] || cp "$out"* "$BENCH_INSTR_KEEP/"
  [[ $bad == 0 ]] || { echo "bench-instructions: $v: $bad of $n requests failed" >&2; exit 1; }
  # The dump holds the instrumented part only.
  local ir
  ir=$(awk '/^totals:/ {t += $2} /^summary:/ {s += $2} END {print (t > 0 ? t : s)}' "$out"*)
  awk -v ir="$ir" -v n="$n" 'BEGIN {printf "%.0f", ir / n}'
}

declare -A IPR
table="| variant | instructions per request, run 1 | run 2 | spread |
|---|---|---|---|"
for v in ${BENCH_INSTR_VARIANTS:-bare route miss hit guard anthropic cheapest fastest least_busy floor floorhit nroute nmiss nhit nfloor nfloorhit}; do
  runs=()
  for r in $(seq 1 "$RUNS"); do runs+=("$(measure $v)"); done
  IPR[$v]=${runs[0]}
  spread=$(printf '%s\n' "${runs[@]}" | awk 'NR==1 {lo=$1; hi=$1} {if ($1<lo) lo=$1; if ($1>hi) hi=$1} END {printf "%.2f%%", (hi-lo)*100/lo}')
  table+=$'\n'"| $v | ${runs[0]} | ${runs[1]:-} | $spread |"
done
ratio() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.2f", a / b}'; }
mkdir -p .run
{
  echo "instructions per request of the Envoy process (callgrind; $N requests after $WARM, 4 connections, one worker; $(date -u +%F))"
  echo
  echo "$table"
  echo
  [[ -z ${IPR[bare]:-} || -z ${IPR[route]:-} || -z ${IPR[hit]:-} || -z ${IPR[floor]:-} || -z ${IPR[floorhit]:-} ]] || echo "Ratios by instructions (bare / variant: >1 is cheaper than bare): route $(ratio "${IPR[bare]}" "${IPR[route]}")x, hit $(ratio "${IPR[bare]}" "${IPR[hit]}")x, routed floor $(ratio "${IPR[bare]}" "${IPR[floor]}")x, local-answer floor $(ratio "${IPR[bare]}" "${IPR[floorhit]}")x"
  [[ -z ${IPR[miss]:-} || -z ${IPR[route]:-} ]] || echo "A cache miss (key, lookup, store) against the routed path with the cache off: route/miss $(ratio "${IPR[route]}" "${IPR[miss]}")x ($((IPR[miss] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[guard]:-} || -z ${IPR[route]:-} ]] || echo "Guardrails (five input checks, one output check) against the same routed path without: route/guard $(ratio "${IPR[route]}" "${IPR[guard]}")x ($((IPR[guard] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[anthropic]:-} || -z ${IPR[route]:-} ]] || echo "An Anthropic-backed routed request (translated both ways) against an OpenAI-backed one: route/anthropic $(ratio "${IPR[route]}" "${IPR[anthropic]}")x ($((IPR[anthropic] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[gemini]:-} || -z ${IPR[route]:-} ]] || echo "A Gemini-backed routed request (translated both ways) against an OpenAI-backed one: route/gemini $(ratio "${IPR[route]}" "${IPR[gemini]}")x ($((IPR[gemini] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[bedrock]:-} || -z ${IPR[route]:-} ]] || echo "A Bedrock-backed routed request (translated both ways, SigV4-signed) against an OpenAI-backed one: route/bedrock $(ratio "${IPR[route]}" "${IPR[bedrock]}")x ($((IPR[bedrock] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[keylimits]:-} || -z ${IPR[route]:-} ]] || echo "A key's limits (requests, tokens, concurrency, two budgets) on the routed path: $((IPR[keylimits] - IPR[route])) instructions per request more than none"
  [[ -z ${IPR[keylimitsnolog]:-} || -z ${IPR[routenolog]:-} || -z ${IPR[teamlimitsnolog]:-} ]] || echo "Without the request log: a key's limits $((IPR[keylimitsnolog] - IPR[routenolog])), the team's too $((IPR[teamlimitsnolog] - IPR[keylimitsnolog])) more instructions per request"
  [[ -z ${IPR[keys10]:-} || -z ${IPR[keys10000]:-} ]] || echo "10,000 client keys against 10 (routed, no log): keys10/keys10000 $(ratio "${IPR[keys10]}" "${IPR[keys10000]}")x ($((IPR[keys10000] - IPR[keys10])) instructions per request more)"
  [[ -z ${IPR[traced]:-} || -z ${IPR[route]:-} ]] || echo "A client's traceparent continued (a child span per attempt upstream, ids in the record) against none: route/traced $(ratio "${IPR[route]}" "${IPR[traced]}")x ($((IPR[traced] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[baretraced]:-} || -z ${IPR[bare]:-} ]] || echo "Bare Envoy carrying the same traceparent (Envoy's share of the traced variant): $((IPR[baretraced] - IPR[bare])) instructions per request more"
  [[ -z ${IPR[tracestart]:-} || -z ${IPR[route]:-} ]] || echo "A trace started for every request without one (tracing.sample_rate 1) against none: route/tracestart $(ratio "${IPR[route]}" "${IPR[tracestart]}")x ($((IPR[tracestart] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[teamlimits]:-} || -z ${IPR[keylimits]:-} ]] || echo "The same limits at the team's level too: $((IPR[teamlimits] - IPR[keylimits])) instructions per request more than the key's alone (keylimits/teamlimits $(ratio "${IPR[keylimits]}" "${IPR[teamlimits]}")x)"
  [[ -z ${IPR[held]:-} || -z ${IPR[route]:-} ]] || echo "The whole answer held (an output check that never matches) against the routed path: route/held $(ratio "${IPR[route]}" "${IPR[held]}")x ($((IPR[held] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[held]:-} || -z ${IPR[anthropic]:-} ]] || echo "An Anthropic-backed request against the held routed path (the translation itself): held/anthropic $(ratio "${IPR[held]}" "${IPR[anthropic]}")x ($((IPR[anthropic] - IPR[held])) instructions per request more)"
  [[ -z ${IPR[responses]:-} || -z ${IPR[route]:-} ]] || echo "A Responses request passed through against a chat request: route/responses $(ratio "${IPR[route]}" "${IPR[responses]}")x ($((IPR[responses] - IPR[route])) instructions per request more)"
  [[ -z ${IPR[responses_anthropic]:-} || -z ${IPR[responses]:-} ]] || echo "A Responses request translated twice (to an Anthropic-backed model) against one passed through: responses/responses_anthropic $(ratio "${IPR[responses]}" "${IPR[responses_anthropic]}")x ($((IPR[responses_anthropic] - IPR[responses])) instructions per request more)"
  [[ -z ${IPR[messages_openai]:-} || -z ${IPR[messages]:-} ]] || echo "A Messages request through the pivot (OpenAI-backed) against one sent direct (Anthropic-backed): messages/messages_openai $(ratio "${IPR[messages]}" "${IPR[messages_openai]}")x ($((IPR[messages_openai] - IPR[messages])) instructions per request more)"
  for st in cheapest fastest least_busy; do
    [[ -z ${IPR[$st]:-} || -z ${IPR[route]:-} ]] || echo "Strategy $st against weighted: route/$st $(ratio "${IPR[route]}" "${IPR[$st]}")x ($((IPR[$st] - IPR[route])) instructions per request more)"
  done
  for rt in realtime nrealtime; do
    [[ -z ${IPR[$rt]:-} || -z ${IPR[barerealtime]:-} ]] || echo "A Realtime turn ($rt: 1 KB sent, two events of about 1 KB back) against bare Envoy's: $((IPR[$rt] - IPR[barerealtime])) instructions more ($(ratio "${IPR[$rt]}" "${IPR[barerealtime]}")x), $(((IPR[$rt] - IPR[barerealtime]) / 3)) per 1 KB event passed"
  done
  [[ -z ${IPR[realtime]:-} || -z ${IPR[floorstream]:-} ]] || echo "A Realtime turn against the stream floor (every chunk read, nothing done): realtime $((IPR[realtime] - IPR[floorstream])) above floorstream (floorstream $((IPR[floorstream] - ${IPR[barerealtime]:-0})) above bare)"
  [[ -z ${IPR[nrealtime]:-} || -z ${IPR[nfloorstream]:-} ]] || echo "Native: nrealtime $((IPR[nrealtime] - IPR[nfloorstream])) above nfloorstream (nfloorstream $((IPR[nfloorstream] - ${IPR[barerealtime]:-0})) above bare)"
  [[ -z ${IPR[floor]:-} || -z ${IPR[route]:-} || -z ${IPR[hit]:-} || -z ${IPR[floorhit]:-} ]] || echo "Ours against the floors: route/floor $(ratio "${IPR[floor]}" "${IPR[route]}")x, hit/floorhit $(ratio "${IPR[floorhit]}" "${IPR[hit]}")x; instructions of ours above the floor: route $((IPR[route] - IPR[floor])), hit $((IPR[hit] - IPR[floorhit]))"
  [[ -z ${IPR[floor]:-} || -z ${IPR[floorshared]:-} ]] || echo "Limits' shared-data calls through the proxy-wasm ABI, nothing else: floorshared $((IPR[floorshared] - IPR[floor])) above floor ($(((IPR[floorshared] - IPR[floor]) / 12)) per call)"
  [[ -z ${IPR[floor]:-} || -z ${IPR[miss]:-} ]] || echo "A cache miss against the routed floor: miss/floor $(ratio "${IPR[floor]}" "${IPR[miss]}")x"
  [[ -z ${IPR[bare]:-} || -z ${IPR[nroute]:-} || -z ${IPR[nhit]:-} ]] || echo "The native build (dynamic module), instructions as a multiple of bare Envoy's: routed $(ratio "${IPR[nroute]}" "${IPR[bare]}")x, cache hit $(ratio "${IPR[nhit]}" "${IPR[bare]}")x (bare / variant: routed $(ratio "${IPR[bare]}" "${IPR[nroute]}")x, hit $(ratio "${IPR[bare]}" "${IPR[nhit]}")x)"
  [[ -z ${IPR[bare]:-} || -z ${IPR[nfloor]:-} || -z ${IPR[nfloorhit]:-} || -z ${IPR[nroute]:-} || -z ${IPR[nhit]:-} ]] || echo "The native floors (bench/floor-native) as a multiple of bare Envoy's instructions: routed $(ratio "${IPR[nfloor]}" "${IPR[bare]}")x, local answer $(ratio "${IPR[nfloorhit]}" "${IPR[bare]}")x; ours above them: nroute $((IPR[nroute] - IPR[nfloor])), nhit $((IPR[nhit] - IPR[nfloorhit]))"
  [[ -z ${IPR[route]:-} || -z ${IPR[nroute]:-} || -z ${IPR[hit]:-} || -z ${IPR[nhit]:-} ]] || echo "Native against Wasm, same configs: routed $((IPR[route] - IPR[nroute])) instructions per request fewer (route/nroute $(ratio "${IPR[route]}" "${IPR[nroute]}")x), hit $((IPR[hit] - IPR[nhit])) fewer (hit/nhit $(ratio "${IPR[hit]}" "${IPR[nhit]}")x)"
} | tee .run/bench-instructions-latest.md
