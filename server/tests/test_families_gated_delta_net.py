"""Qwen3.5's hybrid (Gated DeltaNet beside gated attention) and Qwen3-Next's (the same with experts) match
transformers: logits of mixed steps whose spans cross the delta rule's 64-token chunks and the shard's prefill
chunks, and greedy tokens of requests that decode together, finish at different steps and hand their state slots to
later requests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from recurrent_testing import assert_mixed_steps_match_logits, assert_requests_pass_their_slots_on
from reference_checks import assert_greedy_matches_generate
from shard_testing import (
    CPU,
    TINY_SETTINGS,
    load_tiny_model,
    write_tiny_checkpoint,
)
from tandem_server.errors import ConfigError
from tandem_server.layers.recurrent.gated_delta_rule import chunked_gated_delta_rule, recurrent_gated_delta_rule
from tandem_server.layers.recurrent.kernels import delta_rule_spans
from tandem_server.layers.recurrent.state_pool import RecurrentStatePool, state_pool_bytes
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.qwen3_5 import hybrid_layer_types, qwen3_5_args
from transformers import (
    PretrainedConfig,
    PreTrainedModel,
    Qwen3_5Config,
    Qwen3_5ForCausalLM,
    Qwen3_5ForConditionalGeneration,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForCausalLM,
    Qwen3_5MoeForConditionalGeneration,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3NextConfig,
    Qwen3NextForCausalLM,
)

# float32 on CPU; the chunked and token-by-token delta rules differ from transformers' only in summation order.
LOGITS_ATOL = 2e-4
BLOCK_SIZE = 4
MAX_POSITIONS = 256
QWEN3_5: dict[str, Any] = {
    "num_hidden_layers": 3,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "head_dim": 16,
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 12,
    "max_position_embeddings": MAX_POSITIONS,
}
SEQUENCE_LENGTHS = {"A": 150, "B": 70, "C": 9}
# (request, first position, tokens): A's first span crosses the delta rule's 64-token chunk, B's spans each stay
# within one; decodes share steps with prompt chunks.
SCHEDULE = [
    [("A", 0, 100), ("B", 0, 30)],
    [("B", 30, 40), ("A", 100, 45)],
    [("A", 145, 1), ("C", 0, 6)],
    [("C", 6, 3), ("A", 146, 1)],
    [("A", 147, 3)],
]


# Qwen3-Next: the same layers, a mixture of experts with a gated shared expert on all but the attention layer, and
# each key head's projections stored together.
QWEN3_NEXT: dict[str, Any] = {
    **QWEN3_5,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "shared_expert_intermediate_size": 48,
    "mlp_only_layers": [1],
}
# Qwen3.5-MoE: Qwen3.5's layers, every feed-forward a mixture of experts with a gated shared expert.
QWEN3_5_MOE: dict[str, Any] = {
    **{key: value for key, value in QWEN3_NEXT.items() if key != "mlp_only_layers"},
    "intermediate_size": None,
}
FAMILIES: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], dict[str, Any]]] = {
    "qwen3_5": (Qwen3_5TextConfig, Qwen3_5ForCausalLM, QWEN3_5),
    "qwen3_5_moe": (Qwen3_5MoeTextConfig, Qwen3_5MoeForCausalLM, QWEN3_5_MOE),
    "qwen3_next": (Qwen3NextConfig, Qwen3NextForCausalLM, QWEN3_NEXT),
}
# Where a span starts decides the delta rule's chunk boundaries, and so its float32 rounding: transformers itself
# gives Qwen3.5-MoE logits 3.2e-4 apart for sequence B prefilled whole or in spans of 30 and 40 tokens. The BLAS
# path rounds too: on an AMD EPYC (MKL's non-Intel kernels) Qwen3-Next's first span lands 7.3e-4 from transformers'
# (under 2e-4 on Intel Xeons).
FAMILY_LOGITS_ATOL = {"qwen3_5_moe": 5e-4, "qwen3_next": 1e-3}


def randomize_delta_net(model: PreTrainedModel) -> None:
    """Random `dt_bias` (its init is all ones, which would hide one loaded per wrong head) and routers (zero init)."""
    for name, param in model.named_parameters():
        if name.endswith(("dt_bias", "mlp.gate.weight")):
            param.copy_(torch.randn_like(param))


def write_hybrid(path: Path, family: str = "qwen3_5") -> PreTrainedModel:
    config_class, model_class, settings = FAMILIES[family]
    return write_tiny_checkpoint(path, config_class, model_class, randomize=randomize_delta_net, **settings)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_mixed_steps_across_delta_rule_chunks_match_transformers_logits(tmp_path: Path, family: str) -> None:
    reference = write_hybrid(tmp_path, family)
    atol = FAMILY_LOGITS_ATOL.get(family, LOGITS_ATOL)
    assert_mixed_steps_match_logits(reference, load_tiny_model(tmp_path), SEQUENCE_LENGTHS, SCHEDULE, BLOCK_SIZE, atol)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_requests_decode_together_finish_apart_and_pass_their_slots_on(tmp_path: Path, family: str) -> None:
    reference = write_hybrid(tmp_path, family)
    # Four state slots: the fifth request runs only in the slot a finished one gave back. Prefill chunks of 100
    # tokens: the 140-token prompt's first chunk crosses a delta-rule chunk boundary.
    assert_requests_pass_their_slots_on(reference, tmp_path, (5, 140, 9, 70, 12), (3, 8, 8, 6, 8), BLOCK_SIZE, 100)


def test_chunked_and_token_by_token_delta_rules_agree_from_carried_states() -> None:
    torch.manual_seed(0)
    seqs, heads, key_dim, value_dim, tokens = 2, 3, 8, 5, 37
    query = torch.nn.functional.normalize(torch.randn(seqs, heads, tokens, key_dim), dim=-1)
    key = torch.nn.functional.normalize(torch.randn(seqs, heads, tokens, key_dim), dim=-1)
    value = torch.randn(seqs, heads, tokens, value_dim)
    decay, beta = -torch.rand(seqs, heads, tokens), torch.rand(seqs, heads, tokens)
    initial = torch.randn(seqs, heads, key_dim, value_dim)

    state, expected = initial, []
    for t in range(tokens):
        out, state = recurrent_gated_delta_rule(
            query[:, :, t], key[:, :, t], value[:, :, t], decay[:, :, t], beta[:, :, t], state
        )
        expected.append(out)
    # Chunks of 8: several whole chunks and a padded last one.
    outputs, final = chunked_gated_delta_rule(query, key, value, decay, beta, initial, chunk=8)
    torch.testing.assert_close(outputs, torch.stack(expected, dim=2), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(final, state, atol=1e-5, rtol=1e-5)


def test_spans_of_different_lengths_leave_each_sequence_its_own_state() -> None:
    torch.manual_seed(1)
    heads, key_dim, value_dim = 2, 4, 3
    lens = [6, 1, 3]
    tokens = sum(lens)
    query, key = (torch.nn.functional.normalize(torch.randn(tokens, heads, key_dim), dim=-1) for _ in range(2))
    value, decay, beta = torch.randn(tokens, heads, value_dim), -torch.rand(tokens, heads), torch.rand(tokens, heads)
    initial = torch.randn(len(lens), heads, key_dim, value_dim)
    outputs, states = delta_rule_spans(query, key, value, decay, beta, lens, initial)
    start = 0
    for i, n in enumerate(lens):
        state = initial[i : i + 1]
        for t in range(start, start + n):
            out, state = recurrent_gated_delta_rule(
                query[t : t + 1], key[t : t + 1], value[t : t + 1], decay[t : t + 1], beta[t : t + 1], state
            )
            torch.testing.assert_close(outputs[t : t + 1], out, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(states[i : i + 1], state, atol=1e-5, rtol=1e-5)
        start += n


def test_layer_kinds_default_to_attention_every_fourth_layer_and_rope_ignores_multimodal_sections() -> None:
    base = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96}
    assert hybrid_layer_types({**base, "num_hidden_layers": 8}) == (["linear_attention"] * 3 + ["full_attention"]) * 2
    rope = {"rope_type": "default", "rope_theta": 1e7, "mrope_section": [11, 11, 10], "mrope_interleaved": True}
    args = qwen3_5_args({**base, "num_hidden_layers": 4, "full_attention_interval": 2, "rope_parameters": rope})
    assert [kind.recurrent for kind in args.layers] == [True, False, True, False]
    assert (args.layers[1].rope.theta, args.layers[1].rope.partial_rotary_factor, args.head_dim) == (1e7, 0.25, 256)
    with pytest.raises(ConfigError, match="unsupported layer types"):
        qwen3_5_args({**base, "num_hidden_layers": 2, "layer_types": ["linear_attention", "sliding_attention"]})


def test_state_pool_keeps_the_delta_rule_memory_in_float32(tmp_path: Path) -> None:
    write_hybrid(tmp_path)
    spec = load_tiny_model(tmp_path).spec
    # Per linear-attention layer: the convolution's last 3 inputs of q, k and v, then the delta rule's memory.
    assert spec.state_shapes == ((2 * 16 + 48, 3), (4, 8, 12)) * 2
    pool = RecurrentStatePool(spec.state_shapes, 2, torch.bfloat16, CPU, spec.state_dtypes)
    assert [layer.dtype for layer in pool.layers] == [torch.bfloat16, torch.float32] * 2
    # What a CUDA shard takes out of the KV cache's budget for the pool.
    assert state_pool_bytes(spec.state_shapes, 2, torch.bfloat16, spec.state_dtypes) == pool.nbytes


# The published checkpoints' layout: the text decoder under `model.language_model.`, a vision tower beside it.
CONDITIONAL: dict[str, tuple[type[PretrainedConfig], type[PreTrainedModel], str]] = {
    "Qwen3_5ForConditionalGeneration": (Qwen3_5Config, Qwen3_5ForConditionalGeneration, "qwen3_5"),
    "Qwen3_5MoeForConditionalGeneration": (Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration, "qwen3_5_moe"),
}


def write_conditional(path: Path, architecture: str) -> PreTrainedModel:
    """A multimodal checkpoint (how the published Qwen3.5 ones come) with a tiny vision tower."""
    config_class, model_class, family = CONDITIONAL[architecture]
    text_config_class, _, settings = FAMILIES[family]
    torch.manual_seed(0)
    vision = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "out_hidden_size": 64}
    text = text_config_class(**{**TINY_SETTINGS, **settings})
    config = config_class(text_config=text.to_dict(), vision_config={**vision, "patch_size": 4})
    config._attn_implementation = "eager"
    config._experts_implementation = "eager"
    reference = model_class(config).eval()
    with torch.no_grad():
        for name, param in reference.named_parameters():
            if name.endswith("norm.weight") and "visual" not in name:
                param.add_(torch.randn_like(param) * 0.2)
        randomize_delta_net(reference)
    reference.save_pretrained(path)
    return reference


@pytest.mark.parametrize("architecture", sorted(CONDITIONAL))
def test_conditional_generation_checkpoint_serves_its_text_part(tmp_path: Path, architecture: str) -> None:
    reference = write_conditional(tmp_path, architecture)
    checkpoint = read_checkpoint_config(tmp_path)
    assert (checkpoint.architecture, checkpoint.skipped_parts) == (architecture, ("vision",))
    assert type(load_tiny_model(tmp_path)).__name__ == FAMILIES[CONDITIONAL[architecture][2]][1].__name__
    assert_greedy_matches_generate(tmp_path, reference, architecture, eos_token_id=2)
