"""State checkpoints on a hybrid shard: a span saves its request's recurrent state into a checkpoint the router
names, and a new request after a cached prefix restores it, so it continues exactly as if it had computed the
prefix itself; checkpoints that do not hold the prefix's state are refused."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from shard_testing import make_runner, new_request
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import ScheduledRequest, StepInput, WarmupPlan
from tandem_server.errors import InvalidStepError
from test_families_gated_delta_net import write_hybrid
from transformers import PreTrainedModel

BLOCK_SIZE = 4
PROMPT_LEN = 23
# The block-aligned prefix the first request saves and the second resumes after.
CHECKPOINT_AT = 20
NEW_TOKENS = 6


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, PreTrainedModel]:
    path = tmp_path_factory.mktemp("qwen3_5")
    return path, write_hybrid(path)


def warmed_runner(path: Path, checkpoints: int = 4) -> ModelRunner:
    runner = make_runner(path)
    runner.warmup(
        WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=2, max_state_checkpoints=checkpoints)
    )
    return runner


def scheduled(
    request_id: int, start: int, num_tokens: int, blocks: tuple[int, ...] = (), **checkpoints: int
) -> ScheduledRequest:
    return ScheduledRequest(
        id=request_id, num_tokens=num_tokens, new_block_ids=blocks, num_computed_tokens=start, **checkpoints
    )


def decode(runner: ModelRunner, request_id: int, position: int, first: int, blocks: list[int]) -> list[int]:
    """Greedy tokens after `first` (sampled at `position`), one step each, growing the block table from `blocks`."""
    tokens = [first]
    while len(tokens) < NEW_TOKENS:
        end = position + len(tokens)
        grow = (blocks.pop(0),) if (end - 1) % BLOCK_SIZE == 0 else ()
        out = runner.step(StepInput(scheduled=(scheduled(request_id, end - 1, 1, grow),)))
        tokens.append(out.generations[0].token_id)
    return tokens


def test_a_request_restored_from_a_checkpoint_continues_as_the_request_that_saved_it(
    hybrid: tuple[Path, PreTrainedModel],
) -> None:
    path, reference = hybrid
    runner = warmed_runner(path)
    prompt = [random.Random(5).randrange(3, 96) for _ in range(PROMPT_LEN)]
    first_blocks = (0, 1, 2, 3, 4, 5)
    saved = runner.step(
        StepInput(
            new_requests=(new_request(1, prompt, NEW_TOKENS),),
            scheduled=(scheduled(1, 0, CHECKPOINT_AT, first_blocks[:5], save_state_checkpoint=2),),
        )
    )
    assert not saved.generations and not saved.failures
    out = runner.step(StepInput(scheduled=(scheduled(1, CHECKPOINT_AT, PROMPT_LEN - CHECKPOINT_AT, first_blocks[5:]),)))
    original = decode(runner, 1, PROMPT_LEN, out.generations[0].token_id, [6, 7])
    # The second request shares the first five blocks and brings its own for the rest.
    resumed = runner.step(
        StepInput(
            new_requests=(new_request(2, prompt, NEW_TOKENS),),
            scheduled=(
                scheduled(2, CHECKPOINT_AT, PROMPT_LEN - CHECKPOINT_AT, (0, 1, 2, 3, 4, 8), restore_state_checkpoint=2),
            ),
        )
    )
    restored = decode(runner, 2, PROMPT_LEN, resumed.generations[0].token_id, [9, 10])
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, do_sample=False)
    assert original == expected[0, PROMPT_LEN:].tolist()
    assert restored == original


def test_a_checkpoint_saved_at_another_position_is_refused(hybrid: tuple[Path, PreTrainedModel]) -> None:
    runner = warmed_runner(hybrid[0])
    prompt = list(range(3, 3 + PROMPT_LEN))
    runner.step(
        StepInput(
            new_requests=(new_request(1, prompt),),
            scheduled=(scheduled(1, 0, 8, (0, 1), save_state_checkpoint=0),),
        )
    )
    with pytest.raises(InvalidStepError, match="holds the state after 8 tokens"):
        runner.step(
            StepInput(
                new_requests=(new_request(2, prompt),),
                scheduled=(scheduled(2, 12, 4, (0, 1, 2, 3), restore_state_checkpoint=0),),
            )
        )


@pytest.mark.parametrize(("checkpoint", "message"), [(1, "holds no state"), (4, r"outside 0\.\.3")])
def test_an_empty_or_unknown_checkpoint_is_refused(
    hybrid: tuple[Path, PreTrainedModel], checkpoint: int, message: str
) -> None:
    runner = warmed_runner(hybrid[0])
    with pytest.raises(InvalidStepError, match=message):
        runner.step(
            StepInput(
                new_requests=(new_request(1, list(range(3, 20))),),
                scheduled=(scheduled(1, 8, 4, (0, 1, 2), restore_state_checkpoint=checkpoint),),
            )
        )


def test_checkpoints_take_at_most_a_quarter_of_the_cache_budget(hybrid: tuple[Path, PreTrainedModel]) -> None:
    runner = make_runner(hybrid[0], kv_cache_memory=4 * 1024 * 1024)
    many = runner.warmup(
        WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=2, max_state_checkpoints=10**6)
    )
    assert 0 < many.state_checkpoint_bytes <= 1024 * 1024
    assert many.state_checkpoint_bytes + many.kv_cache_bytes <= 4 * 1024 * 1024
    none = runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=2))
    assert (none.num_state_checkpoints, none.state_checkpoint_bytes) == (0, 0)
    assert none.num_blocks > many.num_blocks
