"""The int4 Triton GEMM (CUDA's int4 path): its numbers under Triton's interpreter, its ahead-of-time compile for
sm80 and sm90 within shared memory, its packing, launch plan and refusals, and where the shard uses it."""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import pytest
import torch
from int4_testing import pack_along_rows
from tandem_server.quant.int4.weight import Int4TritonWeight, Int4Weight
from tandem_server.quant.kernels import kernels_unavailable_reason, quantized_weight
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.values import INT4_KERNEL_GROUPS, Int4Groups
from triton_testing import SHARED_MEMORY, assert_cases_pass_under_the_interpreter, compile_all

triton = pytest.importorskip("triton")

from tandem_server.quant.int4 import triton_gemm  # noqa: E402

# The slow tier (runs Triton kernels in the interpreter): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

CUDA = torch.device("cuda", 0)


def test_int4_kernel_matches_its_references_under_the_interpreter() -> None:
    """Runs int4_triton_cases.py with TRITON_INTERPRET=1, which must be set before Triton is first imported."""
    assert_cases_pass_under_the_interpreter("int4_triton_cases.py")


@dataclass(frozen=True)
class CompileCase:
    arch: int
    rows: int
    group_size: int
    dtype: str = "bf16"

    @property
    def name(self) -> str:
        return f"sm{self.arch}-{self.rows}rows-g{self.group_size}-{self.dtype}"


def compile_matrix() -> list[CompileCase]:
    """Decode tiles (split-K, float32 partial sums) for every group size, prefill tiles (the output itself) for the
    smallest and largest, and float16 once per architecture."""
    cases = []
    for arch in SHARED_MEMORY:
        cases += [CompileCase(arch, 1, group) for group in INT4_KERNEL_GROUPS]
        cases += [CompileCase(arch, 64, group) for group in (32, 256)]
        cases.append(CompileCase(arch, 1, 128, "fp16"))
    return cases


def compile_case(case: CompileCase) -> int:
    """The shared memory (bytes) the kernel needs."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    config = triton_gemm.tile_config(case.rows, case.group_size)
    output = "fp32" if case.rows <= triton_gemm.DECODE_ROWS else case.dtype
    pointers = {"x_ptr": case.dtype, "words_ptr": "i32", "scale_ptr": case.dtype, "zero_ptr": case.dtype}
    signature = {name: f"*{element}" for name, element in {**pointers, "out_ptr": output}.items()}
    signature |= dict.fromkeys(("rows", "out_features", "in_features", "tiles_per_split"), "i32")
    constants = {"GROUP": case.group_size, "MIDPOINT": 8, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n}
    constants["BLOCK_K"] = config.block_k
    signature |= dict.fromkeys(constants, "constexpr")
    options = {"num_warps": config.num_warps, "num_stages": config.num_stages}
    source = ASTSource(triton_gemm._int4_gemm, signature, constants)
    return triton.compile(source, target=GPUTarget("cuda", case.arch, 32), options=options).metadata.shared


@pytest.fixture(scope="module")
def compiled() -> dict[CompileCase, int]:
    return compile_all(compile_matrix(), compile_case)


@pytest.mark.parametrize("case", compile_matrix(), ids=lambda case: case.name)
def test_int4_kernel_compiles_ahead_of_time_within_shared_memory(
    compiled: dict[CompileCase, int], case: CompileCase
) -> None:
    assert compiled[case] <= SHARED_MEMORY[case.arch], f"{case.name} needs {compiled[case]} bytes of shared memory"


def test_rows_and_splits_are_never_specialised() -> None:
    unspecialised = {param.name for param in triton_gemm._int4_gemm.params if param.do_not_specialize}
    assert unspecialised == {"rows", "tiles_per_split"}


def test_packed_words_are_gptqs_qweight_layout() -> None:
    q = torch.randint(0, 16, (24, 64), generator=torch.Generator().manual_seed(0), dtype=torch.uint8)
    words = triton_gemm.pack(q)
    assert words.dtype == torch.int32 and words.shape == (8, 24)
    assert torch.equal(words, pack_along_rows(q.t().long()))


def test_packing_refuses_inputs_that_fill_no_whole_word() -> None:
    with pytest.raises(ValueError, match="input features in multiples of 8, this weight has 12"):
        triton_gemm.pack(torch.zeros(16, 12, dtype=torch.uint8))


@pytest.mark.parametrize("group_size", INT4_KERNEL_GROUPS)
@pytest.mark.parametrize("rows", [1, 16, 17, 512])
def test_each_tile_of_inputs_lies_in_one_group(rows: int, group_size: int) -> None:
    config = triton_gemm.tile_config(rows, group_size)
    assert group_size % config.block_k == 0
    assert min(config.block_m, config.block_n, config.block_k) >= 16
    assert config.block_m == (16 if rows <= 16 else 64)


@pytest.mark.parametrize(
    ("output_tiles", "k_tiles", "expected"),
    [
        (64, 128, 5),  # one decode row, 4096 outputs: 2 programs per SM of 132
        (8, 128, 16),  # few outputs: as many parts as allowed
        (64, 8, 2),  # few inputs: at least 4 tiles of inputs per part
        (64, 3, 1),
        (300, 128, 1),  # enough programs already (prefill)
    ],
)
def test_decodes_split_their_inputs_to_fill_the_gpu(output_tiles: int, k_tiles: int, expected: int) -> None:
    assert triton_gemm.k_splits(output_tiles, k_tiles, 132) == expected


def _operands(in_features: int = 64, group_size: int = 32) -> dict[str, torch.Tensor]:
    groups = in_features // group_size
    return {
        "x": torch.zeros(2, in_features, dtype=torch.bfloat16),
        "words": torch.zeros(in_features // 8, 32, dtype=torch.int32),
        "scale": torch.ones(groups, 32, dtype=torch.bfloat16),
        "zero": torch.zeros(groups, 32, dtype=torch.bfloat16),
    }


BAD_OPERANDS = {
    "float32 activations": ({"x": torch.zeros(2, 64)}, 32, "takes bfloat16 or float16 activations"),
    "float16 scales": ({"scale": torch.ones(2, 32, dtype=torch.float16)}, 32, "torch.float16 scales"),
    "group of 48": ({}, 48, r"groups of \(32, 64, 128, 256\) inputs, not 48"),
    "too few words": ({"words": torch.zeros(4, 32, dtype=torch.int32)}, 32, r"needs int32 words \(8, 32\)"),
    "uint8 words": ({"words": torch.zeros(8, 32, dtype=torch.uint8)}, 32, "got torch.uint8 words"),
    "scales of more groups": ({"zero": torch.zeros(4, 32, dtype=torch.bfloat16)}, 32, r"zeros \(4, 32\)"),
    "inputs splitting a group": ({}, 128, r"64 input features in groups of 128"),
    "transposed scales": ({"scale": torch.ones(32, 2, dtype=torch.bfloat16).t()}, 32, "as contiguous tensors"),
}


@pytest.mark.parametrize("case", BAD_OPERANDS)
def test_the_kernel_refuses_operands_it_cannot_multiply(case: str) -> None:
    changes, group_size, message = BAD_OPERANDS[case]
    operands = {**_operands(), **changes}
    with pytest.raises(ValueError, match=message):
        triton_gemm.int4_gemm(operands["x"], operands["words"], operands["scale"], operands["zero"], group_size)


def _groups(input_order: torch.Tensor | None = None) -> Int4Groups:
    return Int4Groups(torch.zeros(32, 64, dtype=torch.uint8), torch.ones(32, 2), torch.zeros(32, 2), 32, input_order)


def test_the_triton_weight_keeps_its_scales_in_the_models_dtype_and_serves_no_embedding_rows() -> None:
    assert Int4TritonWeight(_groups(), torch.float16).scale.dtype == torch.float16
    weight = Int4TritonWeight(_groups(), torch.float32)
    assert weight.scale.dtype == weight.zero.dtype == torch.bfloat16
    assert weight.nbytes == 8 * 32 * 4 + 2 * (2 * 32 * 2)
    assert not weight.serves_rows and weight.name == "int4"


def test_int4_groups_on_the_cpu_keep_torchs_cpu_kernel() -> None:
    assert type(quantized_weight(_groups())) is Int4Weight
    moved = _groups(torch.arange(64).flip(0)).to(torch.device("cpu"))
    assert torch.equal(moved.input_order, torch.arange(64).flip(0))


def test_int4_runs_on_cuda_from_ampere_and_int8_stays_a_cpu_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    assert kernels_unavailable_reason(CUDA, QuantizeMode.INT4) is None
    for mode in (QuantizeMode.INT8, QuantizeMode.GGUF):
        reason = kernels_unavailable_reason(CUDA, mode)
        assert reason is not None and "CPU path" in reason and "int4 runs through Tandem's Triton kernel" in reason
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    assert "compute capability 8.0 or newer" in str(kernels_unavailable_reason(CUDA, QuantizeMode.INT4))
    assert "Tesla T4 is 7.5" in str(kernels_unavailable_reason(CUDA, QuantizeMode.INT4))


def test_int4_on_cuda_needs_triton(monkeypatch: pytest.MonkeyPatch) -> None:
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest: None if name == "triton" else find_spec(name))
    assert "Triton is not installed" in str(kernels_unavailable_reason(CUDA, QuantizeMode.INT4))
