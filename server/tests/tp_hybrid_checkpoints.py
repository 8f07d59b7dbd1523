"""Small random hybrids for the two-process tensor-parallel tests: each rank holds its share of the recurrent layers'
heads or channels, their weights and their states."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from shard_testing import randomize_correction_biases
from transformers import (
    GraniteMoeHybridConfig,
    GraniteMoeHybridForCausalLM,
    Lfm2Config,
    Lfm2ForCausalLM,
    Lfm2MoeConfig,
    Lfm2MoeForCausalLM,
    NemotronHConfig,
    NemotronHForCausalLM,
    PretrainedConfig,
    PreTrainedModel,
)


def write_lfm2(path: Path, small: dict[str, Any]) -> None:
    """A hybrid: each rank convolves its share of the channels (B, C and x split from the fused `in_proj` rows, the
    taps and the state by channel) and `out_proj` sums the shares."""
    torch.manual_seed(0)
    config = Lfm2Config(**{**small, "num_hidden_layers": 3}, vocab_size=96, hidden_size=64, intermediate_size=96,
                        block_multiple_of=16, num_attention_heads=4, num_key_value_heads=2, conv_bias=True,
                        layer_types=["conv", "full_attention", "conv"])  # fmt: skip
    Lfm2ForCausalLM(config).eval().save_pretrained(path)


def write_lfm2_moe(path: Path, small: dict[str, Any]) -> None:
    """LFM2's split convolutions with a dense first layer, then experts split across ranks behind the biased sigmoid
    router every rank holds whole."""
    torch.manual_seed(0)
    config = Lfm2MoeConfig(**{**small, "num_hidden_layers": 3}, vocab_size=96, hidden_size=64, intermediate_size=96,
                           num_attention_heads=4, num_key_value_heads=2, num_dense_layers=1, num_experts=4,
                           layer_types=["conv", "full_attention", "conv"], num_experts_per_tok=2,
                           moe_intermediate_size=32)  # fmt: skip
    model = Lfm2MoeForCausalLM(config).eval()
    with torch.no_grad():
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            if name.endswith(("feed_forward.gate.weight", "expert_bias")):
                tensor.copy_(torch.randn_like(tensor))
    model.save_pretrained(path)


QWEN3_NEXT_EXPERTS = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
                      "shared_expert_intermediate_size": 48}  # fmt: skip


def write_gated_delta_net(
    path: Path,
    small: dict[str, Any],
    config_class: type[PretrainedConfig],
    model_class: type[PreTrainedModel],
    extra: dict[str, Any] | None = None,
) -> None:
    """Gated DeltaNet: each rank holds one key head with its two value heads, their q/k/v rows of the stacked
    projections and `conv1d` and their states; `out_proj` sums the shares. Gated attention splits whole heads, each
    rank's `q_proj` rows holding its heads' queries and gates."""
    torch.manual_seed(0)
    config = config_class(**{**small, "num_hidden_layers": 3}, vocab_size=96, hidden_size=64, intermediate_size=96,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4, linear_key_head_dim=8, linear_value_head_dim=12,
                          layer_types=["linear_attention", "full_attention", "linear_attention"],
                          **(extra or {}))  # fmt: skip
    model = model_class(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("dt_bias", "mlp.gate.weight")):
                param.copy_(torch.randn_like(param))
    model.save_pretrained(path)


def randomize_mamba(model: PreTrainedModel) -> None:
    """Random `dt_bias`, `A_log`, `D` and norm scales (their inits are constant or in head order, which would hide one
    loaded for the wrong rank's heads)."""
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("dt_bias", ".D", "norm.weight")):
                param.copy_(torch.randn_like(param))
            elif name.endswith("A_log"):
                param.copy_(torch.rand_like(param) * 2 - 1)


def write_granite_hybrid(path: Path, small: dict[str, Any]) -> None:
    """Granite 4.0-H's one group: the two ranks split its four Mamba-2 heads, each keeps the group's whole `B` and
    `C`, and the gated norm sums the group's squares over both ranks."""
    torch.manual_seed(0)
    config = GraniteMoeHybridConfig(**{**small, "num_hidden_layers": 3}, vocab_size=96, hidden_size=64,
                                    shared_intermediate_size=96, num_local_experts=0, num_attention_heads=4,
                                    num_key_value_heads=2, layer_types=["mamba", "attention", "mamba"],
                                    mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=16,
                                    mamba_chunk_size=4, embedding_multiplier=3.0, residual_multiplier=0.5,
                                    attention_multiplier=0.2, logits_scaling=2.5)  # fmt: skip
    model = GraniteMoeHybridForCausalLM(config).eval()
    randomize_mamba(model)
    model.save_pretrained(path)


def write_nemotron_h(path: Path, small: dict[str, Any]) -> None:
    """Nemotron-H's groups split whole across ranks (two groups of two heads), with biased projections: each rank
    reads its own group's `B` and `C` rows and normalises without the other rank. Its expert block splits every
    expert's features (18 a rank) behind the grouped router every rank holds whole; each rank maps its experts' latent
    term back to the hidden size and the block adds the latent projection's and the shared expert's biases once."""
    torch.manual_seed(0)
    config = NemotronHConfig(**{**small, "num_hidden_layers": 5}, vocab_size=96, hidden_size=64, intermediate_size=96,
                             hybrid_override_pattern="ME*M-", num_attention_heads=4, num_key_value_heads=2,
                             head_dim=16, mamba_num_heads=4, mamba_head_dim=32, n_groups=2, ssm_state_size=16,
                             chunk_size=4, use_bias=True, use_conv_bias=True, mlp_bias=True, n_routed_experts=8,
                             n_group=4, topk_group=2, num_experts_per_tok=3, moe_intermediate_size=36,
                             moe_shared_expert_intermediate_size=48, moe_latent_size=32,
                             routed_scaling_factor=2.5)  # fmt: skip
    model = NemotronHForCausalLM(config).eval()
    randomize_mamba(model)
    randomize_correction_biases(model)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(".bias"):
                param.copy_(torch.randn_like(param) * 0.5)
    model.save_pretrained(path)
