"""One tensor-parallel rank serving a vision-language checkpoint for the two-process test; it reads its request and
chunk size from a file, so spawned ranks import no test helper that builds checkpoints."""

from __future__ import annotations

from pathlib import Path

import torch
from tandem_server.distributed import GroupAddress, ParallelContext, init_distributed, shutdown_distributed
from tandem_server.engine.companions import Companions
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, WarmupPlan
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.vision.loader import load_image_embedder

WORLD_SIZE = 2
BLOCK_SIZE = 4


@torch.inference_mode()
def run_vision(checkpoint: Path, request: NewRequest, chunk: int, parallel: ParallelContext) -> dict[str, object]:
    """The greedy tokens of `request`, its prompt run in chunks of `chunk`, and every draw's logits."""
    config = read_checkpoint_config(checkpoint)
    model = load_model(config, torch.float32, torch.device("cpu"), parallel, TorchAttentionBackend())
    images = load_image_embedder(config, torch.float32, torch.device("cpu"), 1 << 20)
    options = ExecutionOptions(kv_cache_memory=1 << 20)
    runner = ModelRunner(
        model, config.eos_token_ids, torch.float32, torch.device("cpu"), options, Companions(images=images)
    )
    runner.warmup(WarmupPlan(BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=4))
    logits: list[torch.Tensor] = []
    compute_logits = model.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        logits.append(compute_logits(hidden))
        return logits[-1]

    model.compute_logits = recording  # type: ignore[method-assign]
    total = len(request.token_ids) + request.stopping.max_new_tokens
    blocks = tuple(range(-(-total // BLOCK_SIZE)))
    computed, tokens = 0, list(request.token_ids)
    new: tuple[NewRequest, ...] = (request,)
    while len(tokens) < total:
        count = min(chunk, len(tokens) - computed)
        scheduled = ScheduledRequest(request.id, count, blocks if new else (), computed)
        output = runner.step(StepInput(new_requests=new, scheduled=(scheduled,)))
        new, computed = (), computed + count
        tokens.extend(generation.token_id for generation in output.generations)
    return {"tokens": tokens[len(request.token_ids) :], "logits": torch.cat(logits)}


def run_rank(rank: int, root: Path, port: int) -> None:
    """Serves `root/request.pt` (a request and its chunk size) on this rank and saves the results to
    `root/rank{rank}.pt`."""
    torch.set_num_threads(1)
    parallel = init_distributed(rank, WORLD_SIZE, GroupAddress("127.0.0.1", port), "cpu")
    try:
        saved = torch.load(root / "request.pt", weights_only=False)
        torch.save(run_vision(root / "model", saved["request"], saved["chunk"], parallel), root / f"rank{rank}.pt")
    finally:
        shutdown_distributed()
