# Thin aliases over uv and cargo; see README.md.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/tandem/target
UV = $(shell command -v uv 2>/dev/null || echo python3 -m uv)
ARGS ?=

.PHONY: install serve test test-fast lint test-rust test-python chart bench bench-overhead gpu-check gpu-check-bundle

install:
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --locked

serve: install
	$(UV) run --no-sync tandem-launcher $(ARGS)

lint: install
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(UV) run --no-sync ruff check .
	$(UV) run --no-sync mypy
	$(UV) run --no-sync python scripts/check_layers.py
	$(UV) run --no-sync lint-imports

test-rust:
	cargo test --workspace

test-python: install
	$(UV) run --no-sync pytest --durations=30 server/tests launcher/tests benchmark/tests scripts/tests router/python/tests integration-tests charts/tests

test: lint test-rust test-python

# The unit tier: every Python test not marked e2e or slow (see conftest.py), a few minutes on 2 cores.
test-fast: install
	$(UV) run --no-sync pytest -m "not e2e and not slow" server/tests launcher/tests benchmark/tests scripts/tests router/python/tests

# Starts Tandem on a free port, runs the standard suite against its peers (ARGS="--llama-server PATH ..."; about
# 45 minutes on 2 cores with llama-server) and rewrites the README's benchmark table and chart; results.json and the
# other plots go to $(HOME)/.cache/tandem/bench.
bench: install
	$(UV) run --no-sync python -m tandem_bench.suite $(ARGS)

# Starts Tandem on a free port and prints the per-step overhead of the serving path against the forward pass at
# batch 1, 8, 32 and 64 (a few minutes on 2 cores); see docs/benchmarks.md.
bench-overhead: install
	$(UV) run --no-sync tandem-bench overhead $(ARGS)

# Helm chart checks: lint, render every value set, validate against Kubernetes schemas and the LeaderWorkerSet and
# InferencePool CRDs (fetched once through the Go module proxy), parse the argv.
# The first run builds helm from source into $(HOME)/.cache/tandem/helm (a few minutes); later runs reuse it.
chart: install
	$(UV) run --no-sync pytest charts/tests

# On a CUDA machine (under 8 minutes): CUDA tests in bf16, the real stack answering a chat on cuda:0, and a batch
# sweep (1..256) of a random-weight Llama-3-8B-shaped model with TTFT/ITL percentiles and MFU; see docs/gpu.md.
# Needs no install: run gpu-check-bundle first on a machine with uv and carry what it lists.
gpu-check:
	bash scripts/gpu_check.sh $(ARGS)

gpu-check-bundle: install
	bash scripts/gpu_check_bundle.sh
