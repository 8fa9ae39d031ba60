#!/usr/bin/env bash
# Wrap a plugin config (envoy/plugin.yaml) into the ECDS resource Envoy watches,
# and put it in place by rename: Envoy reloads on a file moved into the
# watched directory, not on an in-place edit.
#   usage: envoy/render-ecds.sh PLUGIN_YAML OUT_FILE [WASM_FILE]
# With PORTCULLIS_BUILD=native the resource loads the native build instead
# (libportcullis.so, found through Envoy's ENVOY_DYNAMIC_MODULES_SEARCH_PATH);
# it reads Envoy's own environment, so no variable list is needed.
# The filter reads only the environment variables listed in host_env_keys:
# the shipped providers' keys, every preset's (docs/providers.md), the
# gateway's seal secret (and the previous one while it rotates), and any
# named in PORTCULLIS_ENV_KEYS (space- or comma-separated), and every one the
# plugin config names (`api_key_env`, an MCP server's `credential.env`).
set -euo pipefail
in="$1"; out="$2"
env_keys="OPENAI_API_KEY, BACKUP_API_KEY, ANTHROPIC_API_KEY, GEMINI_API_KEY, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, GROQ_API_KEY, MISTRAL_API_KEY, DEEPSEEK_API_KEY, TOGETHER_API_KEY, FIREWORKS_API_KEY, OPENROUTER_API_KEY, XAI_API_KEY, PERPLEXITY_API_KEY, PORTCULLIS_MAX_CONFIG_BYTES, PORTCULLIS_INGEST_TOKEN, PORTCULLIS_LIMITER_TOKEN, PORTCULLIS_SEAL_SECRET, PORTCULLIS_SEAL_SECRET_PREVIOUS, PORTCULLIS_TESTING"
for k in ${PORTCULLIS_ENV_KEYS:+${PORTCULLIS_ENV_KEYS//,/ }}; do
  [[ $k =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || { echo "render-ecds.sh: PORTCULLIS_ENV_KEYS: $k is not a variable name" >&2; exit 1; }
  env_keys+=", $k"
done
# Every variable the config itself names (a provider's `api_key_env`, an MCP
# server's `credential.env`) is readable too.
for k in $(grep -oE '(^|[^A-Za-z0-9_])(api_key_env|env): *"?[A-Za-z_][A-Za-z0-9_]*' "$in" | sed -E 's/.*: *"?//' | sort -u); do
  case ", $env_keys, " in *", $k, "*) ;; *) env_keys+=", $k" ;; esac
done
wasm="${3:-target/wasm32-wasip1/release/portcullis_filter.wasm}"
mkdir -p "$(dirname "$out")"
tmp="$(dirname "$out")/.$(basename "$out").tmp.$$"
# The CDS file envoy/envoy.yaml reads beside this one must exist: none yet
# means no dynamic cluster (envoy/render-cds.sh writes the real one).
cds="$(dirname "$out")/cds.yaml"
[[ -e $cds ]] || printf '# No dynamic clusters (envoy/render-cds.sh writes them).\nresources: []\n' >"$cds"
if [[ "${PORTCULLIS_BUILD:-wasm}" == native ]]; then
  {
    cat <<HEAD
resources:
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: portcullis
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.dynamic_modules.v3.DynamicModuleFilter
    # Metrics are portcullis.* (the Wasm build's are wasmcustom.portcullis.*;
    # docs/native.md).
    dynamic_module_config: {name: portcullis, do_not_close: true, metrics_namespace: portcullis}
    filter_name: portcullis
    filter_config:
      "@type": type.googleapis.com/google.protobuf.StringValue
      value: |
HEAD
    sed 's/^/        /' "$in"
  } > "$tmp"
  mv -f "$tmp" "$out"
  exit 0
fi
{
  cat <<HEAD
resources:
- "@type": type.googleapis.com/envoy.config.core.v3.TypedExtensionConfig
  name: portcullis
  typed_config:
    "@type": type.googleapis.com/envoy.extensions.filters.http.wasm.v3.Wasm
    config:
      name: portcullis
      root_id: portcullis
      allow_on_headers_stop_iteration: true
      # A trapped VM is reloaded (with Envoy's backoff) instead of failing
      # every later request on its worker; requests in between get a 503.
      failure_policy: FAIL_RELOAD
      vm_config:
        vm_id: portcullis
        runtime: envoy.wasm.runtime.v8
        code: {local: {filename: "$wasm"}}
        environment_variables:
          host_env_keys: [$env_keys]
      configuration:
        "@type": type.googleapis.com/google.protobuf.StringValue
        value: |
HEAD
  sed 's/^/          /' "$in"
} > "$tmp"
mv -f "$tmp" "$out"
