"""Weights load from safetensors only: pickle files are refused unless allowed, and no model code is ever run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from shard_testing import load_tiny_model, write_tiny_llama
from tandem_server.cli import config_from_args, main
from tandem_server.distributed import ParallelContext
from tandem_server.errors import UnsupportedArchitectureError, WeightsError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import model_factory


def write_pickled_llama(path: Path) -> dict[str, torch.Tensor]:
    """A tiny Llama whose weights live only in `pytorch_model.bin`; returns its tensors."""
    write_tiny_llama(path)
    tensors = load_file(path / "model.safetensors")
    torch.save(tensors, path / "pytorch_model.bin")
    (path / "model.safetensors").unlink()
    return tensors


def load(path: Path, allow_pickle_weights: bool) -> torch.nn.Module:
    checkpoint = read_checkpoint_config(path)
    device, parallel, backend = torch.device("cpu"), ParallelContext(), TorchAttentionBackend()
    return load_model(checkpoint, torch.float32, device, parallel, backend, allow_pickle_weights)


def test_pickle_only_checkpoints_are_refused_by_default(tmp_path: Path) -> None:
    write_pickled_llama(tmp_path)
    with pytest.raises(WeightsError, match=r"holds only pickle weights \(pytorch_model\.bin\).*--allow-pickle-weights"):
        load(tmp_path, allow_pickle_weights=False)


def test_the_shard_exits_with_a_clear_start_up_error_on_pickle_weights(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write_pickled_llama(tmp_path)
    argv = ["--model-path", str(tmp_path), "--uds-path", str(tmp_path / "s"), "--num-threads", "1"]
    argv += ["--attention-backend", "torch"]
    assert main(argv) == 2
    assert "cannot start" in caplog.text and "--allow-pickle-weights" in caplog.text
    assert not (tmp_path / "s").exists()


def test_allowed_pickle_weights_load_the_same_model(tmp_path: Path) -> None:
    tensors = write_pickled_llama(tmp_path)
    model = load(tmp_path, allow_pickle_weights=True)
    params = dict(model.named_parameters())
    torch.testing.assert_close(params["model.embed_tokens.weight"].data, tensors["model.embed_tokens.weight"])
    torch.testing.assert_close(
        params["model.layers.1.mlp.down_proj.weight"].data, tensors["model.layers.1.mlp.down_proj.weight"]
    )
    assert config_from_args(["--model-path", "m", "--uds-path", "s", "--allow-pickle-weights"]).allow_pickle_weights
    assert not config_from_args(["--model-path", "m", "--uds-path", "s"]).allow_pickle_weights


def test_safetensors_win_over_pickle_files_even_when_pickle_is_allowed(tmp_path: Path) -> None:
    write_tiny_llama(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"not even a pickle")
    reference = load_tiny_model(tmp_path)
    model = load(tmp_path, allow_pickle_weights=True)
    torch.testing.assert_close(model.lm_head.weight, reference.lm_head.weight)


class _RunsCodeWhenUnpickled:
    """A pickle payload that would create `marker` if a full unpickler loaded it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, int]]:
        return (os.open, (str(self.marker), os.O_CREAT | os.O_WRONLY))


def test_allowed_pickle_weights_still_never_run_code(tmp_path: Path) -> None:
    write_pickled_llama(tmp_path)
    marker = tmp_path / "code-ran"
    torch.save({"model.embed_tokens.weight": _RunsCodeWhenUnpickled(marker)}, tmp_path / "pytorch_model.bin")
    with pytest.raises(WeightsError, match="cannot load pickle weights"):
        load(tmp_path, allow_pickle_weights=True)
    assert not marker.exists()


def test_remote_code_in_the_model_directory_is_never_imported(tmp_path: Path) -> None:
    marker = tmp_path / "code-ran"
    (tmp_path / "modeling_custom.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    config = {
        "architectures": ["CustomForCausalLM"],
        "auto_map": {"AutoModelForCausalLM": "modeling_custom.CustomForCausalLM"},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    checkpoint = read_checkpoint_config(tmp_path)
    with pytest.raises(UnsupportedArchitectureError, match="unsupported architecture 'CustomForCausalLM'"):
        model_factory(checkpoint.architecture)
    assert not marker.exists()
