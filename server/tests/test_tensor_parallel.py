"""Tensor parallelism: head partitioning, per-rank weight slicing, and two gloo ranks matching one process."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from fp8_testing import write_fp8_checkpoint
from gguf_testing import write_tiny_llama_gguf
from gpt_oss_testing import write_gpt_oss, write_gpt_oss_mxfp4
from safetensors import safe_open
from safetensors.torch import save_file
from shard_testing import randomize_correction_biases, write_tiny_llama
from tandem_launcher.embedded import convert_gguf
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.head_partition import partition_heads
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.weights import loader as weights_loader
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor
from tp_hybrid_checkpoints import (
    QWEN3_NEXT_EXPERTS,
    write_gated_delta_net,
    write_granite_hybrid,
    write_lfm2,
    write_lfm2_moe,
    write_nemotron_h,
)
from tp_worker import COMPILED_PREFIX, EXPERTS_SPLIT, WORLD_SIZE, run_checkpoint, run_rank
from transformers import (
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    Gemma4ForCausalLM,
    Gemma4TextConfig,
    Glm4MoeConfig,
    Glm4MoeForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2MoeConfig,
    Qwen2MoeForCausalLM,
    Qwen3_5ForCausalLM,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

# The slow tier (starts gloo process groups): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

UNEVEN = {"num_attention_heads": 6, "num_key_value_heads": 3, "intermediate_size": 100, "vocab_size": 97}
VARIANTS: dict[str, dict[str, Any]] = {
    "even-gqa-biased": {"num_key_value_heads": 2, "attention_bias": True, "mlp_bias": True},
    "uneven-groups": {**UNEVEN, "hidden_size": 48, "tie_word_embeddings": False},
    "replicated-kv": {"num_key_value_heads": 1, "vocab_size": 95, "tie_word_embeddings": True},
    # --torch-compile: each rank compiles its own shapes, and the row-parallel sums run inside compiled stages.
    f"{COMPILED_PREFIX}uneven-groups": {**UNEVEN, "hidden_size": 48, "tie_word_embeddings": False},
}
FAMILY_VARIANTS = (
    "qwen3",
    "phi3-fused",
    "gguf-q4_0",
    "fp8-channel",
    "fp8-phi3-tensor",
    "mixtral-moe",
    "qwen3-moe-uneven",
    "qwen2-moe-shared",
    f"{COMPILED_PREFIX}qwen3-moe-uneven",
    f"{EXPERTS_SPLIT}mixtral-moe",
    f"{EXPERTS_SPLIT}qwen2-moe-shared",
    f"{COMPILED_PREFIX}{EXPERTS_SPLIT}qwen3-moe-uneven",
    "glm4-moe-grouped",
    "deepseek-v3-mla",
    "gpt-oss",
    "gpt-oss-mxfp4",
    "lfm2-hybrid",
    "lfm2-moe-hybrid",
    "qwen3_5-hybrid",
    "qwen3-next-hybrid",
    "granite-hybrid-one-group",
    "nemotron-h-two-groups",
    f"{EXPERTS_SPLIT}nemotron-h-two-groups",
    "gemma4-shared-kv",
)
# Per rank's KV heads at world size 2.
EXPECTED_KV_HEADS = {
    "gguf-q4_0": (1, 1),
    "even-gqa-biased": (1, 1),
    "uneven-groups": (2, 1),
    f"{COMPILED_PREFIX}uneven-groups": (2, 1),
    "replicated-kv": (1, 1),
    "qwen3": (1, 1),
    "phi3-fused": (2, 1),
    "fp8-channel": (2, 1),
    "fp8-phi3-tensor": (2, 1),
    "mixtral-moe": (1, 1),
    "qwen3-moe-uneven": (1, 1),
    "qwen2-moe-shared": (1, 1),
    f"{COMPILED_PREFIX}qwen3-moe-uneven": (1, 1),
    f"{EXPERTS_SPLIT}mixtral-moe": (1, 1),
    f"{EXPERTS_SPLIT}qwen2-moe-shared": (1, 1),
    f"{COMPILED_PREFIX}{EXPERTS_SPLIT}qwen3-moe-uneven": (1, 1),
    "glm4-moe-grouped": (1, 1),
    # Each rank's cache holds the whole latent: one row per token, whatever its heads.
    "deepseek-v3-mla": (1, 1),
    "gpt-oss": (1, 1),
    "gpt-oss-mxfp4": (1, 1),
    "lfm2-hybrid": (1, 1),
    "lfm2-moe-hybrid": (1, 1),
    "qwen3_5-hybrid": (1, 1),
    "qwen3-next-hybrid": (1, 1),
    "granite-hybrid-one-group": (1, 1),
    "nemotron-h-two-groups": (1, 1),
    f"{EXPERTS_SPLIT}nemotron-h-two-groups": (1, 1),
    # The sliding layers' two KV heads split; the global layers' one KV head (32 wide) is replicated.
    "gemma4-shared-kv": (1, 1),
}

# Quantized GEMMs take bfloat16 activations, which can round the row-parallel sums' float32 differences to one
# bfloat16 step.
LOGITS_TOLERANCE = {
    "gguf-q4_0": {"rtol": 0.02, "atol": 0.05},
    # Its row-parallel sums (experts, shared expert, linear attention) add in another order on each rank: one logit in
    # 864 lands 1.2e-5 from the single process's.
    "qwen3-next-hybrid": {"rtol": 1e-4, "atol": 1e-4},
}


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def rank(index: int, world_size: int = WORLD_SIZE) -> ParallelContext:
    return ParallelContext(rank=index, world_size=world_size)


def test_heads_split_by_whole_gqa_groups_with_uneven_ranges() -> None:
    # SmolLM2-135M: 9 query heads in 3 groups of 3 on 2 ranks -> groups 2 + 1.
    first, second = (partition_heads(9, 3, 64, rank(r)) for r in range(2))
    assert (first.query_heads, first.kv_heads) == (range(0, 6), range(0, 2))
    assert (second.query_heads, second.kv_heads) == (range(6, 9), range(2, 3))
    assert (second.query_features, second.kv_features) == (range(384, 576), range(128, 192))


def test_kv_heads_are_replicated_when_fewer_than_ranks() -> None:
    mqa = [partition_heads(4, 1, 8, rank(r)) for r in range(2)]
    assert [(p.query_heads, p.kv_heads) for p in mqa] == [(range(0, 2), range(0, 1)), (range(2, 4), range(0, 1))]
    # 3 ranks over 2 groups of 2: the first group's query heads split over two ranks, the second stays whole.
    three = [partition_heads(4, 2, 8, rank(r, 3)) for r in range(3)]
    assert [(p.query_heads, p.kv_heads) for p in three] == [
        (range(0, 1), range(0, 1)),
        (range(1, 2), range(0, 1)),
        (range(2, 4), range(1, 2)),
    ]


def test_more_ranks_than_query_heads_is_a_startup_error() -> None:
    with pytest.raises(ConfigError, match="4 shards but the model has only 3 attention heads"):
        partition_heads(3, 1, 8, rank(0, 4))


class _RecordingTensor:
    """Wraps an unread checkpoint tensor and records the shape of every read."""

    def __init__(self, name: str, tensor: CheckpointTensor, reads: dict[str, tuple[int, ...]]) -> None:
        self.name, self.tensor, self.reads = name, tensor, reads
        self.shape = tensor.shape

    def read(self, part: CheckpointSlice | None = None) -> torch.Tensor:
        loaded = self.tensor.read(part)
        self.reads[self.name] = tuple(loaded.shape)
        return loaded


def test_each_rank_reads_and_holds_only_its_slice_of_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_tiny_llama(tmp_path, **VARIANTS["uneven-groups"])
    with safe_open(str(tmp_path / "model.safetensors"), framework="pt") as handle:
        full = {name: handle.get_tensor(name) for name in handle.keys()}
    reads: dict[str, tuple[int, ...]] = {}
    unread = weights_loader.iterate_tensors
    monkeypatch.setattr(
        weights_loader,
        "iterate_tensors",
        lambda path: ((name, _RecordingTensor(name, tensor, reads)) for name, tensor in unread(path)),
    )
    # rows (dim 0) or columns (dim 1) of each rank: heads of 8 dims split 2 + 1 groups of 2 heads.
    expected_parts = {
        "model.layers.0.self_attn.q_proj.weight": (0, [range(0, 32), range(32, 48)]),
        "model.layers.0.self_attn.k_proj.weight": (0, [range(0, 16), range(16, 24)]),
        "model.layers.1.self_attn.v_proj.weight": (0, [range(0, 16), range(16, 24)]),
        "model.layers.1.self_attn.o_proj.weight": (1, [range(0, 32), range(32, 48)]),
        "model.layers.0.mlp.gate_proj.weight": (0, [range(0, 50), range(50, 100)]),
        "model.layers.0.mlp.down_proj.weight": (1, [range(0, 50), range(50, 100)]),
        "model.embed_tokens.weight": (0, [range(0, 49), range(49, 97)]),
        "lm_head.weight": (0, [range(0, 49), range(49, 97)]),
        "model.norm.weight": (0, [range(0, 48), range(0, 48)]),
    }
    config = read_checkpoint_config(tmp_path)
    for index in range(WORLD_SIZE):
        reads.clear()
        model = load_model(config, torch.float32, torch.device("cpu"), rank(index), TorchAttentionBackend())
        params = dict(model.named_parameters())
        for name, (dim, runs) in expected_parts.items():
            run = runs[index]
            expected = full[name].narrow(dim, run.start, len(run))
            torch.testing.assert_close(params[name].data, expected, atol=0, rtol=0)
        # No rank reads more of any tensor than the part it keeps.
        assert reads == {name: tuple(param.shape) for name, param in params.items()}


def test_a_fused_tensor_part_reads_only_the_rank_slice_of_its_rows(tmp_path: Path) -> None:
    fused = torch.arange(10 * 6, dtype=torch.float32).view(10, 6)
    save_file({"qkv": fused}, str(tmp_path / "fused.safetensors"))
    with safe_open(str(tmp_path / "fused.safetensors"), framework="pt") as handle:
        key_part = CheckpointTensor(handle.get_slice("qkv")).narrow(0, 4, 3)
        assert key_part.shape == (3, 6)
        torch.testing.assert_close(key_part.read(), fused[4:7])
        torch.testing.assert_close(key_part.read(CheckpointSlice(0, 1, 3)), fused[5:7])
        torch.testing.assert_close(key_part.read(CheckpointSlice(1, 2, 5)), fused[4:7, 2:5])
        with pytest.raises(ValueError, match="outside"):
            key_part.read(CheckpointSlice(0, 2, 4))


def _checkpoints(root: Path) -> list[Path]:
    for name, overrides in VARIANTS.items():
        write_tiny_llama(root / name, **overrides)
    small = {"num_hidden_layers": 2, "max_position_embeddings": 128, "initializer_range": 0.2}
    torch.manual_seed(0)
    qwen3 = Qwen3Config(**small, vocab_size=96, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16)  # fmt: skip
    Qwen3ForCausalLM(qwen3).eval().save_pretrained(root / "qwen3")
    # Phi-3 stores q/k/v and gate/up fused; each rank reads its rows of every part, with uneven head groups.
    phi3 = Phi3Config(**small, **UNEVEN, hidden_size=48, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    Phi3ForCausalLM(phi3).eval().save_pretrained(root / "phi3-fused")
    # Served quantized: each rank slices the GGUF blocks (row-parallel layers along whole blocks of 32 inputs).
    write_tiny_llama_gguf(root / "tiny.gguf", "Q4_0")
    convert_gguf(root / "tiny.gguf", root / "gguf-q4_0")
    # FP8: per-channel scales follow column-parallel rows and stay whole for row-parallel layers; a fused tensor's
    # per-tensor scale is replicated to its parts. Static input scales (the range 22 covers the inputs'): per-token
    # scales of a row-parallel layer's input would come from each rank's slice alone, so ranks would round
    # differently from one process.
    for source, fp8, layout in (
        ("uneven-groups", "fp8-channel", "compressed-tensors-channel"),
        ("phi3-fused", "fp8-phi3-tensor", "compressed-tensors-tensor"),
    ):
        write_fp8_checkpoint(root / source, root / fp8, layout, dict.fromkeys(_weight_names(root / source), 22.0))
    _moe_checkpoints(root, small)
    write_lfm2(root / "lfm2-hybrid", small)
    write_lfm2_moe(root / "lfm2-moe-hybrid", small)
    write_gated_delta_net(root / "qwen3_5-hybrid", small, Qwen3_5TextConfig, Qwen3_5ForCausalLM)
    # Qwen3-Next: each rank's rows of `in_proj_qkvz` and `in_proj_ba` are its key heads' groups; its experts split.
    write_gated_delta_net(root / "qwen3-next-hybrid", small, Qwen3NextConfig, Qwen3NextForCausalLM, QWEN3_NEXT_EXPERTS)
    write_granite_hybrid(root / "granite-hybrid-one-group", small)
    write_nemotron_h(root / "nemotron-h-two-groups", small)
    # --expert-parallel: each rank holds four whole ungated experts; the shared expert still splits by features.
    write_nemotron_h(root / f"{EXPERTS_SPLIT}nemotron-h-two-groups", small)
    _gemma4_checkpoint(root / "gemma4-shared-kv", small)
    return [root / name for name in [*VARIANTS, *FAMILY_VARIANTS]]


def _moe_checkpoints(root: Path, small: dict[str, Any]) -> None:
    """Each rank holds its share of every expert's intermediate features (uneven for Qwen3-MoE: 50 + 49, each padded
    to the grouped GEMM's alignment) and sums the routed and shared experts in the block's one all-reduce."""
    sizes = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2}
    configs = {
        "mixtral-moe": (MixtralForCausalLM, MixtralConfig(**small, **sizes, intermediate_size=96, num_local_experts=5,
                                                          num_experts_per_tok=2)),
        "qwen3-moe-uneven": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**small, **sizes, head_dim=16, num_experts=7,
                                                                 num_experts_per_tok=3, moe_intermediate_size=99,
                                                                 norm_topk_prob=True, mlp_only_layers=[0])),
        "qwen2-moe-shared": (Qwen2MoeForCausalLM, Qwen2MoeConfig(**small, **sizes, num_experts=4, num_experts_per_tok=2,
                                                                 moe_intermediate_size=32,
                                                                 shared_expert_intermediate_size=48)),
    }  # fmt: skip
    # Grouped routing with a router and correction bias whole on every rank; MLA splits its heads and keeps the latent
    # projections whole.
    grouped = {
        **small,
        **sizes,
        "intermediate_size": 96,
        "n_routed_experts": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "moe_intermediate_size": 36,
        "routed_scaling_factor": 2.5,
    }
    configs["glm4-moe-grouped"] = (Glm4MoeForCausalLM, Glm4MoeConfig(**grouped, n_shared_experts=2))
    latent = {"q_lora_rank": 32, "kv_lora_rank": 16, "qk_nope_head_dim": 12, "qk_rope_head_dim": 8, "v_head_dim": 10}
    configs["deepseek-v3-mla"] = (
        DeepseekV3ForCausalLM,
        DeepseekV3Config(**{**grouped, "num_key_value_heads": 4}, **latent, n_shared_experts=1),
    )
    # --torch-compile: the MoE blocks' dispatch and all-reduce inside each rank's compiled stages and decode graphs.
    configs[f"{COMPILED_PREFIX}qwen3-moe-uneven"] = configs["qwen3-moe-uneven"]
    # --expert-parallel: each rank holds whole experts (5 as 3 + 2, 7 as 4 + 3), the shared expert still split by
    # features; compiled, the dispatch that drops the other rank's pairs runs inside the graphs.
    for name in ("mixtral-moe", "qwen2-moe-shared"):
        configs[f"{EXPERTS_SPLIT}{name}"] = configs[name]
    configs[f"{COMPILED_PREFIX}{EXPERTS_SPLIT}qwen3-moe-uneven"] = configs["qwen3-moe-uneven"]
    for name, (model_class, config) in configs.items():
        torch.manual_seed(0)
        model = model_class(config).eval()
        with torch.no_grad():
            randomize_correction_biases(model)
        model.save_pretrained(root / name)
    # Each rank's heads read their sinks; each rank's experts their share of every feature's interleaved gate/up
    # columns and bias, the down bias added by rank 0 alone; MXFP4 ranks split the features in whole 32-value blocks.
    write_gpt_oss(root / "gpt-oss")
    write_gpt_oss_mxfp4(root / "gpt-oss-mxfp4")


def _gemma4_checkpoint(path: Path, small: dict[str, Any]) -> None:
    """Heads split per layer by that layer's own KV heads and head size; per-layer inputs and the layers that reuse
    earlier layers' keys and values on every rank."""
    sliding, full = "sliding_attention", "full_attention"
    config = Gemma4TextConfig(
        **{**small, "num_hidden_layers": 5},
        vocab_size=96,
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        layer_types=[sliding, full, sliding, sliding, full],
        num_kv_shared_layers=2,
        hidden_size_per_layer_input=8,
        vocab_size_per_layer_input=96,
        sliding_window=4,
    )
    torch.manual_seed(0)
    Gemma4ForCausalLM(config).eval().save_pretrained(path)


def _weight_names(checkpoint: Path) -> list[str]:
    with safe_open(str(checkpoint / "model.safetensors"), framework="pt") as handle:
        return list(handle.keys())


@pytest.fixture(scope="module")
def world_size_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Every checkpoint run in this process at world size 1, then by two spawned gloo ranks."""
    root = tmp_path_factory.mktemp("tp")
    checkpoints = _checkpoints(root)
    single = {path.name: run_checkpoint(path, ParallelContext()) for path in checkpoints}
    mp.start_processes(run_rank, args=(checkpoints, free_port(), root), nprocs=WORLD_SIZE, start_method="spawn")
    return single, [torch.load(root / f"rank{r}.pt") for r in range(WORLD_SIZE)]


@pytest.mark.parametrize("variant", [*VARIANTS, *FAMILY_VARIANTS])
def test_two_gloo_ranks_match_single_process_logits_and_greedy_tokens(
    variant: str, world_size_runs: tuple[dict[str, Any], list[dict[str, Any]]]
) -> None:
    single, ranks = world_size_runs
    expected = single[variant]
    assert tuple(r[variant]["num_kv_heads"] for r in ranks) == EXPECTED_KV_HEADS[variant]
    # Split by features or by experts, the ranks' routed expert weights add up to the whole layer's.
    assert sum(r[variant]["routed_expert_weights"] for r in ranks) == expected["routed_expert_weights"]
    for result in ranks:
        torch.testing.assert_close(result[variant]["logits"], expected["logits"], **LOGITS_TOLERANCE.get(variant, {}))
        assert result[variant]["tokens"][1] == expected["tokens"][1]
    # Every rank sees bit-identical logits, so even sampled tokens agree across ranks.
    assert torch.equal(ranks[0][variant]["logits"], ranks[1][variant]["logits"])
    assert ranks[0][variant]["tokens"] == ranks[1][variant]["tokens"]


@pytest.mark.parametrize("variant", ["uneven-groups", "qwen3-moe-uneven"])
def test_compiled_ranks_give_the_eager_single_process_logits(
    variant: str, world_size_runs: tuple[dict[str, Any], list[dict[str, Any]]]
) -> None:
    # Both checkpoints hold the same weights (the same seed and settings).
    single, ranks = world_size_runs
    eager = single[variant]
    for result in ranks:
        compiled = result[f"{COMPILED_PREFIX}{variant}"]
        torch.testing.assert_close(compiled["logits"], eager["logits"])
        assert compiled["tokens"][1] == eager["tokens"][1]
        # Both requests decoding together ran as whole-step graphs, the row-parallel sums inside them (4 steps at
        # Warmup: one request twice, then 2 and 4).
        assert compiled["decode_graph_steps"] > 4
