"""One tensor-parallel rank for the two-process test; kept free of transformers so spawned ranks start fast."""

from __future__ import annotations

from pathlib import Path

import torch
from tandem_server.distributed import init_distributed, shutdown_distributed
from tandem_server.engine.batch import ScheduledSpan, build_step_batch
from tandem_server.engine.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from torch import nn

WORLD_SIZE = 2
BLOCK_SIZE = 4
PROMPT = [5, 17, 33, 8, 61, 12, 40, 9, 71]


@torch.inference_mode()
def prompt_logits(model: nn.Module) -> torch.Tensor:
    """Logits of every prompt position, computed through a paged cache with non-contiguous blocks."""
    geometry = CacheGeometry(2, BLOCK_SIZE, model.spec.num_kv_heads, model.spec.head_dim, torch.float32)
    cache = KVCache(geometry, num_blocks=4, device=torch.device("cpu"))
    batch = build_step_batch([ScheduledSpan(PROMPT, 0, [2, 0, 3])], BLOCK_SIZE, torch.device("cpu"))
    return model.compute_logits(model(batch.input_ids, batch.positions, cache.layers, batch.metadata))


def run_rank(rank: int, checkpoint: Path, port: int, out_dir: Path) -> None:
    """Loads this rank's slice of the checkpoint and saves its prompt logits to `out_dir/rank{rank}.pt`."""
    torch.set_num_threads(1)
    parallel = init_distributed(rank, WORLD_SIZE, "127.0.0.1", port, "cpu")
    try:
        config = read_checkpoint_config(checkpoint)
        model = load_model(config, torch.float32, torch.device("cpu"), parallel, TorchAttentionBackend())
        torch.save((model.spec.num_kv_heads, prompt_logits(model)), out_dir / f"rank{rank}.pt")
    finally:
        shutdown_distributed()
