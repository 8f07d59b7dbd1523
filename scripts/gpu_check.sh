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
# protobuf code, and flash-attn-4 when it was bundled. The folders an earlier bundle left go first, so that none of
# their packages outlives the archive that replaces them.
if [ -f "$BUNDLE/bundle.tar.xz" ]; then rm -rf "$BUNDLE"/site-*; fi
if [ -f "$BUNDLE/flash-attn-4.tar.xz" ]; then rm -rf "$BUNDLE"/flash-site-* "$BUNDLE"/cuda-bindings-site-*; fi
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
# The bundle's folders come before the machine's packages, so they hold nothing of its torch; the CuTe DSL's
# cuda-bindings join only where that torch brought none, so they never shadow the machine's own.
SITES="$BUNDLE/site-$python_version:$BUNDLE/flash-site-$python_version"
# Folders on PYTHONPATH run no .pth file, so the one that puts the CuTe DSL's `cutlass` on sys.path is done here.
SITES="$SITES:$BUNDLE/flash-site-$python_version/nvidia_cutlass_dsl/dsl_packages"
if ! "$PYTHON" -c 'import cuda.bindings' 2>/dev/null; then
  SITES="$SITES:$BUNDLE/cuda-bindings-site-$python_version"
fi
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

# The stack is served and swept once per attention backend: triton, then flash (flash-attn-4) where it imports.
# An --attention-backends among the arguments overrides this choice.
backends=(triton flash)
if ! flash_problem=$("$PYTHON" -c 'import flash_attn.cute' 2>&1); then
  echo "gpu-check: skipping the flash backend: flash-attn-4 does not import ($(tail -n 1 <<<"$flash_problem"))" >&2
  backends=(triton)
fi

exec timeout --signal=TERM --kill-after=20 "$LIMIT_S" "$PYTHON" -m tandem_bench.gpu_check \
  --attention-backends "${backends[@]}" "$@"
