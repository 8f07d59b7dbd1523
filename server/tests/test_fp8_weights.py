"""FP8 (e4m3) weights through torch._scaled_mm on CPU: the GEMM's numbers, tiny checkpoints in each Hub layout
(compressed-tensors per tensor and per channel, FBGEMM, AutoFP8, block-wise) against transformers on the same values,
`--quantize fp8`, the CUDA capability guard, and the start-up errors for bad checkpoints."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from fp8_testing import (
    LAYOUTS,
    TEST_BLOCK,
    linear_input_amax,
    load_fp8_checkpoint,
    round_activations_like_fp8,
    write_fp8_checkpoint,
)
from safetensors.torch import load_file, save_file
from shard_testing import write_tiny_llama
from tandem_server.bootstrap import load_shard
from tandem_server.cli import config_from_args
from tandem_server.errors import ConfigError, WeightsError
from tandem_server.models.config import read_checkpoint_config
from tandem_server.quant.checks import check_quantization
from tandem_server.quant.fp8.weight import Fp8Weight
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.values import FP8_DTYPE, FP8_MAX, Fp8Channels, quantize_fp8
from tp_worker import NEW_TOKENS, PROMPT, generate, prompt_logits
from transformers import LlamaForCausalLM

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(kernels_unavailable_reason(CPU, QuantizeMode.FP8) is not None, reason="no _scaled_mm")
# Against a reference that rounds activations to float8 exactly as the GEMM does, only float32 summation order
# differs (measured: under 2e-6 on logits of magnitude 5).
SAME_ROUNDING_ATOL = 1e-4
# Against plain float32 (activations unrounded): e4m3 keeps 4 significant bits, so each activation moves by up to
# 2^-4 of itself. Measured on the tiny model (logits up to 5.2): 0.55 to 0.71 for the checkpoints (weights exact),
# 0.86 for --quantize fp8 (weights rounded too, LM head included).
FLOAT_RELATIVE = 0.25


def test_the_gemm_multiplies_float8_activations_by_the_weights_values() -> None:
    channels = quantize_fp8(torch.randn(48, 64))
    kernel = Fp8Weight(channels)
    x = torch.randn(5, 64) * 3
    x[2] = 0
    q, scale = kernel.quantize_activations(x)
    assert q.dtype == FP8_DTYPE and scale.shape == (5, 1)
    # Each activation is rounded to 4 significant bits: within 2^-4 of itself (or a subnormal step).
    assert ((q.float() * scale - x).abs() <= x.abs() * 2**-4 + scale * 2**-9).all()
    expected = F.linear(q.float() * scale, channels.dequantize())
    torch.testing.assert_close(kernel.linear(x, None), expected, rtol=1e-5, atol=1e-5)
    bias = torch.randn(48)
    torch.testing.assert_close(kernel.linear(x, bias), expected + bias, rtol=1e-5, atol=1e-5)
    ids = torch.tensor([[0, 47], [5, 5]])
    assert torch.equal(kernel.rows(ids, torch.float32), channels.dequantize()[ids])


def test_float_weights_quantize_to_float8_within_half_a_step() -> None:
    weight = torch.randn(24, 64)
    channels = quantize_fp8(weight)
    assert channels.q.dtype == FP8_DTYPE
    assert torch.equal(channels.q.float().abs().amax(-1), torch.full((24,), FP8_MAX))
    step = weight.abs() * 2**-4 + channels.scale.unsqueeze(-1) * 2**-10
    assert ((channels.dequantize() - weight).abs() <= step).all()


def test_static_and_bounded_activation_scales() -> None:
    channels = quantize_fp8(torch.randn(16, 32))
    x = torch.randn(3, 32)
    x[1, 0] = 100.0
    static = Fp8Weight(Fp8Channels(channels.q, channels.scale, input_scale=0.01))
    q, scale = static.quantize_activations(x)
    assert torch.equal(scale, torch.full((3, 1), 0.01))
    assert q.float()[1, 0] == FP8_MAX  # 100 is beyond 448 * 0.01: clipped
    bounded = Fp8Weight(Fp8Channels(channels.q, channels.scale, activation_bound=1.0))
    _, scale = bounded.quantize_activations(x)
    assert scale[1, 0] == 1.0 / FP8_MAX
    assert torch.equal(scale[0], x[0].abs().amax().clamp_max(1.0).reshape(1) / FP8_MAX)


def test_stacked_parts_share_the_largest_static_scale_and_keep_their_channel_scales() -> None:
    first = Fp8Channels(torch.zeros(2, 4, dtype=FP8_DTYPE), torch.tensor([1.0, 1.0]), input_scale=0.1)
    second = Fp8Channels(torch.zeros(3, 4, dtype=FP8_DTYPE), torch.tensor([2.0, 2.0, 2.0]), input_scale=0.2)
    stacked = Fp8Channels.concat([first, second])
    assert stacked.input_scale == 0.2 and stacked.q.shape == (5, 4)
    assert stacked.scale.tolist() == [1.0, 1.0, 2.0, 2.0, 2.0]
    assert Fp8Channels.concat([first, Fp8Channels(second.q, second.scale)]).input_scale is None


def _reference(float_dir: Path, values: dict[str, torch.Tensor]) -> LlamaForCausalLM:
    """transformers on a float checkpoint written with `values`."""
    reference = LlamaForCausalLM.from_pretrained(float_dir).eval()
    reference.load_state_dict(values)
    reference.save_pretrained(float_dir.with_name(f"{float_dir.name}-values"))
    return LlamaForCausalLM.from_pretrained(float_dir.with_name(f"{float_dir.name}-values")).eval()


def _expected(reference: LlamaForCausalLM) -> tuple[torch.Tensor, list[int]]:
    """The reference's logits over PROMPT and its greedy tokens."""
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPT])).logits[0]
        tokens = reference.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return logits, tokens[0, len(PROMPT) :].tolist()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A float tiny Llama, its linear layers' input ranges over PROMPT (the static scales' calibration)."""
    root = tmp_path_factory.mktemp("fp8")
    reference = write_tiny_llama(root / "float", tie_word_embeddings=False)
    # A quarter above the calibration's largest inputs, so decoded tokens' inputs are rarely clipped.
    amax = {name: 1.25 * value for name, value in linear_input_amax(reference, torch.tensor([PROMPT])).items()}
    return {"root": root, "amax": amax}


def _static_scales(checkpoint: Path) -> dict[str, float] | None:
    stored = load_file(str(checkpoint / "model.safetensors"))
    scales = {name.replace("input_scale", "weight"): v.item() for name, v in stored.items() if "input_scale" in name}
    return scales or None


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_fp8_checkpoint_gives_the_logits_and_greedy_tokens_of_its_values(tiny: dict[str, Any], layout: str) -> None:
    root = tiny["root"]
    # Per-tensor weights with static activation scales, per-channel and block ones with per-token scales.
    amax = tiny["amax"] if layout in ("compressed-tensors-tensor", "autofp8") else None
    values = write_fp8_checkpoint(root / "float", root / layout, layout, amax)
    model, report = load_fp8_checkpoint(root / layout)
    assert report.formats == {
        "qkv_proj: float8 checkpoint as fp8": 2, "o_proj: float8 checkpoint as fp8": 2,
        "gate_up_proj: float8 checkpoint as fp8": 2, "down_proj: float8 checkpoint as fp8": 2,
        "lm_head: float32": 1, "embed_tokens: float32": 1,
    }  # fmt: skip
    reference = _reference(root / "float", values)
    float_logits, _ = _expected(reference)
    bound = 1200.0 if layout == "fbgemm" else None
    group = TEST_BLOCK[1] if layout == "block" else None
    round_activations_like_fp8(reference, _static_scales(root / layout), bound, input_group=group)
    logits, tokens = _expected(reference)
    ours = prompt_logits(model)
    assert (ours - logits).abs().max() <= SAME_ROUNDING_ATOL
    assert (ours - float_logits).abs().max() <= FLOAT_RELATIVE * float_logits.abs().max()
    assert generate(model, (2,))[1][: len(tokens)] == tokens


def test_quantize_fp8_rounds_a_float_checkpoint_to_float8_channels(tiny: dict[str, Any]) -> None:
    root = tiny["root"]
    model, report = load_fp8_checkpoint(root / "float", QuantizeMode.FP8)
    assert report.formats["down_proj: float as fp8"] == 2 and report.formats["lm_head: float as fp8"] == 1
    float_values = load_file(str(root / "float" / "model.safetensors"))
    rounded = {
        name: quantize_fp8(tensor).dequantize() if name.endswith("proj.weight") or name == "lm_head.weight" else tensor
        for name, tensor in float_values.items()
    }
    reference = _reference(root / "float", rounded)
    round_activations_like_fp8(reference, roles=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                                 "down_proj", "lm_head"))  # fmt: skip
    logits, tokens = _expected(reference)
    ours = prompt_logits(model)
    assert (ours - logits).abs().max() <= SAME_ROUNDING_ATOL
    float_logits, _ = _expected(LlamaForCausalLM.from_pretrained(root / "float").eval())
    assert (ours - float_logits).abs().max() <= FLOAT_RELATIVE * float_logits.abs().max()
    assert generate(model, (2,))[1][: len(tokens)] == tokens


def test_quantize_fp8_takes_a_quarter_of_float32s_bytes(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path, tie_word_embeddings=True)
    _, report = load_fp8_checkpoint(tmp_path, QuantizeMode.FP8)
    assert report.formats["embed_tokens: fp8, shared with the tied LM head"] == 1
    _, float_report = load_fp8_checkpoint(tmp_path, QuantizeMode.NONE)
    # One byte per weight plus a float32 scale per row; norms stay float32 (measured ratio 0.26).
    assert 0.25 <= report.weight_bytes / float_report.weight_bytes <= 0.28


def test_a_stack_mixing_float8_and_float_parts_is_served_in_float_with_the_same_values(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path / "float")
    values = write_fp8_checkpoint(tmp_path / "float", tmp_path / "fp8", "fbgemm")
    tensors = load_file(str(tmp_path / "fp8" / "model.safetensors"))
    # The layer-0 key projection left float, as `modules_to_not_convert` can leave a layer.
    tensors["model.layers.0.self_attn.k_proj.weight"] = values["model.layers.0.self_attn.k_proj.weight"]
    del tensors["model.layers.0.self_attn.k_proj.weight_scale"]
    save_file(tensors, str(tmp_path / "fp8" / "model.safetensors"))
    model, report = load_fp8_checkpoint(tmp_path / "fp8")
    assert report.formats["qkv_proj: float32"] == 1 and report.formats["qkv_proj: float8 checkpoint as fp8"] == 1
    stacked = torch.cat([values[f"model.layers.0.self_attn.{role}_proj.weight"] for role in "qkv"])
    assert torch.equal(model.model.layers[0].self_attn.qkv_proj.weight, stacked)


def test_fp8_on_cuda_needs_compute_capability_8_9(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100-SXM4-80GB")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "compute capability 8.9 or newer" in str(kernels_unavailable_reason(cuda, QuantizeMode.FP8))
    write_tiny_llama(tmp_path / "float")
    with pytest.raises(ConfigError, match=r"--quantize fp8: .*8\.9 or newer .*A100-SXM4-80GB is 8\.0"):
        check_quantization(QuantizeMode.FP8, read_checkpoint_config(tmp_path / "float"), cuda)
    write_fp8_checkpoint(tmp_path / "float", tmp_path / "fbgemm", "fbgemm")
    with pytest.raises(ConfigError, match=r"FP8 checkpoint \(fbgemm_fp8\): .*8\.9 or newer"):
        check_quantization(QuantizeMode.NONE, read_checkpoint_config(tmp_path / "fbgemm"), cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 9))
    assert kernels_unavailable_reason(cuda, QuantizeMode.FP8) is None
    check_quantization(QuantizeMode.NONE, read_checkpoint_config(tmp_path / "fbgemm"), cuda)
    # The CPU-only modes stay CPU-only.
    with pytest.raises(ConfigError, match=r"FP8 checkpoint .* serve it with --quantize none"):
        check_quantization(QuantizeMode.INT8, read_checkpoint_config(tmp_path / "fbgemm"), CPU)


def test_the_shard_serves_an_fp8_checkpoint_and_reports_its_formats_in_info(fp8_checkpoint: Path) -> None:
    flags = ["--dtype", "float32"]  # its float layers stay the checkpoint's float32 on any CPU
    config = config_from_args(
        ["--model-path", str(fp8_checkpoint), "--uds-path", str(fp8_checkpoint / "s.sock"), *flags]
    )
    info = load_shard(config).info
    assert "qkv_proj: float8 checkpoint as fp8" in info.weights_format and "lm_head: float32" in info.weights_format
    quantized = load_shard(replace(config, quantize=QuantizeMode.FP8)).info
    assert "lm_head: float as fp8" in quantized.weights_format and quantized.weight_bytes < info.weight_bytes


def test_a_weight_the_format_cannot_take_fails_start_up_naming_it(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path, hidden_size=48)
    with pytest.raises(ConfigError, match=r"--quantize int4: model\.layers\.0\.self_attn\.o_proj: .*multiples of 32"):
        load_fp8_checkpoint(tmp_path, QuantizeMode.INT4)


def test_the_shard_takes_fp8_and_int4_on_cuda_and_keeps_the_other_modes_cpu_only(tmp_path: Path) -> None:
    base = ["--model-path", str(tmp_path), "--uds-path", str(tmp_path / "s.sock"), "--device", "cuda"]
    assert config_from_args([*base, "--quantize", "fp8"]).quantize is QuantizeMode.FP8
    # The launcher passes --quantize int4 on to CUDA shards, whose Triton kernel serves it.
    assert config_from_args([*base, "--quantize", "int4"]).quantize is QuantizeMode.INT4
    for mode in ("int8", "gguf"):
        with pytest.raises(ConfigError, match=f"--quantize {mode} is a CPU option; on CUDA use none, int4 or fp8"):
            config_from_args([*base, "--quantize", mode])


def _fp8_checkpoint(tmp_path: Path, layout: str = "compressed-tensors-channel") -> Path:
    write_tiny_llama(tmp_path / "float")
    amax = linear_input_amax(LlamaForCausalLM.from_pretrained(tmp_path / "float"), torch.tensor([PROMPT]))
    write_fp8_checkpoint(tmp_path / "float", tmp_path / "fp8", layout, amax if layout.endswith("tensor") else None)
    return tmp_path / "fp8"


def _edit_config(checkpoint: Path, **quantization: Any) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"].update(quantization)
    (checkpoint / "config.json").write_text(json.dumps(config))


def _drop_tensor(checkpoint: Path, name: str) -> None:
    tensors = load_file(str(checkpoint / "model.safetensors"))
    del tensors[name]
    save_file(tensors, str(checkpoint / "model.safetensors"))


def test_a_missing_weight_scale_fails_start_up_naming_it(tmp_path: Path) -> None:
    checkpoint = _fp8_checkpoint(tmp_path)
    _drop_tensor(checkpoint, "model.layers.1.mlp.down_proj.weight_scale")
    with pytest.raises(WeightsError, match=r"lacks model\.layers\.1\.mlp\.down_proj\.weight_scale"):
        load_fp8_checkpoint(checkpoint)


def test_a_missing_static_input_scale_fails_start_up_naming_it(tmp_path: Path) -> None:
    checkpoint = _fp8_checkpoint(tmp_path, "compressed-tensors-tensor")
    _drop_tensor(checkpoint, "model.layers.0.self_attn.k_proj.input_scale")
    with pytest.raises(WeightsError, match=r"static activation scales, .*self_attn\.k_proj\.input_scale"):
        load_fp8_checkpoint(checkpoint)


def test_an_unknown_quant_method_fails_start_up_naming_it(tmp_path: Path) -> None:
    checkpoint = _fp8_checkpoint(tmp_path)
    _edit_config(checkpoint, quant_method="bitsandbytes")
    with pytest.raises(ConfigError, match="quant_method 'bitsandbytes' is not supported"):
        read_checkpoint_config(checkpoint)


def test_an_int4_compressed_tensors_scheme_fails_start_up_naming_it(tmp_path: Path) -> None:
    checkpoint = _fp8_checkpoint(tmp_path)
    int4 = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 128}
    _edit_config(checkpoint, format="pack-quantized", config_groups={"group_0": {"weights": int4}})
    with pytest.raises(ConfigError, match="group 'group_0': format 'pack-quantized' is not supported"):
        read_checkpoint_config(checkpoint)
    _edit_config(checkpoint, format="naive-quantized")
    with pytest.raises(ConfigError, match="weights int 4-bit, strategy group, group_size 128 are not supported"):
        read_checkpoint_config(checkpoint)


def test_float8_tensors_without_a_quantization_config_fail_start_up(tmp_path: Path) -> None:
    checkpoint = _fp8_checkpoint(tmp_path)
    config = json.loads((checkpoint / "config.json").read_text())
    del config["quantization_config"]
    (checkpoint / "config.json").write_text(json.dumps(config))
    with pytest.raises(WeightsError, match=r"float8 tensor, but config\.json declares no quantization_config"):
        load_fp8_checkpoint(checkpoint)


DOWN = "model.layers.1.mlp.down_proj"
BAD_TENSORS = {
    "nonzero zero point": ({f"{DOWN}.weight_zero_point": torch.ones(1)}, "weight_zero_point is not zero: asymmetric"),
    "scale of a float weight": ({f"{DOWN}.weight": torch.zeros(64, 128)}, "but its weight is not float8 e4m3"),
    "scale count": ({f"{DOWN}.weight_scale": torch.ones(3, 1)}, "weight_scale holds 3 scales for 64 rows"),
    "per-channel input scale": ({f"{DOWN}.input_scale": torch.ones(64, 1)}, "only per-tensor values are supported"),
    "e5m2 weight": ({f"{DOWN}.weight": torch.zeros(64, 128, dtype=torch.float8_e5m2)}, "float8_e5m2 weights are not"),
}


@pytest.fixture(scope="module")
def fp8_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fp8_checkpoint(tmp_path_factory.mktemp("fp8-checkpoint"))


@pytest.mark.parametrize("case", BAD_TENSORS)
def test_bad_fp8_tensors_fail_start_up_naming_the_tensor(fp8_checkpoint: Path, tmp_path: Path, case: str) -> None:
    changes, message = BAD_TENSORS[case]
    checkpoint = Path(shutil.copytree(fp8_checkpoint, tmp_path / "fp8"))
    tensors = load_file(str(checkpoint / "model.safetensors"))
    save_file({**tensors, **changes}, str(checkpoint / "model.safetensors"))
    with pytest.raises(WeightsError, match=message):
        load_fp8_checkpoint(checkpoint)


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "kv cache scheme": ({"kv_cache_scheme": {"num_bits": 8, "type": "float"}}, "kv_cache_scheme .* is not supported"),
    "no groups": ({"config_groups": {}}, "has no config_groups"),
    "2:4 sparse": ({"sparsity_config": {"format": "sparse-24-bitmask"}}, "format 'sparse-24-bitmask' .* not supported"),
    "grouped float8": (
        {"config_groups": {"g": {"weights": {"num_bits": 8, "type": "float", "strategy": "block"}}}},
        "group 'g': weights float 8-bit, strategy block are not supported",
    ),
    "int8 activations": (
        {
            "config_groups": {
                "g": {
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {"num_bits": 8, "type": "int", "strategy": "token", "dynamic": True},
                }
            }
        },
        "input activations int 8-bit, strategy token",
    ),
    "mixed activations": (
        {
            "config_groups": {
                "a": {"weights": {"num_bits": 8, "type": "float", "strategy": "channel"}},
                "b": {
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False},
                },
            }
        },
        "mix static and dynamic activation scales",
    ),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_unsupported_compressed_tensors_configs_fail_start_up_naming_the_scheme(
    fp8_checkpoint: Path, tmp_path: Path, case: str
) -> None:
    changes, message = BAD_CONFIGS[case]
    checkpoint = Path(shutil.copytree(fp8_checkpoint, tmp_path / "fp8"))
    _edit_config(checkpoint, **changes)
    with pytest.raises(ConfigError, match=message):
        read_checkpoint_config(checkpoint)
