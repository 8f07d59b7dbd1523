"""Start-up configuration: flags, sizes, dtypes, architectures and strict weight loading."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.cli import config_from_args
from tandem_server.config import parse_byte_size
from tandem_server.errors import ConfigError, UnsupportedArchitectureError, WeightsError
from tandem_server.layers.attention import create_backend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.registry import model_factory
from tandem_server.weight_defaults import cpu_multiplies_bfloat16


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1024", 1024), ("512MiB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1GB", 10**9), ("1.5 kib", 1536)],
)
def test_byte_sizes_accept_binary_and_decimal_units(text: str, expected: int) -> None:
    assert parse_byte_size(text) == expected


def test_byte_size_rejects_unknown_units() -> None:
    with pytest.raises(ConfigError, match="invalid size"):
        parse_byte_size("3 parsecs")


def test_cli_defaults_and_auto_dtype(tmp_path: Path) -> None:
    config = config_from_args(["--model-path", str(tmp_path), "--uds-path", str(tmp_path / "s.sock")])
    cpu_dtype = torch.bfloat16 if cpu_multiplies_bfloat16() else torch.float32
    assert config.dtype == cpu_dtype and config.device == "cpu" and config.kv_cache_memory is None
    assert config.num_threads >= 1 and config.world_size == 1
    cuda = config_from_args(["--model-path", "m", "--uds-path", "s", "--device", "cuda", "--kv-cache-memory", "2GiB"])
    assert cuda.dtype == torch.bfloat16 and cuda.kv_cache_memory == 2 * 2**30


def test_cli_rejects_unknown_attention_backend() -> None:
    with pytest.raises(ConfigError, match="unknown attention backend 'flashy'"):
        config_from_args(["--model-path", "m", "--uds-path", "s", "--attention-backend", "flashy"])
    with pytest.raises(ConfigError, match="available: torch"):
        create_backend("flashy")


def test_unknown_architecture_lists_supported_ones() -> None:
    with pytest.raises(UnsupportedArchitectureError) as error:
        model_factory("GPT2LMHeadModel")
    assert "GPT2LMHeadModel" in str(error.value)
    assert "LlamaForCausalLM" in str(error.value) and "MistralForCausalLM" in str(error.value)


def test_eos_ids_merge_config_and_generation_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "eos_token_id": 2}))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2]}))
    assert read_checkpoint_config(tmp_path).eos_token_ids == (2, 7)


def test_missing_checkpoint_tensor_is_a_clear_error(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    weights_file = next(tmp_path.glob("*.safetensors"))
    tensors = load_file(weights_file)
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, weights_file)
    with pytest.raises(WeightsError, match=r"model\.layers\.1\.mlp\.up_proj\.weight"):
        load_tiny_model(tmp_path)


def test_tied_checkpoint_has_no_lm_head_and_shares_the_embedding(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path, tie_word_embeddings=True)
    assert "lm_head.weight" not in load_file(next(tmp_path.glob("*.safetensors")))
    model = load_tiny_model(tmp_path)
    assert model.lm_head.weight is model.model.embed_tokens.weight
