"""Nemotron-H (Mamba-2, attention without rotary, ungated relu² MLP blocks and routed-expert blocks, per
`hybrid_override_pattern`) matches transformers: logits of mixed steps whose spans cross the scan's chunks, and greedy
tokens of requests that decode together, finish apart and hand their state slots on. MLP and expert blocks take
neither paged caches nor state slots."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from recurrent_testing import assert_mixed_steps_match_logits, assert_requests_pass_their_slots_on
from shard_testing import load_tiny_model, randomize_correction_biases, write_tiny_checkpoint
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.recurrent.mamba2 import Mamba2Args, Mamba2Mixer
from tandem_server.models.nemotron_h import nemotron_h_args, nemotron_h_blocks, nemotron_h_moe_args
from transformers import NemotronHConfig, NemotronHForCausalLM, PreTrainedModel

LOGITS_ATOL = 2e-4
BLOCK_SIZE = 4
NEMOTRON_H: dict[str, Any] = {
    "hybrid_override_pattern": "ME*M-",
    "head_dim": 16,
    "intermediate_size": 96,
    "mamba_num_heads": 4,
    "mamba_head_dim": 32,
    "n_groups": 2,
    "ssm_state_size": 16,
    "conv_kernel": 4,
    # Small chunks, so that spans cross several of the scan's chunks.
    "chunk_size": 16,
    # Ungated relu² experts (20 features each: padded to the grouped GEMM's 24) beside an ungated shared expert.
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 20,
    "moe_shared_expert_intermediate_size": 40,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": NEMOTRON_H,
    # A floor under the step that many heads' steps fall below (the reference's chunked scan applies it; the
    # logits here are the reference's over whole sequences).
    "biased-step-floor": {
        **NEMOTRON_H,
        "use_bias": True,
        "use_conv_bias": False,
        "mlp_bias": True,
        "tie_word_embeddings": True,
        "time_step_min": 0.3,
    },
    # Nemotron 3's routing: groups of experts, unnormalised scaled weights, and experts between biased latent
    # projections.
    "latent-grouped-experts": {
        **NEMOTRON_H,
        "n_routed_experts": 8,
        "n_group": 4,
        "topk_group": 2,
        "num_experts_per_tok": 3,
        "norm_topk_prob": False,
        "routed_scaling_factor": 2.5,
        "moe_latent_size": 32,
        "mlp_bias": True,
    },
}
SEQUENCE_LENGTHS = {"A": 70, "B": 41, "C": 9}
SCHEDULE = [
    [("A", 0, 37), ("B", 0, 11)],
    [("B", 11, 29), ("A", 37, 30)],
    [("A", 67, 1), ("C", 0, 6)],
    [("C", 6, 3), ("A", 68, 1)],
    [("A", 69, 1), ("B", 40, 1)],
]


def randomize(model: PreTrainedModel) -> None:
    """Random `dt_bias`, `A_log`, `D`, biases and routing correction biases (their inits are constant), which would
    hide a misplaced one."""
    randomize_correction_biases(model)
    for name, param in model.named_parameters():
        if name.endswith(("dt_bias", ".D", ".bias")):
            param.copy_(torch.randn_like(param) * 0.5)
        elif name.endswith("A_log"):
            param.copy_(torch.rand_like(param) * 2 - 1)


def write_nemotron_h(path: Path, variant: str = "plain") -> PreTrainedModel:
    return write_tiny_checkpoint(path, NemotronHConfig, NemotronHForCausalLM, randomize=randomize, **VARIANTS[variant])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_mixed_steps_across_scan_chunks_match_transformers_logits(tmp_path: Path, variant: str) -> None:
    reference = write_nemotron_h(tmp_path, variant)
    model = load_tiny_model(tmp_path)
    # One paged cache (the attention block), two Mamba-2 layers' states; the MLP blocks keep nothing.
    assert (model.spec.num_layers, len(model.spec.state_shapes)) == (1, 4)
    assert_mixed_steps_match_logits(reference, model, SEQUENCE_LENGTHS, SCHEDULE, BLOCK_SIZE, LOGITS_ATOL)


@pytest.mark.parametrize("variant", ["plain", "latent-grouped-experts"])
def test_requests_decode_together_finish_apart_and_pass_their_slots_on(tmp_path: Path, variant: str) -> None:
    reference = write_nemotron_h(tmp_path, variant)
    # Three state slots: the fourth request runs only in the slot a finished one gave back.
    assert_requests_pass_their_slots_on(reference, tmp_path, (5, 60, 9, 12), (3, 6, 6, 6), BLOCK_SIZE, 40)


def test_config_reading_block_kinds_and_refusals() -> None:
    base = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 32}
    hf = {**base, **NEMOTRON_H}
    assert nemotron_h_blocks(hf) == ["mamba", "experts", "attention", "mamba", "mlp"]
    listed = ["linear_attention", "moe", "full_attention", "mlp"]
    assert nemotron_h_blocks({**base, "layers_block_type": listed}) == ["mamba", "experts", "attention", "mlp"]
    args = nemotron_h_args(hf)
    assert [kind.recurrent for kind in args.layers] == [True, False, False, True, False]
    assert [kind.sparse_mlp for kind in args.layers] == [False, True, False, False, False]
    assert (args.hidden_act, args.layers[2].rope.partial_rotary_factor, args.rms_norm_eps) == ("relu2", 0.0, 1e-5)
    assert nemotron_h_args({**hf, "hybrid_override_pattern": "M-*"}).moe is None
    with pytest.raises(ConfigError, match="multi-token prediction layers"):
        nemotron_h_blocks({**hf, "num_nextn_predict_layers": 1})
    with pytest.raises(ConfigError, match="unsupported Nemotron-H layer types"):
        nemotron_h_blocks({**hf, "hybrid_override_pattern": "M+"})
    assert Mamba2Args.from_nemotron_h(hf).time_step_limit == (0.001, float("inf"))
    with pytest.raises(ConfigError, match="n_groups"):
        Mamba2Args.from_nemotron_h({**hf, "n_groups": 3})
    with pytest.raises(ConfigError, match="3 shards cannot split the Mamba-2 layers' 4 heads evenly"):
        Mamba2Mixer(Mamba2Args.from_nemotron_h(hf), ParallelContext(rank=0, world_size=3))


def test_expert_blocks_read_transformers_defaults_and_stacked_tensors() -> None:
    """Keys config.json leaves out take NemotronHConfig's defaults; the in-memory stacks split per expert."""
    moe = nemotron_h_moe_args({"mlp_bias": True})
    router = moe.router
    assert (router.num_experts, router.top_k, router.normalize_top_k) == (8, 2, True)
    assert router.grouped is not None and (router.grouped.num_groups, router.grouped.top_groups) == (1, 1)
    assert (moe.intermediate_size, moe.shared_experts_intermediate_size, moe.latent_size) == (7688, 7688, 0)
    assert (moe.gated_experts, moe.mlp_bias) == (False, True)
    layout = nemotron_h_args({"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, **NEMOTRON_H}).layout
    assert layout.parameter_names("backbone.layers.1.mixer.experts.down_proj") == [
        f"model.layers.1.mixer.experts.{expert}.down_proj.weight" for expert in range(4)
    ]
    with pytest.raises(ConfigError, match="n_group 3 does not divide 8 experts"):
        nemotron_h_moe_args({"n_group": 3})
