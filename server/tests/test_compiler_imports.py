"""A CPU shard that does not compile never imports Triton, Inductor or Dynamo: together they cost it about 200 MiB of
resident memory."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR
from tandem_launcher.embedded import converted_model_dir, embedded_gguf

# Run in a fresh interpreter: the test process has imported them already.
PROGRAM = """
import json, sys

import tandem_server.cli
from tandem_server.bootstrap import load_shard
from tandem_server.cli import config_from_args
from tandem_server.engine.step import WarmupPlan

def compilers():
    return sorted(name for name in ("triton", "torch._dynamo", "torch._inductor") if name in sys.modules)

imported = compilers()
shard = load_shard(config_from_args(sys.argv[1:]))
shard.runner.warmup(WarmupPlan(block_size=16, max_batch_tokens=64, max_batch_requests=8))
print(json.dumps({"imported": imported, "warmed": compilers()}))
"""


def test_a_cpu_shard_without_torch_compile_imports_no_compiler(tmp_path: Path) -> None:
    model = converted_model_dir(embedded_gguf(), DEFAULT_MODEL_CACHE_DIR)
    arguments = ["--model-path", str(model), "--uds-path", str(tmp_path / "shard.sock"), "--device", "cpu"]
    arguments += ["--dtype", "bfloat16", "--quantize", "gguf", "--quantized-dense-memory", "auto"]
    arguments += ["--kv-cache-memory", "16MiB", "--num-threads", "1", "--torch-compile", "off"]
    finished = subprocess.run(
        [sys.executable, "-c", PROGRAM, *arguments], capture_output=True, text=True, timeout=300, check=False
    )
    assert finished.returncode == 0, finished.stderr
    assert json.loads(finished.stdout.splitlines()[-1]) == {"imported": [], "warmed": []}
