"""GPTQ and AWQ int4 checkpoints on the CPU int4 kernel (the CUDA one: `test_int4_triton.py`): unpacking against an
independent packer, the exact values each layer stands for, the kernel's numbers (bfloat16 scales and activations),
a tiny Llama against transformers on the same values, two gloo ranks against one process, and the start-up errors
for what is not served."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from int4_testing import (
    AWQ_ORDER,
    LINEAR_ROLES,
    awq_config,
    dequantized_state,
    gptq_config,
    pack_along_columns,
    pack_along_rows,
    write_int4_checkpoint,
)
from safetensors.torch import load_file, save_file
from shard_testing import write_tiny_checkpoint, write_tiny_llama
from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError, WeightsError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.checks import check_quantization
from tandem_server.quant.int4.checkpoint import INT4_VALUES, Int4Collector
from tandem_server.quant.int4.packing import Int4Layer, unpack_columns, unpack_rows
from tandem_server.quant.int4.weight import Int4Weight
from tandem_server.quant.kernels import kernels_unavailable_reason
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.quantize import quantize_model
from tandem_server.quant.values import Int4Groups
from tandem_server.weights.layout import CheckpointLayout
from tandem_server.weights.safetensors import iterate_tensors
from tandem_server.weights.slicing import CheckpointSlice, sliced_parameter
from test_tensor_parallel import free_port
from tp_worker import NEW_TOKENS, PROMPT, WORLD_SIZE, generate, prompt_logits, run_checkpoint, run_rank
from transformers import LlamaForCausalLM, Phi3Config, Phi3ForCausalLM

CPU = torch.device("cpu")
pytestmark = pytest.mark.skipif(kernels_unavailable_reason(CPU, QuantizeMode.INT4) is not None, reason="no int4 kernel")
CHECKPOINTS: dict[str, dict[str, Any]] = {
    "gptq-g32": gptq_config(32),
    "gptq_v2-g64-sym": gptq_config(64, "gptq_v2", symmetric=True),
    "gptq-one-group": gptq_config(-1),
    "gptq-act-order": {**gptq_config(32), "desc_act": True},
    "awq-g32": awq_config(32),
    "awq-g64": awq_config(64),
}
# The kernel keeps scales and zeros in bfloat16 (8 significant bits): each weight moves by at most
# |q - 8| * 2^-9 s + |8 - z| * 2^-9 s, under 2^-4 of its group's scale s.
BFLOAT16_SCALE_ERROR = 2**-4
# Against transformers on the values the kernel multiplies by, with its int4 layers' inputs and outputs rounded to
# bfloat16 as the kernel's are, the logits agree (measured: 0.0 for every layout; 1.7e-6 with act-order, whose
# permuted activations sum in another order).
SAME_ROUNDING_ATOL = 1e-4
# Against transformers in float32 on the checkpoint's exact values: bfloat16 scales, activations and outputs move
# the logits by 1.4% to 2.2% of their largest magnitude (measured: 0.070 to 0.101 for logits up to 4.6 to 5.2), so
# greedy tokens can differ where two logits nearly tie (2 of the 6 layouts here).
EXACT_RELATIVE = 0.04


def test_unpacking_reads_the_reference_packers_nibble_orders() -> None:
    values = torch.randint(0, 16, (16, 24), generator=torch.Generator().manual_seed(0))
    assert torch.equal(unpack_rows(pack_along_rows(values)).long(), values)
    assert torch.equal(unpack_columns(pack_along_columns(values), awq_order=False).long(), values)
    assert torch.equal(unpack_columns(pack_along_columns(values, AWQ_ORDER), awq_order=True).long(), values)
    # AWQ's order is not the plain one: reading it plainly scrambles each run of eight columns.
    assert not torch.equal(unpack_columns(pack_along_columns(values, AWQ_ORDER), awq_order=False).long(), values)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A float tiny Llama and each int4 layout of it, with every layer's values."""
    root = tmp_path_factory.mktemp("int4")
    write_tiny_llama(root / "float", tie_word_embeddings=False)
    layers = {name: write_int4_checkpoint(root / "float", root / name, config) for name, config in CHECKPOINTS.items()}
    # Phi-3 stores q/k/v and gate/up fused: each part reads its columns of the fused int4 tensors. (Seed 1: its
    # greedy tokens have no near tie for two ranks' bfloat16 partial sums to flip.)
    write_tiny_checkpoint(root / "phi3-float", Phi3Config, Phi3ForCausalLM, seed=1)
    layers["phi3-gptq"] = write_int4_checkpoint(root / "phi3-float", root / "phi3-gptq", gptq_config(32))
    return {"root": root, "layers": layers}


def _load(path: Path, parallel: ParallelContext | None = None) -> CausalLM:
    config = read_checkpoint_config(path)
    return load_model(config, torch.float32, CPU, parallel or ParallelContext(), TorchAttentionBackend())


FUSED_PARTS = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


@pytest.mark.parametrize("name", [*CHECKPOINTS, "phi3-gptq"])
def test_each_layer_loads_as_exactly_the_values_it_stands_for(checkpoints: dict[str, Any], name: str) -> None:
    model = _load(checkpoints["root"] / name)
    params = dict(model.named_parameters())
    for weight_name, values in checkpoints["layers"][name].items():
        parts = FUSED_PARTS.get(weight_name.rsplit(".", 2)[-2], (weight_name.rsplit(".", 2)[-2],))
        names = [weight_name.replace(weight_name.rsplit(".", 2)[-2], part) for part in parts]
        loaded = torch.cat([getattr(params[part], INT4_VALUES).dequantize() for part in names])
        assert torch.equal(loaded, values.dequantize()), weight_name


def _kernel_weight(groups: Int4Groups) -> torch.Tensor:
    """The `[out, in]` weight the kernel multiplies by, columns in input order."""
    weight = Int4Weight(groups).dequantize()
    order = groups.input_order
    return weight if order is None else torch.empty_like(weight).index_copy_(1, order, weight)


@pytest.mark.parametrize("name", ["gptq-g32", "gptq-one-group", "gptq-act-order", "awq-g64"])
def test_the_int4_kernel_multiplies_by_the_checkpoint_values(checkpoints: dict[str, Any], name: str) -> None:
    weight_name = "model.layers.1.mlp.down_proj.weight"
    values = checkpoints["layers"][name][weight_name]
    groups = getattr(dict(_load(checkpoints["root"] / name).named_parameters())[weight_name], INT4_VALUES)
    kernel = Int4Weight(groups)
    exact = values.dequantize()
    step = values.s.float()[values.group_of_input].t()
    assert ((_kernel_weight(groups) - exact).abs() <= BFLOAT16_SCALE_ERROR * step).all()
    x = torch.randn(5, exact.shape[1])
    expected = x @ exact.t()
    assert (kernel.linear(x, None) - expected).abs().max() <= 0.02 * expected.abs().max()


def _reference_outputs(
    float_dir: Path, values: dict[str, torch.Tensor], round_like_kernel: bool = False
) -> tuple[torch.Tensor, list[int]]:
    """transformers' logits over PROMPT and greedy tokens, on a float checkpoint holding `values`; with
    `round_like_kernel`, its int4 layers round their inputs and outputs to bfloat16 as the kernel does."""
    reference = LlamaForCausalLM.from_pretrained(float_dir).eval()
    reference.load_state_dict(values)
    for name, module in reference.named_modules():
        if round_like_kernel and isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1] in LINEAR_ROLES:
            module.register_forward_pre_hook(lambda _, inputs: (inputs[0].bfloat16().float(),))
            module.register_forward_hook(lambda _, inputs, out: out.bfloat16().float())
    with torch.no_grad():
        logits = reference(torch.tensor([PROMPT])).logits[0]
        tokens = reference.generate(torch.tensor([PROMPT]), max_new_tokens=NEW_TOKENS, do_sample=False)
    return logits, tokens[0, len(PROMPT) :].tolist()


@pytest.mark.parametrize("name", CHECKPOINTS)
def test_an_int4_checkpoint_gives_the_logits_and_greedy_tokens_of_its_values(
    checkpoints: dict[str, Any], name: str
) -> None:
    root, layers = checkpoints["root"], checkpoints["layers"][name]
    model = _load(root / name)
    params = dict(model.named_parameters())
    kernel_values = {weight: _kernel_weight(getattr(params[weight], INT4_VALUES)) for weight in layers}
    report = quantize_model(model, QuantizeMode.NONE)
    assert report.formats == {
        "qkv_proj: int4 checkpoint as int4": 2, "o_proj: int4 checkpoint as int4": 2,
        "gate_up_proj: int4 checkpoint as int4": 2, "down_proj: int4 checkpoint as int4": 2,
        "lm_head: float32": 1, "embed_tokens: float32": 1,
    }  # fmt: skip
    exact_values = dequantized_state(root / "float", layers)
    logits, tokens = _reference_outputs(root / "float", {**exact_values, **kernel_values}, round_like_kernel=True)
    ours = prompt_logits(model)
    assert (ours - logits).abs().max() <= SAME_ROUNDING_ATOL
    assert generate(model, (2,))[1][: len(tokens)] == tokens
    exact_logits, _ = _reference_outputs(root / "float", exact_values)
    assert (ours - exact_logits).abs().max() <= EXACT_RELATIVE * exact_logits.abs().max()


def test_two_gloo_ranks_match_one_process(checkpoints: dict[str, Any]) -> None:
    root = checkpoints["root"]
    paths = [root / "gptq-g32", root / "awq-g32", root / "phi3-gptq"]
    single = {path.name: run_checkpoint(path, ParallelContext()) for path in paths}
    mp.start_processes(run_rank, args=(paths, free_port(), root), nprocs=WORLD_SIZE, start_method="spawn")
    for rank in range(WORLD_SIZE):
        ranks = torch.load(root / f"rank{rank}.pt")
        for path in paths:
            expected, result = single[path.name], ranks[path.name]
            # Row-parallel partial sums round to bfloat16 on each rank before they are added.
            torch.testing.assert_close(result["logits"], expected["logits"], rtol=0.02, atol=0.05)
            assert result["tokens"] == expected["tokens"]


def _copy(checkpoints: dict[str, Any], name: str, tmp_path: Path) -> Path:
    return Path(shutil.copytree(checkpoints["root"] / name, tmp_path / name))


def _edit_config(checkpoint: Path, **quantization: Any) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    config["quantization_config"].update(quantization)
    (checkpoint / "config.json").write_text(json.dumps(config))


BAD_CONFIGS: dict[str, tuple[str, dict[str, Any], str]] = {
    "8-bit gptq": ("gptq-g32", {"bits": 8}, "gptq quantization_config: bits 8 is not supported"),
    "marlin format": ("gptq-g32", {"checkpoint_format": "marlin"}, "checkpoint_format 'marlin' is not supported"),
    "group of 48": ("gptq-g32", {"group_size": 48}, "group_size 48 is not supported"),
    "awq gemv": ("awq-g32", {"version": "gemv"}, "awq quantization_config: version 'gemv' is not supported"),
    "awq without zeros": ("awq-g32", {"zero_point": False}, "zero_point false is not supported"),
    "3-bit awq": ("awq-g32", {"bits": 3}, "awq quantization_config: bits 3 is not supported"),
    "bitsandbytes": ("awq-g32", {"quant_method": "bitsandbytes"}, "quant_method 'bitsandbytes' is not supported"),
}


@pytest.mark.parametrize("case", BAD_CONFIGS)
def test_unsupported_int4_configs_fail_start_up_naming_the_setting(
    checkpoints: dict[str, Any], tmp_path: Path, case: str
) -> None:
    name, changes, message = BAD_CONFIGS[case]
    checkpoint = _copy(checkpoints, name, tmp_path)
    _edit_config(checkpoint, **changes)
    with pytest.raises(ConfigError, match=message):
        read_checkpoint_config(checkpoint)


def test_an_int4_checkpoint_is_served_only_with_quantize_none_on_cpu_or_an_ampere_gpu(
    checkpoints: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = read_checkpoint_config(checkpoints["root"] / "awq-g32")
    check_quantization(QuantizeMode.NONE, checkpoint, CPU)
    with pytest.raises(ConfigError, match=r"--quantize int4: AWQ int4 checkpoints are served with --quantize none"):
        check_quantization(QuantizeMode.INT4, checkpoint, CPU)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))
    refusal = r"AWQ int4 checkpoint: (the int4 Triton kernel needs .* 8\.0 or newer|.*Triton is not installed)"
    with pytest.raises(ConfigError, match=refusal):
        check_quantization(QuantizeMode.NONE, checkpoint, cuda)
    if importlib.util.find_spec("triton") is not None:
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
        check_quantization(QuantizeMode.NONE, checkpoint, cuda)


DOWN = "model.layers.1.mlp.down_proj"


def _rewrite(checkpoint: Path, changes: dict[str, torch.Tensor | None]) -> None:
    tensors = load_file(str(checkpoint / "model.safetensors"))
    for name, tensor in changes.items():
        if tensor is None:
            del tensors[name]
        else:
            tensors[name] = tensor
    save_file(tensors, str(checkpoint / "model.safetensors"))


BAD_TENSORS: dict[str, tuple[str, dict[str, torch.Tensor | None], str]] = {
    "missing zeros": ("gptq-g32", {f"{DOWN}.qzeros": None}, rf"{DOWN}: the checkpoint lacks {DOWN}\.qzeros"),
    "uneven act-order groups": (
        "gptq-g32",
        {f"{DOWN}.g_idx": (torch.arange(128) % 3).to(torch.int32)},
        rf"{DOWN}: g_idx gives groups of \[42, 43\] inputs, not 32 each",
    ),
    "scales of more groups": (
        "awq-g32",
        {f"{DOWN}.scales": torch.ones(8, 64, dtype=torch.float16)},
        r"scales has shape \(8, 64\); qweight \(128, 8\) with groups of 32 needs \(4, 64\)",
    ),
}


@pytest.mark.parametrize("case", BAD_TENSORS)
def test_bad_int4_tensors_fail_start_up_naming_the_layer(
    checkpoints: dict[str, Any], tmp_path: Path, case: str
) -> None:
    name, changes, message = BAD_TENSORS[case]
    checkpoint = _copy(checkpoints, name, tmp_path)
    _rewrite(checkpoint, changes)
    with pytest.raises(WeightsError, match=message):
        _load(checkpoint)


def test_ranks_that_would_split_a_group_fail_start_up_naming_the_layer(checkpoints: dict[str, Any]) -> None:
    # o_proj's 64 inputs are one group of 64: two ranks would take half of it each.
    with pytest.raises(WeightsError, match=r"self_attn\.o_proj\.\w+: input features \[0, 32\) split groups of 64"):
        _load(checkpoints["root"] / "awq-g64", ParallelContext(rank=0, world_size=2))


def test_act_order_layers_split_along_their_inputs_fail_start_up_naming_the_layer(checkpoints: dict[str, Any]) -> None:
    with pytest.raises(WeightsError, match=r"self_attn\.o_proj: g_idx .*act-order.* not supported across ranks"):
        _load(checkpoints["root"] / "gptq-act-order", ParallelContext(rank=0, world_size=2))


def test_stacked_parts_must_order_their_inputs_alike() -> None:
    q = torch.zeros(16, 64, dtype=torch.uint8)
    ones = torch.ones(16, 2)
    first = Int4Groups(q, ones, ones, 32, torch.arange(64))
    with pytest.raises(ValueError, match="order their input features differently"):
        Int4Groups.concat([first, Int4Groups(q, ones, ones, 32, torch.arange(64).flip(0))])
    with pytest.raises(ValueError, match="order their input features differently"):
        Int4Groups.concat([first, Int4Groups(q, ones, ones, 32)])
    assert torch.equal(Int4Groups.concat([first, first]).input_order, torch.arange(64))


def test_output_features_the_kernel_cannot_pack_are_refused() -> None:
    values = torch.zeros(32, 8, dtype=torch.uint8)
    layer = Int4Layer(values, torch.zeros(1, 8, dtype=torch.int32), torch.ones(1, 8), group_size=32)
    with pytest.raises(ValueError, match="8 output features on this rank; the int4 kernel needs multiples of 16"):
        layer.groups()


@pytest.mark.parametrize("name", ["gptq-g32", "awq-g32"])
@pytest.mark.parametrize(
    ("part", "rows", "columns"),
    [
        (CheckpointSlice(0, 4, 20), slice(4, 20), slice(None)),  # output columns off the 8-value packing
        (CheckpointSlice(0, 40, 56), slice(40, 56), slice(None)),
        (CheckpointSlice(1, 32, 96), slice(None), slice(32, 96)),  # inputs on whole groups
    ],
)
def test_a_rank_reads_its_slice_of_the_packed_tensors(
    checkpoints: dict[str, Any], name: str, part: CheckpointSlice, rows: slice, columns: slice
) -> None:
    weight_name = "model.layers.0.mlp.down_proj.weight"
    exact = checkpoints["layers"][name][weight_name].dequantize()
    expected = exact[rows, columns]
    params = {weight_name: sliced_parameter(tuple(expected.shape), part)}
    collector = Int4Collector(read_checkpoint_config(checkpoints["root"] / name).int4, CheckpointLayout(), params)
    for checkpoint_name, tensor in iterate_tensors(checkpoints["root"] / name):
        if checkpoint_name.startswith(weight_name.removesuffix("weight")) and collector.takes(checkpoint_name):
            collector.add(checkpoint_name, tensor)
    assert collector.attach() == []
    assert torch.equal(getattr(params[weight_name], INT4_VALUES).dequantize(), expected)
