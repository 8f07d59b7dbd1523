"""Speculative decoding with a draft model on the shard: it proposes each drafting request's next tokens greedily
from its own KV cache (addressed by the router's block tables), and the model keeps them only where they equal its
own draws, so outputs never change whatever the draft model holds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from draft_testing import greedy_and_seeded_requests, run
from shard_testing import CPU, load_tiny_model, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.bootstrap import load_draft_model
from tandem_server.config import ShardConfig
from tandem_server.distributed import ParallelContext
from tandem_server.engine.draft_model import DraftRow
from tandem_server.engine.step import ScheduledRequest, StepInput, WarmupPlan
from tandem_server.errors import ConfigError, InvalidStepError
from tandem_server.sampling import SamplingParams
from transformers import AutoModelForCausalLM, PreTrainedModel


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("target")
    write_tiny_llama(path)
    return path


@pytest.fixture(scope="module")
def reference_model(checkpoint: Path) -> PreTrainedModel:
    return AutoModelForCausalLM.from_pretrained(checkpoint, attn_implementation="eager").eval()


@pytest.fixture(scope="module")
def other_draft(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A different model of the same vocabulary: its drafts are sometimes right, mostly wrong."""
    path = tmp_path_factory.mktemp("other-draft")
    write_tiny_llama(path, seed=7, num_hidden_layers=1)
    return path


def test_the_model_drafting_for_itself_has_every_greedy_draft_kept_and_changes_nothing(checkpoint: Path) -> None:
    greedy = [new_request(1, [5, 20, 21, 22], max_new_tokens=14), new_request(2, [7, *range(30, 39)], 11)]
    reference = run(warmed(make_runner(checkpoint)), greedy, drafter=None)
    drafted = run(warmed(make_runner(checkpoint, draft_path=checkpoint)), greedy, drafter=None, model_drafts=4)
    assert drafted.tokens == reference.tokens
    # A draft's keys and values left stale, or written at the wrong position, would make a draft differ.
    assert drafted.accepted == drafted.drafted > 0
    assert drafted.steps < reference.steps / 2, (drafted.steps, reference.steps)
    for rid, logprobs in reference.logprobs.items():
        assert drafted.logprobs[rid] == pytest.approx(logprobs, abs=1e-4)


def test_seeded_requests_draw_the_same_tokens_with_a_draft_model(checkpoint: Path, other_draft: Path) -> None:
    requests = greedy_and_seeded_requests()
    reference = run(warmed(make_runner(checkpoint)), requests, drafter=None)
    for draft in (checkpoint, other_draft):
        drafted = run(warmed(make_runner(checkpoint, draft_path=draft)), requests, drafter=None, model_drafts=3)
        assert drafted.tokens == reference.tokens
        assert drafted.drafted > 0


def test_after_refused_drafts_each_proposal_is_the_greedy_continuation_of_the_whole_context(
    checkpoint: Path, reference_model: PreTrainedModel
) -> None:
    # Sampled tokens often differ from the draft model's greedy drafts: its keys and values written for the refused
    # ones must never be read as the request's own, even after steps without drafts.
    runner = warmed(make_runner(checkpoint, draft_path=checkpoint))
    assert runner.draft_model is not None
    proposals: list[tuple[list[int], tuple[int, ...]]] = []
    propose = runner.draft_model.propose

    def recording(rows: list[DraftRow]) -> dict[int, tuple[int, ...]]:
        drafts = propose(rows)
        proposals.extend((list(row.state.token_ids), drafts[row.state.id]) for row in rows)
        return drafts

    runner.draft_model.propose = recording  # type: ignore[method-assign]
    sampled = SamplingParams(temperature=1.0, seed=3)
    requests = [new_request(rid, [5 + rid, 20, 21, 22], max_new_tokens=20, sampling=sampled) for rid in (1, 2)]
    drafted = run(runner, requests, drafter=None, model_drafts=3, draft_every=3)
    assert 0 < drafted.accepted < drafted.drafted
    for context, drafts in proposals:
        assert _greedy_continuation(reference_model, context, len(drafts)) == drafts, context


def _greedy_continuation(model: PreTrainedModel, context: list[int], count: int) -> tuple[int, ...]:
    tokens = list(context)
    with torch.no_grad():
        for _ in range(count):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tuple(tokens[len(context) :])


def test_a_different_draft_model_has_drafts_refused_and_changes_nothing(checkpoint: Path, other_draft: Path) -> None:
    greedy = [new_request(1, [5, 20, 21, 22], max_new_tokens=16), new_request(2, [9, 50, 51], max_new_tokens=12)]
    reference = run(warmed(make_runner(checkpoint)), greedy, drafter=None)
    drafted = run(warmed(make_runner(checkpoint, draft_path=other_draft)), greedy, drafter=None, model_drafts=4)
    assert drafted.tokens == reference.tokens
    assert drafted.accepted < drafted.drafted


def test_a_long_catch_up_runs_in_forward_passes_no_larger_than_a_step(checkpoint: Path) -> None:
    runner = make_runner(checkpoint, draft_path=checkpoint)
    runner.warmup(WarmupPlan(block_size=4, max_batch_tokens=5, max_batch_requests=4))
    assert runner.draft_model is not None
    sizes: list[int] = []
    draft_forward = runner.draft_model.model.forward

    def recording(input_ids: torch.Tensor, *args: object) -> torch.Tensor:
        sizes.append(int(input_ids.shape[0]))
        return draft_forward(input_ids, *args)

    runner.draft_model.model.forward = recording  # type: ignore[method-assign]
    # 13 prompt tokens run 5 at a time; its first decode drafts after catching up on all 14 tokens.
    prompt = [5, *range(20, 32)]
    reference = run(warmed(make_runner(checkpoint)), [new_request(1, prompt, max_new_tokens=10)], drafter=None)
    drafted = run(runner, [new_request(1, prompt, max_new_tokens=10)], drafter=None, model_drafts=3)
    assert drafted.tokens == reference.tokens
    assert drafted.accepted == drafted.drafted > 0
    assert max(sizes) == 5
    assert sizes[:3] == [5, 5, 4], sizes


def test_warmup_sizes_the_cache_for_both_models_keys_and_values(checkpoint: Path, other_draft: Path) -> None:
    alone = make_runner(checkpoint, kv_cache_memory=1 << 20)
    alone_blocks = alone.warmup(WarmupPlan(block_size=4, max_batch_tokens=16, max_batch_requests=4)).num_blocks
    paired = make_runner(checkpoint, kv_cache_memory=1 << 20, draft_path=other_draft)
    result = paired.warmup(WarmupPlan(block_size=4, max_batch_tokens=16, max_batch_requests=4))
    assert paired.cache is not None and paired.draft_model is not None and paired.draft_model.cache is not None
    # The target has 2 layers, the draft 1 of the same width: a block costs 1.5 times as much.
    assert result.num_blocks == (1 << 20) // (paired.cache.geometry.bytes_per_block * 3 // 2) - 1 < alone_blocks
    assert paired.draft_model.cache.num_blocks == result.num_blocks
    assert result.kv_cache_bytes == paired.cache.nbytes + paired.draft_model.cache.nbytes <= 1 << 20


def _first_decode(draft_tokens: tuple[int, ...], model_drafts: int) -> StepInput:
    return StepInput(scheduled=(ScheduledRequest(1, 1, (1,), 3, draft_tokens, model_drafts),))


@pytest.mark.parametrize(
    ("with_draft_model", "step", "message"),
    [
        (False, _first_decode((), 2), "without a draft model"),
        (True, _first_decode((3,), 2), "draft tokens and draft-model drafts"),
    ],
    ids=["no draft model", "both kinds of drafts"],
)
def test_model_drafts_the_shard_cannot_run_fail_the_step(
    checkpoint: Path, with_draft_model: bool, step: StepInput, message: str
) -> None:
    runner = warmed(make_runner(checkpoint, draft_path=checkpoint if with_draft_model else None))
    request = new_request(1, [5, 20, 21])
    output = runner.step(StepInput(new_requests=(request,), scheduled=(ScheduledRequest(1, 3, (0,), 0),)))
    assert len(output.generations) == 1
    with pytest.raises(InvalidStepError, match=message):
        runner.step(step)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"vocab_size": 64}, "its vocabulary has 64 tokens, the model's 96"),
        ({"max_position_embeddings": 32}, "it holds 32 positions, the model 128"),
    ],
    ids=["other vocabulary", "fewer positions"],
)
def test_a_draft_model_that_cannot_draft_for_the_model_is_refused_at_start(
    checkpoint: Path, tmp_path: Path, overrides: dict, message: str
) -> None:
    write_tiny_llama(tmp_path, **overrides)
    config = ShardConfig(model_path=checkpoint, uds_path=tmp_path / "shard.sock", draft_model_path=tmp_path)
    with pytest.raises(ConfigError, match=message):
        load_draft_model(config, load_tiny_model(checkpoint), ParallelContext(), CPU)


def test_a_loaded_draft_model_is_described_by_architecture_and_layers(checkpoint: Path, other_draft: Path) -> None:
    config = ShardConfig(model_path=checkpoint, uds_path=other_draft / "shard.sock", draft_model_path=other_draft)
    drafting = load_draft_model(config, load_tiny_model(checkpoint), ParallelContext(), CPU)
    assert drafting is not None
    assert drafting.describe() == "LlamaForCausalLM, 1 layer"
