"""The recurrent layers' kernels: fla's Triton kernels against Tandem's torch forms under Triton's interpreter, the
decode kernels compiled ahead of time for sm80 and sm90 within shared memory, and CPU steps that run the torch forms
without importing fla.

Compiling needs no GPU (`triton_testing`); the compiled kernels are kept in `triton_testing.KERNEL_CACHE`.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from triton_testing import SHARED_MEMORY, assert_cases_pass_under_the_interpreter, compile_all

# fla-core is installed where Triton is (Linux).
triton = pytest.importorskip("triton")

# The layers' head sizes: Qwen3.5's and Qwen3-Next's delta rule (key and value heads of 128); Mamba-2's scan (heads of
# 64 over states of 128 or 256: fla's tiles stop at 64, so any larger state compiles the same tiles).
DELTA_RULE_SIZES = ((128, 128),)
SSD_SIZES = ((128, 64), (256, 64))


@pytest.mark.slow
def test_fla_kernels_match_the_torch_forms_under_the_interpreter() -> None:
    """Runs recurrent_kernel_cases.py with TRITON_INTERPRET=1, which must be set before Triton is first imported."""
    assert_cases_pass_under_the_interpreter("recurrent_kernel_cases.py")


@dataclass(frozen=True)
class DecodeCompileCase:
    arch: int
    kernel: str
    key_dim: int
    value_dim: int
    num_warps: int

    @property
    def name(self) -> str:
        return f"sm{self.arch}-{self.kernel}-k{self.key_dim}-v{self.value_dim}-w{self.num_warps}"


def compile_matrix() -> list[DecodeCompileCase]:
    """Both decode kernels at every layer's sizes, with every warp count their launch may pick."""
    cases = []
    for arch in SHARED_MEMORY:
        for key_dim, value_dim in DELTA_RULE_SIZES:
            cases.append(DecodeCompileCase(arch, "gated_delta_rule", key_dim, value_dim, num_warps=1))
        for key_dim, value_dim in SSD_SIZES:
            cases += [DecodeCompileCase(arch, "simple_gla", key_dim, value_dim, warps) for warps in (4, 8)]
    return cases


def _delta_rule_kernel(case: DecodeCompileCase) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """fla's fused recurrent delta rule as `kernels.fla_delta_rule_spans` launches it for a step of decodes."""
    from fla.ops.gated_delta_rule import fused_recurrent  # noqa: PLC0415

    constants: dict[str, Any] = dict.fromkeys(("gk", "gv", "A_log", "dt_bias", "cu_seqlens"))
    constants |= {"H": 16, "HV": 16, "K": case.key_dim, "V": case.value_dim, "BK": case.key_dim, "BV": 8}
    constants |= {"USE_G": True, "IS_BETA_HEADWISE": True, "USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True}
    off = ("USE_GK", "USE_GV", "USE_QK_L2NORM_IN_KERNEL", "STATE_V_FIRST", "IS_VARLEN", "USE_GATE_IN_KERNEL")
    constants |= dict.fromkeys((*off, "HAS_DT_BIAS", "APPLY_BETA_SIGMOID", "ALLOW_NEG_EIGVAL"), False)
    return fused_recurrent.fused_recurrent_gated_delta_rule_fwd_kernel.fn, constants, {"scale": "fp32", "T": "i32"}


def _simple_gla_kernel(case: DecodeCompileCase) -> tuple[Any, dict[str, Any], dict[str, str]]:
    """fla's fused recurrent simple gated linear attention as `kernels.fla_ssd_spans` launches it for decodes."""
    from fla.ops.common import fused_recurrent  # noqa: PLC0415

    tile_k, tile_v = min(case.key_dim, 64), min(case.value_dim, 64)
    constants: dict[str, Any] = dict.fromkeys(("g_gamma", "gk", "gv", "cu_seqlens"))
    constants |= {"H": 32, "K": case.key_dim, "V": case.value_dim, "BK": tile_k, "BV": tile_v, "REVERSE": False}
    constants |= {"USE_G": True, "USE_G_GAMMA": False, "USE_GK": False, "USE_GV": False, "IS_VARLEN": False}
    constants |= {"USE_INITIAL_STATE": True, "STORE_FINAL_STATE": True, "STATE_V_FIRST": True}
    # The heuristics wrap the autotuner, which wraps the kernel.
    kernel = fused_recurrent.fused_recurrent_fwd_kernel.fn.fn
    return kernel, constants, {"scale": "fp32", "B": "i32", "T": "i32"}


def compile_case(case: DecodeCompileCase) -> int:
    """Shared memory (bytes) of the decode kernel; every other argument is a float32 tensor."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    build = _delta_rule_kernel if case.kernel == "gated_delta_rule" else _simple_gla_kernel
    kernel, constants, scalars = build(case)
    signature = {name: "constexpr" if name in constants else scalars.get(name, "*fp32") for name in kernel.arg_names}
    source = ASTSource(kernel, signature, constants)
    options = {"num_warps": case.num_warps, "num_stages": 3}
    return int(triton.compile(source, target=GPUTarget("cuda", case.arch, 32), options=options).metadata.shared)


@pytest.fixture(scope="module")
def compiled() -> Iterator[dict[DecodeCompileCase, int]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        # Lifts the root conftest's block on importing fla without a GPU while the kernels compile.
        if sys.modules.get("fla", ...) is None:
            monkeypatch.delitem(sys.modules, "fla")
        yield compile_all(compile_matrix(), compile_case)


@pytest.mark.slow
@pytest.mark.parametrize("case", compile_matrix(), ids=lambda case: case.name)
def test_fla_decode_kernels_compile_ahead_of_time_within_shared_memory(
    compiled: dict[DecodeCompileCase, int], case: DecodeCompileCase
) -> None:
    limit = SHARED_MEMORY[case.arch]
    needed = compiled[case]
    assert needed <= limit, f"{case.name} needs {needed} bytes of shared memory, sm{case.arch} has {limit}"


def test_cpu_steps_run_the_torch_forms_without_importing_fla() -> None:
    """fla is installed only on Linux; a CPU step anywhere must not need it."""
    program = """
import sys, torch
from tandem_server.layers.recurrent.kernels import delta_rule_spans, ssd_spans
lens, heads = [3, 1], 2
x = torch.randn(4, heads, 4)
delta_rule_spans(x, x, x, -torch.rand(4, heads), torch.rand(4, heads), lens, torch.zeros(2, heads, 4, 4))
ssd_spans(x, -torch.rand(4, heads), x, x, lens, torch.zeros(2, heads, 4, 4), chunk=2)
assert "fla" not in sys.modules, sorted(name for name in sys.modules if name.startswith("fla"))
"""
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stderr[-2000:]
