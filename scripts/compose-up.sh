#!/usr/bin/env bash
# make compose-up: start the compose fleet and wait until every service's
# health check passes, with `docker compose` (v2) when present, else
# Debian 12's `docker-compose` (v1, which has no `--wait`). Prints the
# front's address and a try. Stop it with the printed `down` command.
set -euo pipefail
cd "$(dirname "$0")/.."
if docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
elif command -v docker-compose >/dev/null; then
  compose=(docker-compose)
else
  echo "compose-up: neither \`docker compose\` nor \`docker-compose\` is installed" >&2
  exit 1
fi
project="${PORTCULLIS_COMPOSE_PROJECT:-portcullis}"
"${compose[@]}" -p "$project" up -d
deadline=$((SECONDS + ${PORTCULLIS_COMPOSE_WAIT_S:-180}))
while :; do
  ids=$("${compose[@]}" -p "$project" ps -q)
  waiting=$(for id in $ids; do docker inspect -f '{{.Name}} {{if .State.Health}}{{.State.Health.Status}}{{else}}{{.State.Status}}{{end}}' "$id"; done |
    awk '$2 != "healthy" && $2 != "running" {print $1 "=" $2}')
  [[ -z $waiting ]] && break
  if ((SECONDS >= deadline)); then
    echo "compose-up: not healthy after ${PORTCULLIS_COMPOSE_WAIT_S:-180} s: $waiting" >&2
    exit 1
  fi
  sleep 1
done
port="${PORTCULLIS_PORT:-10000}"
echo "compose-up: the fleet is healthy; the front on 127.0.0.1:$port, the dashboard on 127.0.0.1:${PORTCULLIS_DASHBOARD_PORT:-9090}"
echo "  try: curl -s 127.0.0.1:$port/v1/chat/completions -H 'authorization: Bearer sk-portcullis-demo' -H 'content-type: application/json' -d '{\"model\":\"gpt-4o-mini\",\"messages\":[{\"role\":\"user\",\"content\":\"hi\"}]}'"
echo "  stop: ${compose[*]} -p $project down -v"
