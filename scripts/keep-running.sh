#!/usr/bin/env bash
# keep-running.sh NAME CMD [ARGS...]: run CMD and start it again whenever it
# exits, so that one part's failure never stops the others (make run keeps
# every side service this way, and Envoy). It waits before each restart,
# 1 s doubling to 10 s while the part keeps failing, back to 1 s once it
# ran for 30 s; each restart is logged (the part's own log, stderr).
# SIGTERM or SIGINT stops CMD and this script.
set -uo pipefail
name=$1
shift
child=""
stop() {
  [[ -n $child ]] && kill "$child" 2>/dev/null && wait "$child" 2>/dev/null
  exit 0
}
trap stop INT TERM
backoff=1
while true; do
  started=$SECONDS
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  ((SECONDS - started >= 30)) && backoff=1
  echo "portcullis: $(date -u +%FT%TZ) $name exited (status $rc); starting it again in ${backoff}s" >&2
  # A pause, so a part that cannot start does not spin a core.
  sleep "$backoff" &
  child=$!
  wait "$child"
  child=""
  backoff=$((backoff * 2 > 10 ? 10 : backoff * 2))
done
