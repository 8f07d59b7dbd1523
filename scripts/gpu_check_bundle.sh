#!/usr/bin/env bash
# Prepares what `make gpu-check` needs beyond the working tree on a GPU machine that has torch, triton and
# transformers but no package registry. Run here (uv, registry access, a synced .venv); then carry .gpu-check/ along:
# it holds one archive, .gpu-check/bundle.tar.xz, that scripts/gpu_check.sh unpacks into the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."

BUNDLE=.gpu-check
# The GPU machine's Python (abi3 router extension: any >= 3.10); pure-Python wheels are chosen where they exist.
PYTHON_VERSION=${GPU_CHECK_PYTHON_VERSION:-3.11}
UV=${UV:-uv}

version() { "$UV" run --no-sync python -c "import importlib.metadata as m; print(m.version('$1'))"; }

test -f router/python/tandem_router/_native.abi3.so || { echo "router extension missing: run make install" >&2; exit 1; }
test -f server/tandem_server/rpc/generated/shard_pb2.py || { echo "protobuf code missing: run make install" >&2; exit 1; }

rm -rf "$BUNDLE/site" "$BUNDLE/tokenizer"
mkdir -p "$BUNDLE/site" "$BUNDLE/tokenizer"
# Same versions as the synced environment: the generated protobuf code needs its own protobuf runtime.
packages=()
# grpcio too: the generated stubs refuse a grpcio older than the grpcio-tools that wrote them.
for name in grpcio llguidance protobuf prometheus-client aiohttp aiohappyeyeballs aiosignal attrs frozenlist multidict propcache yarl \
            pytest pluggy iniconfig pytest-timeout; do
  packages+=("$name==$(version "$name")")
done
"$UV" pip install --quiet --no-deps --target "$BUNDLE/site" --python-version "$PYTHON_VERSION" \
  --python-platform x86_64-manylinux_2_28 "${packages[@]}"

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
tar -cJf "$BUNDLE/bundle.tar.xz" "$BUNDLE/site" "$BUNDLE/tokenizer" server/tandem_server/rpc/generated \
  -C "$stripped" --transform 's,^_native,router/python/tandem_router/_native,' _native.abi3.so
rm -rf "$BUNDLE/site" "$BUNDLE/tokenizer"
du -sh "$BUNDLE/bundle.tar.xz"
