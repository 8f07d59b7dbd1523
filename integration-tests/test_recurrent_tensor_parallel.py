"""`--num-shard 2` on small random hybrids serves the greedy tokens of `--num-shard 1`: Qwen3.5, each rank holding
its key heads of the Gated DeltaNet layers, and Granite 4.0-H with one Mamba-2 group, each rank holding half its heads
and both normalising the group over the two ranks. Prompts run alone, then together; the longest is prefilled over
two steps."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from recurrent_models import LONG_PROMPT, PREFILL_CHUNK, PROMPTS, serving_flags, write_random_hybrid
from reference import Reference
from tandem_harness import TandemServer

MAX_NEW_TOKENS = 8


@pytest.fixture(scope="module", params=["granite-hybrid-one-group", "qwen3_5"])
def model_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_hybrid(request.param, tmp_path_factory.mktemp(request.param))


def _greedy_ids(model_dir: Path, log_dir: Path, num_shard: int) -> tuple[list[list[int]], list[list[int]]]:
    """Each prompt's greedy tokens run alone, then all of them run together."""
    flags = (*serving_flags(model_dir), "--num-shard", str(num_shard))
    server = TandemServer.start(log_dir / f"launcher-{num_shard}.log", *flags)
    try:
        assert server.info()["num_shard"] == num_shard
        alone = [server.generate_ids(prompt, MAX_NEW_TOKENS) for prompt in PROMPTS]
        with ThreadPoolExecutor(max_workers=len(PROMPTS)) as pool:
            together = list(pool.map(lambda prompt: server.generate_ids(prompt, MAX_NEW_TOKENS), PROMPTS))
        return alone, together
    finally:
        assert server.stop() == 0, server.log_tail()


def test_two_shards_give_the_greedy_tokens_of_one_shard_alone_and_together(model_dir: Path, tmp_path: Path) -> None:
    one_alone, one_together = _greedy_ids(model_dir, tmp_path, 1)
    two_alone, two_together = _greedy_ids(model_dir, tmp_path, 2)
    reference = Reference(model_dir)
    assert len(reference.encode(LONG_PROMPT)) > PREFILL_CHUNK
    for index, prompt in enumerate(PROMPTS):
        assert len(one_alone[index]) > 0
        # Row-parallel sums round differently from one matmul, so only a genuine near-tie may flip a token.
        reference.assert_same_greedy(prompt, one_alone[index], two_alone[index])
        reference.assert_same_greedy(prompt, one_together[index], two_together[index])
