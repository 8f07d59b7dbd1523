"""gpt-oss under --torch-compile: compiled layer stages (the MXFP4 experts called eagerly between their graphs) and
warm-up-compiled decode graphs that add the attention sinks give transformers' logits and greedy tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
from gpt_oss_testing import write_gpt_oss, write_gpt_oss_mxfp4
from reference_checks import Target, assert_greedy_matches_generate, assert_mixed_steps_match_logits, warm_for_reference
from shard_testing import make_runner
from tandem_server.config import CompileMode

# The slow tier (compiles graphs with Inductor): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

WRITERS = {"float": write_gpt_oss, "mxfp4": write_gpt_oss_mxfp4}


@pytest.mark.parametrize("weights", WRITERS)
def test_compiled_layers_match_transformers_logits(tmp_path: Path, weights: str) -> None:
    reference = WRITERS[weights](tmp_path)
    assert_mixed_steps_match_logits(tmp_path, reference, f"gpt-oss {weights} compiled", Target(compiled=True))


@pytest.mark.parametrize("weights", WRITERS)
def test_warmup_compiled_decode_graphs_match_transformers_generate(tmp_path: Path, weights: str) -> None:
    reference = WRITERS[weights](tmp_path)
    runner = warm_for_reference(make_runner(tmp_path, compile_mode=CompileMode.WARMUP))
    assert_greedy_matches_generate(tmp_path, reference, f"gpt-oss {weights} compiled", runner=runner, eos_token_id=2)
