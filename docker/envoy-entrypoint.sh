#!/usr/bin/env bash
# Envoy with a stop that loses nothing, for rolling restarts (#34). On
# SIGTERM:
#   1. fail the health check (`/healthcheck/fail`: the admin `/ready` the
#      front probes answers 503 DRAINING) while still serving everything in
#      flight and everything the front still sends;
#   2. wait PORTCULLIS_UNHEALTHY_WAIT_S seconds, long enough for the front
#      to mark this replica unhealthy (its health check: interval 1 s,
#      unhealthy after 1 failure, so at most about 2 s) and stop sending it
#      new requests;
#   3. drain the listeners (answers to requests in flight still go out,
#      every connection is told to close) for PORTCULLIS_DRAIN_S seconds,
#      so streams in flight finish;
#   4. stop Envoy.
# Without step 1 the front kept sending requests to a draining replica, and
# one written to a connection the replica then closed was lost (1 to 3
# requests in 5 of 12 stops). Compose's stop_grace_period must cover the
# sum (docker-compose.yml: 15 s); Kubernetes: the same as a preStop hook
# (docs/fleet.md).
set -u
/usr/local/bin/envoy "$@" &
pid=$!
admin_post() {
  if exec 3<>/dev/tcp/127.0.0.1/9901; then
    printf 'POST %s HTTP/1.1\r\nHost: l\r\nConnection: close\r\nContent-Length: 0\r\n\r\n' "$1" >&3
    cat <&3 >/dev/null
    exec 3<&-
  fi
}
drain() {
  admin_post /healthcheck/fail
  sleep "${PORTCULLIS_UNHEALTHY_WAIT_S:-3}"
  admin_post '/drain_listeners?graceful'
  sleep "${PORTCULLIS_DRAIN_S:-3}"
  kill -TERM "$pid" 2>/dev/null
}
trap drain TERM INT
wait "$pid"
# `wait` returns early when the trap runs; wait for Envoy itself.
wait "$pid"
