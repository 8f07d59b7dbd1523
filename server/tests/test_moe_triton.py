"""The fused MoE Triton kernels (CUDA's MoE path): their numbers under Triton's interpreter, their ahead-of-time
compile for sm80 and sm90 within shared memory, the block schedule they run over, and where the experts use them."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import torch

# Imported here: its first import, run inside a fake CUDA step, would meet FakeCuda's torch.Generator.
import torch._dynamo
from fake_cuda import FakeCuda
from tandem_server.distributed import ParallelContext
from tandem_server.layers.moe import experts as experts_module
from tandem_server.layers.moe.block_schedule import max_blocks, schedule_blocks
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.routing import Routing
from triton_testing import SHARED_MEMORY, assert_cases_pass_under_the_interpreter, compile_all

triton = pytest.importorskip("triton")

from tandem_server.layers.moe import triton_grouped  # noqa: E402

HIDDEN, INTERMEDIATE, EXPERTS = 32, 20, 5
# Token 0 -> experts 3, 0; token 1 -> 0, 1; token 2 -> 3, 1: experts 2 and 4 get no token.
CHOSEN = torch.tensor([[3, 0], [0, 1], [3, 1]])


@pytest.mark.slow
def test_moe_kernels_match_the_grouped_gemm_dispatch_under_the_interpreter() -> None:
    """Runs moe_triton_cases.py with TRITON_INTERPRET=1, which must be set before Triton is first imported."""
    assert_cases_pass_under_the_interpreter("moe_triton_cases.py")


def test_each_expert_owns_whole_blocks_of_its_pairs_and_the_rest_is_padding() -> None:
    schedule = schedule_blocks(CHOSEN, EXPERTS, block_m=2)
    # Pairs flattened: 0 -> expert 3, 1 -> 0, 2 -> 0, 3 -> 1, 4 -> 3, 5 -> 1; 6 marks a padding row.
    assert schedule.pair_rows.tolist() == [1, 2, 3, 5, 0, 4, 6, 6, 6, 6]
    # Experts 0, 1 and 3 own a block each; the last two blocks (room for five experts' padding) belong to none.
    assert schedule.block_experts.tolist() == [0, 1, 3, EXPERTS, EXPERTS]


def test_a_partly_filled_block_pads_its_expert_run() -> None:
    schedule = schedule_blocks(torch.tensor([[2], [2], [2], [0]]), 3, block_m=2)
    # Expert 0's pair 3 and a padding row (4), then expert 2's pairs 0, 1 and 2 and a padding row.
    assert schedule.pair_rows.tolist() == [3, 4, 0, 1, 2, 4]
    assert schedule.block_experts.tolist() == [0, 2, 2]


@pytest.mark.parametrize(
    ("pairs", "experts", "block_m", "expected"), [(1, 64, 16, 1), (8, 64, 16, 8), (4096, 64, 64, 127)]
)
def test_the_block_count_covers_the_worst_padding_of_the_pair_count(
    pairs: int, experts: int, block_m: int, expected: int
) -> None:
    assert max_blocks(pairs, experts, block_m) == expected


def test_the_schedule_reads_nothing_on_the_host_so_a_cuda_graph_captures_it(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(free_bytes=2**30).install(monkeypatch)

    def capture() -> list[int]:
        torch.cuda.set_device(0)
        chosen = CHOSEN.to("cuda")
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            schedule = schedule_blocks(chosen, EXPERTS, block_m=2)
        return schedule.block_experts.tolist()

    with ThreadPoolExecutor(max_workers=1) as worker:
        assert worker.submit(capture).result() == [0, 1, 3, EXPERTS, EXPERTS]


def _experts(hidden_act: str = "silu") -> RoutedExperts:
    experts = RoutedExperts(EXPERTS, HIDDEN, INTERMEDIATE, hidden_act, ParallelContext())
    for param in experts.parameters():
        torch.nn.init.normal_(param)
    return experts


def _dispatched(experts: RoutedExperts, device: str, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the experts took for one step on `device` (a fake CUDA device's tensors live on the CPU)."""
    taken: list[str] = []

    def fused(hidden: torch.Tensor, routing: Routing, gate_up: torch.Tensor, down: torch.Tensor) -> torch.Tensor:
        assert gate_up is experts.gate_up and down is experts.down
        taken.append("triton")
        return torch.zeros_like(hidden)

    def grouped_mm(hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
        taken.append("grouped_mm")
        return torch.zeros_like(hidden)

    monkeypatch.setattr(experts_module, "fused_experts_on_cuda", fused)
    monkeypatch.setattr(experts, "grouped_mm", grouped_mm)

    def step() -> None:
        if device == "cuda":
            torch.cuda.set_device(0)
        routing = Routing(CHOSEN.to(device), torch.rand(3, 2, device=device))
        with torch.no_grad():
            experts(torch.randn(3, HIDDEN, device=device), routing)

    with ThreadPoolExecutor(max_workers=1) as worker:
        worker.submit(step).result()
    return taken


def test_silu_experts_take_the_triton_kernels_on_cuda_and_the_grouped_gemm_on_the_cpu(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _dispatched(_experts(), "cpu", monkeypatch) == ["grouped_mm"]
    FakeCuda(free_bytes=2**30).install(monkeypatch)
    assert _dispatched(_experts(), "cuda", monkeypatch) == ["triton"]


def test_experts_of_another_activation_keep_the_grouped_gemm_on_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    FakeCuda(free_bytes=2**30).install(monkeypatch)
    assert _dispatched(_experts("gelu"), "cuda", monkeypatch) == ["grouped_mm"]


@dataclass(frozen=True)
class CompileCase:
    arch: int
    num_pairs: int
    dtype: str

    @property
    def name(self) -> str:
        return f"sm{self.arch}-{self.num_pairs}pairs-{self.dtype}"


TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# With 64 experts: a decode step (16-row blocks) and a prefill chunk (64-row blocks).
COMPILED_EXPERTS = 64


def compile_matrix() -> list[CompileCase]:
    return [CompileCase(arch, pairs, dtype) for arch in SHARED_MEMORY for pairs in (8, 8192) for dtype in TORCH_DTYPES]


def compile_case(case: CompileCase) -> list[int]:
    """The shared memory (bytes) of the gate-up and the down kernel."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    config = triton_grouped.tile_config(case.num_pairs, COMPILED_EXPERTS, TORCH_DTYPES[case.dtype])
    constants = {"NUM_EXPERTS": COMPILED_EXPERTS, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
    constants |= {"BLOCK_K": config.block_k, "IEEE": case.dtype == "fp32"}
    index = {"pair_rows_ptr": "*i32", "block_experts_ptr": "*i32"}
    sizes = dict.fromkeys(("num_pairs", "hidden", "intermediate"), "i32")
    gate_up = {"x_ptr": f"*{case.dtype}", "gate_up_ptr": f"*{case.dtype}", **index, "out_ptr": f"*{case.dtype}"}
    down = {"activated_ptr": f"*{case.dtype}", "down_ptr": f"*{case.dtype}", **index}
    down |= {"routing_weights_ptr": f"*{case.dtype}", "out_ptr": f"*{case.dtype}"}
    kernels = [
        (triton_grouped._gate_up_silu, gate_up | sizes | dict.fromkeys(("TOP_K", *constants), "constexpr"), 4),
        (triton_grouped._down_weighted, down | sizes | dict.fromkeys(constants, "constexpr"), None),
    ]
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    target = GPUTarget("cuda", case.arch, 32)
    shared = []
    for kernel, signature, top_k in kernels:
        values = constants if top_k is None else {"TOP_K": top_k, **constants}
        compiled = triton.compile(ASTSource(kernel, signature, values), target=target, options=options)
        shared.append(compiled.metadata.shared)
    return shared


@pytest.fixture(scope="module")
def compiled() -> dict[CompileCase, list[int]]:
    return compile_all(compile_matrix(), compile_case)


@pytest.mark.slow
@pytest.mark.parametrize("case", compile_matrix(), ids=lambda case: case.name)
def test_moe_kernels_compile_ahead_of_time_within_shared_memory(
    compiled: dict[CompileCase, list[int]], case: CompileCase
) -> None:
    assert max(compiled[case]) <= SHARED_MEMORY[case.arch], f"{case.name} needs {compiled[case]} bytes"


def test_the_compile_matrix_reaches_both_block_sizes() -> None:
    configs = {
        triton_grouped.tile_config(case.num_pairs, COMPILED_EXPERTS, torch.bfloat16) for case in compile_matrix()
    }
    assert {config.block_m for config in configs} == {16, 64}


def test_the_pair_count_is_never_specialised() -> None:
    for kernel in (triton_grouped._gate_up_silu, triton_grouped._down_weighted):
        assert {param.name for param in kernel.params if param.do_not_specialize} == {"num_pairs"}
