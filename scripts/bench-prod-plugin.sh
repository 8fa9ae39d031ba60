#!/usr/bin/env bash
# The benchmarks' limited and guarded plugin configs, printed from a routed
# config (the shipped config, cache off) given as $2; $1 says which:
#   keylimits   the demo key with five limits (requests, tokens,
#               concurrency, a day's and a month's budget), far above what a
#               run reaches, so every request is admitted and counted
#   teamlimits  the same limits at the key and at its team (`bench`)
#   guard       five input checks and one output check
#   prod        the production-like config of #49 (`prod` in make bench
#               and make bench-instructions): teamlimits and guard, the
#               request log as the routed config has it
set -euo pipefail
part=$1 route=$2
LIMITS='{requests_per_minute: 100000000, tokens_per_minute: 1000000000, max_concurrent: 1000, budgets: [{usd: 1000000, period: day}, {usd: 10000000, period: month}]}'
with_limits() { # extra line for the demo client (or none)
  local out
  out=$(awk -v l="$LIMITS" -v extra="$1" '{print} /^  - name: demo$/ {if (extra != "") print extra; print "    limits: " l}' "$route")
  grep -q "^    limits: " <<<"$out" || { echo "bench-prod-plugin: no demo client to give limits" >&2; exit 1; }
  printf '%s\n' "$out"
}
team() {
  with_limits "    team: bench"
  printf 'teams:\n  - name: bench\n    limits: %s\n' "$LIMITS"
}
guardrails() {
  cat <<'YAML'
guardrails:
  input:
    - {name: email, pii: [email], action: redact}
    - {name: cards, pii: [card, iban], action: deny}
    - {name: keys, pii: [api_key], action: deny}
    - {name: secret, regex: '(?i)top\s+secret', action: deny}
    - {name: size, max_words: 4000}
  output:
    - {name: phone, pii: [phone], action: redact}
YAML
}
case $part in
  keylimits) with_limits "" ;;
  teamlimits) team ;;
  guard) cat "$route"; guardrails ;;
  prod) team; guardrails ;;
  *) echo "bench-prod-plugin: unknown part $part (keylimits, teamlimits, guard, prod)" >&2; exit 1 ;;
esac
