#!/usr/bin/env bash
# Prepares what `make gpu-check` needs beyond the working tree on a GPU machine that has torch (CUDA 13), triton and
# transformers but no package registry. Run here (uv, registry access, a synced .venv); then carry .gpu-check/ along:
# .gpu-check/bundle.tar.xz (packages, tokenizer, router extension, protobuf code) and, unless GPU_CHECK_FLASH=0,
# .gpu-check/flash-attn-4.tar.xz (flash-attn-4 and its CuTe DSL compiler, about 75 MB) for the flash backend.
# scripts/gpu_check.sh unpacks both into the working tree and picks the packages of the Python it runs.
# Nothing here may shadow the machine's torch: no torch, triton or nvidia-* CUDA libraries, and cuda-bindings only in
# a folder of its own that gpu_check.sh uses where torch brought none (scripts/tests/test_install_gpu_bundle.py).
set -euo pipefail
cd "$(dirname "$0")/.."

BUNDLE=.gpu-check
# The GPU machine's Pythons, space-separated (abi3 router extension: any >= 3.10); each gets its own site folder.
PYTHON_VERSIONS=${GPU_CHECK_PYTHON_VERSIONS:-${GPU_CHECK_PYTHON_VERSION:-3.12}}
WITH_FLASH=${GPU_CHECK_FLASH:-1}
UV=${UV:-uv}
# flash-attn-4 and what it imports beyond torch, as uv.lock's `cuda` extra installs them for Python 3.12: the CuTe
# DSL's CUDA 13 libraries, matching the machine's torch.
FLASH_PACKAGES=(flash-attn-4==4.0.0b40 nvidia-cutlass-dsl==4.8.1 nvidia-cutlass-dsl-libs-base==4.8.1
                nvidia-cutlass-dsl-libs-core==4.8.1 nvidia-cutlass-dsl-libs-cu13==4.8.1 apache-tvm-ffi==0.1.15.post2
                torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5 einops==0.8.2)
# The CuTe DSL's CUDA driver bindings, which a CUDA 13 torch normally brings along.
CUDA_BINDINGS_PACKAGES=(cuda-bindings==13.5.0 cuda-pathfinder==1.9.1)

version() { "$UV" run --no-sync python -c "import importlib.metadata as m; print(m.version('$1'))"; }

test -f router/python/tandem_router/_native.abi3.so || { echo "router extension missing: run make install" >&2; exit 1; }
test -f server/tandem_server/rpc/generated/shard_pb2.py || { echo "protobuf code missing: run make install" >&2; exit 1; }

rm -rf "$BUNDLE"/site* "$BUNDLE"/flash-site* "$BUNDLE"/cuda-bindings-site* "$BUNDLE/tokenizer" \
  "$BUNDLE/flash-attn-4.tar.xz"
mkdir -p "$BUNDLE/tokenizer"
# Same versions as the synced environment: the generated protobuf code needs its own protobuf runtime.
packages=()
# grpcio too: the generated stubs refuse a grpcio older than the grpcio-tools that wrote them. fla-core (with einops):
# the recurrent layers' Triton kernels.
for name in grpcio llguidance protobuf prometheus-client aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl \
            pytest pluggy iniconfig pytest-timeout fla-core einops; do
  packages+=("$name==$(version "$name")")
done
sites=()
flash_sites=()
for python_version in $PYTHON_VERSIONS; do
  "$UV" pip install --quiet --no-deps --target "$BUNDLE/site-$python_version" --python-version "$python_version" \
    --python-platform x86_64-manylinux_2_28 "${packages[@]}"
  sites+=("$BUNDLE/site-$python_version")
  if [ "$WITH_FLASH" = 1 ]; then
    "$UV" pip install --quiet --no-deps --target "$BUNDLE/flash-site-$python_version" \
      --python-version "$python_version" --python-platform x86_64-manylinux_2_28 "${FLASH_PACKAGES[@]}"
    "$UV" pip install --quiet --no-deps --target "$BUNDLE/cuda-bindings-site-$python_version" \
      --python-version "$python_version" --python-platform x86_64-manylinux_2_28 "${CUDA_BINDINGS_PACKAGES[@]}"
    flash_sites+=("$BUNDLE/flash-site-$python_version" "$BUNDLE/cuda-bindings-site-$python_version")
  fi
done

# The embedded model's tokenizer, converted once by the launcher; the check pads it to Llama 3's vocabulary.
tokenizer_source=$("$UV" run --no-sync python -c "
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf
print(converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR))")
for name in tokenizer.json tokenizer_config.json chat_template.jinja generation_config.json; do
  if [ -f "$tokenizer_source/$name" ]; then cp "$tokenizer_source/$name" "$BUNDLE/tokenizer/"; fi
done
# One compressed archive keeps the copied tree small: the router extension is stripped of its symbols on the way.
stripped=$(mktemp -d)
trap 'rm -rf "$stripped"' EXIT
strip -o "$stripped/_native.abi3.so" router/python/tandem_router/_native.abi3.so
tar -cJf "$BUNDLE/bundle.tar.xz" "${sites[@]}" "$BUNDLE/tokenizer" server/tandem_server/rpc/generated \
  -C "$stripped" --transform 's,^_native,router/python/tandem_router/_native,' _native.abi3.so
if [ "${#flash_sites[@]}" -gt 0 ]; then
  XZ_OPT=-T0 tar -cJf "$BUNDLE/flash-attn-4.tar.xz" "${flash_sites[@]}"
fi
rm -rf "$BUNDLE"/site-* "$BUNDLE"/flash-site-* "$BUNDLE"/cuda-bindings-site-* "$BUNDLE/tokenizer"
du -sh "$BUNDLE"/*.tar.xz
