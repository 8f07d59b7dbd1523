"""The flash backend's forward, through stand-ins that enforce flash-attn 2's and flash-attn-4's contracts on CPU,
equals the torch backend at 16- and 256-token pages, on mixed and decode steps, with windows and softcap, and on
the padded batches CUDA graphs replay."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from attention_testing import (
    DECODE_STEP,
    DRAFTED_STEP,
    HEAD_DIM,
    MIXED_STEP,
    paged_case,
    reference_output,
    uniform_layout,
)
from flash_contract import FlashContractError
from tandem_server.errors import ConfigError
from tandem_server.interfaces.attention import PackageRelease
from tandem_server.interfaces.attention_registry import FLASH_ATTN_2, FLASH_ATTN_4
from tandem_server.layers.attention import AttentionParams, UniformShape
from tandem_server.layers.attention.flash_backend import FlashAttentionBackend, FlashAttentionMetadata

STAND_INS = Path(__file__).with_name("flash_stand_ins")
RELEASES = {
    "flash-attn-2": (FLASH_ATTN_2, STAND_INS / "flash_attn_2"),
    "flash-attn-4": (FLASH_ATTN_4, STAND_INS / "flash_attn_4"),
}
PARAMS = {
    "causal": AttentionParams(scale=HEAD_DIM**-0.5),
    "sliding_window": AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=5),
    "softcap": AttentionParams(scale=0.3, logit_softcap=2.5),
    "window_and_softcap": AttentionParams(scale=0.3, sliding_window=3, logit_softcap=2.5),
}
STEPS = {"mixed": MIXED_STEP, "decode_only": DECODE_STEP}
# bfloat16 inputs and caches; the stand-ins round their float32 result to bfloat16 (as triton_cases.py allows).
BF16_TOLERANCE = {"atol": 2e-2, "rtol": 2e-2}


def _forget_flash_modules() -> None:
    for name in [name for name in sys.modules if name == "flash_attn" or name.startswith("flash_attn.")]:
        del sys.modules[name]


@pytest.fixture(params=sorted(RELEASES))
def release(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[PackageRelease]:
    """The release whose stand-in is importable as `flash_attn` (2) or `flash_attn.cute` (4) for one test."""
    flash_release, root = RELEASES[request.param]
    _forget_flash_modules()
    monkeypatch.syspath_prepend(str(root))
    yield flash_release
    _forget_flash_modules()


def _pageable(release: PackageRelease, block_size: int) -> bool:
    return release.page_problem(block_size) is None


# flash-attn 2 pages only multiples of 256 tokens (its refusal of 16 is tested below).
@pytest.mark.parametrize(
    ("release", "block_size"),
    [("flash-attn-2", 256), ("flash-attn-4", 16), ("flash-attn-4", 256)],
    indirect=["release"],
)
@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("params", PARAMS)
def test_flash_backend_matches_torch_backend(release: PackageRelease, block_size: int, step: str, params: str) -> None:
    case = paged_case(STEPS[step], seed=len(params), dtype=torch.bfloat16, block_size=block_size)
    expected, expected_cache = reference_output(case, PARAMS[params])
    cache = case.fresh_cache()
    backend = FlashAttentionBackend(release)
    metadata = backend.prepare(case.batch().metadata, [cache]).metadata
    output = backend.forward(case.query, case.key, case.value, cache, metadata, PARAMS[params])
    assert output.dtype == torch.bfloat16 and output.shape == case.query.shape
    torch.testing.assert_close(output.float(), expected, **BF16_TOLERANCE)
    torch.testing.assert_close(cache.key, expected_cache.key.to(torch.bfloat16))


def test_flash_attn_2_refuses_small_pages_naming_the_block_size_to_use(release: PackageRelease) -> None:
    case = paged_case(MIXED_STEP, dtype=torch.bfloat16, block_size=16)
    backend = FlashAttentionBackend(release)
    metadata = case.batch().metadata
    if _pageable(release, 16):
        backend.forward(case.query, case.key, case.value, case.fresh_cache(), metadata, PARAMS["causal"])
        return
    cache = case.fresh_cache()
    with pytest.raises(ConfigError, match="multiple of 256 tokens, not 16; start with --block-size 256"):
        backend.forward(case.query, case.key, case.value, cache, metadata, PARAMS["causal"])
    # Refused before anything was written.
    assert torch.equal(cache.key, case.cache.key)


@pytest.mark.parametrize(
    ("step", "shape"), [(DECODE_STEP, UniformShape(8, 1)), (DRAFTED_STEP, UniformShape(4, 5))], ids=["decode", "verify"]
)
def test_padded_graph_batches_attend_like_the_unpadded_step(
    release: PackageRelease, step: tuple[tuple[int, int], ...], shape: UniformShape
) -> None:
    block_size = 256 if release is FLASH_ATTN_2 else 16
    case = paged_case(step, seed=5, dtype=torch.bfloat16, block_size=block_size)
    expected, _ = reference_output(case, PARAMS["sliding_window"])
    laid_out = uniform_layout(case, shape, max_positions=4 * block_size)
    backend = FlashAttentionBackend(release)
    metadata = backend.prepare(laid_out.metadata, [laid_out.cache]).metadata
    output = backend.forward(
        laid_out.query, laid_out.key, laid_out.value, laid_out.cache, metadata, PARAMS["sliding_window"]
    )
    torch.testing.assert_close(output.index_select(0, laid_out.rows).float(), expected, **BF16_TOLERANCE)
    assert torch.isfinite(output).all()


@pytest.mark.parametrize("release", ["flash-attn-2"], indirect=True)
def test_flash_attn_2_key_offsets_sum_the_padded_graph_rows_too(release: PackageRelease) -> None:
    case = paged_case(DECODE_STEP, seed=5, dtype=torch.bfloat16, block_size=256)
    laid_out = uniform_layout(case, UniformShape(8, 1), max_positions=4 * 256)
    metadata = FlashAttentionBackend(release).prepare(laid_out.metadata, [case.cache]).metadata
    assert isinstance(metadata, FlashAttentionMetadata) and metadata.key_start_loc is not None
    assert metadata.key_start_loc.tolist() == [0, 5, 17, 18, 39, 40, 41, 42, 43]
    assert metadata.key_start_loc.dtype == torch.int32


def test_stand_ins_refuse_what_upstream_refuses(release: PackageRelease) -> None:
    """The stand-ins are only worth their passing tests if they fail where the real kernels do."""
    block_size = 256 if release is FLASH_ATTN_2 else 16
    case = paged_case(MIXED_STEP, dtype=torch.bfloat16, block_size=block_size)
    metadata = case.batch().metadata
    varlen = release.load()
    paged = metadata.paged
    if release is FLASH_ATTN_2:
        flash = FlashAttentionBackend(release).prepare(metadata, [case.cache]).metadata
        assert isinstance(flash, FlashAttentionMetadata)
        keywords = {"cu_seqlens_q": paged.query_start_loc, "cu_seqlens_k": flash.key_start_loc, "causal": True}
        keywords |= {"max_seqlen_q": paged.max_query_len, "max_seqlen_k": paged.max_seq_len}
        table_keyword = "block_table"
    else:
        keywords = {"cu_seqlens_q": paged.query_start_loc, "seqused_k": paged.seq_lens, "causal": True}
        table_keyword = "page_table"
    cache = case.cache
    with pytest.raises(FlashContractError, match="int32"):
        varlen(case.query, cache.key, cache.value, **keywords, **{table_keyword: paged.block_tables.long()})
    with pytest.raises(FlashContractError, match="fp16 and bf16"):
        varlen(
            case.query.float(),
            cache.key.float(),
            cache.value.float(),
            **keywords,
            **{table_keyword: paged.block_tables},
        )
    with pytest.raises(FlashContractError, match="divide number of heads"):
        varlen(case.query[:, :3], cache.key, cache.value, **keywords, **{table_keyword: paged.block_tables})
    with pytest.raises(TypeError, match="unexpected keyword"):
        varlen(case.query, cache.key, cache.value, **keywords, **{table_keyword: paged.block_tables}, sliding_window=4)
