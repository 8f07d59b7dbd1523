"""A draft model cut from the served model itself: its first layers, its embeddings, final norm and LM head, and its
tokenizer (early-exit self-speculation). Same vocabulary by construction, so it can draft for the model it came from
wherever no smaller model of the same tokenizer exists."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def write_truncated_checkpoint(source: Path, target: Path, num_layers: int) -> Path:
    """Writes the first `num_layers` decoder layers of the safetensors checkpoint at `source` into `target`, with
    every file that is not a weight (config, tokenizer, generation config) copied alongside; returns `target`."""
    config = json.loads((source / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 0 < num_layers <= total:
        raise ValueError(f"{source} has {total} layers; a draft keeps between 1 and {total}, not {num_layers}")
    target.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for path in sorted(source.glob("*.safetensors")):
        for name, tensor in load_file(path).items():
            layer = _LAYER.search(name)
            if layer is None or int(layer.group(1)) < num_layers:
                tensors[name] = tensor.contiguous()
    if not tensors:
        raise ValueError(f"{source} holds no safetensors weights")
    save_file(tensors, target / "model.safetensors", metadata={"format": "pt"})
    for path in source.iterdir():
        if path.is_file() and path.suffix != ".safetensors" and not path.name.endswith(".safetensors.index.json"):
            shutil.copy2(path, target / path.name)
    (target / "config.json").write_text(json.dumps({**config, "num_hidden_layers": num_layers}, indent=2))
    return target
