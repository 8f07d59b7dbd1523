"""One tensor-parallel rank serving LoRA adapters for the two-process test; kept free of transformers so spawned ranks
start fast."""

from __future__ import annotations

from pathlib import Path

import torch
from tandem_server.distributed import GroupAddress, ParallelContext, init_distributed, shutdown_distributed
from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StoppingCriteria, WarmupPlan
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.sampling import SamplingParams

WORLD_SIZE = 2
BLOCK_SIZE = 4
PROMPT = [5, 17, 33, 8, 61, 12, 40, 9, 71]
NEW_TOKENS = 5
# Request id -> the adapter it runs under ("": the base model); all three share every step.
REQUESTS = {1: "", 2: "values", 3: "everything"}


@torch.inference_mode()
def run_adapters(root: Path, parallel: ParallelContext) -> dict[str, object]:
    """Greedy tokens of each request and the logits of every step, with the adapters in `root` loaded."""
    config = read_checkpoint_config(root / "model")
    model = load_model(config, torch.float32, torch.device("cpu"), parallel, TorchAttentionBackend())
    runner = ModelRunner(
        model, config.eos_token_ids, torch.float32, torch.device("cpu"), ExecutionOptions(kv_cache_memory=1 << 20)
    )
    runner.warmup(WarmupPlan(BLOCK_SIZE, max_batch_tokens=64, max_batch_requests=4))
    for name in sorted(set(REQUESTS.values()) - {""}):
        runner.lora.load(name, root / name)
    logits: list[torch.Tensor] = []
    compute_logits = model.compute_logits

    def recording(hidden: torch.Tensor) -> torch.Tensor:
        logits.append(compute_logits(hidden))
        return logits[-1]

    model.compute_logits = recording  # type: ignore[method-assign]
    blocks = -(-(len(PROMPT) + NEW_TOKENS) // BLOCK_SIZE)
    new = tuple(
        NewRequest(rid, tuple(PROMPT), 0, SamplingParams(), StoppingCriteria(NEW_TOKENS), lora_adapter=adapter)
        for rid, adapter in REQUESTS.items()
    )
    tables = {rid: tuple(range((rid - 1) * blocks, rid * blocks)) for rid in REQUESTS}
    step = StepInput(new, tuple(ScheduledRequest(rid, len(PROMPT), tables[rid], 0) for rid in REQUESTS))
    tokens: dict[int, list[int]] = {rid: [] for rid in REQUESTS}
    while step.scheduled:
        for generation in runner.step(step).generations:
            tokens[generation.id].append(generation.token_id)
        running = [rid for rid in REQUESTS if len(tokens[rid]) < NEW_TOKENS]
        step = StepInput(
            scheduled=tuple(ScheduledRequest(rid, 1, (), len(PROMPT) + len(tokens[rid]) - 1) for rid in running)
        )
    return {"tokens": tokens, "logits": torch.stack(logits)}


def run_rank(rank: int, root: Path, port: int) -> None:
    """Runs the adapters on this rank and saves the results to `root/rank{rank}.pt`."""
    torch.set_num_threads(1)
    parallel = init_distributed(rank, WORLD_SIZE, GroupAddress("127.0.0.1", port), "cpu")
    try:
        torch.save(run_adapters(root, parallel), root / f"rank{rank}.pt")
    finally:
        shutdown_distributed()
