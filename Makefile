# Thin aliases over uv and cargo; see README.md.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/tandem/target
UV = $(shell command -v uv 2>/dev/null || echo python3 -m uv)
ARGS ?=

.PHONY: install serve test lint test-rust test-python

install:
	@command -v uv >/dev/null 2>&1 || python3 -m uv --version >/dev/null 2>&1 || python3 -m pip install --quiet uv
	$(UV) sync --locked

serve: install
	$(UV) run --no-sync tandem-launcher $(ARGS)

lint: install
	cargo fmt --all --check
	cargo clippy --workspace --all-targets -- -D warnings
	$(UV) run --no-sync ruff check .

test-rust:
	cargo test --workspace

test-python: install
	$(UV) run --no-sync pytest server/tests launcher/tests integration-tests

test: lint test-rust test-python
