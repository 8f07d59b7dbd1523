"""The machine's roofline for torch on CPU: float32 matmul FLOP/s (square and at the model's own shapes), bfloat16
matmul FLOP/s (square) and copy bandwidth, measured in the same run as the workloads they put into perspective."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from tandem_bench.mfu import TransformerShape

SQUARE = 2048
COPY_BYTES = 256 * 2**20


@dataclass(frozen=True)
class Roofline:
    """Best of several timed runs each; `model_flops` is the decode step's matmuls at `batch` rows."""

    square_flops: float
    model_flops: float
    bf16_square_flops: float
    batch: int
    copy_bytes_per_s: float
    threads: int

    @property
    def peak_flops(self) -> float:
        """The float32 peak: the larger of the two float32 matmul figures."""
        return max(self.square_flops, self.model_flops)

    def peak_for(self, precision: str) -> float:
        return self.bf16_square_flops if precision == "bfloat16" else self.peak_flops

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "peak_flops": self.peak_flops}


def _best_seconds(run: Any, repeats: int) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def model_matmuls(shape: TransformerShape, batch: int) -> list[tuple[int, int, int, int]]:
    """(rows, inner, columns, times per step) of one decode step's weight matmuls: fused qkv, o, fused gate/up and
    down in every layer, then the LM head."""
    h, d, layers = shape.hidden_size, shape.head_dim, shape.num_layers
    qkv = d * (shape.num_heads + 2 * shape.num_kv_heads)
    return [
        (batch, h, qkv, layers),
        (batch, shape.num_heads * d, h, layers),
        (batch, h, 2 * shape.intermediate_size, layers),
        (batch, shape.intermediate_size, h, layers),
        (batch, h, shape.vocab_size, 1),
    ]


def measure_roofline(shape: TransformerShape, batch: int, repeats: int = 5) -> Roofline:
    import torch  # noqa: PLC0415  (the load generator itself never needs torch)

    a, b = torch.randn(SQUARE, SQUARE), torch.randn(SQUARE, SQUARE)
    square = 2 * SQUARE**3 / _best_seconds(lambda: torch.mm(a, b), repeats)
    a16, b16 = a.bfloat16(), b.bfloat16()
    bf16_square = 2 * SQUARE**3 / _best_seconds(lambda: torch.mm(a16, b16), repeats)
    flops = seconds = 0.0
    for rows, inner, columns, times in model_matmuls(shape, batch):
        x, w = torch.randn(rows, inner), torch.randn(columns, inner)
        # Weights are stored [out, in] and multiplied transposed, as torch.nn.functional.linear does.
        seconds += times * _best_seconds(lambda x=x, w=w: torch.nn.functional.linear(x, w), repeats)
        flops += times * 2 * rows * inner * columns
    source = torch.empty(COPY_BYTES // 4)
    target = torch.empty_like(source)
    # A copy reads and writes every byte.
    copy = 2 * COPY_BYTES / _best_seconds(lambda: target.copy_(source), repeats)
    return Roofline(square, flops / seconds, bf16_square, batch, copy, torch.get_num_threads())
