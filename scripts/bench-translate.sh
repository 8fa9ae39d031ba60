#!/usr/bin/env bash
# make bench-translate: instructions per request of each translation step
# natively (filter/core/examples/translate_instr.rs), counted by callgrind:
# the step run 2000 times minus the same program running it 0 times. Envoy's
# V8 code has no symbols, so this is where a translation's cost is
# attributed; `make bench-instructions` gives the same pairs inside Envoy.
# With PORTCULLIS_TRANSLATE_KEEP=DIR the callgrind files stay there
# (callgrind_annotate them; build with CARGO_PROFILE_RELEASE_STRIP=false
# CARGO_PROFILE_RELEASE_DEBUG=1 for function names).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v valgrind >/dev/null || apt-get install -y -qq valgrind >/dev/null
cargo build --release -q -p portcullis-core --example translate_instr
bin=target/release/examples/translate_instr
dir=$(mktemp -d /tmp/portcullis-translate.XXXX)
trap 'rm -rf "$dir"' EXIT
count() { valgrind --tool=callgrind --callgrind-out-file="$dir/$1.$2" "$bin" "$1" "$2" 2>&1 | awk '/Collected/ {print $4}'; }
echo "| step | instructions per request (native) |"
echo "|---|---|"
for step in parse direct chat_anthropic messages_chat responses_anthropic anthropic_answer chat_messages_answer chat_responses_answer; do
  zero=$(count "$step" 0); many=$(count "$step" 2000)
  echo "| $step | $(( (many - zero) / 2000 )) |"
done
[[ -z ${PORTCULLIS_TRANSLATE_KEEP:-} ]] || cp "$dir"/* "$PORTCULLIS_TRANSLATE_KEEP/"
