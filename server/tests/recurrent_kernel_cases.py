"""fla's Triton kernels for the recurrent layers (Gated DeltaNet's delta rule, Mamba-2's scan) against Tandem's torch
forms: run on CUDA, or on CPU by Triton's interpreter.

Not collected by default (no `test_` prefix): `test_recurrent_kernels.py` runs it in a subprocess with
TRITON_INTERPRET=1, and `make gpu-check` runs it on CUDA. Each step holds spans of different lengths (one crossing
fla's 64-token chunk) from nonzero carried states, or decodes only; the torch forms run on CPU in float32.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import pytest
import torch
from triton_testing import interpret_library_kernels

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
ON_CUDA = torch.cuda.is_available() and not INTERPRETED
DEVICE = torch.device("cuda" if ON_CUDA else "cpu")
# Both sides compute in float32 and differ only in the order of their sums (fla solves each chunk blockwise): a few
# float32 roundings of values of order one. On CUDA, fla's dots round their float32 operands to TF32 (10-bit
# mantissas), about 1e-3 each.
TOLERANCE = {"atol": 1e-2, "rtol": 1e-2} if ON_CUDA else {"atol": 1e-5, "rtol": 1e-5}

if not ON_CUDA and not INTERPRETED:
    pytest.skip("needs CUDA or TRITON_INTERPRET=1", allow_module_level=True)

if INTERPRETED:
    interpret_library_kernels()

from tandem_server.layers.recurrent.gated_delta_rule import gated_delta_rule_spans, l2_normalise  # noqa: E402
from tandem_server.layers.recurrent.kernels import fla_delta_rule_spans, fla_ssd_spans  # noqa: E402
from tandem_server.layers.recurrent.ssd_scan import ssd_scan_spans  # noqa: E402

# A step of prompt chunks (one crossing a 64-token chunk, one of a single token) and a step of decodes only.
STEPS = {"prompt-chunks": [5, 70, 1, 3], "decodes": [1, 1, 1]}
HEADS, KEY_DIM, VALUE_DIM = 2, 16, 8

Spans = Callable[..., tuple[torch.Tensor, torch.Tensor]]


def _assert_kernel_matches_torch(kernel: Spans, reference: Spans, inputs: list[torch.Tensor], lens: list[int]) -> None:
    *flat, state = inputs
    expected, expected_state = reference(*flat, lens, state)
    outputs, states = kernel(*(x.to(DEVICE) for x in flat), lens, state.to(DEVICE))
    torch.testing.assert_close(outputs.cpu(), expected, **TOLERANCE)
    torch.testing.assert_close(states.cpu(), expected_state, **TOLERANCE)


@pytest.mark.parametrize("step", STEPS)
def test_fla_delta_rule_matches_the_torch_form(step: str) -> None:
    torch.manual_seed(0)
    lens = STEPS[step]
    tokens = sum(lens)
    query = l2_normalise(torch.randn(tokens, HEADS, KEY_DIM)) * KEY_DIM**-0.5
    key = l2_normalise(torch.randn(tokens, HEADS, KEY_DIM))
    value = torch.randn(tokens, HEADS, VALUE_DIM)
    decay, beta = -torch.rand(tokens, HEADS), torch.rand(tokens, HEADS)
    state = torch.randn(len(lens), HEADS, KEY_DIM, VALUE_DIM)
    inputs = [query, key, value, decay, beta, state]
    _assert_kernel_matches_torch(fla_delta_rule_spans, gated_delta_rule_spans, inputs, lens)


@pytest.mark.parametrize("step", STEPS)
def test_fla_simple_gla_matches_the_ssd_scan(step: str) -> None:
    torch.manual_seed(1)
    lens = STEPS[step]
    tokens, state_size = sum(lens), KEY_DIM
    dt = torch.nn.functional.softplus(torch.randn(tokens, HEADS))
    weighted_x = torch.randn(tokens, HEADS, VALUE_DIM) * dt.unsqueeze(-1)
    log_decay = dt * (-torch.rand(HEADS) - 0.1)
    # B and C of unit norm keep the outputs of order one.
    b, c = (torch.randn(tokens, HEADS, state_size) * state_size**-0.5 for _ in range(2))
    state = torch.randn(len(lens), HEADS, VALUE_DIM, state_size)

    def ssd_reference(*args: torch.Tensor | list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        return ssd_scan_spans(*args, chunk=16)  # type: ignore[arg-type]

    _assert_kernel_matches_torch(fla_ssd_spans, ssd_reference, [weighted_x, log_decay, b, c, state], lens)
