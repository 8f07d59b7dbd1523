"""The Triton paged-attention kernel against the torch backend: run on CUDA, or on CPU by Triton's interpreter.

Not collected by default (no `test_` prefix): `test_attention_backends.py` runs it in a subprocess with
TRITON_INTERPRET=1, and `make gpu-check` runs it on CUDA in bfloat16.
"""

from __future__ import annotations

import os

import pytest
import torch
from attention_testing import DECODE_STEP, HEAD_DIM, MIXED_STEP, paged_case, reference_output
from tandem_server.layers.attention import AttentionParams, LayerCache

ON_CUDA = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
DTYPE = torch.bfloat16 if ON_CUDA else torch.float32
# bfloat16 keeps 8 mantissa bits; the reference runs in float32 on the same bfloat16 inputs.
TOLERANCE = {"atol": 2e-2, "rtol": 2e-2} if ON_CUDA else {"atol": 2e-5, "rtol": 2e-5}
PARAMS = {
    "causal": AttentionParams(scale=HEAD_DIM**-0.5),
    "sliding_window": AttentionParams(scale=HEAD_DIM**-0.5, sliding_window=5),
    "softcap": AttentionParams(scale=0.3, logit_softcap=2.5),
    "window_and_softcap": AttentionParams(scale=0.3, sliding_window=3, logit_softcap=2.5),
}
STEPS = {"mixed": MIXED_STEP, "decode_only": DECODE_STEP}

if not ON_CUDA and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)


@pytest.mark.parametrize("step", STEPS)
@pytest.mark.parametrize("params", PARAMS)
def test_triton_kernel_matches_torch_backend(step: str, params: str) -> None:
    from tandem_server.layers.attention.triton_backend import TritonAttentionBackend  # noqa: PLC0415

    case = paged_case(STEPS[step], seed=len(params), dtype=DTYPE)
    expected, expected_cache = reference_output(case, PARAMS[params])
    cache = LayerCache(case.cache.key.to(DEVICE), case.cache.value.to(DEVICE))
    metadata = case.batch(slot_lists=False, device=DEVICE).metadata
    query, key, value = (tensor.to(DEVICE) for tensor in (case.query, case.key, case.value))
    output = TritonAttentionBackend().forward(query, key, value, cache, metadata, PARAMS[params])
    torch.testing.assert_close(output.float().cpu(), expected.float(), **TOLERANCE)
    torch.testing.assert_close(cache.key.cpu(), expected_cache.key)
    torch.testing.assert_close(cache.value.cpu(), expected_cache.value)
