"""Finds the model directory to serve: a local directory, a GGUF file, the HF cache, or the embedded model."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tandem_launcher.config import EMBEDDED_MODEL_ID
from tandem_launcher.embedded import GgufConversionError, converted_model_dir, embedded_gguf, user_gguf

# Weight files loaded through pickle, refused unless --allow-pickle-weights.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")


class ModelResolutionError(Exception):
    """The model cannot be found locally or its directory is incomplete."""


@dataclass(frozen=True)
class ResolvedModel:
    """A directory the shards load weights from and the router loads the tokenizer from."""

    path: Path
    served_name: str
    max_position_embeddings: int | None


def resolve_model(
    model_id: str, revision: str | None, cache_dir: Path, allow_pickle_weights: bool = False
) -> ResolvedModel:
    """Resolves offline: nothing is downloaded at start-up."""
    try:
        path = _locate(model_id, revision, cache_dir)
    except GgufConversionError as error:
        raise ModelResolutionError(str(error)) from error
    validate_model_dir(path, allow_pickle_weights)
    return ResolvedModel(path=path, served_name=model_id, max_position_embeddings=read_max_positions(path))


def _locate(model_id: str, revision: str | None, cache_dir: Path) -> Path:
    local = Path(model_id).expanduser()
    if local.is_dir():
        return local.resolve()
    if local.suffix == ".gguf":
        return converted_model_dir(user_gguf(local.resolve()), cache_dir)
    if model_id == EMBEDDED_MODEL_ID and revision is None:
        return converted_model_dir(embedded_gguf(), cache_dir)
    if model_id.startswith(("/", ".", "~")):
        raise ModelResolutionError(f"no such model directory: {local}")
    return _from_hf_cache(model_id, revision)


def _from_hf_cache(model_id: str, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download  # noqa: PLC0415  (only needed for repo ids)
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError  # noqa: PLC0415

    try:
        return Path(snapshot_download(repo_id=model_id, revision=revision, local_files_only=True))
    except (LocalEntryNotFoundError, HFValidationError, FileNotFoundError) as error:
        at_revision = f" at revision {revision!r}" if revision else ""
        raise ModelResolutionError(
            f"model {model_id!r}{at_revision} is neither a local directory, a .gguf file, nor in the local "
            f"Hugging Face cache; Tandem downloads nothing at start-up, so fetch it first "
            f"(e.g. `hf download {model_id}`) or pass a directory"
        ) from error


def validate_model_dir(path: Path, allow_pickle_weights: bool = False) -> None:
    """A servable directory has config.json, safetensors weights (pickle ones only when allowed) and tokenizer.json."""
    missing = [name for name in ("config.json", "tokenizer.json") if not (path / name).is_file()]
    pickled = sorted(file.name for file in path.iterdir() if file.suffix in PICKLE_SUFFIXES) if path.is_dir() else []
    if not any(path.glob("*.safetensors")):
        if pickled and not allow_pickle_weights:
            raise ModelResolutionError(
                f"model directory {path} has only pickle weights ({', '.join(pickled[:3])}), which Tandem does not "
                "load by default because unpickling can run arbitrary code: convert them to safetensors, or pass "
                "--allow-pickle-weights if you trust the files"
            )
        if not pickled:
            missing.append("*.safetensors weights")
    if missing:
        raise ModelResolutionError(f"model directory {path} is missing {', '.join(missing)}")


def read_max_positions(path: Path) -> int | None:
    """The context length declared in config.json (or its text_config), if any."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelResolutionError(f"cannot read {path / 'config.json'}: {error}") from error
    for section in (config, config.get("text_config") or {}):
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return value
    return None
