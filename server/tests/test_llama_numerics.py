"""Our Llama forward over the paged cache matches transformers for mixed chunked/decode steps."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from reference_checks import Target, assert_greedy_matches_generate, assert_mixed_steps_match_logits
from shard_testing import CHECKPOINT_VARIANTS, write_tiny_llama


@pytest.mark.parametrize("variant", sorted(CHECKPOINT_VARIANTS))
def test_mixed_steps_match_transformers_logits(tmp_path: Path, variant: str) -> None:
    reference = write_tiny_llama(tmp_path, **CHECKPOINT_VARIANTS[variant])
    assert_mixed_steps_match_logits(tmp_path, reference, variant)


@pytest.mark.parametrize("variant", sorted(CHECKPOINT_VARIANTS))
def test_bfloat16_steps_err_at_most_twice_as_much_as_transformers_in_bfloat16(tmp_path: Path, variant: str) -> None:
    reference = write_tiny_llama(tmp_path, **CHECKPOINT_VARIANTS[variant])
    assert_mixed_steps_match_logits(tmp_path, reference, variant, Target(dtype=torch.bfloat16))


@pytest.mark.parametrize("variant", sorted(CHECKPOINT_VARIANTS))
def test_greedy_generation_matches_transformers_generate(tmp_path: Path, variant: str) -> None:
    reference = write_tiny_llama(tmp_path, **CHECKPOINT_VARIANTS[variant])
    assert_greedy_matches_generate(tmp_path, reference, variant)
