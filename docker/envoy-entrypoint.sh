#!/usr/bin/env bash
# Envoy with a graceful stop, for rolling restarts: on SIGTERM, drain the
# listeners (answers to requests in flight still go out, every connection
# is told to close, new connections are refused once the drain time is
# over), give the front PORTCULLIS_DRAIN_S seconds to move to the other
# replica, then stop Envoy. Without this, Envoy's SIGTERM resets the
# requests on connections a front has just picked.
set -u
/usr/local/bin/envoy "$@" &
pid=$!
drain() {
  if exec 3<>/dev/tcp/127.0.0.1/9901; then
    printf 'POST /drain_listeners?graceful HTTP/1.1\r\nHost: l\r\nConnection: close\r\nContent-Length: 0\r\n\r\n' >&3
    cat <&3 >/dev/null
  fi
  sleep "${PORTCULLIS_DRAIN_S:-3}"
  kill -TERM "$pid" 2>/dev/null
}
trap drain TERM INT
wait "$pid"
# `wait` returns early when the trap runs; wait for Envoy itself.
wait "$pid"
