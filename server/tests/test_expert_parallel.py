"""Expert parallelism within one process: ranks' contexts built by hand (no collective runs before the block's
all-reduce), so each rank's experts, what it loads and what it refuses are checked directly. Two real gloo ranks
serving whole models are in test_tensor_parallel.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from moe_gguf_testing import tiny_qwen3_moe, write_tiny_qwen3_moe_gguf
from safetensors import safe_open
from shard_testing import write_tiny_checkpoint
from tandem_launcher.embedded import convert_gguf
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.moe import MoeArgs, RouterConfig
from tandem_server.layers.moe.block import routed_experts
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.routing import Routing
from tandem_server.layers.moe.swiglu_experts import ClampedSwiGLU
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from transformers import MixtralConfig, MixtralForCausalLM

CPU = torch.device("cpu")
HIDDEN, INTERMEDIATE, EXPERTS = 8, 6, 5
# Token 0 -> experts 3, 0; token 1 -> 0, 1; token 2 -> 3, 1; token 3 -> 4, 3: expert 2 gets no token.
CHOSEN = torch.tensor([[3, 0], [0, 1], [3, 1], [4, 3]])


def _rank(rank: int) -> ParallelContext:
    return ParallelContext(rank=rank, world_size=2, expert_parallel=True)


def _whole_experts() -> RoutedExperts:
    torch.manual_seed(0)
    experts = RoutedExperts(EXPERTS, HIDDEN, INTERMEDIATE, "silu", ParallelContext())
    with torch.no_grad():
        for param in experts.parameters():
            param.copy_(torch.randn_like(param))
    return experts


def _rank_experts(rank: int, whole: RoutedExperts) -> RoutedExperts:
    """Rank `rank`'s experts, each a copy of the whole layer's expert of the same index."""
    experts = RoutedExperts(EXPERTS, HIDDEN, INTERMEDIATE, "silu", _rank(rank))
    with torch.no_grad():
        for index in experts.expert_run:
            for name in ("gate_proj", "up_proj", "down_proj"):
                getattr(experts[index], name).weight.copy_(getattr(whole[index], name).weight)
    return experts


def test_each_rank_holds_whole_experts_and_the_ranks_outputs_sum_to_the_whole_layers() -> None:
    whole = _whole_experts()
    ranks = [_rank_experts(rank, whole) for rank in range(2)]
    assert [experts.expert_run for experts in ranks] == [range(0, 3), range(3, 5)]
    assert [tuple(experts.gate_up.shape) for experts in ranks] == [(3, 16, HIDDEN), (2, 16, HIDDEN)]
    assert sum(experts.parameter_count() for experts in ranks) == whole.parameter_count()
    hidden = torch.randn(len(CHOSEN), HIDDEN)
    routing = Routing(CHOSEN, torch.rand(CHOSEN.shape))
    parts = [experts(hidden, routing) for experts in ranks]
    torch.testing.assert_close(parts[0] + parts[1], whole(hidden, routing))
    # Token 1 chose experts 0 and 1 only: rank 1 adds nothing to it.
    assert torch.equal(parts[1][1], torch.zeros(HIDDEN))
    # A step whose pairs all go to one rank leaves the other's term zero.
    only_first = Routing(torch.tensor([[0, 1], [2, 0]]), torch.rand(2, 2))
    assert torch.equal(ranks[1](hidden[:2], only_first), torch.zeros(2, HIDDEN))
    torch.testing.assert_close(ranks[0](hidden[:2], only_first), whole(hidden[:2], only_first))


def test_a_rank_loads_only_its_experts_from_the_checkpoint(tmp_path: Path) -> None:
    write_tiny_checkpoint(
        tmp_path, MixtralConfig, MixtralForCausalLM, num_local_experts=5, num_experts_per_tok=2, intermediate_size=32
    )
    checkpoint = read_checkpoint_config(tmp_path)
    model = load_model(checkpoint, torch.float32, CPU, _rank(1), TorchAttentionBackend())
    experts = next(module for module in model.modules() if isinstance(module, RoutedExperts))
    assert experts.expert_run == range(3, 5)
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        stored = [handle.get_tensor(f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight") for e in (3, 4)]
    torch.testing.assert_close(experts.down[:, :, :32], torch.stack(stored))
    assert experts[0].down_proj.weight.numel() == 0


def test_fewer_experts_than_shards_stop_start_up_naming_both() -> None:
    with pytest.raises(ConfigError, match=r"4 shards.*3 routed experts"):
        RoutedExperts(3, HIDDEN, INTERMEDIATE, "silu", ParallelContext(rank=0, world_size=4, expert_parallel=True))


def test_clamped_swiglu_experts_refuse_expert_parallelism() -> None:
    router = RouterConfig(num_experts=4, top_k=2, normalize_top_k=False)
    moe = MoeArgs(router, INTERMEDIATE, clamped_swiglu=ClampedSwiGLU(1.702, 7.0))
    with pytest.raises(ConfigError, match=r"--expert-parallel.*gpt-oss"):
        routed_experts(HIDDEN, moe, "silu", _rank(0))


def test_quantized_experts_refuse_expert_parallelism(tmp_path: Path) -> None:
    write_tiny_qwen3_moe_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe(), "Q8_0", "Q8_0")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted")
    checkpoint = read_checkpoint_config(tmp_path / "converted")
    with pytest.raises(ConfigError, match=r"--expert-parallel serves float experts only.*layers\.0\.mlp\.experts"):
        load_model(checkpoint, torch.float32, CPU, _rank(0), TorchAttentionBackend(), gguf_blocks=True)
