"""Run as a script: loads a checkpoint with `--quantize MODE` semantics and prints the resident memory it added, in
bytes, as JSON (a fresh process, so nothing else the tests loaded is counted)."""

from __future__ import annotations

import gc
import json
import sys
from pathlib import Path

import torch
from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import quantize_model


def resident_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def main(model_path: str, mode_name: str) -> None:
    mode = QuantizeMode(mode_name)
    checkpoint = read_checkpoint_config(Path(model_path))
    gc.collect()
    before = resident_bytes()
    model = load_model(
        checkpoint, torch.float32, torch.device("cpu"), ParallelContext(), TorchAttentionBackend(),
        gguf_blocks=mode is QuantizeMode.GGUF,
    )  # fmt: skip
    report = quantize_model(model, mode)
    gc.collect()
    print(json.dumps({"added": resident_bytes() - before, "weight_bytes": report.weight_bytes}))


if __name__ == "__main__":
    main(*sys.argv[1:])
