"""FP8 checkpoints whose config.json says `quant_method: fp8`: AutoFP8's per-tensor layout (static input scales,
`ignored_layers` left float) and the block-wise layout (`weight_block_size`, `weight_scale_inv`) through one
`_scaled_mm` per run of inputs on CPU; their tensor-parallel slicing; and every start-up refusal. The logits and greedy
tokens of both layouts against transformers are in test_fp8_weights.py."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from fp8_testing import linear_input_amax, load_fp8_checkpoint, rounded_like_fp8, write_fp8_checkpoint
from safetensors.torch import load_file, save_file
from shard_testing import TINY_SETTINGS, write_tiny_llama
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError, WeightsError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.quant.fp8.weight import Fp8Weight
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.values import FP8_DTYPE, FP8_MAX, Fp8Channels
from tp_worker import PROMPT, WORLD_SIZE, run_checkpoint, run_rank
from transformers import LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(kernels_unavailable_reason(CPU, QuantizeMode.FP8) is not None, reason="no _scaled_mm")
DOWN = "model.layers.1.mlp.down_proj"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_block_scaled_weight_multiplies_activations_rounded_per_token_and_run() -> None:
    # 112 inputs in runs of 48: the last run holds 16.
    q = (torch.randn(40, 112) * 100).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    channels = Fp8Channels(q, torch.rand(40, 3) + 0.1, input_group=48)
    kernel = Fp8Weight(channels)
    x = torch.randn(5, 112) * 3
    x[1, :48] = 0
    x[2, 50] = 40.0  # one large input rounds only its own run coarsely
    rounded, weight = rounded_like_fp8(x, 48), channels.dequantize()
    # float32 summation order alone: well under 1e-6 of the sum of the terms' magnitudes.
    terms = F.linear(rounded.abs(), weight.abs())
    assert ((kernel.linear(x, None) - F.linear(rounded, weight)).abs() <= 1e-6 * terms).all()
    assert not torch.allclose(F.linear(rounded, weight), F.linear(rounded_like_fp8(x, 112), weight))
    ids = torch.tensor([[0, 39], [7, 7]])
    assert torch.equal(kernel.rows(ids, torch.float32), channels.dequantize()[ids])
    widened = channels.scale.repeat_interleave(48, dim=1)[:, :112]
    assert torch.equal(channels.dequantize(), q.float() * widened)


def test_fp8_on_cuda_refuses_features_not_a_multiple_of_16() -> None:
    # Only the shape and device are read before the check: a stand-in for a CUDA tensor will do. Runs of inputs need
    # no such multiple: a CUDA weight is multiplied in one call, its runs requantized per row when not 128-wide blocks.
    on_cuda = cast(torch.Tensor, SimpleNamespace(shape=(32, 72), is_cuda=True))
    with pytest.raises(ValueError, match="multiples of 16, this weight is 32 x 72"):
        Fp8Weight(Fp8Channels(on_cuda, torch.ones(32, 3), input_group=24))


def test_stacked_parts_must_scale_the_same_runs_of_inputs() -> None:
    q = torch.zeros(2, 64, dtype=FP8_DTYPE)
    blocks = Fp8Channels(q, torch.ones(2, 2), input_group=32)
    stacked = Fp8Channels.concat([blocks, blocks])
    assert stacked.input_group == 32 and stacked.scale.shape == (4, 2)
    with pytest.raises(ValueError, match="stacked float8 parts scale different runs of input features"):
        Fp8Channels.concat([blocks, Fp8Channels(q, torch.ones(2))])


@pytest.fixture(scope="module")
def float_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("fp8-method") / "float"
    write_tiny_llama(path, tie_word_embeddings=False)
    return path


def test_autofp8_static_input_scales_are_the_gemms_activation_scales(float_dir: Path, tmp_path: Path) -> None:
    amax = linear_input_amax(LlamaForCausalLM.from_pretrained(float_dir), torch.tensor([PROMPT]))
    write_fp8_checkpoint(float_dir, tmp_path / "autofp8", "autofp8", amax)
    assert read_checkpoint_config(tmp_path / "autofp8").fp8.static_activations
    stored = load_file(str(tmp_path / "autofp8" / "model.safetensors"))
    model, _ = load_fp8_checkpoint(tmp_path / "autofp8")
    attention = model.model.layers[0].self_attn
    assert attention.o_proj.weight_format.input_scale == stored["model.layers.0.self_attn.o_proj.input_scale"].item()
    # q, k and v share one input: the largest of their static scales.
    qkv = [stored[f"model.layers.0.self_attn.{role}_proj.input_scale"].item() for role in "qkv"]
    assert attention.qkv_proj.weight_format.input_scale == max(qkv)


def test_autofp8_ignored_layers_stay_float_with_their_values(float_dir: Path, tmp_path: Path) -> None:
    ignored = "model.layers.0.mlp.down_proj"
    values = write_fp8_checkpoint(float_dir, tmp_path / "autofp8", "autofp8", ignored=(ignored,))
    assert json.loads((tmp_path / "autofp8" / "config.json").read_text())["quantization_config"] == {
        "quant_method": "fp8", "activation_scheme": "dynamic", "ignored_layers": ["lm_head", ignored],
    }  # fmt: skip
    model, report = load_fp8_checkpoint(tmp_path / "autofp8")
    assert report.formats["down_proj: float32"] == 1 and report.formats["down_proj: float8 checkpoint as fp8"] == 1
    assert report.formats["lm_head: float32"] == 1
    assert torch.equal(model.model.layers[0].mlp.down_proj.weight, values[f"{ignored}.weight"])


def test_two_gloo_ranks_serve_a_block_checkpoint_as_one_process(float_dir: Path, tmp_path: Path) -> None:
    # Blocks of 32 inputs: each rank's inputs of o_proj (32 of 64) and down_proj (64 of 128) are whole blocks, while
    # the 24-row blocks split across the ranks' rows of q (32 each) and of k and v (16 each).
    checkpoint = tmp_path / "block"
    write_fp8_checkpoint(float_dir, checkpoint, "block", block=(24, 32))
    single = run_checkpoint(checkpoint, ParallelContext())
    mp.start_processes(run_rank, args=([checkpoint], _free_port(), tmp_path), nprocs=WORLD_SIZE, start_method="spawn")
    for rank in range(WORLD_SIZE):
        result = torch.load(tmp_path / f"rank{rank}.pt")["block"]
        # Activations are scaled per run of 32 inputs, which no rank splits: only summation order differs.
        torch.testing.assert_close(result["logits"], single["logits"])
        assert result["tokens"] == single["tokens"]


def test_a_fused_tensors_parts_read_the_block_scales_of_their_rows(tmp_path: Path) -> None:
    # Phi-3 stores q/k/v fused (64 + 32 + 32 rows): k's rows start inside the third block of 24.
    torch.manual_seed(0)
    config = Phi3Config(**{**TINY_SETTINGS, "num_hidden_layers": 1})
    Phi3ForCausalLM(config).eval().save_pretrained(tmp_path / "phi3")
    values = write_fp8_checkpoint(tmp_path / "phi3", tmp_path / "block", "block")
    model, report = load_fp8_checkpoint(tmp_path / "block")
    assert report.formats["qkv_proj: float8 checkpoint as fp8"] == 1
    for module, name in ((model.model.layers[0].self_attn.qkv_proj, "self_attn.qkv_proj"),
                         (model.model.layers[0].mlp.gate_up_proj, "mlp.gate_up_proj")):  # fmt: skip
        rows = torch.arange(module.weight_format.out_features)
        assert torch.equal(module.weight_format.rows(rows, torch.float32), values[f"model.layers.0.{name}.weight"])


def test_a_rank_whose_inputs_split_a_block_fails_start_up(float_dir: Path, tmp_path: Path) -> None:
    write_fp8_checkpoint(float_dir, tmp_path / "block", "block", block=(24, 48))
    config = read_checkpoint_config(tmp_path / "block")
    with pytest.raises(
        WeightsError,
        match=r"down_proj.weight_scale_inv: this rank.s input features \[0, 64\) do not cover whole blocks of 48",
    ):
        load_model(config, torch.float32, CPU, ParallelContext(rank=0, world_size=2), TorchAttentionBackend())


BAD_CONFIGS: dict[str, tuple[dict[str, Any], str]] = {
    "activation scheme": ({"activation_scheme": "per-token"}, "activation_scheme 'per-token' is not supported"),
    "e5m2 values": ({"fmt": "e5m2"}, "fmt 'e5m2' is not supported"),
    "power-of-two scales": ({"scale_fmt": "ue8m0"}, "scale_fmt 'ue8m0' .* is not supported"),
    "one-dimensional block": ({"weight_block_size": [128]}, r"weight_block_size \[128\] is not two positive"),
    "empty block": ({"weight_block_size": [0, 128]}, r"weight_block_size \[0, 128\] is not two positive"),
    "stored KV cache scales": (
        {"kv_cache_quant_targets": ["k_proj", "v_proj"]},
        r"kv_cache_quant_targets .* is not supported; Tandem's KV cache dtype is --kv-cache-dtype",
    ),
    "static block-wise": (
        {"weight_block_size": [128, 128], "activation_scheme": "static"},
        r"weight_block_size \[128, 128\] with static activations is not supported",
    ),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_unsupported_fp8_configs_fail_start_up_naming_the_field(float_dir: Path, tmp_path: Path, case: str) -> None:
    write_fp8_checkpoint(float_dir, tmp_path / "fp8", "block")
    changes, message = BAD_CONFIGS[case]
    config = json.loads((tmp_path / "fp8" / "config.json").read_text())
    config["quantization_config"].update(changes)
    (tmp_path / "fp8" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message):
        read_checkpoint_config(tmp_path / "fp8")


BAD_TENSORS: dict[str, tuple[str, dict[str, torch.Tensor], str | None, str]] = {
    "missing block scales": ("block", {}, f"{DOWN}.weight_scale_inv", rf"lacks {DOWN}\.weight_scale_inv"),
    "block scales count": (
        "block",
        {f"{DOWN}.weight_scale_inv": torch.ones(1, 1)},
        None,
        r"has shape \(1, 1\); 64 rows in blocks of 24 \(weight_block_size \[24, 48\]\) make 3, not 1",
    ),
    "input blocks of a column-parallel layer": (
        "block",
        {"model.layers.1.mlp.up_proj.weight_scale_inv": torch.ones(6, 3)},
        None,
        r"up_proj\.weight_scale_inv: has shape \(6, 3\); 64 input features in blocks of 48 .* make 2, not 3",
    ),
    "too few input blocks of a row-parallel layer": (
        "block",
        {"model.layers.0.self_attn.o_proj.weight_scale_inv": torch.ones(3, 1)},
        None,
        r"o_proj\.weight_scale_inv: has shape \(3, 1\); .* in blocks of \[24, 48\] need at least \(3, 2\)",
    ),
    "one-dimensional block scales": (
        "block",
        {f"{DOWN}.weight_scale_inv": torch.ones(9)},
        None,
        r"has shape \(9,\); block scales are 2-D",
    ),
    "block scales of a float weight": (
        "block",
        {f"{DOWN}.weight": torch.zeros(64, 128)},
        None,
        "weight_scale_inv for .*down_proj but its weight is not float8 e4m3",
    ),
    "missing per-tensor scale": ("autofp8", {}, f"{DOWN}.weight_scale", rf"lacks {DOWN}\.weight_scale\b"),
    "missing static input scale": (
        "autofp8-static",
        {},
        f"{DOWN}.input_scale",
        rf"static activation scales, but the checkpoint lacks {DOWN}\.input_scale",
    ),
}


@pytest.mark.parametrize("case", BAD_TENSORS)
def test_bad_fp8_method_tensors_fail_start_up_naming_the_tensor(float_dir: Path, tmp_path: Path, case: str) -> None:
    layout, changes, dropped, message = BAD_TENSORS[case]
    amax = dict.fromkeys(load_file(str(float_dir / "model.safetensors")), 22.0) if layout.endswith("static") else None
    write_fp8_checkpoint(float_dir, tmp_path / "fp8", layout.removesuffix("-static"), amax)
    tensors = {**load_file(str(tmp_path / "fp8" / "model.safetensors")), **changes}
    tensors.pop(dropped or "", None)
    save_file(tensors, str(tmp_path / "fp8" / "model.safetensors"))
    with pytest.raises(WeightsError, match=message):
        load_fp8_checkpoint(tmp_path / "fp8")
