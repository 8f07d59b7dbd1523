"""LoRA adapters under tensor parallelism: two gloo ranks, each holding its slice of A and B as of the layers they
change (B by output rows for column-parallel projections, A by input columns for o_proj and down_proj, summed in the
base layer's all-reduce), give the single process's logits and greedy tokens for base rows and adapter rows alike."""

from __future__ import annotations

import socket
from pathlib import Path

import torch
import torch.multiprocessing as mp
from lora_testing import EVERYTHING, VALUES, write_adapter
from lora_tp_worker import WORLD_SIZE, run_adapters, run_rank
from shard_testing import write_tiny_llama
from tandem_server.distributed import ParallelContext

ADAPTERS = {
    "values": VALUES,
    "everything": EVERYTHING,
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_two_gloo_ranks_serving_adapters_match_the_single_process(tmp_path: Path) -> None:
    reference = write_tiny_llama(tmp_path / "model")
    for name, spec in ADAPTERS.items():
        write_adapter(tmp_path / name, reference, spec)
    single = run_adapters(tmp_path, ParallelContext())
    mp.start_processes(run_rank, args=(tmp_path, free_port()), nprocs=WORLD_SIZE, start_method="spawn")
    ranks = [torch.load(tmp_path / f"rank{rank}.pt") for rank in range(WORLD_SIZE)]
    tokens = single["tokens"]
    assert isinstance(tokens, dict) and len({tuple(t) for t in tokens.values()}) == 3, "each adapter changes tokens"
    for result in ranks:
        torch.testing.assert_close(result["logits"], single["logits"], rtol=1e-4, atol=1e-4)
        assert result["tokens"] == tokens
    assert torch.equal(ranks[0]["logits"], ranks[1]["logits"])
