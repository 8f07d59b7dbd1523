"""The CUDA LoRA path (BGMV Triton kernels over device slots) checked without a GPU: its results under Triton's
interpreter, and its kernels compiled ahead of time for sm80 and sm90 within shared memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from triton_testing import SHARED_MEMORY, assert_cases_pass_under_the_interpreter, compile_all

triton = pytest.importorskip("triton")


@pytest.mark.slow
def test_lora_kernels_and_device_slots_match_the_references_under_the_interpreter() -> None:
    assert_cases_pass_under_the_interpreter("lora_triton_cases.py")


@dataclass(frozen=True)
class CompileCase:
    arch: int
    kernel: str
    dtype: str

    @property
    def name(self) -> str:
        return f"sm{self.arch}-{self.kernel}-{self.dtype}"


KERNELS = ("bgmv-shrink", "bgmv-expand", "sgmv-shrink", "sgmv-expand")
DTYPES = ("bf16", "fp16", "fp32")
CASES = [CompileCase(arch, kernel, dtype) for arch in SHARED_MEMORY for kernel in KERNELS for dtype in DTYPES]


def _kernel(case: CompileCase) -> tuple[Any, dict[str, str], dict[str, Any]]:
    """The kernel, its pointer arguments' dtypes and its constants as the launch functions pass them."""
    from tandem_server.lora import slots, triton_bgmv, triton_sgmv  # noqa: PLC0415

    family, stage = case.kernel.split("-")
    module = triton_bgmv if family == "bgmv" else triton_sgmv
    if stage == "shrink":
        pointers = {"x_ptr": case.dtype, "a_ptr": case.dtype, "shrunk_ptr": "fp32"}
        constants: dict[str, Any] = {"BLOCK_R": module.BLOCK_RANK, "BLOCK_K": module.BLOCK_IN}
    else:
        pointers = {"shrunk_ptr": "fp32", "b_ptr": case.dtype, "out_ptr": case.dtype}
        constants = {"BLOCK_N": module.BLOCK_OUT, "BLOCK_R": module.BLOCK_RANK}
    pointers |= dict.fromkeys(("rows_ptr", "slots_ptr", "block_slots_ptr", "block_starts_ptr", "block_ends_ptr"), "i64")
    if family == "sgmv":
        constants |= {"BLOCK_M": slots.ROW_BLOCK, "IEEE": case.dtype == "fp32"}
    return getattr(module, f"_{stage}"), pointers, constants


def compile_case(case: CompileCase) -> int:
    """Shared memory (bytes) of one kernel as its launch function runs it for a model of `case.dtype`."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    kernel, pointers, constants = _kernel(case)
    signature = {
        name: "constexpr" if name in constants else f"*{pointers[name]}" if name in pointers else "i32"
        for name in kernel.arg_names
    }
    source = ASTSource(kernel, signature, constants)
    compiled = triton.compile(source, target=GPUTarget("cuda", case.arch, 32), options={"num_warps": 4})
    return int(compiled.metadata.shared)


@pytest.fixture(scope="module")
def compiled() -> dict[CompileCase, int]:
    return compile_all(CASES, compile_case)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda case: case.name)
def test_lora_kernels_compile_ahead_of_time_within_shared_memory(
    compiled: dict[CompileCase, int], case: CompileCase
) -> None:
    assert compiled[case] <= SHARED_MEMORY[case.arch]
