"""The fused MoE Triton kernels against the experts' grouped-GEMM dispatch on the CPU: run on CUDA, or on CPU by
Triton's interpreter.

Not collected by default (no `test_` prefix): `test_moe_triton.py` runs it in a subprocess with TRITON_INTERPRET=1
(which must be set before Triton is first imported); `make gpu-check` runs it on the GPU. The reference always runs
on the CPU in float32, from the same (rounded) inputs and weights.
"""

from __future__ import annotations

import os

import pytest
import torch
from tandem_server.distributed import ParallelContext
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.routing import Routing
from triton_testing import widen_bfloat16_dots

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CUDA = torch.cuda.is_available() and not INTERPRETED
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
HIDDEN, INTERMEDIATE = 32, 20

if not ON_CUDA and not INTERPRETED:
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)

if INTERPRETED:
    widen_bfloat16_dots()

from tandem_server.layers.moe import triton_grouped  # noqa: E402


def random_experts(num_experts: int, dtype: torch.dtype, seed: int) -> RoutedExperts:
    """Float32 experts on the CPU whose weights `dtype` holds exactly."""
    torch.manual_seed(seed)
    experts = RoutedExperts(num_experts, HIDDEN, INTERMEDIATE, "silu", ParallelContext())
    with torch.no_grad():
        for param in experts.parameters():
            param.copy_((torch.randn_like(param) / 4).to(dtype))
    return experts


def random_routing(tokens: int, top_k: int, allowed: list[int], dtype: torch.dtype, seed: int) -> Routing:
    """Each token's `top_k` distinct experts among `allowed`, with weights that `dtype` holds exactly."""
    generator = torch.Generator().manual_seed(seed)
    scores = torch.rand(tokens, len(allowed), generator=generator)
    chosen = torch.tensor(allowed)[scores.topk(top_k, dim=-1).indices]
    return Routing(chosen, torch.rand(tokens, top_k, generator=generator).to(dtype).float())


def fused_on_device(experts: RoutedExperts, hidden: torch.Tensor, routing: Routing, dtype: torch.dtype) -> torch.Tensor:
    device_routing = Routing(routing.experts.to(DEVICE), routing.weights.to(DEVICE, dtype))
    stacks = (experts.gate_up.to(DEVICE, dtype), experts.down.to(DEVICE, dtype))
    output = triton_grouped.fused_experts(hidden.to(DEVICE, dtype), device_routing, *stacks)
    assert output.dtype == dtype and output.shape == hidden.shape
    return output.cpu().float()


# float32: IEEE dots, so only the order of float32 sums differs. bfloat16: the down projection's inputs, each pair's
# weighted output and the sum are rounded to bfloat16 (unit roundoff 2^-8), each a relative error of the output's scale;
# measured up to 1.1%.
RELATIVE_TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 2e-2}
CASES = {
    "top1-5experts-1token": (5, 1, 1, None),
    "top2-5experts-3tokens": (5, 2, 3, None),
    "top2-7experts-17tokens-experts-0-and-6-idle": (7, 2, 17, [1, 2, 3, 4, 5]),
    "top4-5experts-1token": (5, 4, 1, None),
    "top4-5experts-40tokens": (5, 4, 40, None),
    "top4-5experts-80tokens-64-row-blocks": (5, 4, 80, None),
    "top1-3experts-9tokens-only-expert-1": (3, 1, 9, [1]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("case", CASES)
def test_fused_kernels_equal_the_grouped_gemm_dispatch(case: str, dtype: torch.dtype) -> None:
    num_experts, top_k, tokens, allowed = CASES[case]
    experts = random_experts(num_experts, dtype, seed=tokens + top_k)
    hidden = torch.randn(tokens, HIDDEN, generator=torch.Generator().manual_seed(tokens)).to(dtype).float()
    routing = random_routing(tokens, top_k, allowed or list(range(num_experts)), dtype, seed=num_experts)
    with torch.no_grad():
        expected = experts.grouped_mm(hidden, routing)
    output = fused_on_device(experts, hidden, routing, dtype)
    tolerance = RELATIVE_TOLERANCE[dtype] * float(expected.abs().max())
    torch.testing.assert_close(output, expected, atol=tolerance, rtol=0)


def test_the_cases_reach_both_block_sizes_and_idle_experts() -> None:
    block_rows = {
        triton_grouped.tile_config(tokens * top_k, num_experts, torch.bfloat16).block_m
        for num_experts, top_k, tokens, _ in CASES.values()
    }
    assert block_rows == {16, 64}
    assert any(allowed for *_, allowed in CASES.values())


def test_a_step_without_tokens_gives_an_empty_output() -> None:
    experts = random_experts(3, torch.float32, seed=0)
    routing = Routing(torch.zeros(0, 2, dtype=torch.long), torch.zeros(0, 2))
    assert fused_on_device(experts, torch.zeros(0, HIDDEN), routing, torch.float32).shape == (0, HIDDEN)
