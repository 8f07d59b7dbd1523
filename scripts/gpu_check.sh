#!/usr/bin/env bash
# `make gpu-check` on a CUDA machine: runs tandem_bench.gpu_check from this working tree (no install, no registry).
# Needs torch, triton and transformers on the machine, plus what scripts/gpu_check_bundle.sh prepared.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
BUNDLE="$PWD/.gpu-check"
# Whole check, from a cold start: the issue's limit.
LIMIT_S=${GPU_CHECK_LIMIT_S:-570}

# Unpacks what scripts/gpu_check_bundle.sh prepared: packages per Python version, tokenizer, router extension,
# protobuf code, and flash-attn-4 when it was bundled.
for archive in "$BUNDLE/bundle.tar.xz" "$BUNDLE/flash-attn-4.tar.xz"; do
  if [ -f "$archive" ]; then
    "$PYTHON" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(filter="data")' "$archive"
  fi
done
python_version=$("$PYTHON" -c 'import sys; print(f"{sys.version_info.major}.{sys.version_info.minor}")')
if [ -d "$BUNDLE" ] && [ ! -d "$BUNDLE/site-$python_version" ]; then
  echo "gpu-check: the bundle has no packages for Python $python_version ($(ls -d "$BUNDLE"/site-* 2>/dev/null | xargs -n1 basename | tr '\n' ' '));" \
    "run GPU_CHECK_PYTHON_VERSIONS=$python_version make gpu-check-bundle" >&2
  exit 1
fi
# The machine's own pytest plugins may not match the bundled pytest.
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
SITES="$BUNDLE/site-$python_version:$BUNDLE/flash-site-$python_version"
export PYTHONPATH="$PWD/server:$PWD/launcher:$PWD/benchmark:$PWD/router/python:$SITES${PYTHONPATH:+:$PYTHONPATH}"
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
