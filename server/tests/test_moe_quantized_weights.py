"""Mixture-of-experts models whose experts stay quantized: a Qwen3-MoE GGUF's Q4_0/Q4_1/Q8_0 expert stacks served
from their blocks, and FP8 checkpoints' per-expert float8 weights (per-tensor and block-wise scales), against
transformers loading the same GGUF or the FP8 checkpoint's values; and the experts' memory."""

from __future__ import annotations

import contextlib
import json
import shutil
import socket
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from fp8_testing import TEST_BLOCK, load_fp8_checkpoint, round_activations_like_fp8, rounded_like_fp8
from fp8_testing import write_fp8_checkpoint as write_fp8
from moe_gguf_testing import TINY_QWEN3_MOE, tiny_qwen3_moe, write_tiny_qwen3_moe_gguf
from safetensors import safe_open
from safetensors.torch import save_file
from shard_testing import write_tiny_checkpoint
from tandem_launcher.embedded import convert_gguf
from tandem_launcher.gguf_metadata import moe_config_overrides
from tandem_server.bootstrap import load_shard
from tandem_server.cli import config_from_args
from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.checks import check_quantization
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import QuantizationReport, quantize_model
from tandem_server.weights.gguf_format import GGUF_BLOCKS_DIR, GGUF_TYPES_KEY
from test_families_grouped_moe import FAMILIES as GROUPED_FAMILIES
from test_families_grouped_moe import randomize_correction_biases
from tp_worker import PROMPT, WORLD_SIZE, generate, prompt_logits, run_checkpoint, run_rank
from transformers import AutoConfig, AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(
    kernels_unavailable_reason(CPU, QuantizeMode.GGUF) is not None
    or kernels_unavailable_reason(CPU, QuantizeMode.FP8) is not None,
    reason="no CPU int4/int8 or float8 kernels",
)
EXPERT_FORMATS = {"Q4_0": "Q4_0 as int4", "Q4_1": "Q4_1 as int4", "Q8_0": "Q8_0 as int8 in groups of 32"}
# The int4 kernels multiply bfloat16 activations by bfloat16 scales: measured on the tiny model (logits up to 3),
# the largest logit error is under 1% of the largest logit for every expert type.
GGUF_RELATIVE = 0.02
# Against a reference that rounds activations to float8 exactly as the GEMMs do, only float32 summation order differs.
SAME_ROUNDING_ATOL = 1e-4


def load_quantized(path: Path, mode: QuantizeMode) -> tuple[CausalLM, QuantizationReport]:
    checkpoint = read_checkpoint_config(path)
    check_quantization(mode, checkpoint, CPU)
    model = load_model(
        checkpoint,
        torch.float32,
        CPU,
        ParallelContext(),
        TorchAttentionBackend(),
        gguf_blocks=mode is QuantizeMode.GGUF,
    )
    return model, quantize_model(model, mode)


def reference_outputs(reference: torch.nn.Module) -> tuple[torch.Tensor, list[int]]:
    """The reference's logits over PROMPT and its greedy tokens."""
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPT])).logits[0]
        tokens = reference.generate(torch.tensor([PROMPT]), max_new_tokens=12, do_sample=False, eos_token_id=2)
    return logits, tokens[0, len(PROMPT) :].tolist()


def routed_experts(model: CausalLM) -> list[RoutedExperts]:
    return [module for module in model.modules() if isinstance(module, RoutedExperts)]


@pytest.fixture(scope="module", params=sorted(EXPERT_FORMATS))
def gguf_moe(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A tiny Qwen3-MoE GGUF with its experts in the given type (other layers Q8_0), converted as the launcher does,
    and transformers' model of the same file."""
    directory = tmp_path_factory.mktemp(f"moe-{request.param}")
    gguf_path = directory / "tiny.gguf"
    write_tiny_qwen3_moe_gguf(gguf_path, tiny_qwen3_moe(), request.param, "Q8_0")
    convert_gguf(gguf_path, directory / "converted")
    config = AutoConfig.from_pretrained(directory, gguf_file=gguf_path.name, **moe_config_overrides(gguf_path))
    reference = AutoModelForCausalLM.from_pretrained(
        directory, gguf_file=gguf_path.name, config=config, dtype=torch.float32, experts_implementation="eager"
    )
    return {"kind": request.param, "converted": directory / "converted", "reference": reference.eval()}


def test_the_conversion_keeps_each_layers_expert_stacks_as_blocks(gguf_moe: dict[str, Any]) -> None:
    blocks = gguf_moe["converted"] / GGUF_BLOCKS_DIR / "model.safetensors"
    with safe_open(str(blocks), framework="pt") as handle:
        types = json.loads(handle.metadata()[GGUF_TYPES_KEY])
        shapes = {name: handle.get_slice(name).get_shape() for name in handle.keys()}
    for layer in range(TINY_QWEN3_MOE["num_hidden_layers"]):
        stacks = f"model.layers.{layer}.mlp.experts."
        assert types[stacks + "gate_up_proj"] == types[stacks + "down_proj"] == gguf_moe["kind"]
        experts, hidden, intermediate = (
            TINY_QWEN3_MOE[key] for key in ("num_experts", "hidden_size", "moe_intermediate_size")
        )
        assert shapes[stacks + "gate_up_proj"][:2] == [experts, 2 * intermediate]
        assert shapes[stacks + "down_proj"][:2] == [experts, hidden]


def test_gguf_experts_served_from_their_blocks_match_transformers_on_the_same_file(gguf_moe: dict[str, Any]) -> None:
    model, report = load_quantized(gguf_moe["converted"], QuantizeMode.GGUF)
    assert report.formats[f"experts: {EXPERT_FORMATS[gguf_moe['kind']]}"] == TINY_QWEN3_MOE["num_hidden_layers"]
    # The float stacks never got storage: the experts multiply by the blocks alone.
    assert all(experts.quantized is not None and experts.gate_up.numel() == 0 for experts in routed_experts(model))
    logits, tokens = reference_outputs(gguf_moe["reference"])
    ours = prompt_logits(model)
    assert (ours - logits).abs().max() <= GGUF_RELATIVE * logits.abs().max()
    assert generate(model, (2,))[1][: len(tokens)] == tokens


def test_gguf_experts_take_about_the_bytes_of_their_blocks(gguf_moe: dict[str, Any]) -> None:
    blocks_bytes = (gguf_moe["converted"] / GGUF_BLOCKS_DIR / "model.safetensors").stat().st_size
    _, report = load_quantized(gguf_moe["converted"], QuantizeMode.GGUF)
    _, float_report = load_quantized(gguf_moe["converted"], QuantizeMode.NONE)
    assert report.weight_bytes <= 1.5 * blocks_bytes
    assert float_report.weight_bytes >= 3 * report.weight_bytes


def test_the_shard_serves_a_moe_gguf_quantized_by_default_and_reports_the_experts_format(
    gguf_moe: dict[str, Any],
) -> None:
    converted = gguf_moe["converted"]
    # The blocks alone, without bfloat16 copies of the dense layers for batches.
    flags = ["--quantized-dense-memory", "0"]
    config = config_from_args(["--model-path", str(converted), "--uds-path", str(converted / "s.sock"), *flags])
    info = load_shard(config).info
    assert f"experts: {EXPERT_FORMATS[gguf_moe['kind']]}" in info.weights_format
    float_info = load_shard(replace(config, quantize=QuantizeMode.NONE, dtype=torch.float32)).info
    assert "experts: float32" in float_info.weights_format
    assert float_info.weight_bytes >= 3 * info.weight_bytes


def test_gate_and_up_stacks_of_different_types_are_served_float_beside_quantized_down_stacks(tmp_path: Path) -> None:
    write_tiny_qwen3_moe_gguf(tmp_path / "tiny.gguf", tiny_qwen3_moe(), "Q4_0", "Q8_0", up_type="Q8_0")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "converted")
    with safe_open(str(tmp_path / "converted" / GGUF_BLOCKS_DIR / "model.safetensors"), framework="pt") as handle:
        kept = set(handle.keys())
    assert "model.layers.0.mlp.experts.down_proj" in kept and "model.layers.0.mlp.experts.gate_up_proj" not in kept
    model, report = load_quantized(tmp_path / "converted", QuantizeMode.GGUF)
    assert report.formats["experts: float32"] == TINY_QWEN3_MOE["num_hidden_layers"]
    config = AutoConfig.from_pretrained(tmp_path, gguf_file="tiny.gguf", **moe_config_overrides(tmp_path / "tiny.gguf"))
    reference = AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file="tiny.gguf", config=config, dtype=torch.float32
    )
    logits, tokens = reference_outputs(reference.eval())
    # The experts multiply by the stacks' exact values, the down stacks dequantized into theirs.
    assert (prompt_logits(model) - logits).abs().max() <= GGUF_RELATIVE * logits.abs().max()
    assert generate(model, (2,))[1][: len(tokens)] == tokens


@contextlib.contextmanager
def _linear_inputs_rounded_like_fp8(width: int | None) -> Iterator[None]:
    """transformers' expert loop calls `nn.functional.linear`: within it, every input is rounded to float8 per token
    (and run of `width` inputs) as Tandem's float8 GEMMs round it."""
    linear = F.linear

    def rounded(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return linear(rounded_like_fp8(x.reshape(-1, x.shape[-1]), width).reshape(x.shape), weight, bias)

    torch.nn.functional.linear = rounded
    try:
        yield
    finally:
        torch.nn.functional.linear = linear


def _round_expert_inputs(reference: torch.nn.Module, width: int | None) -> None:
    """Rounds the inputs of every experts module's projections (its 3-D `gate_up_proj` and `down_proj`)."""

    def wrap(forward: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        def rounded_forward(*args: Any, **kwargs: Any) -> torch.Tensor:
            with _linear_inputs_rounded_like_fp8(width):
                return forward(*args, **kwargs)

        return rounded_forward

    experts = [module for module in reference.modules() if getattr(module, "gate_up_proj", None) is not None]
    assert experts
    for module in experts:
        module.forward = wrap(module.forward)


FP8_MOE = {**TINY_QWEN3_MOE, "vocab_size": 96}
DEEPSEEK_V3 = GROUPED_FAMILIES["deepseek-v3-mla"]
FP8_FAMILIES: dict[str, tuple[Callable[[Path], torch.nn.Module], str]] = {
    "qwen3-moe-per-tensor": (
        lambda path: write_tiny_checkpoint(path, Qwen3MoeConfig, Qwen3MoeForCausalLM, **FP8_MOE),
        "autofp8",
    ),
    "qwen3-moe-block": (
        lambda path: write_tiny_checkpoint(path, Qwen3MoeConfig, Qwen3MoeForCausalLM, **FP8_MOE),
        "block",
    ),
    # A dense first layer and shared experts beside the routed ones, all block-wise float8.
    "deepseek-v3-block": (
        lambda path: write_tiny_checkpoint(
            path, DEEPSEEK_V3[0], DEEPSEEK_V3[1], randomize=randomize_correction_biases, **DEEPSEEK_V3[2]
        ),
        "block",
    ),
}


@pytest.mark.parametrize("family", sorted(FP8_FAMILIES))
def test_an_fp8_moe_checkpoint_gives_the_logits_and_greedy_tokens_of_its_values(tmp_path: Path, family: str) -> None:
    write_float, layout = FP8_FAMILIES[family]
    float_model = write_float(tmp_path / "float")
    values = write_fp8(tmp_path / "float", tmp_path / layout, layout)
    model, report = load_fp8_checkpoint(tmp_path / layout)
    sparse_layers = len(routed_experts(model))
    assert sparse_layers and report.formats["experts: float8 checkpoint as fp8"] == sparse_layers
    assert all(experts.gate_up.numel() == 0 for experts in routed_experts(model))
    (tmp_path / "values").mkdir()
    save_file(
        {name: tensor.contiguous() for name, tensor in values.items()}, str(tmp_path / "values" / "model.safetensors")
    )
    shutil.copy(tmp_path / "float" / "config.json", tmp_path / "values" / "config.json")
    reference = (
        type(float_model)
        .from_pretrained(
            tmp_path / "values", dtype=torch.float32, experts_implementation="eager", attn_implementation="eager"
        )
        .eval()
    )
    width = TEST_BLOCK[1] if layout == "block" else None
    round_activations_like_fp8(reference, input_group=width)
    _round_expert_inputs(reference, width)
    logits, tokens = reference_outputs(reference)
    assert (prompt_logits(model) - logits).abs().max() <= SAME_ROUNDING_ATOL
    assert generate(model, (2,))[1][: len(tokens)] == tokens


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_two_gloo_ranks_serve_quantized_experts_as_one_process(tmp_path: Path) -> None:
    # Each expert's 64 intermediate features split 32 + 32: every rank's down inputs are one whole GGUF block of 32
    # and one whole FP8 block of (24, 32) inputs; the gate/up rows split inside the 24-row FP8 blocks.
    wide = {**TINY_QWEN3_MOE, "moe_intermediate_size": 64}
    model = Qwen3MoeForCausalLM(Qwen3MoeConfig(**wide)).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" not in name:
                param.normal_(0, 0.1)
    write_tiny_qwen3_moe_gguf(tmp_path / "tiny.gguf", model, "Q4_0", "Q8_0")
    convert_gguf(tmp_path / "tiny.gguf", tmp_path / "gguf")
    write_tiny_checkpoint(tmp_path / "float", Qwen3MoeConfig, Qwen3MoeForCausalLM, **{**FP8_MOE, **wide})
    write_fp8(tmp_path / "float", tmp_path / "block", "block", block=(24, 32))
    checkpoints = [tmp_path / "gguf", tmp_path / "block"]
    single = {checkpoint.name: run_checkpoint(checkpoint, ParallelContext()) for checkpoint in checkpoints}
    mp.start_processes(run_rank, args=(checkpoints, _free_port(), tmp_path), nprocs=WORLD_SIZE, start_method="spawn")
    for rank in range(WORLD_SIZE):
        results = torch.load(tmp_path / f"rank{rank}.pt")
        # bfloat16 activations of the int4 kernels round each rank's partial sums apart from the whole ones.
        torch.testing.assert_close(results["gguf"]["logits"], single["gguf"]["logits"], rtol=0.02, atol=0.05)
        torch.testing.assert_close(results["block"]["logits"], single["block"]["logits"])
        for name in ("gguf", "block"):
            assert results[name]["tokens"][1] == single[name]["tokens"][1], name
