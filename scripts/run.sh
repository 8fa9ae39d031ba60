#!/usr/bin/env bash
# Start the local gateway: two mock providers, Envoy with the filter on
# 127.0.0.1:10000 (admin 127.0.0.1:9901), the collector, Redis and the
# limiter, the control plane. Every one of them runs under
# scripts/keep-running.sh: a part that exits is started again (with a
# backoff, logged in its log) while the others keep serving, as a
# deployment's supervisor would. Ctrl-C stops everything.
set -euo pipefail
cd "$(dirname "$0")/.."
ENVOY="${ENVOY:-.venv/bin/envoy}"
MOCK=target/release/portcullis-mock
COLLECTOR=target/release/portcullis-collector
LIMITER=target/release/portcullis-limiter
CONTROL_PLANE=target/release/portcullis-control
REDIS_SERVER="${REDIS_SERVER:-redis-server}"
mkdir -p .run/ecds .run/logs
pids=()
cleanup() {
  trap - INT TERM EXIT
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "portcullis: stopped"
}
trap cleanup INT TERM EXIT

wait_for() { # url what
  local deadline=$((SECONDS + 30))
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    if ((SECONDS > deadline)); then echo "portcullis: $2 did not come up; see .run/logs/" >&2; exit 1; fi
    sleep 0.1
  done
}

# The mocks check the provider keys Envoy injects from its environment.
scripts/keep-running.sh primary "$MOCK" --port 18001 --name primary --api-key sk-mock-primary >.run/logs/primary.log 2>&1 & pids+=($!)
scripts/keep-running.sh backup "$MOCK" --port 18002 --name backup --api-key sk-mock-backup >.run/logs/backup.log 2>&1 & pids+=($!)
# Two MCP servers (the mock's MCP mode) behind /mcp/tools and /mcp/notes;
# `notes` takes only the credential the gateway sends it.
scripts/keep-running.sh mcp-tools "$MOCK" --port 18011 --name tools >.run/logs/mcp-tools.log 2>&1 & pids+=($!)
scripts/keep-running.sh mcp-notes "$MOCK" --port 18012 --name notes --api-key sk-mock-notes >.run/logs/mcp-notes.log 2>&1 & pids+=($!)
wait_for http://127.0.0.1:18001/__mock/hits "mock provider primary"
wait_for http://127.0.0.1:18002/__mock/hits "mock provider backup"
wait_for http://127.0.0.1:18011/__mock/hits "MCP server tools"
wait_for http://127.0.0.1:18012/__mock/hits "MCP server notes"

# The request log must never fail a request: the collector is restarted
# when it exits instead of taking the gateway down with it.
# Its HTTP API and dashboard need a read token (made once, kept in .run/).
[ -s .run/collector-token ] || (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >.run/collector-token)
TOKEN=$(cat .run/collector-token)
# Records come only from this gateway: Envoy sends the ingest token.
[ -s .run/ingest-token ] || (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >.run/ingest-token)
# The gateway's seal secret (MCP sessions, file and batch ids): one for
# both replicas, so either opens what the other sealed.
[ -s .run/seal-secret ] || (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' >.run/seal-secret)
# Only this gateway may spend clients' global limits: the limiter's token.
[ -s .run/limiter-token ] || (umask 077; od -An -tx1 -N16 /dev/urandom | tr -d ' \n' >.run/limiter-token)
# The budgets the dashboard shows are the config's: with the control plane,
# the one it serves (written to .run/control-plugin.yaml at each version).
plugin_for_collector=envoy/plugin.yaml
[[ "${CONTROL:-1}" == 0 ]] || plugin_for_collector=.run/control-plugin.yaml
scripts/keep-running.sh collector \
  "$COLLECTOR" --grpc 127.0.0.1:50051 --http 127.0.0.1:9090 --db .run/portcullis.db \
  --read-token-file .run/collector-token --ingest-token-file .run/ingest-token \
  --plugin-config "$plugin_for_collector" \
  >>.run/logs/collector.log 2>&1 & pids+=($!)
wait_for http://127.0.0.1:9090/healthz "collector"

# Limits scoped `global` (docs/limits.md): Redis holds the counters, the
# limiter speaks Envoy's rate limit protocol over them.
scripts/keep-running.sh redis "$REDIS_SERVER" --port 6379 --bind 127.0.0.1 --save '' --appendonly no >>.run/logs/redis.log 2>&1 & pids+=($!)
scripts/keep-running.sh limiter \
  "$LIMITER" --listen 127.0.0.1:8081 --redis redis://127.0.0.1:6379 --token-file .run/limiter-token \
  >>.run/logs/limiter.log 2>&1 & pids+=($!)

# NATIVE=1 (make run NATIVE=1): the native build, libportcullis.so, found
# through ENVOY_DYNAMIC_MODULES_SEARCH_PATH; otherwise the .wasm.
if [[ "${NATIVE:-}" == 1 ]]; then
  export PORTCULLIS_BUILD=native ENVOY_DYNAMIC_MODULES_SEARCH_PATH="$PWD/target/native"
fi
envoy/render-ecds.sh envoy/plugin.yaml .run/ecds/portcullis.yaml
# The providers' clusters from envoy/clusters/ (CONTROL=0; with the control
# plane they come from it over CDS).
envoy/render-cds.sh envoy/clusters .run/ecds/cds.yaml
bootstrap=envoy/envoy.yaml
# The control plane (CONTROL=0: none, Envoy reads the ECDS file): keys,
# teams and budgets through its admin API on 127.0.0.1:9400, the plugin
# config served to Envoy over xDS on 127.0.0.1:18000. Its database starts
# from envoy/plugin.yaml at each `make run`; an admin token is made for you.
if [[ "${CONTROL:-1}" != 0 ]]; then
  rm -f .run/control.db .run/control.db-wal .run/control.db-shm
  (umask 077; "$CONTROL_PLANE" token create --db .run/control.db --name make-run --role write >.run/control-admin-token)
  # Restarted on the same database: keys made through the API survive it,
  # and Envoy keeps serving its last config meanwhile.
  scripts/keep-running.sh control "$CONTROL_PLANE" serve --db .run/control.db --admin 127.0.0.1:9400 --xds 127.0.0.1:18000 \
    --resource .run/ecds/portcullis.yaml --import envoy/plugin.yaml --write-config .run/control-plugin.yaml \
    --collector http://127.0.0.1:9090 --collector-token-file .run/collector-token >>.run/logs/control.log 2>&1 & pids+=($!)
  wait_for http://127.0.0.1:9400/healthz "control plane"
  bootstrap=.run/envoy-control.yaml
  cp envoy/envoy.yaml "$bootstrap"
  envoy/use-control.sh "$bootstrap" 127.0.0.1:18000
fi
OPENAI_API_KEY=sk-mock-primary BACKUP_API_KEY=sk-mock-backup ANTHROPIC_API_KEY=sk-mock-primary MCP_NOTES_TOKEN=sk-mock-notes \
  PORTCULLIS_INGEST_TOKEN="$(cat .run/ingest-token)" PORTCULLIS_LIMITER_TOKEN="$(cat .run/limiter-token)" \
  PORTCULLIS_SEAL_SECRET="$(cat .run/seal-secret)" \
  scripts/keep-running.sh envoy "$ENVOY" -c "$bootstrap" --disable-hot-restart --concurrency 2 -l info \
  >.run/logs/envoy.log 2>&1 & pids+=($!)
wait_for http://127.0.0.1:9901/ready "Envoy"
# A second replica on the same config (listener 127.0.0.1:10001, admin
# 9902): what the fleet shares (the prompt cache's tier in Redis, limits
# scoped `global`) shows across replicas.
sed -e 's/port_value: 10000}/port_value: 10001}/' -e 's/port_value: 9901}/port_value: 9902}/' \
  -e 's/id: portcullis-local$/id: portcullis-local-2/' "$bootstrap" >.run/envoy-2.yaml
OPENAI_API_KEY=sk-mock-primary BACKUP_API_KEY=sk-mock-backup ANTHROPIC_API_KEY=sk-mock-primary MCP_NOTES_TOKEN=sk-mock-notes \
  PORTCULLIS_INGEST_TOKEN="$(cat .run/ingest-token)" PORTCULLIS_LIMITER_TOKEN="$(cat .run/limiter-token)" \
  PORTCULLIS_SEAL_SECRET="$(cat .run/seal-secret)" \
  scripts/keep-running.sh envoy-2 "$ENVOY" -c .run/envoy-2.yaml --disable-hot-restart --concurrency 1 -l info \
  >.run/logs/envoy-2.log 2>&1 & pids+=($!)
wait_for http://127.0.0.1:9902/ready "the second Envoy"
until curl -fsS -o /dev/null -H 'authorization: Bearer sk-portcullis-demo' http://127.0.0.1:10000/v1/models 2>/dev/null; do
  ((SECONDS < 60)) || { echo "portcullis: gateway not answering; see .run/logs/envoy.log" >&2; exit 1; }
  sleep 0.1
done

cat <<MSG
portcullis: ready on http://127.0.0.1:10000 and a second replica on :10001, the ${PORTCULLIS_BUILD:-wasm} build (admin http://127.0.0.1:9901 and :9902, logs in .run/logs/).
Dashboard: http://127.0.0.1:9090/dashboard (read token: $TOKEN; the collector's API takes it as 'Authorization: Bearer $TOKEN'). Try:
  curl -s http://127.0.0.1:10000/v1/chat/completions -H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d '{"model":"auto","messages":[{"role":"user","content":"Hello!"}]}'
  curl -s http://127.0.0.1:10000/v1/responses -H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d '{"model":"claude-sonnet","input":"Hello!"}'
  curl -s http://127.0.0.1:10000/v1/messages -H 'x-api-key: sk-portcullis-demo' -H 'anthropic-version: 2023-06-01' -H 'content-type: application/json' -d '{"model":"gpt-4o-mini","max_tokens":100,"messages":[{"role":"user","content":"Hello!"}]}'
  curl -s http://127.0.0.1:10000/v1/embeddings -H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d '{"model":"text-embedding-3-small","input":["hello","world"]}'
One capability each, with the tour's key (sk-portcullis-tour; envoy/plugin.yaml's demo sections):
  # a guardrail: the provider got the prompt with the address redacted
  curl -s -o /dev/null http://127.0.0.1:10000/v1/chat/completions -H 'authorization: Bearer sk-portcullis-tour' -H 'content-type: application/json' -d '{"model":"mini","messages":[{"role":"user","content":"write to jo@example.com"}]}'; curl -s http://127.0.0.1:18001/__mock/requests | grep -o 'write to [^"]*' | tail -1
  # a routing strategy: 'fast' goes to the cheapest provider serving it (the backup)
  curl -s -D - -o /dev/null http://127.0.0.1:10000/v1/chat/completions -H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d '{"model":"fast","messages":[{"role":"user","content":"Hi"}]}' | grep -i '^x-portcullis-provider'
  # a sticky A/B experiment: each key keeps its arm for 'claude-haiku'
  curl -s -D - -o /dev/null http://127.0.0.1:10000/v1/chat/completions -H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d '{"model":"claude-haiku","messages":[{"role":"user","content":"Hi"}]}' | grep -i '^x-portcullis-\(experiment\|model\)'
  # a limit: the tour key's 5 requests a minute (the first try counts), then 429 (its budget, \$0.01 a day, is on the dashboards)
  for i in 1 2 3 4 5 6; do curl -s -o /dev/null -w '%{http_code} ' http://127.0.0.1:10000/v1/chat/completions -H 'authorization: Bearer sk-portcullis-tour' -H 'content-type: application/json' -d "{\"model\":\"mini\",\"messages\":[{\"role\":\"user\",\"content\":\"hi \$i\"}]}"; done; echo
  # an MCP client's session through the gateway (docs/mcp-gateway.md): initialize, tools/list, tools/call
  M=(-H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -H 'accept: application/json, text/event-stream'); S=\$(curl -s -D - -o /dev/null http://127.0.0.1:10000/mcp/notes "\${M[@]}" -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"curl","version":"1"}}}' | tr -d '\r' | sed -n 's/^mcp-session-id: //Ip'); curl -s http://127.0.0.1:10000/mcp/notes "\${M[@]}" -H "mcp-session-id: \$S" -d '{"jsonrpc":"2.0","id":2,"method":"tools/list"}'; echo; curl -s http://127.0.0.1:10000/mcp/notes "\${M[@]}" -H "mcp-session-id: \$S" -d '{"jsonrpc":"2.0","id":3,"method":"tools/call","params":{"name":"echo","arguments":{"text":"hi"}}}'; echo
  # the fleet's cache: a prompt this replica answered is, from its next tick (250 ms), a hit on the second replica (127.0.0.1:10001)
  Q=(-H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d "{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"Shared? \$RANDOM\"}]}"); curl -s -o /dev/null http://127.0.0.1:10000/v1/chat/completions "\${Q[@]}"; sleep 0.5; curl -s -D - -o /dev/null http://127.0.0.1:10001/v1/chat/completions "\${Q[@]}" | grep -i '^x-portcullis-cache'
Edit envoy/plugin.yaml and run 'make reload' to apply it live. Ctrl-C stops everything.
MSG
if [[ "${CONTROL:-1}" != 0 ]]; then
  ADMIN=$(cat .run/control-admin-token)
  cat <<MSG
Control plane: http://127.0.0.1:9400 (admin token in .run/control-admin-token; docs/control-plane.md); keys and teams with their spend: http://127.0.0.1:9400/dashboard#token=$ADMIN
A new key, working within a second:
  curl -s http://127.0.0.1:9400/v1/keys -H 'authorization: Bearer $ADMIN' -d '{"name":"my-app"}'
MSG
fi
# Every part is kept running: only Ctrl-C (or a supervisor that was
# itself killed) ends this.
wait -n "${pids[@]}" || true
for p in "${pids[@]}"; do
  kill -0 "$p" 2>/dev/null || { echo "portcullis: a supervisor exited; see .run/logs/" >&2; exit 1; }
done
