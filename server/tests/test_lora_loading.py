"""Loading PEFT LoRA adapters: what Info reports of each, and every malformed adapter refused with an error naming
the adapter, the tensor and what was expected, leaving the shard's adapters and the base model serving as before."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from lora_testing import AdapterSpec, greedy, merged, tensor_prefix, write_adapter
from safetensors.torch import load_file, save_file
from shard_testing import StepDriver, make_runner, new_request, warmed, write_tiny_llama
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.errors import LoraAdapterError, LoraAdapterExistsError, LoraAdapterNotFoundError
from transformers import LlamaForCausalLM

PROMPT = [5, 17, 33, 8, 61, 12, 40]
GOOD = AdapterSpec(rank=8, alpha=16, targets=("v_proj", "down_proj"), seed=1)


@dataclasses.dataclass(frozen=True)
class Shard:
    root: Path
    runner: ModelRunner
    reference: LlamaForCausalLM


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Shard:
    root = tmp_path_factory.mktemp("lora-loading")
    reference = write_tiny_llama(root / "model")
    runner = warmed(make_runner(root / "model"))
    runner.lora.load("good", write_adapter(root / "good", reference, GOOD))
    return Shard(root, runner, reference)


def edit_tensors(directory: Path, edit: Callable[[dict[str, torch.Tensor]], None]) -> None:
    path = directory / "adapter_model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path)


def edit_config(directory: Path, **entries: object) -> None:
    path = directory / "adapter_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **entries}))


def swap_in_shape(tensors: dict[str, torch.Tensor]) -> None:
    key = f"{tensor_prefix(0, 'v_proj')}.lora_B.weight"
    tensors[key] = torch.zeros(31, 8)


def rename_to_unknown_module(tensors: dict[str, torch.Tensor]) -> None:
    for kind in "AB":
        tensors[f"base_model.model.model.layers.0.self_attn.x_proj.lora_{kind}.weight"] = tensors.pop(
            f"{tensor_prefix(0, 'v_proj')}.lora_{kind}.weight"
        )


def move_beyond_last_layer(tensors: dict[str, torch.Tensor]) -> None:
    for kind in "AB":
        tensors[f"{tensor_prefix(7, 'v_proj')}.lora_{kind}.weight"] = tensors.pop(
            f"{tensor_prefix(1, 'v_proj')}.lora_{kind}.weight"
        )


def drop_b(tensors: dict[str, torch.Tensor]) -> None:
    del tensors[f"{tensor_prefix(1, 'down_proj')}.lora_B.weight"]


MALFORMED: dict[str, tuple[Callable[[Path], None], str]] = {
    "wrong-shape": (
        lambda d: edit_tensors(d, swap_in_shape),
        r"'bad': tensor base_model\.model\.model\.layers\.0\.self_attn\.v_proj\.lora_B\.weight has shape \[31, 8\], "
        r"expected \[32, 8\]",
    ),
    "unknown-module": (
        lambda d: edit_tensors(d, rename_to_unknown_module),
        r"'bad': tensor base_model\.model\.model\.layers\.0\.self_attn\.x_proj\.lora_A\.weight targets unknown "
        r"module 'x_proj'",
    ),
    "unknown-module-in-config": (
        lambda d: edit_config(d, target_modules=["v_proj", "w_proj"]),
        r"'bad': unknown target module\(s\) \['w_proj'\]",
    ),
    "layer-out-of-range": (
        lambda d: edit_tensors(d, move_beyond_last_layer),
        r"'bad': tensor base_model\.model\.model\.layers\.7\.self_attn\.v_proj\.lora_A\.weight is for layer 7, "
        r"beyond the base model's 2 layers",
    ),
    "rank-above-limit": (
        lambda d: edit_config(d, r=128),
        r"'bad': rank 128 is above the shard's --max-lora-rank 64",
    ),
    "missing-weights": (
        lambda d: (d / "adapter_model.safetensors").unlink(),
        r"'bad': .*adapter_model\.safetensors is missing",
    ),
    "missing-config": (
        lambda d: (d / "adapter_config.json").unlink(),
        r"'bad': .*adapter_config\.json is missing",
    ),
    "missing-b": (
        lambda d: edit_tensors(d, drop_b),
        r"'bad': tensor base_model\.model\.model\.layers\.1\.mlp\.down_proj\.lora_B\.weight is missing",
    ),
    "bias": (lambda d: edit_config(d, bias="all"), r"'bad': bias is 'all'"),
    "modules-to-save": (
        lambda d: edit_config(d, modules_to_save=["lm_head"]),
        r"'bad': modules_to_save is set",
    ),
    "rank-pattern": (
        lambda d: edit_config(d, rank_pattern={"v_proj": 4}),
        r"'bad': rank_pattern is set",
    ),
    "rank-disagrees-with-tensors": (
        lambda d: edit_config(d, r=4),
        r"'bad': tensor .*down_proj\.lora_A\.weight has shape \[8, 128\], expected \[4, 128\]",
    ),
}


def still_serves(shard: Shard) -> None:
    """The adapter loaded before and the base model both still generate their references."""
    driver = StepDriver(shard.runner, shard.runner.cache.num_blocks if shard.runner.cache else 0, chunk_size=16)
    base = new_request(1, PROMPT, max_new_tokens=4)
    adapted = dataclasses.replace(new_request(2, PROMPT, max_new_tokens=4), lora_adapter="good")
    driver.step([base, adapted])
    while driver.tracked:
        driver.step([])
    assert driver.done[1] == greedy(shard.reference, PROMPT, 4)[0]
    good = merged(shard.reference, shard.root / "good", GOOD)
    assert driver.done[2] == greedy(good, PROMPT, 4)[0]


@pytest.mark.parametrize("kind", sorted(MALFORMED))
def test_a_malformed_adapter_is_refused_by_name_and_nothing_changes(shard: Shard, kind: str, tmp_path: Path) -> None:
    damage, message = MALFORMED[kind]
    directory = write_adapter(tmp_path / "bad", shard.reference, GOOD)
    damage(directory)
    with pytest.raises(LoraAdapterError, match=message):
        shard.runner.lora.load("bad", directory)
    assert [adapter.name for adapter in shard.runner.lora.adapters] == ["good"]
    still_serves(shard)


def test_a_taken_name_is_refused_and_the_loaded_adapter_kept(shard: Shard, tmp_path: Path) -> None:
    other = write_adapter(tmp_path / "other", shard.reference, dataclasses.replace(GOOD, seed=9))
    with pytest.raises(LoraAdapterExistsError, match="'good' is already loaded"):
        shard.runner.lora.load("good", other)
    still_serves(shard)


def test_unloading_an_unknown_name_is_refused(shard: Shard) -> None:
    with pytest.raises(LoraAdapterNotFoundError, match="no LoRA adapter named 'absent'"):
        shard.runner.lora.unload("absent")


def test_a_loaded_adapter_reports_its_rank_and_sorted_target_modules(shard: Shard, tmp_path: Path) -> None:
    spec = AdapterSpec(rank=4, alpha=4, targets=("up_proj", "q_proj", "o_proj"), seed=5)
    adapter = shard.runner.lora.load("reported", write_adapter(tmp_path / "reported", shard.reference, spec))
    try:
        assert (adapter.name, adapter.rank, adapter.target_modules) == ("reported", 4, ("o_proj", "q_proj", "up_proj"))
        assert [adapter.name for adapter in shard.runner.lora.adapters] == ["good", "reported"]
    finally:
        shard.runner.lora.unload("reported")
    assert [adapter.name for adapter in shard.runner.lora.adapters] == ["good"]


def test_an_empty_name_is_refused_since_it_selects_the_base_model(shard: Shard, tmp_path: Path) -> None:
    with pytest.raises(LoraAdapterError, match="non-empty name"):
        shard.runner.lora.load("", write_adapter(tmp_path / "unnamed", shard.reference, GOOD))


def test_an_adapter_over_all_linear_layers_loads_its_tensors(shard: Shard, tmp_path: Path) -> None:
    spec = dataclasses.replace(GOOD, config={"target_modules": "all-linear"})
    adapter = shard.runner.lora.load("all-linear", write_adapter(tmp_path / "all", shard.reference, spec))
    shard.runner.lora.unload("all-linear")
    assert adapter.target_modules == ("down_proj", "v_proj")
