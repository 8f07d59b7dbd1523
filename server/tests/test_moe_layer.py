"""The MoE block's parts: routing, grouping by expert, dispatch, checkpoint layouts of experts, and what MoE models
refuse at start-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import save_file
from shard_testing import load_tiny_model, write_tiny_checkpoint
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError, WeightsError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.moe import MoeArgs, RouterConfig, SparseMoeBlock
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.routing import Routing, TopKRouter, group_by_expert
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.parameter_counts import parameter_counts
from tandem_server.quant.checks import check_expert_weights, check_quantization
from tandem_server.quant.fp8.scheme import Fp8Scheme
from tandem_server.quant.int4.scheme import Int4Scheme
from tandem_server.quant.mode import QuantizeMode
from tandem_server.weight_defaults import choose_weight_settings
from tandem_server.weights.slicing import CheckpointSlice, CheckpointTensor
from transformers import OlmoeConfig, OlmoeForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

CPU = torch.device("cpu")
HIDDEN, INTERMEDIATE, EXPERTS = 8, 6, 5
# Token 0 -> experts 3, 0; token 1 -> 0, 1; token 2 -> 3, 1: experts 2 and 4 get no token.
CHOSEN = torch.tensor([[3, 0], [0, 1], [3, 1]])


def filled_experts(seed: int = 0) -> RoutedExperts:
    torch.manual_seed(seed)
    experts = RoutedExperts(EXPERTS, HIDDEN, INTERMEDIATE, "silu", ParallelContext())
    with torch.no_grad():
        for param in experts.parameters():
            param.copy_(torch.randn_like(param))
    return experts


def token_by_token(experts: RoutedExperts, hidden: torch.Tensor, routing: Routing) -> torch.Tensor:
    """The MoE output computed one token and one chosen expert at a time."""
    rows = []
    for token, chosen in enumerate(routing.experts.tolist()):
        total = torch.zeros(HIDDEN)
        for slot, expert in enumerate(chosen):
            expert_module = experts[expert]
            gate = F.linear(hidden[token], expert_module.gate_proj.weight)
            up = F.linear(hidden[token], expert_module.up_proj.weight)
            out = F.linear(F.silu(gate) * up, expert_module.down_proj.weight)
            total += routing.weights[token, slot] * out
        rows.append(total)
    return torch.stack(rows)


def test_pairs_group_by_expert_and_experts_without_tokens_get_empty_runs() -> None:
    groups = group_by_expert(CHOSEN, EXPERTS)
    # Runs [0, 2), [2, 4), [4, 4), [4, 6), [6, 6): experts 2 and 4 are empty.
    assert groups.ends.tolist() == [2, 4, 4, 6, 6]
    assert groups.tokens.tolist() == [0, 1, 1, 2, 0, 2]
    assert CHOSEN.reshape(-1)[groups.order].tolist() == [0, 0, 1, 1, 3, 3]


def test_dispatch_equals_each_token_through_its_chosen_experts() -> None:
    experts = filled_experts()
    hidden = torch.randn(3, HIDDEN)
    routing = Routing(CHOSEN, torch.rand(3, 2))
    with torch.no_grad():
        torch.testing.assert_close(experts(hidden, routing), token_by_token(experts, hidden, routing))


def test_per_expert_parameters_are_views_of_the_stacks() -> None:
    experts = filled_experts()
    # 6 intermediate features padded to 8 with zeros.
    assert not experts.gate_up[:, INTERMEDIATE:8].any() and not experts.gate_up[:, 8 + INTERMEDIATE :].any()
    assert not experts.down[:, :, INTERMEDIATE:].any()
    experts[2].up_proj.weight.fill_(7.0)
    assert torch.equal(experts.gate_up[2, 8 : 8 + INTERMEDIATE], torch.full((INTERMEDIATE, HIDDEN), 7.0))
    experts[4].down_proj.weight.fill_(3.0)
    assert torch.equal(experts.down[4, :, :INTERMEDIATE], torch.full((HIDDEN, INTERMEDIATE), 3.0))


def test_a_hidden_size_the_grouped_gemm_cannot_align_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="hidden_size 12: the experts' grouped GEMMs need a multiple of 8"):
        RoutedExperts(EXPERTS, 12, INTERMEDIATE, "silu", ParallelContext())


def test_each_rank_holds_its_share_of_every_experts_intermediate_features() -> None:
    shares = [RoutedExperts(EXPERTS, HIDDEN, 7, "silu", ParallelContext(r, 2)) for r in range(2)]
    # 4 and 3 features, each padded to 8.
    assert [tuple(share.down.shape) for share in shares] == [(EXPERTS, HIDDEN, 8), (EXPERTS, HIDDEN, 8)]
    assert [share.parameter_count() for share in shares] == [EXPERTS * 3 * 4 * HIDDEN, EXPERTS * 3 * 3 * HIDDEN]
    assert shares[1][0].gate_proj.weight.checkpoint_slice == CheckpointSlice(0, 4, 7)
    assert shares[1][0].down_proj.weight.checkpoint_slice == CheckpointSlice(1, 4, 7)


@pytest.mark.parametrize("normalize", [False, True])
def test_router_keeps_the_top_k_softmax_probabilities(normalize: bool) -> None:
    router = TopKRouter(HIDDEN, RouterConfig(EXPERTS, 3, normalize))
    router.weight.copy_(torch.randn(EXPERTS, HIDDEN))
    hidden = torch.randn(4, HIDDEN)
    routing = router.route(hidden)
    probabilities = torch.softmax(hidden @ router.weight.T, dim=-1)
    expected, chosen = probabilities.topk(3, dim=-1)
    assert torch.equal(routing.experts, chosen)
    expected = expected / expected.sum(-1, keepdim=True) if normalize else expected
    torch.testing.assert_close(routing.weights, expected)


@pytest.mark.parametrize("top_k", [0, EXPERTS + 1])
def test_a_top_k_outside_the_expert_count_is_a_config_error(top_k: int) -> None:
    with pytest.raises(ConfigError, match=f"num_experts_per_tok is {top_k} with {EXPERTS} experts"):
        RouterConfig(EXPERTS, top_k, False)


def test_selecting_an_expert_of_a_checkpoint_tensor_reads_only_its_rows(tmp_path: Path) -> None:
    stack = torch.arange(3 * 4 * 2, dtype=torch.float32).view(3, 4, 2)
    save_file({"stack": stack}, str(tmp_path / "stack.safetensors"))
    with safe_open(str(tmp_path / "stack.safetensors"), framework="pt") as handle:
        expert = CheckpointTensor(handle.get_slice("stack")).select(1)
        assert expert.shape == (4, 2)
        torch.testing.assert_close(expert.narrow(0, 2, 2).read(CheckpointSlice(0, 1, 2)), stack[1, 3:4])
        with pytest.raises(ValueError, match="cannot select entry 3"):
            CheckpointTensor(handle.get_slice("stack")).select(3)
        with pytest.raises(ValueError, match="cannot select entry 0"):
            CheckpointTensor(handle.get_slice("stack")).narrow(0, 1, 1).select(0)


QWEN2_MOE = {
    "num_experts": 3,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 16,
    "shared_expert_intermediate_size": 24,
}


def test_an_expert_stack_of_the_wrong_expert_count_is_a_weights_error(tmp_path: Path) -> None:
    reference = write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    state = {name: tensor.contiguous() for name, tensor in reference.state_dict().items()}
    name = "model.layers.0.mlp.experts.gate_up_proj"
    state[name] = state[name][:2].contiguous()
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(WeightsError, match=r"expert stack has shape \(2, 32, 64\), expected \[3, rows, columns\]"):
        load_tiny_model(tmp_path)


def test_parameter_counts_hold_every_weight_and_a_tokens_active_share(tmp_path: Path) -> None:
    reference = write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    counts = parameter_counts(load_tiny_model(tmp_path))
    assert counts.total == sum(param.numel() for param in reference.parameters())
    # Per layer: 3 experts of 3 * 64 * 16 weights, one of which a token with top-2 never reads.
    assert counts.total - counts.active == reference.config.num_hidden_layers * 64 * 16 * 3
    assert counts.describe().endswith("active per token")


@pytest.mark.parametrize("mode", [QuantizeMode.INT8, QuantizeMode.INT4, QuantizeMode.FP8])
def test_quantizing_a_moe_models_float_weights_at_load_is_refused_naming_the_allowed_values(
    tmp_path: Path, mode: QuantizeMode
) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    checkpoint = read_checkpoint_config(tmp_path)
    check_quantization(QuantizeMode.NONE, checkpoint, CPU)
    message = rf"--quantize {mode.value}: Qwen2MoeForCausalLM is a mixture-of-experts .*; allowed: none, gguf$"
    with pytest.raises(ConfigError, match=message):
        check_quantization(mode, checkpoint, CPU)


def test_gguf_mode_on_a_float_moe_model_is_refused_for_want_of_blocks(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    with pytest.raises(ConfigError, match=r"--quantize gguf: .* keeps no GGUF blocks"):
        check_quantization(QuantizeMode.GGUF, read_checkpoint_config(tmp_path), CPU)


def test_an_int4_moe_checkpoint_is_refused_and_an_fp8_one_is_served(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    float_checkpoint = read_checkpoint_config(tmp_path)
    check_quantization(QuantizeMode.NONE, dataclasses.replace(float_checkpoint, fp8=Fp8Scheme("fbgemm_fp8")), CPU)
    checkpoint = dataclasses.replace(float_checkpoint, int4=Int4Scheme("gptq", 32))
    with pytest.raises(ConfigError, match="is a gptq checkpoint, but Qwen2MoeForCausalLM is a mixture-of-exp"):
        check_quantization(QuantizeMode.NONE, checkpoint, CPU)


def test_an_fp8_moe_checkpoint_is_refused_off_the_cpu(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    checkpoint = dataclasses.replace(read_checkpoint_config(tmp_path), fp8=Fp8Scheme("fbgemm_fp8"))
    with pytest.raises(ConfigError, match="float8 experts run on CPU only"):
        check_expert_weights(QuantizeMode.NONE, checkpoint, torch.device("cuda"))


def test_quantize_auto_keeps_a_moe_safetensors_model_float(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    settings = choose_weight_settings("auto", "auto", "auto", "cpu", tmp_path, bfloat16_cpu=False)
    assert settings.quantize is QuantizeMode.NONE
    check_quantization(settings.quantize, read_checkpoint_config(tmp_path), CPU)


OLMOE = {"num_experts": 3, "num_experts_per_tok": 2, "intermediate_size": 16, "pad_token_id": 0}


def test_olmoe_clip_qkv_is_a_config_error(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, OlmoeConfig, OlmoeForCausalLM, **OLMOE, clip_qkv=8.0)
    with pytest.raises(ConfigError, match=r"clip_qkv \(8.0\) is not supported"):
        load_tiny_model(tmp_path)


def test_olmoe_over_several_ranks_is_a_config_error(tmp_path: Path) -> None:
    write_tiny_checkpoint(tmp_path, OlmoeConfig, OlmoeForCausalLM, **OLMOE)
    with pytest.raises(ConfigError, match=r"all heads at once.*serve it on one rank \(this group has 2\)"):
        load_model(read_checkpoint_config(tmp_path), torch.float32, CPU, ParallelContext(0, 2), TorchAttentionBackend())


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"mlp_only_layers": [2]}, r"mlp_only_layers names layers \[2\]; the model has 2"),
        ({"num_experts": 0}, "Qwen2MoeForCausalLM needs num_experts"),
    ],
)
def test_qwen_moe_layer_options_outside_the_model_are_config_errors(
    tmp_path: Path, overrides: dict[str, object], message: str
) -> None:
    write_tiny_checkpoint(tmp_path, Qwen2MoeConfig, Qwen2MoeForCausalLM, **QWEN2_MOE)
    config = read_checkpoint_config(tmp_path)
    hf = {**config.hf, **overrides}
    with pytest.raises(ConfigError, match=message):
        load_model(dataclasses.replace(config, hf=hf), torch.float32, CPU, ParallelContext(), TorchAttentionBackend())


def test_a_block_on_several_ranks_reduces_once_with_its_shared_expert(monkeypatch: pytest.MonkeyPatch) -> None:
    reduced: list[tuple[int, ...]] = []

    def recording(self: ParallelContext, tensor: torch.Tensor) -> torch.Tensor:
        reduced.append(tuple(tensor.shape))
        return tensor

    monkeypatch.setattr(ParallelContext, "all_reduce", recording)
    moe = MoeArgs(RouterConfig(EXPERTS, 2, False), INTERMEDIATE, shared_intermediate_size=16)
    block = SparseMoeBlock(HIDDEN, moe, "silu", ParallelContext(0, 2))
    for param in block.parameters():
        torch.nn.init.normal_(param)
    with torch.no_grad():
        block(torch.randn(3, HIDDEN))
    assert reduced == [(3, HIDDEN)]
