"""Model resolution: local directories, the Hugging Face cache, and clear errors for everything else."""

from __future__ import annotations

import json
from pathlib import Path

import huggingface_hub.constants
import pytest
from resolution_testing import resolve_model
from tandem_launcher.model_resolution import ModelResolutionError


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


def test_dynamic_rope_scaling_serves_factor_times_the_declared_context(model_dir: Path, tmp_path: Path) -> None:
    dynamic = {"max_position_embeddings": 4096, "rope_scaling": {"type": "dynamic", "factor": 2.0}}
    (model_dir / "config.json").write_text(json.dumps(dynamic))
    assert resolve_model(str(model_dir), None, tmp_path).max_position_embeddings == 8192


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


OFFLINE = {"HF_HUB_OFFLINE": "1"}


def no_download(source) -> None:
    raise AssertionError(f"{source.model_id} must not be downloaded")


def test_a_repo_id_resolves_offline_from_the_hf_cache_honouring_revision(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = write_hf_snapshot(cache, "acme/tiny", "v1", commit)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    model = resolve_model("acme/tiny", "v1", tmp_path / "models", environ=OFFLINE, download=no_download)
    assert model.path == snapshot and model.max_position_embeddings == 1024
    with pytest.raises(
        ModelResolutionError, match=r"at revision 'v2'.*tandem-launcher download acme/tiny --revision v2"
    ):
        resolve_model("acme/tiny", "v2", tmp_path / "models", environ=OFFLINE, download=no_download)


def test_an_uncached_repo_id_is_refused_offline_naming_how_to_fetch_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    with pytest.raises(ModelResolutionError) as refused:
        resolve_model("acme/not-cached", None, tmp_path / "models", environ=OFFLINE, download=no_download)
    assert str(refused.value) == (
        "model 'acme/not-cached' is neither a local directory, a .gguf file, nor complete in the local Hugging Face "
        f"cache (it is not in the local Hugging Face cache ({tmp_path / 'empty-hub'})), and HF_HUB_OFFLINE=1 forbids "
        "downloading it: unset HF_HUB_OFFLINE to let the launcher download it, or fetch it where the Hub is "
        "reachable (`tandem-launcher download acme/not-cached`, or `hf download`) into this cache (HF_HOME), or pass "
        "a directory"
    )


def test_a_repo_id_missing_from_the_cache_is_downloaded_once_then_served_from_it(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    commit = "89abcdef0123456789abcdef0123456789abcdef"
    downloads = []

    def download(source) -> None:
        downloads.append((source.model_id, source.revision, source.cache_dir))
        write_hf_snapshot(cache, source.model_id, "main", commit)

    model = resolve_model("acme/fresh", None, tmp_path / "models", environ={}, download=download)
    assert model.path == cache / "models--acme--fresh" / "snapshots" / commit
    assert downloads == [("acme/fresh", None, tmp_path / "models")]
    assert resolve_model("acme/fresh", None, tmp_path / "models", environ={}, download=no_download) == model


def test_a_snapshot_missing_a_weight_shard_is_downloaded_again(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    snapshot = write_hf_snapshot(cache, "acme/sharded", "main", "fedcba9876543210fedcba9876543210fedcba98")
    (snapshot / "model.safetensors").rename(snapshot / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(ModelResolutionError, match=r"lacks model-00002-of-00002\.safetensors\), and HF_HUB_OFFLINE=1"):
        resolve_model("acme/sharded", None, tmp_path / "models", environ=OFFLINE, download=no_download)

    def download(source) -> None:
        (snapshot / "model-00002-of-00002.safetensors").write_bytes(b"")

    assert resolve_model("acme/sharded", None, tmp_path / "models", environ={}, download=download).path == snapshot


def test_the_cached_tree_listing_decides_which_served_files_a_snapshot_lacks(tmp_path: Path, monkeypatch) -> None:
    cache = tmp_path / "hub"
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    commit = "00112233445566778899aabbccddeeff00112233"
    snapshot = write_hf_snapshot(cache, "acme/listed", "main", commit)
    listed = [
        "config.json",
        "tokenizer.json",
        "model.safetensors",
        "generation_config.json",
        "README.md",
        "original/x.pth",
    ]
    tree = {"format_version": 1, "files": {name: {"size": 1, "blob_id": "0" * 40} for name in listed}}
    (cache / "models--acme--listed" / "trees").mkdir()
    (cache / "models--acme--listed" / "trees" / f"{commit}.json").write_text(json.dumps(tree))
    with pytest.raises(ModelResolutionError, match=r"lacks generation_config\.json\)"):
        resolve_model("acme/listed", None, tmp_path / "models", environ=OFFLINE, download=no_download)
    (snapshot / "generation_config.json").write_text("{}")  # README.md and original/ are never needed
    assert (
        resolve_model("acme/listed", None, tmp_path / "models", environ=OFFLINE, download=no_download).path == snapshot
    )


def test_an_invalid_repo_id_is_named_as_such(tmp_path: Path) -> None:
    with pytest.raises(
        ModelResolutionError, match=r"'acme/a/b' is neither a local directory, a \.gguf file, nor a Hugging"
    ):
        resolve_model("acme/a/b", None, tmp_path, environ={}, download=no_download)
