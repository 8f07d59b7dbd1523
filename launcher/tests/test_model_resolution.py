"""Model resolution: local directories, the Hugging Face cache, and clear errors for everything else."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import pytest
from tandem_launcher.model_resolution import ModelResolutionError, resolve_model


def test_a_complete_local_directory_is_served_as_is(model_dir: Path, tmp_path: Path) -> None:
    model = resolve_model(str(model_dir), None, tmp_path / "cache")
    assert model.path == model_dir.resolve()
    assert model.served_name == str(model_dir)
    assert model.max_position_embeddings == 2048


def test_an_incomplete_directory_names_every_missing_file(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelResolutionError, match=r"missing tokenizer\.json, \*\.safetensors weights"):
        resolve_model(str(tmp_path), None, tmp_path / "cache")


def test_context_length_is_read_from_a_nested_text_config(model_dir: Path, tmp_path: Path) -> None:
    (model_dir / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 32768}}))
    assert resolve_model(str(model_dir), None, tmp_path).max_position_embeddings == 32768


def test_a_missing_path_is_reported_as_such(tmp_path: Path) -> None:
    with pytest.raises(ModelResolutionError, match="no such model directory"):
        resolve_model(str(tmp_path / "absent"), None, tmp_path)
    with pytest.raises(ModelResolutionError, match="no such GGUF file"):
        resolve_model(str(tmp_path / "absent.gguf"), None, tmp_path)


def write_hf_snapshot(cache: Path, repo_id: str, revision: str, commit: str) -> Path:
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps({"max_position_embeddings": 1024}))
    (snapshot / "tokenizer.json").write_text("{}")
    (snapshot / "model.safetensors").write_bytes(b"")
    (repo / "refs").mkdir()
    (repo / "refs" / revision).write_text(commit)
    return snapshot


def test_a_repo_id_resolves_offline_from_the_hf_cache_honouring_revision(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = write_hf_snapshot(cache, "acme/tiny", "v1", commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    model = resolve_model("acme/tiny", "v1", tmp_path / "models")
    assert model.path == snapshot and model.max_position_embeddings == 1024
    with pytest.raises(ModelResolutionError, match=r"at revision 'v2'.*hf download acme/tiny"):
        resolve_model("acme/tiny", "v2", tmp_path / "models")


def test_an_uncached_repo_id_fails_without_downloading(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(ModelResolutionError, match="nor in the local Hugging Face cache"):
        resolve_model("acme/not-cached", None, tmp_path / "models")
