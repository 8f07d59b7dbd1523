"""Hybrid models (LFM2's short convolutions beside attention, dense or with LFM2-MoE's experts) match transformers:
logits of mixed steps whose recurrent state is carried from chunk to chunk in the shard's slot pool, and greedy tokens
through the runner."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from recurrent_testing import assert_mixed_steps_match_logits
from reference_checks import BLOCK_SIZE, LOGITS_ATOL, SCHEDULE, SEQUENCE_LENGTHS, assert_greedy_matches_generate
from shard_testing import CPU, load_tiny_model, make_runner, new_request, warmed, write_tiny_checkpoint
from tandem_server.distributed import ParallelContext
from tandem_server.engine.step import ScheduledRequest, StepInput
from tandem_server.errors import ConfigError, InvalidStepError
from tandem_server.layers.recurrent.short_conv import causal_conv_chunks
from tandem_server.layers.recurrent.state_pool import RecurrentStatePool
from tandem_server.models.lfm2 import lfm2_args
from tandem_server.models.lfm2_moe import lfm2_moe_args
from tandem_server.rpc.servicer import build_info
from transformers import Lfm2Config, Lfm2ForCausalLM, Lfm2MoeConfig, Lfm2MoeForCausalLM, PreTrainedModel

HYBRIDS: dict[str, dict[str, Any]] = {
    "lfm2-conv-attention-conv": {
        "num_hidden_layers": 3,
        "layer_types": ["conv", "full_attention", "conv"],
        "block_multiple_of": 16,
        "tie_word_embeddings": True,
    },
    "lfm2-attention-first-biased-conv-kernel-4": {
        "num_hidden_layers": 3,
        "layer_types": ["full_attention", "conv", "conv"],
        "conv_L_cache": 4,
        "conv_bias": True,
        "tie_word_embeddings": False,
    },
}
LFM2_MOE: dict[str, Any] = {
    "num_hidden_layers": 3,
    "layer_types": ["conv", "full_attention", "conv"],
    "intermediate_size": 96,
    "num_dense_layers": 1,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "routed_scaling_factor": 1.5,
}
# LFM2-MoE: a dense first layer, then experts behind the biased sigmoid router; or an unbiased, unnormalised one.
MOE_HYBRIDS: dict[str, dict[str, Any]] = {
    "lfm2-moe-expert-bias": LFM2_MOE,
    "lfm2-moe-no-bias-unnormalised": {**LFM2_MOE, "use_expert_bias": False, "norm_topk_prob": False},
}
HYBRIDS |= MOE_HYBRIDS


def randomize_routers(model: PreTrainedModel) -> None:
    """Random routers and expert biases (both start at zero, which would tie every expert)."""
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        if name.endswith(("feed_forward.gate.weight", "expert_bias")):
            tensor.copy_(torch.randn_like(tensor))


def write_hybrid(path: Path, name: str) -> PreTrainedModel:
    if name in MOE_HYBRIDS:
        return write_tiny_checkpoint(
            path, Lfm2MoeConfig, Lfm2MoeForCausalLM, randomize=randomize_routers, **HYBRIDS[name]
        )
    reference = write_tiny_checkpoint(path, Lfm2Config, Lfm2ForCausalLM, **HYBRIDS[name])
    assert isinstance(reference, Lfm2ForCausalLM)
    return reference


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_mixed_steps_carry_recurrent_state_and_match_transformers_logits(tmp_path: Path, name: str) -> None:
    reference = write_hybrid(tmp_path, name)
    model = load_tiny_model(tmp_path)
    assert_mixed_steps_match_logits(reference, model, SEQUENCE_LENGTHS, SCHEDULE, BLOCK_SIZE, LOGITS_ATOL, name)


# The unbiased router's variant runs the runner's path the biased one already does; its logits are checked above.
@pytest.mark.parametrize("name", sorted(HYBRIDS.keys() - {"lfm2-moe-no-bias-unnormalised"}))
def test_chunked_staggered_greedy_generation_matches_transformers_generate(tmp_path: Path, name: str) -> None:
    reference = write_hybrid(tmp_path, name)
    runner = warmed(make_runner(tmp_path))
    assert_greedy_matches_generate(tmp_path, reference, name, runner=runner, eos_token_id=2)
    # The shard ended every request itself; the next step frees their slots (the router never lists them).
    runner.step(StepInput())
    assert runner.execution.states is not None
    assert runner.execution.states.held == 0


def test_preempted_request_rebuilds_its_state_from_the_prompt(tmp_path: Path) -> None:
    reference = write_hybrid(tmp_path, "lfm2-conv-attention-conv")
    runner = warmed(make_runner(tmp_path))
    prompt = [5, 17, 33, 8, 61, 12, 40]
    blocks = tuple(range(8))

    def run(request_id: int, tokens: list[int], steps: int, num_output_tokens: int = 0) -> list[int]:
        request = new_request(request_id, tokens, max_new_tokens=32, num_output_tokens=num_output_tokens)
        first = ScheduledRequest(request_id, len(tokens), blocks, 0)
        out = runner.step(StepInput(new_requests=(request,), scheduled=(first,)))
        generated = [out.generations[0].token_id]
        for _ in range(steps - 1):
            position = len(tokens) + len(generated) - 1
            out = runner.step(StepInput(scheduled=(ScheduledRequest(request_id, 1, (), position),)))
            generated.append(out.generations[0].token_id)
        return generated

    before = run(1, prompt, 3)
    # Preempted: forgotten, then admitted again from its first token with what it generated so far.
    runner.step(StepInput(finished=(1,)))
    after = run(1, prompt + before, 3, num_output_tokens=len(before))
    with torch.no_grad():
        expected = reference.generate(torch.tensor([prompt]), max_new_tokens=6, do_sample=False, eos_token_id=None)
    assert before + after == expected[0, len(prompt) :].tolist()


def test_state_pool_refuses_a_span_that_skips_tokens_and_frees_forgotten_slots() -> None:
    pool = RecurrentStatePool([(2, 1)], num_slots=2, dtype=torch.float32, device=CPU)
    pool.place([(7, 0, 4), (8, 0, 2)])
    with pytest.raises(InvalidStepError, match="resumes at position 3"):
        pool.place([(7, 3, 1)])
    with pytest.raises(InvalidStepError, match="all 2 are held"):
        pool.place([(9, 0, 1)])
    pool.forget([8])
    assert pool.held == 1
    pool.place([(9, 0, 1), (7, 4, 1)])
    with pytest.raises(InvalidStepError, match="holds none"):
        pool.place([(10, 5, 1)])


def test_a_fresh_span_zeroes_the_slot_a_forgotten_request_left() -> None:
    pool = RecurrentStatePool([(1, 2)], num_slots=1, dtype=torch.float32, device=CPU)
    states = pool.place([(1, 0, 3)])
    states.layers[0][states.slots] = 5.0
    pool.forget([1])
    states = pool.place([(2, 0, 1)])
    assert states.layers[0][states.slots].abs().sum().item() == 0.0


def test_chunked_convolution_equals_one_convolution_over_the_whole_sequence() -> None:
    torch.manual_seed(0)
    channels, kernel = 6, 4
    weight, bias = torch.randn(channels, kernel), torch.randn(channels)
    sequences = [torch.randn(n, channels) for n in (9, 1, 5)]
    whole = [
        torch.nn.functional.conv1d(s.T.unsqueeze(0), weight.unsqueeze(1), bias, padding=kernel - 1, groups=channels)[
            0, :, : len(s)
        ].T
        for s in sequences
    ]
    state = torch.zeros(len(sequences), channels, kernel - 1)
    outputs: list[list[torch.Tensor]] = [[] for _ in sequences]
    # Chunks of 4, 1 and 2 tokens alternate, so prefill chunks and decodes share steps.
    positions = [0, 0, 0]
    for size in (4, 1, 2, 1, 4):
        lens = [min(size, len(s) - p) for s, p in zip(sequences, positions, strict=True)]
        running = [i for i, n in enumerate(lens) if n > 0]
        chunk = torch.cat([sequences[i][positions[i] : positions[i] + lens[i]] for i in running])
        out, after = causal_conv_chunks(chunk, weight, bias, [lens[i] for i in running], state[running])
        state[running] = after
        row = 0
        for i in running:
            outputs[i].append(out[row : row + lens[i]])
            row += lens[i]
            positions[i] += lens[i]
    for i, expected in enumerate(whole):
        torch.testing.assert_close(torch.cat(outputs[i]), expected)


def test_layer_types_decide_each_layers_kind() -> None:
    base = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 96}
    args = lfm2_args({**base, "num_hidden_layers": 3, "layer_types": ["conv", "conv", "full_attention"]})
    assert [kind.recurrent for kind in args.layers] == [True, True, False]
    # Older configs name the attention layers by index.
    args = lfm2_args({**base, "num_hidden_layers": 3, "full_attn_idxs": [1]})
    assert [kind.recurrent for kind in args.layers] == [True, False, True]
    with pytest.raises(ConfigError, match="unsupported LFM2 layer types"):
        lfm2_args({**base, "num_hidden_layers": 2, "layer_types": ["conv", "sliding_attention"]})


def test_rope_base_defaults_to_lfm2s_own_and_block_ff_dim_is_adjusted() -> None:
    hub_config = {
        "vocab_size": 96,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_hidden_layers": 2,
        "block_ff_dim": 192,
        "block_multiple_of": 32,
        "block_ffn_dim_multiplier": 1.0,
    }
    args = lfm2_args(hub_config)
    assert args.layers[0].rope.theta == 1_000_000.0
    # Two thirds of 192, rounded up to a multiple of 32.
    assert args.intermediate_size == 128


def test_info_says_the_model_keeps_recurrent_state_and_counts_only_attention_layers(tmp_path: Path) -> None:
    write_hybrid(tmp_path, "lfm2-conv-attention-conv")
    runner = make_runner(tmp_path)
    info = build_info(runner, "Lfm2ForCausalLM", "torch", ParallelContext())
    assert (info.recurrent_state, info.num_layers) == (True, 1)
    assert runner.model.spec.state_shapes == ((64, 2), (64, 2))


def test_lfm2_moe_config_reads_dense_layers_and_the_router() -> None:
    hf = {"vocab_size": 96, "hidden_size": 64, "num_attention_heads": 4, **LFM2_MOE}
    args = lfm2_moe_args(hf)
    assert [kind.sparse_mlp for kind in args.layers] == [False, True, True]
    assert args.intermediate_size == 96 and args.moe is not None and args.moe.router.grouped is not None
    assert (args.moe.router.grouped.scaling_factor, args.moe.router.grouped.correction_bias) == (1.5, True)
    with pytest.raises(ConfigError, match="num_dense_layers is 4"):
        lfm2_moe_args({**hf, "num_dense_layers": 4})
