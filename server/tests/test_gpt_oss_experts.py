"""gpt-oss's MoE parts: the router over its top-k logits, the MXFP4 layout, packed experts that unpack only the experts
tokens chose, and each rank's share of the experts."""

from __future__ import annotations

import pytest
import torch
from gpt_oss_testing import E2M1, GPT_OSS_SETTINGS, quantize_mxfp4
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.moe import RouterConfig
from tandem_server.layers.moe import mxfp4_experts as packed_module
from tandem_server.layers.moe.logit_router import TopKLogitsRouter
from tandem_server.layers.moe.mxfp4_experts import Mxfp4SwiGLUExperts
from tandem_server.layers.moe.routing import Routing
from tandem_server.layers.moe.swiglu_experts import ClampedSwiGLU, ClampedSwiGLUExperts, expert_shape
from tandem_server.quant.mxfp4.format import dequantize, pair_values
from tandem_server.weights.slicing import CheckpointSlice
from transformers import GptOssConfig
from transformers.integrations.mxfp4 import convert_moe_packed_tensors
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssTopKRouter

EXPERTS, HIDDEN, INTERMEDIATE = 5, 64, 64
GLU = ClampedSwiGLU(alpha=1.702, limit=1.0)


def test_router_softmaxes_its_biased_top_k_logits_as_transformers_does() -> None:
    torch.manual_seed(0)
    config = GptOssConfig(**{**GPT_OSS_SETTINGS, "hidden_size": HIDDEN})
    reference = GptOssTopKRouter(config)
    torch.nn.init.normal_(reference.weight)
    torch.nn.init.normal_(reference.bias)
    router = TopKLogitsRouter(HIDDEN, RouterConfig(EXPERTS, 3, False))
    router.load_state_dict(reference.state_dict())
    hidden = torch.randn(7, HIDDEN)
    _, scores, indices = reference(hidden)
    routing = router.route(hidden)
    assert torch.equal(routing.experts, indices)
    torch.testing.assert_close(routing.weights, scores)


def test_mxfp4_blocks_read_as_transformers_reads_them_and_round_trip() -> None:
    torch.manual_seed(1)
    weight = torch.randn(3, 10, 96) * torch.logspace(-3, 2, 10).view(1, 10, 1)
    blocks, scales = quantize_mxfp4(weight)
    assert (blocks.shape, scales.shape) == ((3, 10, 3, 16), (3, 10, 3))
    ours = dequantize(blocks, scales, pair_values(torch.float32))
    # transformers returns the stacks transposed, `[..., columns, rows]`.
    torch.testing.assert_close(ours, convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).transpose(1, 2))
    # Each value lands within half of E2M1's widest step (2, between 4 and 6) times its block's scale.
    steps = torch.exp2(scales.float() - 127).repeat_interleave(32, dim=-1)
    assert ((ours - weight).abs() <= steps).all()
    # Dequantized values are E2M1 values times their blocks' scales, so quantizing them again loses nothing.
    assert set((ours / steps).unique().tolist()) <= set(E2M1.tolist())
    assert torch.equal(dequantize(*quantize_mxfp4(ours), pair_values(torch.float32)), ours)


def packed_and_float_experts(parallel: ParallelContext) -> tuple[Mxfp4SwiGLUExperts, ClampedSwiGLUExperts]:
    """This rank's packed experts from random MXFP4 weights, and float ones holding the same weights dequantized."""
    torch.manual_seed(2)
    gate_up = torch.randn(EXPERTS, 2 * INTERMEDIATE, HIDDEN) * 0.2
    down = torch.randn(EXPERTS, HIDDEN, INTERMEDIATE) * 0.2
    full = {"gate_up_proj_bias": torch.randn(EXPERTS, 2 * INTERMEDIATE), "down_proj_bias": torch.randn(EXPERTS, HIDDEN)}
    for name, tensor in (("gate_up_proj", gate_up), ("down_proj", down)):
        full[f"{name}_blocks"], full[f"{name}_scales"] = quantize_mxfp4(tensor)
        full[name] = convert_moe_packed_tensors(full[f"{name}_blocks"], full[f"{name}_scales"], dtype=torch.float32)
    packed = Mxfp4SwiGLUExperts(expert_shape(EXPERTS, HIDDEN, INTERMEDIATE, parallel, 32), GLU, parallel)
    dense = ClampedSwiGLUExperts(expert_shape(EXPERTS, HIDDEN, INTERMEDIATE, parallel, 32), GLU, parallel)
    for experts in (packed, dense):
        for name, param in experts.named_parameters():
            part = getattr(param, "checkpoint_slice", None)
            value = full[name] if part is None else full[name].narrow(part.dim, part.start, part.stop - part.start)
            param.data.copy_(value)
    return packed, dense


def test_packed_experts_unpack_only_the_experts_tokens_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    packed, dense = packed_and_float_experts(ParallelContext())
    unpacked: list[tuple[int, ...]] = []

    def recording(blocks: torch.Tensor, scales: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        unpacked.append(tuple(blocks.shape))
        return dequantize(blocks, scales, values)

    monkeypatch.setattr(packed_module, "dequantize", recording)
    # Experts 1 and 3 only; token 2 chooses expert 3 twice over.
    chosen = torch.tensor([[3, 1], [1, 3], [3, 3]])
    routing = Routing(chosen, torch.softmax(torch.randn(3, 2), dim=-1))
    hidden = torch.randn(3, HIDDEN)
    torch.testing.assert_close(packed(hidden, routing), dense(hidden, routing))
    # One expert's gate/up then down blocks, for each of the two experts chosen.
    assert unpacked == [(2 * INTERMEDIATE, HIDDEN // 32, 16), (HIDDEN, INTERMEDIATE // 32, 16)] * 2


def test_each_rank_holds_whole_mxfp4_blocks_of_its_features_and_adds_the_down_bias_once() -> None:
    shares = [packed_and_float_experts(ParallelContext(rank, 2)) for rank in range(2)]
    first, second = (packed for packed, _ in shares)
    assert second.gate_up_proj_blocks.checkpoint_slice == CheckpointSlice(1, 64, 128)
    assert second.down_proj_blocks.checkpoint_slice == CheckpointSlice(2, 1, 2)
    assert (first.adds_down_bias, second.adds_down_bias) == (True, False)
    whole, _ = packed_and_float_experts(ParallelContext())
    routing = Routing(torch.tensor([[0, 4], [2, 0]]), torch.tensor([[0.7, 0.3], [0.4, 0.6]]))
    hidden = torch.randn(2, HIDDEN)
    torch.testing.assert_close(first(hidden, routing) + second(hidden, routing), whole(hidden, routing))
    # The float experts split the same way.
    torch.testing.assert_close(shares[0][1](hidden, routing) + shares[1][1](hidden, routing), whole(hidden, routing))


def test_packed_experts_off_the_cpu_are_a_config_error() -> None:
    with torch.device("meta"), pytest.raises(ConfigError, match="MXFP4 expert weights are served on the CPU only"):
        Mxfp4SwiGLUExperts(expert_shape(EXPERTS, HIDDEN, INTERMEDIATE, ParallelContext(), 32), GLU, ParallelContext())


def test_float_experts_the_grouped_gemm_cannot_align_are_a_config_error() -> None:
    # 24 features split over two ranks leave 12 each: intermediate rows of 48 bytes in float32.
    parallel = ParallelContext(0, 2)
    with pytest.raises(ConfigError, match="hidden_size 64 with 12 expert intermediate features on this rank"):
        ClampedSwiGLUExperts(expert_shape(EXPERTS, HIDDEN, 24, parallel), GLU, parallel)
