"""The Triton kernel compiles ahead of time for every architecture Tandem supports (sm80, sm86, sm89, sm90, sm100)
and fits its shared memory, with the tiles and launch options the backend takes for that GPU
(`triton_kernel.tile_config`); its launch plan leaves no program empty, splits long decodes and never specialises
on what changes every step.

Compiling needs no GPU (`triton_testing`). Each configuration takes seconds, so the matrix covers every architecture x
dtype x head size x step kind in full and cycles page sizes and head groups through it (each value appears on each
architecture), compiling two at a time. A cold compile of the matrix takes minutes on two cores, a warm one seconds:
the compiled kernels are kept in `triton_testing.KERNEL_CACHE`, so whatever keeps the project's build caches keeps
them too.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import pytest
import torch
from triton_testing import SHARED_MEMORY_PER_BLOCK, compile_all

triton = pytest.importorskip("triton")

from attention_testing import paged_case  # noqa: E402
from tandem_server.errors import ConfigError  # noqa: E402
from tandem_server.layers.attention import AttentionParams, triton_kernel  # noqa: E402
from tandem_server.layers.attention.triton_backend import (  # noqa: E402
    MAX_SPLITS,
    TritonAttentionBackend,
    decode_splits,
    query_tiles,
)
from tandem_server.layers.attention.triton_kernel import TileConfig  # noqa: E402

DTYPES = (torch.bfloat16, torch.float32)
# Shared memory follows the head size padded to a power of two (BLOCK_D): 80 and 96 take 128's tiles and bytes, so
# 128 stands for them here (each compile costs seconds on the CPU).
HEAD_DIMS = (64, 128, 256)
PAGES = (16, 64, 128, 256)
GROUPS = (1, 4, 7, 8)
WINDOW_AND_SOFTCAP = AttentionParams(scale=0.1, sliding_window=4096, logit_softcap=30.0)
# gpt-oss's layers: windows and a sink per head.
WINDOW_AND_SINKS = AttentionParams(scale=0.125, sliding_window=128, sinks=torch.zeros(64))
_TYPE_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
_FLOAT_ARGS = ("scale", "softcap")
_FLOAT32_POINTERS = ("partial_ptr", "lse_ptr")
_INDEX_POINTERS = ("block_tables_ptr", "query_start_loc_ptr", "seq_lens_ptr", "work_ptr")


@dataclass(frozen=True)
class CompileCase:
    arch: int
    head_dim: int
    page: int
    groups: int
    decode: bool
    dtype: torch.dtype = torch.bfloat16
    # Above 1: a uniform step (a captured verifying graph's) whose sequences span this many query tiles each.
    tiles_per_seq: int = 1
    sinks: bool = False

    @property
    def capability(self) -> tuple[int, int]:
        return divmod(self.arch, 10)

    @property
    def tiles(self) -> TileConfig:
        return triton_kernel.tile_config(self.capability, self.dtype, self.head_dim)

    @property
    def name(self) -> str:
        kind = "split-decode" if self.decode else "prefill" if self.tiles_per_seq == 1 else "uniform"
        sinks = "-sinks" if self.sinks else ""
        return f"sm{self.arch}-d{self.head_dim}-page{self.page}-g{self.groups}-{kind}-{_TYPE_NAMES[self.dtype]}{sinks}"

    @property
    def params(self) -> AttentionParams:
        return WINDOW_AND_SINKS if self.sinks else WINDOW_AND_SOFTCAP


def compile_matrix() -> list[CompileCase]:
    cases = []
    for arch in SHARED_MEMORY_PER_BLOCK:
        shapes = itertools.product(DTYPES, HEAD_DIMS, (False, True))
        for index, (dtype, head_dim, decode) in enumerate(shapes):
            page, groups = PAGES[index % len(PAGES)], GROUPS[index // 2 % len(GROUPS)]
            cases.append(CompileCase(arch, head_dim, page, groups, decode, dtype))
        cases.append(CompileCase(arch, 128, 16, 8, decode=False, tiles_per_seq=2))
        # gpt-oss's shapes (head size 64, 8 query heads per KV head) with sinks, prefill and split decode.
        cases.extend(CompileCase(arch, 64, 16, 8, decode, sinks=True) for decode in (False, True))
    return cases


def _signature(dtype: torch.dtype) -> dict[str, str]:
    element = _TYPE_NAMES[dtype]
    signature = {}
    for name in triton_kernel._paged_attention.arg_names:
        if name.isupper():
            signature[name] = "constexpr"
        elif name in _FLOAT32_POINTERS:
            signature[name] = "*fp32"
        elif name in _INDEX_POINTERS:
            signature[name] = "*i32"
        elif name.endswith("_ptr"):
            signature[name] = f"*{element}"
        else:
            signature[name] = "fp32" if name in _FLOAT_ARGS else "i32"
    return signature


def compile_case(case: CompileCase) -> list[int]:
    """Shared memory (bytes) of the attention kernel and, for decodes, of the split-combining kernel."""
    from triton.backends.compiler import GPUTarget  # noqa: PLC0415
    from triton.compiler import ASTSource  # noqa: PLC0415

    target = GPUTarget("cuda", case.arch, 32)
    tiles = case.tiles
    tile_tokens = triton_kernel.query_tile_tokens(case.groups, case.decode, tiles)
    constants = triton_kernel.kernel_constants(
        case.head_dim, case.groups, case.page, tile_tokens, tiles, case.params, case.dtype
    )
    uniform = case.tiles_per_seq > 1
    constants |= {"MIXED": not (case.decode or uniform), "TILES_PER_SEQ": case.tiles_per_seq, "SPLIT": case.decode}
    source = ASTSource(triton_kernel._paged_attention, _signature(case.dtype), constants)
    options = {"num_warps": tiles.num_warps, "num_stages": tiles.num_stages}
    kernel = triton.compile(source, target=target, options=options)
    shared = [kernel.metadata.shared]
    if case.decode:
        combine = {"out_ptr": f"*{_TYPE_NAMES[case.dtype]}", "partial_ptr": "*fp32", "lse_ptr": "*fp32"}
        combine |= {"num_splits": "i32", "num_rows": "i32", "HEAD_DIM": "constexpr", "BLOCK_D": "constexpr"}
        combine |= {"BLOCK_S": "constexpr"}
        block_d = triton_kernel.pow2_at_least(case.head_dim)
        values = {"HEAD_DIM": case.head_dim, "BLOCK_D": block_d, "BLOCK_S": MAX_SPLITS}
        combined = triton.compile(ASTSource(triton_kernel._combine_splits, combine, values), target=target)
        shared.append(combined.metadata.shared)
    return shared


@pytest.fixture(scope="module")
def compiled() -> dict[CompileCase, list[int]]:
    return compile_all(compile_matrix(), compile_case)


@pytest.mark.parametrize("case", compile_matrix(), ids=lambda case: case.name)
def test_kernel_compiles_ahead_of_time_within_shared_memory(
    compiled: dict[CompileCase, list[int]], case: CompileCase
) -> None:
    limit = SHARED_MEMORY_PER_BLOCK[case.arch]
    assert max(compiled[case]) <= limit, (
        f"{case.name} needs {compiled[case]} bytes of shared memory, sm{case.arch} has {limit}"
    )


def test_matrix_reaches_every_dtype_head_size_page_size_and_head_group_on_each_architecture() -> None:
    for arch in SHARED_MEMORY_PER_BLOCK:
        cases = [case for case in compile_matrix() if case.arch == arch]
        shapes = {(case.dtype, case.head_dim, case.decode) for case in cases}
        assert shapes == set(itertools.product(DTYPES, HEAD_DIMS, (False, True)))
        assert {case.page for case in cases} == set(PAGES) and {case.groups for case in cases} == set(GROUPS)


@pytest.mark.parametrize("arch", SHARED_MEMORY_PER_BLOCK)
@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize(("head_dim", "dtype"), [(64, torch.bfloat16), (256, torch.bfloat16), (256, torch.float32)])
def test_key_tiles_hold_at_most_64_keys_whatever_the_page_size(
    arch: int, page: int, head_dim: int, dtype: torch.dtype
) -> None:
    tiles = CompileCase(arch, head_dim, page, 4, decode=False, dtype=dtype).tiles
    constants = triton_kernel.kernel_constants(head_dim, 4, page, 16, tiles, WINDOW_AND_SOFTCAP, dtype)
    assert constants["BLOCK_N"] <= 64
    assert constants["BLOCK_N"] * constants["BLOCK_D"] * torch.empty((), dtype=dtype).element_size() <= 32 * 1024
    assert constants["IEEE"] is (dtype == torch.float32)


# (dtype, head size) -> (query rows, key rows). GPUs of 163 KiB or more keep the tiles they had before the tiles
# depended on the GPU; those of 99 KiB, like GPUs the kernel does not name (sm120), halve float32 key tiles where
# the full ones do not fit.
LARGEST_TILES = {
    (torch.bfloat16, 64): (64, 64),
    (torch.bfloat16, 128): (64, 64),
    (torch.bfloat16, 256): (64, 64),
    (torch.float32, 64): (64, 64),
    (torch.float32, 128): (64, 64),
    (torch.float32, 256): (32, 32),
}
TILES_WITHIN_99_KIB = LARGEST_TILES | {(torch.float32, 128): (64, 32), (torch.float32, 256): (32, 16)}


@pytest.mark.parametrize(
    ("capability", "expected"),
    [
        ((8, 0), LARGEST_TILES),
        ((9, 0), LARGEST_TILES),
        ((10, 0), LARGEST_TILES),
        ((8, 6), TILES_WITHIN_99_KIB),
        ((8, 9), TILES_WITHIN_99_KIB),
        ((12, 0), TILES_WITHIN_99_KIB),
    ],
)
def test_tiles_follow_the_shared_memory_of_the_gpu(
    capability: tuple[int, int], expected: dict[tuple[torch.dtype, int], tuple[int, int]]
) -> None:
    for (dtype, head_dim), rows in expected.items():
        assert triton_kernel.tile_config(capability, dtype, head_dim) == TileConfig(*rows, num_warps=4, num_stages=3)


def test_head_sizes_above_the_checked_ones_are_refused_naming_gpu_dtype_and_head_size() -> None:
    assert triton_kernel.tile_config((8, 9), torch.float32, triton_kernel.MAX_HEAD_DIM).key_rows == 16
    with pytest.raises(ConfigError, match=r"head size 512 in float32 on a GPU of compute capability 8\.9"):
        triton_kernel.tile_config((8, 9), torch.float32, 512)


def test_backend_plans_with_the_tiles_of_the_device_capability_read_once(monkeypatch: pytest.MonkeyPatch) -> None:
    probes: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: probes.append(device) or (8, 9))
    backend = TritonAttentionBackend()
    cuda = torch.device("cuda", 0)
    assert backend._device_capability(cuda) == backend._device_capability(cuda) == (8, 9)
    case = paged_case(((0, 70), (5, 1)), seed=1, dtype=torch.float32, heads=(4, 2, 128))
    plan = backend._plan(case.batch().metadata.paged, case.query, 2)
    assert plan.tiles == triton_kernel.tile_config((8, 9), torch.float32, 128) == TileConfig(64, 32)
    assert plan.tile_tokens == 32 and probes == [cuda]


def test_per_step_integers_are_never_specialised() -> None:
    """The block table's width (its row stride) and the split count change from step to step; a value of 1 or a
    multiple of 16 must not compile a new kernel mid-serving."""
    unspecialised = {param.name for param in triton_kernel._paged_attention.params if param.do_not_specialize}
    assert {"stride_table", "num_splits"} <= unspecialised


def test_mixed_step_programs_each_own_a_query_tile_that_holds_tokens() -> None:
    # A 130-token prompt chunk, three decodes and a 2-token chunk, 16 tokens per tile.
    tiles = query_tiles((130, 1, 1, 1, 2), 16)
    assert len(tiles) == 9 + 1 + 1 + 1 + 1
    assert tiles[:2] == [(0, 0), (0, 1)] and tiles[8:] == [(0, 8), (1, 0), (2, 0), (3, 0), (4, 0)]


@pytest.mark.parametrize(
    ("num_seqs", "max_seq_len", "expected"),
    [
        (1, 8192, 16),  # one long sequence: as many splits as allowed
        (1, 700, 2),  # at least 256 keys per split
        (1, 200, 1),  # short contexts never split
        (64, 8192, 1),  # enough programs already
        (8, 8192, 5),  # 8 x 8 KV heads x 5 splits fills 2 programs per SM of 132
    ],
)
def test_decode_splits_fill_the_gpu_without_tiny_parts(num_seqs: int, max_seq_len: int, expected: int) -> None:
    assert decode_splits(num_seqs, 8, max_seq_len, 132) == expected
