"""The CUDA LoRA path (BGMV Triton kernels over device slots) checked on the CPU under Triton's interpreter."""

from __future__ import annotations

import pytest
from triton_testing import assert_cases_pass_under_the_interpreter

triton = pytest.importorskip("triton")


@pytest.mark.slow
def test_lora_kernels_and_device_slots_match_the_references_under_the_interpreter() -> None:
    assert_cases_pass_under_the_interpreter("lora_triton_cases.py")
