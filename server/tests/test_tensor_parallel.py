"""Two gloo ranks, each holding half the heads and MLP columns, produce the single-process logits."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from shard_testing import load_tiny_model, write_tiny_llama
from tp_worker import WORLD_SIZE, prompt_logits, run_rank


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_gloo_ranks_match_single_process_logits(tmp_path: Path) -> None:
    checkpoint = tmp_path / "model"
    write_tiny_llama(checkpoint, num_key_value_heads=2, attention_bias=True, mlp_bias=True)
    expected = prompt_logits(load_tiny_model(checkpoint))
    mp.start_processes(run_rank, args=(checkpoint, free_port(), tmp_path), nprocs=WORLD_SIZE, start_method="spawn")
    for rank in range(WORLD_SIZE):
        kv_heads, logits = torch.load(tmp_path / f"rank{rank}.pt")
        assert kv_heads == 1
        torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)
