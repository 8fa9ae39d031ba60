#!/usr/bin/env bash
# make bench-collector: the collector's ingest rate into SQLite and into a
# PostgreSQL started here (Debian's, a scratch cluster on a loopback port,
# as the postgres user when run as root), then the summary at scale.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p portcullis-collector --bin portcullis-ingest-bench
pgbin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
[[ -n $pgbin ]] || { echo "bench-collector: no PostgreSQL (make postgres)" >&2; exit 1; }
dir=$(mktemp -d /tmp/portcullis-bench-pg.XXXX)
as_pg() { if [[ $(id -u) == 0 ]]; then setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; else "$@"; fi; }
[[ $(id -u) == 0 ]] && chown postgres:postgres "$dir"
port=18432
as_pg "$pgbin/initdb" -A trust -U postgres -E UTF8 --no-sync -D "$dir/data" >/dev/null
# exec: $! is the postmaster itself, so the cleanup's SIGINT reaches it.
(exec_pg() { if [[ $(id -u) == 0 ]]; then exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; else exec "$@"; fi; }
 exec_pg "$pgbin/postgres" -D "$dir/data" -p $port -c listen_addresses=127.0.0.1 -k "$dir") >"$dir/log" 2>&1 &
pg=$!
cleanup() { kill -INT $pg 2>/dev/null || true; wait $pg 2>/dev/null || true; rm -rf "$dir"; }
trap cleanup EXIT INT TERM
d=$((SECONDS + 30))
until "$pgbin/pg_isready" -h 127.0.0.1 -p $port >/dev/null 2>&1; do
  ((SECONDS < d)) || { echo "bench-collector: postgres did not start" >&2; cat "$dir/log" >&2; exit 1; }
  sleep 0.1
done
BENCH_PG_URL="postgres://postgres@127.0.0.1:$port/postgres" target/release/portcullis-ingest-bench
