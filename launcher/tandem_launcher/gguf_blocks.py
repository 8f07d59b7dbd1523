"""Keeps a GGUF's Q4_0/Q4_1/Q8_0 tensors as their raw blocks beside the float conversion, for quantized serving.

Each block tensor is stored under the name of the float tensor it dequantizes to, with its rows put in the same order
as the conversion put the float tensor's rows (the Llama family's q/k rows are permuted); a tensor is kept only when
its blocks dequantize exactly to the float tensor the conversion wrote.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file
from tandem_server.weights.gguf_format import BLOCK_BYTES, GGUF_BLOCKS_DIR, GGUF_TYPES_KEY
from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, get_gguf_hf_weights_map

logger = logging.getLogger(__name__)
FLOAT_TYPES = frozenset({"F32", "F16", "BF16"})


def write_gguf_blocks(gguf_path: Path, model: Any, output_dir: Path) -> int:
    """Writes `output_dir/GGUF_BLOCKS_DIR/model.safetensors`; returns how many tensors it keeps as blocks."""
    reader = GGUFReader(gguf_path)
    architecture = str(reader.fields["general.architecture"].contents())
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    hf_names = get_gguf_hf_weights_map(model, processor)
    float_tensors = model.state_dict()
    kept: dict[str, torch.Tensor] = {}
    types: dict[str, str] = {}
    unsupported: Counter[str] = Counter()
    for tensor in reader.tensors:
        gguf_type = tensor.tensor_type.name
        if gguf_type not in BLOCK_BYTES or len(tensor.data.shape) != 2:
            if gguf_type not in FLOAT_TYPES:
                unsupported[gguf_type] += 1
            continue
        processed = processor.process(weights=np.asarray(tensor.data), name=tensor.name)
        hf_name = hf_names.get(processed.name)
        if hf_name is None or hf_name not in float_tensors or hf_name in kept:
            continue
        rows = np.array(processed.weights, order="C")
        if not np.array_equal(dequantize(rows, tensor.tensor_type), float_tensors[hf_name].numpy()):
            logger.warning("%s (%s) stays float: its blocks do not match the conversion", tensor.name, gguf_type)
            continue
        kept[hf_name] = torch.from_numpy(rows)
        types[hf_name] = gguf_type
    if unsupported:
        logger.warning(
            "%s served dequantized to float32: --quantize gguf keeps only %s tensors quantized",
            ", ".join(f"{count} {kind} tensors" for kind, count in sorted(unsupported.items())),
            "/".join(BLOCK_BYTES),
        )
    if kept:
        blocks_dir = output_dir / GGUF_BLOCKS_DIR
        blocks_dir.mkdir()
        save_file(kept, str(blocks_dir / "model.safetensors"), metadata={GGUF_TYPES_KEY: json.dumps(types)})
    return len(kept)
