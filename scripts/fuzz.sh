#!/usr/bin/env bash
# fuzz.sh SECONDS [TARGET...]: run each cargo-fuzz target (libFuzzer, nightly)
# for SECONDS, starting from its seeds (fuzz/seeds/TARGET) and the corpus
# kept from earlier runs (fuzz/corpus/TARGET, not committed). Builds with
# debug assertions, so arithmetic that would wrap in release is found too.
# A failure leaves the input in fuzz/artifacts/TARGET/ and fails the script.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:?seconds per target}
shift
targets=("$@")
((${#targets[@]})) || targets=(request sse config headers usage since rls guard anthropic gemini bedrock messages responses placements mcp form websocket cache_tiers)
export PATH="$PWD/.tools/bin:$PATH"
cd fuzz
cargo +nightly fuzz build -s none -a >/dev/null
for t in "${targets[@]}"; do
  mkdir -p "corpus/$t"
  log=$(mktemp)
  if ! cargo +nightly fuzz run -s none -a "$t" "corpus/$t" "seeds/$t" -- \
      -max_total_time="$secs" -max_len=8192 -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
    tail -n 40 "$log" >&2
    echo "fuzz: target $t FAILED; the input is in fuzz/artifacts/$t/" >&2
    rm -f "$log"
    exit 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | cut -d' ' -f2)
  echo "fuzz: $t: ${runs:-?} runs in ${secs}s, coverage ${cov:-?} edges, corpus $(ls "corpus/$t" | wc -l) inputs, no failure"
  rm -f "$log"
done
