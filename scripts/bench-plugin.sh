#!/usr/bin/env bash
# bench-plugin.sh: envoy/plugin.yaml as the benchmarks read it, on stdout:
# without the tour's sections (the `# tour:` ... `# end of tour` blocks:
# the tour key, its experiment, guardrail, strategy and price), so that
# every benchmark measures the same config as before they were added
# (BENCHMARKS.md compares runs across sessions). The Anthropic-format demo
# provider stays, as it always has.
set -euo pipefail
cd "$(dirname "$0")/.."
awk '
  /^ *# tour:/ { skip = 1; next }
  skip && /^ *# end of tour/ { skip = 0; next }
  !skip
  END { if (skip) { print "bench-plugin.sh: a # tour: block has no end" > "/dev/stderr"; exit 1 } }
' envoy/plugin.yaml
