"""The sdpa and Triton backends equal the torch backend on random paged steps."""

from __future__ import annotations

import pytest
import torch
from attention_testing import DECODE_STEP, HEAD_DIM, MIXED_STEP, paged_case, reference_output
from tandem_server.layers.attention import AttentionParams, SdpaAttentionBackend
from tandem_server.layers.attention.torch_metadata import TorchAttentionMetadata
from triton_testing import assert_cases_pass_under_the_interpreter

PARAMS = {
    "causal": AttentionParams(scale=HEAD_DIM**-0.5),
    "sliding_window": AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=5),
    "softcap": AttentionParams(scale=0.3, logit_softcap=2.5),
    "window_and_softcap": AttentionParams(scale=0.3, sliding_window=3, logit_softcap=2.5),
}
STEPS = {"mixed": MIXED_STEP, "decode_only": DECODE_STEP}


@pytest.mark.slow
def test_triton_kernel_matches_torch_backend_under_the_interpreter() -> None:
    """Runs triton_cases.py with TRITON_INTERPRET=1, which must be set before Triton is first imported."""
    pytest.importorskip("triton")
    assert_cases_pass_under_the_interpreter("triton_cases.py")


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("params", ["causal", "sliding_window"])
def test_sdpa_backend_matches_torch_backend(step: str, params: str) -> None:
    case = paged_case(STEPS[step], seed=3)
    expected, expected_cache = reference_output(case, PARAMS[params])
    cache = case.fresh_cache()
    output = SdpaAttentionBackend().forward(
        case.query, case.key, case.value, cache, case.batch().metadata, PARAMS[params]
    )
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.key, expected_cache.key)


def test_sdpa_backend_never_pads_a_decode_to_a_prompt_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    case = paged_case(MIXED_STEP, seed=5)
    expected, _ = reference_output(case, PARAMS["causal"])
    query_shapes: list[tuple[int, ...]] = []
    attend = torch.nn.functional.scaled_dot_product_attention

    def recording(query: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        query_shapes.append(tuple(query.shape))
        return attend(query, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    output = SdpaAttentionBackend().forward(
        case.query, case.key, case.value, case.fresh_cache(), case.batch().metadata, PARAMS["causal"]
    )
    torch.testing.assert_close(output, expected, atol=1e-5, rtol=1e-5)
    # [sequences, heads, padded query, dim]: the three decodes share one call with a query of 1; chunks go alone.
    decodes = sum(1 for _, query_len in MIXED_STEP if query_len == 1)
    chunks = [query_len for _, query_len in MIXED_STEP if query_len > 1]
    assert sorted((shape[0], shape[2]) for shape in query_shapes) == sorted([(decodes, 1), *((1, q) for q in chunks)])


def test_sdpa_backend_refuses_softcap_instead_of_ignoring_it() -> None:
    case = paged_case(DECODE_STEP)
    with pytest.raises(ValueError, match="softcap"):
        SdpaAttentionBackend().forward(
            case.query, case.key, case.value, case.fresh_cache(), case.batch().metadata, PARAMS["softcap"]
        )


def test_sdpa_backend_refuses_attention_sinks_instead_of_ignoring_them() -> None:
    case = paged_case(DECODE_STEP)
    params = AttentionParams(scale=HEAD_DIM**-0.5, sinks=torch.zeros(8))
    with pytest.raises(ValueError, match="attention sinks"):
        SdpaAttentionBackend().forward(
            case.query, case.key, case.value, case.fresh_cache(), case.batch().metadata, params
        )


def test_common_metadata_holds_every_token_and_the_torch_backend_adds_only_its_slot_lists() -> None:
    case = paged_case(MIXED_STEP)
    batch, prepared = case.batch(), case.torch_metadata()
    positions = [p for span in case.spans for p in range(span.start_position, span.context_len)]
    slots = [
        span.block_table[p // case.block_size] * case.block_size + p % case.block_size
        for span in case.spans
        for p in range(span.start_position, span.context_len)
    ]
    assert batch.positions.tolist() == positions
    assert batch.metadata.slot_mapping.tolist() == slots
    assert batch.last_rows == (6, 10, 11, 12, 13, 15, 20)
    assert not hasattr(batch.metadata, "prefills") and not hasattr(batch.metadata, "decode")
    assert isinstance(prepared, TorchAttentionMetadata)
    assert prepared.slot_mapping.tolist() == slots
    assert len(prepared.prefills) == 4 and prepared.decode is not None
    assert prepared.decode.query_rows.tolist() == [11, 12, 13]
    layout = batch.metadata.paged
    assert layout.query_start_loc.tolist() == [0, 7, 11, 12, 13, 14, 16, 21]
    assert layout.seq_lens.tolist() == [7, 9, 14, 1, 10, 5, 21]
    assert (layout.max_query_len, layout.max_seq_len) == (7, 21)
    for row, span in enumerate(case.spans):
        assert layout.block_tables[row, : len(span.block_table)].tolist() == list(span.block_table)
