"""Steps replayed from CUDA graphs give the tokens eager steps give, drafts included: the runner captures its graphs
at Warmup on a fake CUDA device whose graphs replay the captured operators on the captured tensors, with every host
value fixed at capture, as a CUDA graph does."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch
from draft_testing import BLOCK_SIZE, Outcome, greedy_and_seeded_requests, oracle, run
from fake_cuda import FakeCuda
from shard_testing import load_tiny_model, step_graphs, write_tiny_llama
from tandem_server.engine.companions import Companions
from tandem_server.engine.draft_model import DraftModel
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import WarmupPlan
from tandem_server.execution.batch import StepBatch
from tandem_server.layers.attention import SdpaAttentionBackend

MAX_DRAFTS = 4
CUDA = torch.device("cuda", 0)


def _runner(
    checkpoint: Path, device: torch.device, options: ExecutionOptions, draft_model: DraftModel | None = None
) -> ModelRunner:
    # The sdpa backend runs anywhere from device tensors alone, so the graphs replay it on the CPU too.
    model = load_tiny_model(checkpoint, backend=SdpaAttentionBackend())
    return ModelRunner(model, (2,), torch.float32, device, options, Companions(draft_model=draft_model))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("graphs")
    write_tiny_llama(path)
    return path


def _eager_on_fake_cuda(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, draft_model: DraftModel | None = None
) -> Outcome:
    """The requests served step by step on the fake CUDA device without graphs: seeded draws use the device's own
    noise (a keyed hash on CUDA, generators on the CPU), so the graphs' tokens are compared with the same device's."""
    FakeCuda(free_bytes=16 * 1024 * 1024).install(monkeypatch)
    options = ExecutionOptions(cuda_memory_fraction=0.5)
    runner = _runner(checkpoint, CUDA, options, draft_model)

    def serve() -> Outcome:
        runner.warmup(WarmupPlan(block_size=BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=4))
        model_drafts = MAX_DRAFTS if draft_model is not None else 0
        return run(runner, greedy_and_seeded_requests(), drafter=None, model_drafts=model_drafts)

    with ThreadPoolExecutor(max_workers=1) as worker:
        return worker.submit(serve).result()


@pytest.fixture
def eager(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> Outcome:
    return _eager_on_fake_cuda(checkpoint, monkeypatch)


def _replayed(
    checkpoint: Path,
    monkeypatch: pytest.MonkeyPatch,
    eager: Outcome,
    max_drafting_requests: int,
    self_drafting: bool = False,
) -> tuple[Outcome, list[bool], int]:
    """The requests served on fake CUDA with graphs, drafting the eager tokens (every other draft wrong), or with
    `self_drafting` asking the shard's draft model, the checkpoint itself, for every draft; with which of the
    model's steps replayed a verifying graph, and how many graph replays (the draft model's too) there were."""
    fake = FakeCuda(free_bytes=16 * 1024 * 1024)
    fake.install(monkeypatch)
    options = ExecutionOptions(cuda_memory_fraction=0.5, cuda_graph_sizes=(1, 2, 4))
    draft_model = None
    if self_drafting:
        draft_model = DraftModel(
            load_tiny_model(checkpoint, backend=SdpaAttentionBackend()), "llama", torch.float32, CUDA
        )
    runner = _runner(checkpoint, CUDA, options, draft_model)
    requests = greedy_and_seeded_requests()
    prompts = {request.id: len(request.token_ids) for request in requests}
    # For each replayed step: whether it verified drafts.
    replayed: list[bool] = []

    def serve() -> Outcome:
        # On a worker thread, as the model thread runs it: the fake places that thread's CUDA tensors on the CPU.
        plan = WarmupPlan(BLOCK_SIZE, 64, 4, max_drafts=MAX_DRAFTS, max_drafting_requests=max_drafting_requests)
        runner.warmup(plan)
        graphs = step_graphs(runner)
        assert graphs is not None
        run_graph = graphs.run

        def recorded(batch: StepBatch) -> torch.Tensor:
            hidden = run_graph(batch)
            replayed.append(batch.metadata.paged.max_query_len > 1)
            return hidden

        graphs.run = recorded  # type: ignore[method-assign]
        if self_drafting:
            return run(runner, requests, drafter=None, model_drafts=MAX_DRAFTS)
        return run(runner, requests, drafter=oracle(eager.tokens, prompts, wrong_every=2), max_drafts=MAX_DRAFTS)

    with ThreadPoolExecutor(max_workers=1) as worker:
        outcome = worker.submit(serve).result()
    return outcome, replayed, sum(call.name == "CUDAGraph.replay" for call in fake.calls)


def test_verifying_steps_replayed_from_graphs_give_the_eager_tokens(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, eager: Outcome
) -> None:
    outcome, replayed, _ = _replayed(checkpoint, monkeypatch, eager, max_drafting_requests=4)
    assert outcome.tokens == eager.tokens
    assert 0 < outcome.accepted < outcome.drafted
    for rid, logprobs in eager.logprobs.items():
        assert outcome.logprobs[rid] == pytest.approx(logprobs, abs=1e-4)
    # Every step after the prompts' replays a graph, and the drafted ones replay a verifying graph.
    assert len(replayed) == outcome.steps - 1 and sum(replayed) > outcome.steps // 2


def test_without_verifying_graphs_drafted_steps_run_eagerly_with_the_same_tokens(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, eager: Outcome
) -> None:
    outcome, replayed, _ = _replayed(checkpoint, monkeypatch, eager, max_drafting_requests=0)
    assert outcome.tokens == eager.tokens
    assert not any(replayed)


def test_a_draft_model_replays_its_own_graphs_and_its_drafts_change_no_token(
    checkpoint: Path, monkeypatch: pytest.MonkeyPatch, eager: Outcome
) -> None:
    draft_model = DraftModel(load_tiny_model(checkpoint, backend=SdpaAttentionBackend()), "llama", torch.float32, CUDA)
    eager_drafting = _eager_on_fake_cuda(checkpoint, monkeypatch, draft_model)
    outcome, replayed, replays = _replayed(checkpoint, monkeypatch, eager, max_drafting_requests=4, self_drafting=True)
    assert outcome.tokens == eager.tokens == eager_drafting.tokens
    # The same drafts kept as when the draft model runs eagerly.
    assert (outcome.accepted, outcome.drafted) == (eager_drafting.accepted, eager_drafting.drafted)
    assert outcome.accepted > 0 and sum(replayed) > outcome.steps // 2
    # Drafting steps replay the draft model's passes (a short catch-up, then one per further draft) too.
    assert replays - len(replayed) >= 2 * sum(replayed)
