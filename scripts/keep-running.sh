#!/usr/bin/env bash
# keep-running.sh NAME CMD [ARGS...]: run CMD and start it again whenever it
# exits, so that one part's failure (the collector) never stops the others
# (the gateway). SIGTERM or SIGINT stops CMD and this script.
set -uo pipefail
name=$1
shift
child=""
stop() {
  [[ -n $child ]] && kill "$child" 2>/dev/null && wait "$child" 2>/dev/null
  exit 0
}
trap stop INT TERM
while true; do
  "$@" &
  child=$!
  wait "$child"
  rc=$?
  echo "portcullis: $name exited (status $rc); starting it again" >&2
  # A short pause, so a part that cannot start does not spin a core.
  sleep 1
done
