"""Mixtral (`llama` with experts) and OLMoE GGUF files, which transformers' GGUF loader does not read: converted from
their metadata and tensors, their Q4_0/Q8_0 expert stacks served from their blocks, against transformers on the
values the file's tensors dequantize to."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from moe_gguf_testing import MIXTRAL, OLMOE, MoeGgufFamily, tiny_moe, write_moe_gguf
from safetensors import safe_open
from tandem_launcher.embedded import GgufConversionError, convert_gguf
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.weights.gguf_format import GGUF_BLOCKS_DIR, GGUF_TYPES_KEY
from test_moe_quantized_weights import EXPERT_FORMATS, GGUF_RELATIVE, load_quantized, reference_outputs, routed_experts
from tp_worker import PROMPT, generate, prompt_logits
from transformers import AutoModelForCausalLM

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    kernels_unavailable_reason(CPU, QuantizeMode.GGUF) is not None, reason="no CPU int4/int8 kernels"
)
FAMILIES = {"mixtral": MIXTRAL, "olmoe": OLMOE}
# A seed whose greedy tokens have no near tie for the int4/int8 kernels' bfloat16 activations to flip, on the CPUs
# measured; elsewhere a departure is allowed only where the reference's two best logits are this close (relative to
# its largest logit): twice the kernels' measured logit error.
SEED = 7
NEAR_TIE_RELATIVE = 2 * GGUF_RELATIVE


@pytest.fixture(scope="module", params=[(name, kind) for name in FAMILIES for kind in ("Q4_0", "Q8_0")], ids=str)
def converted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny GGUF of the family with its experts in the given type (other layers Q8_0), converted as the launcher
    does, and transformers' model of the values its tensors dequantize to."""
    name, kind = request.param
    family: MoeGgufFamily = FAMILIES[name]
    directory = tmp_path_factory.mktemp(f"{name}-{kind}")
    reference = write_moe_gguf(directory / "tiny.gguf", tiny_moe(family, SEED), family, (kind, "Q8_0"))
    convert_gguf(directory / "tiny.gguf", directory / "converted")
    return {"family": family, "kind": kind, "converted": directory / "converted", "reference": reference}


def test_the_float_conversion_holds_the_values_the_file_dequantizes_to(converted: dict[str, Any]) -> None:
    # q_proj and k_proj included: the `llama` architecture's permuted rows are put back in transformers' order.
    model = AutoModelForCausalLM.from_pretrained(converted["converted"], dtype=torch.float32)
    assert type(model) is converted["family"].model_class
    ours, expected = model.state_dict(), converted["reference"].state_dict()
    assert ours.keys() == expected.keys()
    for name, values in expected.items():
        torch.testing.assert_close(ours[name], values, rtol=0, atol=0, msg=name)


def test_the_conversion_keeps_the_expert_stacks_and_attention_as_blocks(converted: dict[str, Any]) -> None:
    with safe_open(str(converted["converted"] / GGUF_BLOCKS_DIR / "model.safetensors"), framework="pt") as handle:
        types = json.loads(handle.metadata()[GGUF_TYPES_KEY])
    for layer in range(converted["family"].config["num_hidden_layers"]):
        experts, attention = f"model.layers.{layer}.mlp.experts.", f"model.layers.{layer}.self_attn."
        assert types[experts + "gate_up_proj"] == types[experts + "down_proj"] == converted["kind"]
        assert types[attention + "q_proj.weight"] == types[attention + "k_proj.weight"] == "Q8_0"


def test_the_float_conversion_served_gives_transformers_logits_and_greedy_tokens(converted: dict[str, Any]) -> None:
    model, report = load_quantized(converted["converted"], QuantizeMode.NONE)
    assert report.formats["experts: float32"] == converted["family"].config["num_hidden_layers"]
    logits, tokens = reference_outputs(converted["reference"])
    torch.testing.assert_close(prompt_logits(model), logits, rtol=1e-4, atol=1e-4)
    assert generate(model, (2,))[1][: len(tokens)] == tokens


def test_experts_served_from_their_blocks_give_transformers_greedy_tokens(converted: dict[str, Any]) -> None:
    model, report = load_quantized(converted["converted"], QuantizeMode.GGUF)
    layers = converted["family"].config["num_hidden_layers"]
    assert report.formats[f"experts: {EXPERT_FORMATS[converted['kind']]}"] == layers
    assert all(experts.quantized is not None and experts.gate_up.numel() == 0 for experts in routed_experts(model))
    logits, tokens = reference_outputs(converted["reference"])
    assert (prompt_logits(model) - logits).abs().max() <= GGUF_RELATIVE * logits.abs().max()
    _assert_follows_up_to_near_ties(converted["reference"], tokens, generate(model, (2,))[1][: len(tokens)])


def _assert_follows_up_to_near_ties(reference: torch.nn.Module, expected: list[int], actual: list[int]) -> None:
    """`actual` equals `expected`, or first departs from it where the reference's two best logits nearly tie."""
    departs = next((i for i, (want, got) in enumerate(zip(expected, actual, strict=True)) if want != got), None)
    if departs is None:
        return
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPT + expected[:departs]])).logits[0, -1]
    gap = (logits.max() - logits[actual[departs]]).item()
    assert gap <= NEAR_TIE_RELATIVE * logits.abs().max().item(), f"departs at {departs}: {expected} vs {actual}"


def test_a_file_without_a_tensor_the_family_needs_is_refused(tmp_path: Path) -> None:
    # As a Mixtral file of llama.cpp's older layout, one tensor per expert, lacks the stacks.
    write_moe_gguf(tmp_path / "tiny.gguf", tiny_moe(MIXTRAL), MIXTRAL, ("Q8_0", "Q8_0"), omit="ffn_down_exps")
    with pytest.raises(GgufConversionError, match="does not hold a mixtral model"):
        convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted")
