#!/usr/bin/env bash
# The production-like plugin config of #49 (`prod` in make bench and make
# bench-instructions), printed from a routed config (the shipped config,
# cache off) given as $1: the demo key's and its team's limits (requests,
# tokens, concurrency, a day's and a month's budget, far above what a run
# reaches, so every request is admitted and counted at both levels), five
# input checks and one output check, the request log on.
set -euo pipefail
route=$1
LIMITS='{requests_per_minute: 100000000, tokens_per_minute: 1000000000, max_concurrent: 1000, budgets: [{usd: 1000000, period: day}, {usd: 10000000, period: month}]}'
out=$(awk -v l="$LIMITS" '{print} /^  - name: demo$/ {print "    team: bench"; print "    limits: " l}' "$route")
grep -q "team: bench" <<<"$out" || { echo "bench-prod-plugin: no demo client to give limits" >&2; exit 1; }
printf '%s\nteams:\n  - name: bench\n    limits: %s\n' "$out" "$LIMITS"
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
