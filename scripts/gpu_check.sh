#!/usr/bin/env bash
# `make gpu-check` on a CUDA machine: runs tandem_bench.gpu_check from this working tree (no install, no registry).
# Needs torch, triton and transformers on the machine, plus what scripts/gpu_check_bundle.sh prepared.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BUNDLE="$PWD/.gpu-check"
# Whole check, from a cold start: the issue's limit.
LIMIT_S=${GPU_CHECK_LIMIT_S:-480}

# Unpacks what scripts/gpu_check_bundle.sh prepared: packages, tokenizer, router extension, protobuf code.
if [ -f "$BUNDLE/bundle.tar.xz" ]; then
  "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(filter="data")' "$BUNDLE/bundle.tar.xz"
fi
# The machine's own pytest plugins may not match the bundled pytest.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
export PYTHONPATH="$PWD/server:$PWD/launcher:$PWD/benchmark:$PWD/router/python:$BUNDLE/site${PYTHONPATH:+:$PYTHONPATH}"
# The launcher spawns `tandem-shard` and `tandem-router` from PATH; without an install they are thin wrappers.
BIN=$(mktemp -d)
trap 'rm -rf "$BIN"' EXIT
python_path=$(command -v "$PYTHON")
printf '#!/bin/sh\nexec "%s" -c "import sys; from tandem_server.cli import main; sys.exit(main())" "$@"\n' \
  "$python_path" > "$BIN/tandem-shard"
printf '#!/bin/sh\nexec "%s" -c "from tandem_router import main; main()" "$@"\n' "$python_path" > "$BIN/tandem-router"
chmod +x "$BIN/tandem-shard" "$BIN/tandem-router"
export PATH="$BIN:$PATH"

"$PYTHON" - <<'PY'
import importlib
import sys

modules = [
    "torch", "triton", "transformers", "grpc", "google.protobuf", "safetensors", "tokenizers", "numpy",
    "prometheus_client", "aiohttp", "tqdm", "huggingface_hub", "pytest", "llguidance", "psutil", "matplotlib",
    "tandem_router._native", "tandem_server.rpc.generated.shard_pb2",
]
missing = []
for name in modules:
    try:
        importlib.import_module(name)
    except Exception as error:  # any import failure makes the check impossible
        missing.append(f"{name} ({error})")
if missing:
    sys.exit("gpu-check: cannot import " + "; ".join(missing) + "\n  prepare with scripts/gpu_check_bundle.sh and carry .gpu-check/")
import torch

if not torch.cuda.is_available():
    sys.exit("gpu-check: no CUDA device is visible")
print(f"gpu-check: torch {torch.__version__}, {torch.cuda.get_device_name(0)}, python {sys.version.split()[0]}")
PY

exec timeout --signal=TERM --kill-after=20 "$LIMIT_S" "$PYTHON" -m tandem_bench.gpu_check "$@"
