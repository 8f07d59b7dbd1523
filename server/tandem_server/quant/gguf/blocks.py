"""GGUF quantized tensors kept as their raw blocks (layout in `weights/gguf_format.py`): decoding, exact dequantization,
per-rank slicing."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from tandem_server.quant.values import INT4_MIDPOINT, Int4Groups, Int8Groups
from tandem_server.weights.gguf_format import BLOCK_BYTES, BLOCK_VALUES, GGUF_BLOCKS_DIR, GGUF_TYPES_KEY
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor


@dataclass(frozen=True)
class GgufBlocks:
    """Rows of GGUF blocks of one type: `[out features, in features / BLOCK_VALUES * block bytes]` uint8."""

    gguf_type: str
    raw: torch.Tensor

    @property
    def in_features(self) -> int:
        return self.raw.shape[1] // BLOCK_BYTES[self.gguf_type] * BLOCK_VALUES

    def unpack(self) -> Int4Groups | Int8Groups:
        """The blocks' values exactly: Q4_0/Q4_1 as int4 groups, Q8_0 as int8 groups."""
        if self.gguf_type == "Q8_0":
            blocks = self.raw.view(self.raw.shape[0], -1, BLOCK_BYTES["Q8_0"])
            scale = _halves(blocks[..., :2])
            return Int8Groups(blocks[..., 2:].contiguous().view(torch.int8).reshape(self.raw.shape[0], -1), scale)
        return _unpack_q4(self.raw, self.gguf_type)

    def dequantize(self) -> torch.Tensor:
        """The exact float32 values llama.cpp computes from these blocks (Q4_1 as q d + m, in that order)."""
        if self.gguf_type != "Q4_1":
            return self.unpack().dequantize()
        values = _unpack_q4(self.raw, self.gguf_type)
        minimum = _halves(self.raw.view(self.raw.shape[0], -1, BLOCK_BYTES["Q4_1"])[..., 2:4])
        grouped = values.q.view(*values.scale.shape, BLOCK_VALUES).float() * values.scale.unsqueeze(-1)
        return (grouped + minimum.unsqueeze(-1)).view(self.raw.shape[0], -1)


def _halves(pairs: torch.Tensor) -> torch.Tensor:
    """float32 values of little-endian float16s stored as byte pairs `[..., 2]`."""
    return pairs.contiguous().view(torch.float16).float().squeeze(-1)


def _unpack_q4(raw: torch.Tensor, gguf_type: str) -> Int4Groups:
    rows = raw.shape[0]
    blocks = raw.view(rows, -1, BLOCK_BYTES[gguf_type])
    scale = _halves(blocks[..., :2])
    packed = blocks[..., -16:]
    # Byte j holds value j in its low nibble and value j + 16 in its high nibble.
    q = torch.cat([packed & 0x0F, packed >> 4], dim=-1).reshape(rows, -1)
    if gguf_type == "Q4_0":  # w = (q - 8) * d
        zero = torch.zeros_like(scale)
    else:  # Q4_1: w = q * d + m = (q - 8) * d + (m + 8 d)
        zero = _halves(blocks[..., 2:4]) + INT4_MIDPOINT * scale
    return Int4Groups(q, scale, zero)


def read_blocks(tensor: CheckpointTensor, gguf_type: str, part: CheckpointSlice | None) -> GgufBlocks:
    """This rank's `part` of a blocks tensor; a split of the input features must fall on block boundaries."""
    if part is not None and part.dim == 1:
        block_bytes = BLOCK_BYTES[gguf_type]
        if part.start % BLOCK_VALUES or part.stop % BLOCK_VALUES:
            raise ValueError(
                f"input features [{part.start}, {part.stop}) split a {gguf_type} block of {BLOCK_VALUES}; "
                "serve this model unquantized (--quantize none) or on fewer shards"
            )
        part = CheckpointSlice(1, part.start // BLOCK_VALUES * block_bytes, part.stop // BLOCK_VALUES * block_bytes)
    return GgufBlocks(gguf_type, tensor.read(part))


def iterate_block_tensors(model_path: Path) -> Iterator[tuple[str, str, CheckpointTensor]]:
    """`(checkpoint name, GGUF type, unread blocks)` for every tensor under `GGUF_BLOCKS_DIR`, if it exists."""
    for file in sorted((model_path / GGUF_BLOCKS_DIR).glob("*.safetensors")):
        with safe_open(str(file), framework="pt", device="cpu") as handle:
            types = json.loads((handle.metadata() or {}).get(GGUF_TYPES_KEY, "{}"))
            for name in handle.keys():
                gguf_type = types.get(name)
                if gguf_type in BLOCK_BYTES:
                    yield name, gguf_type, CheckpointTensor(handle.get_slice(name))
