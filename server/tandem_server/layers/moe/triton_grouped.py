"""The routed experts on CUDA as two Triton grouped GEMMs over the block schedule (`block_schedule`); imported only
when the experts run on a CUDA device.

The first kernel multiplies each block's rows by its expert's `gate_up [experts, 2 * intermediate, hidden]` stack
and keeps `silu(gate) * up` (gate rows first, as `experts.py` stacks them); the second multiplies that by the
expert's `down [experts, hidden, intermediate]`, scales each row by its routing weight and writes it to its pair's
row; summing each token's `top_k` rows in float32 gives its output, in a fixed order (no atomics). Products
accumulate in float32; float32 models get IEEE float32 dots (never TF32). Every launch's grid follows from the token
count, so nothing reads the routing on the host and CUDA graphs capture MoE steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from tandem_server.layers.moe.block_schedule import BlockSchedule, schedule_blocks
from tandem_server.layers.moe.routing import Routing

# A block of 16 rows (tl.dot's least) while experts average fewer than this many pairs (decodes), 64 above.
LARGE_BLOCK_PAIRS = 64


@dataclass(frozen=True)
class TileConfig:
    """A launch's tile sizes: rows per expert block, output features and inputs per tile."""

    block_m: int
    block_n: int
    block_k: int
    num_warps: int
    num_stages: int


def tile_config(num_pairs: int, num_experts: int, dtype: torch.dtype) -> TileConfig:
    """Tiles for a step of `num_pairs` token-expert pairs. Not yet timed on a GPU; each compiles within sm80's and
    sm90's shared memory (`test_moe_triton.py`)."""
    block_m = 64 if num_pairs >= LARGE_BLOCK_PAIRS * num_experts else 16
    block_k = 32 if dtype == torch.float32 else 64
    return TileConfig(block_m, 64, block_k, num_warps=4, num_stages=3)


@triton.jit
def _dot(a, b, acc, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    return tl.dot(a, b, acc)


@triton.jit(do_not_specialize=["num_pairs"])
def _gate_up_silu(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    x_ptr,
    gate_up_ptr,
    pair_rows_ptr,
    block_experts_ptr,
    out_ptr,
    num_pairs,
    hidden,
    intermediate,
    TOP_K: tl.constexpr,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """`silu(gate) * up` of one block's rows for one tile of intermediate features: `out [blocks * BLOCK_M,
    intermediate]`, a padding row's zeros."""
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= NUM_EXPERTS:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_rows_ptr + rows)
    valid = pairs < num_pairs
    tokens = (pairs // TOP_K).to(tl.int64)
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    feature_mask = features < intermediate
    inputs = tl.arange(0, BLOCK_K)
    weights = gate_up_ptr + expert.to(tl.int64) * 2 * intermediate * hidden
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, hidden, BLOCK_K):
        k = start + inputs
        k_mask = k < hidden
        x = tl.load(x_ptr + tokens[:, None] * hidden + k[None, :], mask=valid[:, None] & k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & feature_mask[None, :]
        w_gate = tl.load(weights + features[None, :] * hidden + k[:, None], mask=w_mask, other=0.0)
        w_up = tl.load(weights + (intermediate + features[None, :]) * hidden + k[:, None], mask=w_mask, other=0.0)
        gate = _dot(x, w_gate, gate, IEEE)
        up = _dot(x, w_up, up, IEEE)
    activated = gate * tl.sigmoid(gate) * up
    offsets = rows[:, None].to(tl.int64) * intermediate + features[None, :]
    tl.store(out_ptr + offsets, activated.to(out_ptr.dtype.element_ty), mask=feature_mask[None, :])


@triton.jit(do_not_specialize=["num_pairs"])
def _down_weighted(  # noqa: PLR0913, PLR0917  (kernel: arguments are registers)
    activated_ptr,
    down_ptr,
    pair_rows_ptr,
    block_experts_ptr,
    routing_weights_ptr,
    out_ptr,
    num_pairs,
    hidden,
    intermediate,
    NUM_EXPERTS: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    IEEE: tl.constexpr,
):
    """One block's rows times its expert's down projection for one tile of hidden features, each row scaled by its
    routing weight and stored at its pair's row of `out [pairs, hidden]`."""
    block = tl.program_id(0)
    expert = tl.load(block_experts_ptr + block)
    if expert >= NUM_EXPERTS:
        return
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    pairs = tl.load(pair_rows_ptr + rows)
    valid = pairs < num_pairs
    features = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    feature_mask = features < hidden
    inputs = tl.arange(0, BLOCK_K)
    weights = down_ptr + expert.to(tl.int64) * hidden * intermediate
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for start in range(0, intermediate, BLOCK_K):
        k = start + inputs
        k_mask = k < intermediate
        a_offsets = rows[:, None].to(tl.int64) * intermediate + k[None, :]
        a = tl.load(activated_ptr + a_offsets, mask=k_mask[None, :], other=0.0)
        w_mask = k_mask[:, None] & feature_mask[None, :]
        w = tl.load(weights + features[None, :] * intermediate + k[:, None], mask=w_mask, other=0.0)
        acc = _dot(a, w, acc, IEEE)
    routing_weight = tl.load(routing_weights_ptr + pairs, mask=valid, other=0.0).to(tl.float32)
    acc = acc * routing_weight[:, None]
    offsets = pairs[:, None].to(tl.int64) * hidden + features[None, :]
    tl.store(out_ptr + offsets, acc.to(out_ptr.dtype.element_ty), mask=valid[:, None] & feature_mask[None, :])


def fused_experts(hidden: torch.Tensor, routing: Routing, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
    """Each token's chosen SiLU experts' outputs, weighted and summed `[tokens, hidden]` in `hidden`'s dtype, for
    stacks `gate_up [experts, 2 * intermediate, hidden]` and `down [experts, hidden, intermediate]` of that dtype."""
    tokens, top_k = routing.experts.shape
    num_experts, hidden_size, intermediate = down.shape
    if tokens == 0:
        return torch.zeros_like(hidden)
    config = tile_config(tokens * top_k, num_experts, hidden.dtype)
    schedule = schedule_blocks(routing.experts, num_experts, config.block_m)
    activated = _gate_up(hidden.contiguous(), gate_up, schedule, config, top_k)
    pair_outputs = hidden.new_empty(tokens * top_k, hidden_size)
    grid = (schedule.block_experts.numel(), triton.cdiv(hidden_size, config.block_n))
    _down_weighted[grid](
        activated, down, schedule.pair_rows, schedule.block_experts, routing.weights.reshape(-1).contiguous(),
        pair_outputs, tokens * top_k, hidden_size, intermediate, NUM_EXPERTS=num_experts, BLOCK_M=config.block_m,
        BLOCK_N=config.block_n, BLOCK_K=config.block_k, IEEE=hidden.dtype == torch.float32,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )  # fmt: skip
    return pair_outputs.view(tokens, top_k, hidden_size).sum(1, dtype=torch.float32).to(hidden.dtype)


def _gate_up(
    hidden: torch.Tensor, gate_up: torch.Tensor, schedule: BlockSchedule, config: TileConfig, top_k: int
) -> torch.Tensor:
    """The first kernel's `silu(gate) * up` rows `[blocks * block_m, intermediate]` in the schedule's order."""
    num_experts, double_intermediate, hidden_size = gate_up.shape
    intermediate = double_intermediate // 2
    blocks = schedule.block_experts.numel()
    activated = hidden.new_empty(blocks * schedule.block_m, intermediate)
    grid = (blocks, triton.cdiv(intermediate, config.block_n))
    _gate_up_silu[grid](
        hidden, gate_up, schedule.pair_rows, schedule.block_experts, activated, hidden.shape[0] * top_k, hidden_size,
        intermediate, TOP_K=top_k, NUM_EXPERTS=num_experts, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
        BLOCK_K=config.block_k, IEEE=hidden.dtype == torch.float32, num_warps=config.num_warps,
        num_stages=config.num_stages,
    )  # fmt: skip
    return activated
