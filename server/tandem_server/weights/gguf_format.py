"""Where a converted GGUF model keeps tensors as raw GGUF blocks, and their layout; torch-free for the launcher.

A converted GGUF model may carry, beside its float32 safetensors, `GGUF_BLOCKS_DIR/*.safetensors` holding some tensors
as uint8 rows of GGUF blocks (one row per output feature, `BLOCK_VALUES` input features per block), under the float
tensor's name; the file's metadata names each tensor's GGUF type under `GGUF_TYPES_KEY`.
"""

from __future__ import annotations

from pathlib import Path

GGUF_BLOCKS_DIR = "gguf-blocks"
GGUF_TYPES_KEY = "gguf_types"
BLOCK_VALUES = 32
# Bytes per block: a float16 scale (and for Q4_1 a float16 minimum) then the packed values.
BLOCK_BYTES = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
QUANTIZE_CHOICES = ("none", "gguf", "int8", "int4", "fp8")


def has_gguf_blocks(model_path: Path) -> bool:
    """Whether the model directory carries kept GGUF blocks."""
    return any((model_path / GGUF_BLOCKS_DIR).glob("*.safetensors"))
