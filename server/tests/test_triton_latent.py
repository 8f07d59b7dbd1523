"""The Triton MLA decode kernel: against the eager absorbed form under Triton's interpreter, compiled ahead of time
for every architecture Tandem supports within its shared memory, and laid out over programs as the backend plans.

Compiling needs no GPU (`triton_testing`); the compiled kernels are kept in `triton_testing.KERNEL_CACHE`.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from triton_testing import SHARED_MEMORY_PER_BLOCK, assert_cases_pass_under_the_interpreter, compile_all

triton = pytest.importorskip("triton")

from attention_testing import DECODE_STEP, MIXED_STEP, paged_case  # noqa: E402
from tandem_server.layers.attention import triton_latent_kernel  # noqa: E402
from tandem_server.layers.attention.latent_cache import LatentLayerCache  # noqa: E402
from tandem_server.layers.attention.triton_backend import MAX_SPLITS, TritonAttentionBackend  # noqa: E402
from tandem_server.layers.attention.triton_kernel import _combine_splits, pow2_at_least  # noqa: E402
from tandem_server.layers.attention.triton_latent import TritonLatentMetadata  # noqa: E402

_TYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
_FLOAT32_POINTERS = ("partial_ptr", "lse_ptr")
_INDEX_POINTERS = ("block_tables_ptr", "seq_lens_ptr", "seqs_ptr")


def test_latent_decode_kernel_matches_the_eager_absorbed_form_under_the_interpreter() -> None:
    """Runs latent_triton_cases.py with TRITON_INTERPRET=1, which must be set before Triton is first imported."""
    assert_cases_pass_under_the_interpreter("latent_triton_cases.py")


@dataclass(frozen=True)
class LatentCompileCase:
    arch: int
    heads: int
    latent_dim: int
    rope_dim: int
    page: int
    dtype: torch.dtype
    split: bool
    gather: bool

    @property
    def name(self) -> str:
        parts = [f"sm{self.arch}", f"h{self.heads}", f"d{self.latent_dim}+{self.rope_dim}", f"page{self.page}"]
        parts += ["split" if self.split else "whole", "gather" if self.gather else "every-row", _TYPE_NAMES[self.dtype]]
        return "-".join(parts)


def compile_matrix() -> list[LatentCompileCase]:
    """DeepSeek-V3's latent (512 + 64) in both dtypes, split and gathered, and a small latent, on every
    architecture: the tiles depend only on the dtype and latent width, so these bound every model's shared memory."""
    cases = []
    for arch in SHARED_MEMORY_PER_BLOCK:
        cases.append(LatentCompileCase(arch, 16, 512, 64, 64, torch.bfloat16, split=True, gather=True))
        cases.append(LatentCompileCase(arch, 128, 512, 64, 16, torch.float32, split=True, gather=False))
        cases.append(LatentCompileCase(arch, 4, 32, 16, 256, torch.bfloat16, split=False, gather=True))
    return cases


def _signature(dtype: torch.dtype) -> dict[str, str]:
    signature = {}
    for name in triton_latent_kernel._latent_decode.arg_names:
        if name.isupper():
            signature[name] = "constexpr"
        elif name in _FLOAT32_POINTERS:
            signature[name] = "*fp32"
        elif name in _INDEX_POINTERS:
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = f"*{_TYPE_NAMES[dtype]}"
        else:
            signature[name] = "fp32" if name == "scale" else "i32"
    return signature


def compile_case(case: LatentCompileCase) -> list[int]:
    """Shared memory (bytes) of the decode kernel and, for splits, of the combining kernel."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    target = GPUTarget("cuda", case.arch, 32)
    constants = triton_latent_kernel.kernel_constants(case.latent_dim, case.rope_dim, case.heads, case.page, case.dtype)
    constants |= {"GATHER": case.gather, "SPLIT": case.split}
    source = ASTSource(triton_latent_kernel._latent_decode, _signature(case.dtype), constants)
    options = {"num_warps": triton_latent_kernel.NUM_WARPS, "num_stages": triton_latent_kernel.NUM_STAGES}
    shared = [triton.compile(source, target=target, options=options).metadata.shared]
    if case.split:
        combine = {"out_ptr": f"*{_TYPE_NAMES[case.dtype]}", "partial_ptr": "*fp32", "lse_ptr": "*fp32"}
        combine |= {"num_splits": "i32", "num_rows": "i32", "HEAD_DIM": "constexpr", "BLOCK_D": "constexpr"}
        combine |= {"BLOCK_S": "constexpr"}
        values = {"HEAD_DIM": case.latent_dim, "BLOCK_D": pow2_at_least(case.latent_dim), "BLOCK_S": MAX_SPLITS}
        shared.append(triton.compile(ASTSource(_combine_splits, combine, values), target=target).metadata.shared)
    return shared


@pytest.fixture(scope="module")
def compiled() -> dict[LatentCompileCase, list[int]]:
    return compile_all(compile_matrix(), compile_case)


@pytest.mark.parametrize("case", compile_matrix(), ids=lambda case: case.name)
def test_latent_kernel_compiles_ahead_of_time_within_shared_memory(
    compiled: dict[LatentCompileCase, list[int]], case: LatentCompileCase
) -> None:
    limit = SHARED_MEMORY_PER_BLOCK[case.arch]
    assert max(compiled[case]) <= limit, (
        f"{case.name} needs {compiled[case]} bytes of shared memory, sm{case.arch} has {limit}"
    )


@pytest.mark.parametrize(
    ("latent_dim", "dtype", "keys"),
    [(512, torch.bfloat16, 32), (512, torch.float32, 16), (32, torch.bfloat16, 64), (16, torch.float32, 64)],
)
def test_key_tiles_hold_at_most_32_kib_of_latents_and_at_least_16_keys(
    latent_dim: int, dtype: torch.dtype, keys: int
) -> None:
    assert triton_latent_kernel.key_tile(latent_dim, dtype) == keys


def test_per_step_integers_are_never_specialised() -> None:
    """The block table's width and the split count change from step to step; a value of 1 or a multiple of 16 must
    not compile a new kernel mid-serving."""
    unspecialised = {param.name for param in triton_latent_kernel._latent_decode.params if param.do_not_specialize}
    assert {"stride_table", "num_splits"} <= unspecialised


def _prepared(
    requests: tuple[tuple[int, int], ...], block_size: int = 4
) -> tuple[TritonAttentionBackend, TritonLatentMetadata]:
    case = paged_case(requests, seed=3, heads=(4, 1, 24), block_size=block_size)
    backend = TritonAttentionBackend()
    metadata = backend.prepare(case.batch().metadata, [LatentLayerCache.of(case.cache.key, 16)]).metadata
    assert isinstance(metadata, TritonLatentMetadata)
    return backend, metadata


def test_a_mixed_latent_step_splits_its_rows_into_prompt_chunks_and_gathered_decodes() -> None:
    _, metadata = _prepared(MIXED_STEP)
    # MIXED_STEP: (0, 7), (5, 4), (13, 1), (0, 1), (9, 1), (3, 2), (16, 5); rows 0-6, 7-10, 11, 12, 13, 14-15, 16-20.
    assert [(span.query_start, span.query_len) for span in metadata.prefills] == [(0, 7), (7, 4), (14, 2), (16, 5)]
    assert isinstance(metadata.decode_rows, torch.Tensor) and metadata.decode_seqs is not None
    assert metadata.decode_rows.tolist() == [11, 12, 13] and metadata.decode_seqs.tolist() == [2, 3, 4]
    assert metadata.decode_max_seq_len == 14


def test_a_step_of_decodes_only_reads_every_row_in_sequence_order() -> None:
    _, metadata = _prepared(DECODE_STEP)
    assert metadata.prefills == () and metadata.decode_rows == slice(None) and metadata.decode_seqs is None
    assert metadata.decode_max_seq_len == 21


def test_the_decode_launch_is_planned_once_per_step_and_splits_long_contexts() -> None:
    backend, metadata = _prepared(((1000, 1), (3, 1)), block_size=64)
    query = torch.zeros(2, 20, 24)
    launch = backend._latent_launch(metadata, query)
    assert backend._latent_launch(metadata, query) is launch
    # 2 rows x 2 head tiles of 16 fill few of 132 SMs: 1001 keys split 3 ways (at least 256 each).
    assert launch.num_splits == 3 and launch.seqs is None
