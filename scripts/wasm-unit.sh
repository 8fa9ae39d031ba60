#!/usr/bin/env bash
# The core's tests natively, then on wasm32 (wasm-bindgen's runner); both
# counts are printed and must be equal: a core test that runs natively only
# is a test the 32-bit build never had.
set -euo pipefail
cd "$(dirname "$0")/.."
count() { sed -n 's/.*test result: [a-zA-Z]*\. \([0-9]*\) passed.*/\1/p' "$1" | awk '{s+=$1} END {print s+0}'; }
native_log=$(mktemp); wasm_log=$(mktemp)
trap 'rm -f "$native_log" "$wasm_log"' EXIT
cargo test -q -p portcullis-core --lib 2>&1 | tee "$native_log" | tail -3
CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_RUNNER="$1" \
  cargo test -p portcullis-core --lib --target wasm32-unknown-unknown 2>&1 | tee "$wasm_log" | tail -5
native=$(count "$native_log"); wasm=$(count "$wasm_log")
echo "core tests: native $native passed, wasm32 $wasm passed"
if [ "$native" -eq 0 ] || [ "$native" != "$wasm" ]; then
  echo "core tests differ between native ($native) and wasm32 ($wasm): every core test must run on both" >&2
  exit 1
fi
