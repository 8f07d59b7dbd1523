"""Finds the model directory to serve, in order: a local directory, a local .gguf file, the embedded model, the local
Hugging Face cache, and last a download from the Hub (or the mirror at HF_ENDPOINT).

The launcher downloads once, before any shard starts, in a child `tandem-launcher download` process (so a shutdown
signal ends a download at once); shards never download. GGUF files and pickle weights are converted once into
`--model-cache-dir`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path

from tandem_server.interfaces.context import served_positions

from tandem_launcher.config import EMBEDDED_MODEL_ID, LauncherConfig
from tandem_launcher.embedded import GgufConversionError, converted_model_dir, embedded_gguf, user_gguf
from tandem_launcher.hub import fetch_file, fetch_snapshot, read_token_file
from tandem_launcher.hub_cache import cache_state, cached_file
from tandem_launcher.hub_errors import HubError
from tandem_launcher.hub_request import HubRequest, hub_cache_dir, hub_offline
from tandem_launcher.lora_adapters import AdapterResolutionError, resolve_adapters
from tandem_launcher.orphan_guard import guarded_argv
from tandem_launcher.pickle_weights import PickleConversionError, converted_pickle_dir, has_only_pickle_weights
from tandem_launcher.progress import DownloadProgress

# Weight files loaded through pickle, refused unless --allow-pickle-weights.
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_POSITION_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length")
_CHILD_STOP_TIMEOUT_S = 10.0
# The download child takes its model from argv alone: these variables would fill the flags a source leaves unset (a
# draft model has neither the served model's --revision nor its --gguf-file) or add a second model to fetch.
_SOURCE_VARIABLES = ("MODEL_ID", "REVISION", "GGUF_FILE", "SPECULATIVE_MODEL", "SPECULATIVE_MODEL_REVISION")


class ModelResolutionError(Exception):
    """The model cannot be found or fetched, or its directory is incomplete."""


@dataclass(frozen=True)
class ResolvedModel:
    """A directory the shards load weights from and the router loads the tokenizer from."""

    path: Path
    served_name: str
    max_position_embeddings: int | None
    # The draft model's directory (`--speculative-method draft`), which every shard loads beside `path`.
    draft_path: Path | None = None
    # The LoRA adapters' PEFT directories by name, which every shard loads beside `path`.
    lora_adapters: tuple[tuple[str, Path], ...] = ()


@dataclass(frozen=True)
class ModelSource:
    """What to serve, as the flags name it."""

    model_id: str
    revision: str | None
    cache_dir: Path
    allow_pickle_weights: bool = False
    gguf_file: str | None = None
    hf_token_file: Path | None = None

    def hub_request(self, with_token: bool = False) -> HubRequest:
        token = read_token_file(self.hf_token_file) if with_token and self.hf_token_file else None
        return HubRequest(self.model_id, self.revision, self.allow_pickle_weights, token=token)

    def draft(self, model_id: str, revision: str | None) -> ModelSource:
        """The draft model `model_id` (`--speculative-model`), fetched and converted with this source's cache,
        token and pickle permission."""
        return replace(self, model_id=model_id, revision=revision, gguf_file=None)


# Runs `tandem-launcher download` for a source that is not (completely) in the cache; raises ModelResolutionError.
Downloader = Callable[[ModelSource], None]


def resolve_configured_model(config: LauncherConfig) -> ResolvedModel:
    """The model the launcher's flags name (see `resolve_source`) and its `--speculative-model`, resolved the same
    way; a download logs like the launcher itself."""
    source = ModelSource(
        config.model_id,
        config.revision,
        config.model_cache_dir,
        config.allow_pickle_weights,
        config.gguf_file,
        config.hf_token_file,
    )
    download = download_in_child(sys.executable, config.log_level, config.json_output)
    model = resolve_source(source, download=download)
    try:
        adapters = resolve_adapters(config.lora_adapters, config.hf_token_file, os.environ)
    except AdapterResolutionError as error:
        raise ModelResolutionError(str(error)) from error
    model = replace(model, lora_adapters=adapters)
    if config.speculative_model is None:
        return model
    draft = source.draft(config.speculative_model, config.speculative_model_revision)
    with named_as_draft():
        return replace(model, draft_path=resolve_source(draft, download=download).path)


@contextmanager
def named_as_draft() -> Iterator[None]:
    """Says that a resolution error is the draft model's, and which flag names it."""
    try:
        yield
    except ModelResolutionError as error:
        raise ModelResolutionError(f"draft model (--speculative-model): {error}") from error


def resolve_source(
    source: ModelSource, environ: Mapping[str, str] | None = None, download: Downloader | None = None
) -> ResolvedModel:
    """Local directory, .gguf file, embedded model, HF cache, and last `download(source)` (a child
    `tandem-launcher download` unless given)."""
    environ = os.environ if environ is None else environ
    with _resolution_errors():
        path = _local_path(source)
        if path is None:
            path, detail = _from_cache(source)
            if path is None:
                if hub_offline(environ):
                    raise ModelResolutionError(_offline_message(source, detail))
                (download or download_in_child(sys.executable))(source)
                path, detail = _from_cache(source)
                if path is None:
                    raise ModelResolutionError(
                        f"{source.model_id} is still not complete in the cache after its download: {detail}"
                    )
    return _checked(path, source)


def prepare_model(source: ModelSource, environ: Mapping[str, str] | None = None) -> ResolvedModel:
    """What `tandem-launcher download` does: a repo id always asks the Hub for its revision (so a moved branch is
    fetched) unless HF_HUB_OFFLINE is set, falling back to a complete cached copy when the Hub cannot be reached;
    GGUF files and pickle weights are converted. Nothing is started."""
    environ = os.environ if environ is None else environ
    with _resolution_errors():
        path = _local_path(source)
        if path is None:
            if hub_offline(environ):
                path, detail = _from_cache(source)
                if path is None:
                    raise ModelResolutionError(_offline_message(source, detail))
            else:
                path = _fetch(source)
    return _checked(path, source)


@contextmanager
def _resolution_errors() -> Iterator[None]:
    """Turns the errors of each step into ModelResolutionError, keeping their messages."""
    try:
        yield
    except (GgufConversionError, PickleConversionError, HubError) as error:
        raise ModelResolutionError(str(error)) from error


def _checked(path: Path, source: ModelSource) -> ResolvedModel:
    validate_model_dir(path, source.allow_pickle_weights)
    return ResolvedModel(path=path, served_name=source.model_id, max_position_embeddings=read_max_positions(path))


def _local_path(source: ModelSource) -> Path | None:
    """A local directory, a local .gguf file or the embedded model; None for a Hugging Face repo id."""
    model_id, cache_dir = source.model_id, source.cache_dir
    local = Path(model_id).expanduser()
    if source.gguf_file is not None and (local.is_dir() or model_id.startswith(("/", ".", "~"))):
        gguf = local / source.gguf_file
        if not gguf.is_file():
            raise ModelResolutionError(f"no such GGUF file: {gguf}")
        return converted_model_dir(user_gguf(gguf.resolve()), cache_dir)
    if local.is_dir():
        return local.resolve()
    if local.suffix == ".gguf":
        return converted_model_dir(user_gguf(local.resolve()), cache_dir)
    if model_id == EMBEDDED_MODEL_ID and source.revision is None and source.gguf_file is None:
        return converted_model_dir(embedded_gguf(), cache_dir)
    if model_id.startswith(("/", ".", "~")):
        raise ModelResolutionError(f"no such model directory: {local}")
    _check_repo_id(model_id)
    return None


def _check_repo_id(model_id: str) -> None:
    from huggingface_hub.errors import HFValidationError  # noqa: PLC0415
    from huggingface_hub.utils import validate_repo_id  # noqa: PLC0415

    try:
        validate_repo_id(model_id)
    except HFValidationError as error:
        raise ModelResolutionError(
            f"model {model_id!r} is neither a local directory, a .gguf file, nor a Hugging Face repo id "
            f"(org/name): {error}"
        ) from error


def _from_cache(source: ModelSource) -> tuple[Path | None, str]:
    """The servable directory when the HF cache holds the whole revision, else None and what is missing."""
    request = source.hub_request()
    cache = hub_cache_dir()
    if source.gguf_file is not None:
        cached = cached_file(request, source.gguf_file, cache)
        if cached is None:
            return None, f"{source.gguf_file} is not in the local Hugging Face cache ({cache})"
        return converted_model_dir(user_gguf(cached), source.cache_dir), ""
    state = cache_state(request, cache)
    if state.snapshot is None:
        return None, f"it is not in the local Hugging Face cache ({cache})"
    if state.missing:
        shown = ", ".join(state.missing[:3]) + (f" and {len(state.missing) - 3} more" if len(state.missing) > 3 else "")
        return None, f"its copy in the local Hugging Face cache ({state.snapshot}) lacks {shown}"
    return _servable(state.snapshot, source), ""


def _fetch(source: ModelSource) -> Path:
    """Downloads what the cache lacks (the download subcommand's work), then converts when needed."""
    request = source.hub_request(with_token=True)
    cache = hub_cache_dir()
    if source.gguf_file is not None:
        gguf = fetch_file(request, source.gguf_file, cache, DownloadProgress)
        return converted_model_dir(user_gguf(gguf), source.cache_dir)
    return _servable(fetch_snapshot(request, cache, DownloadProgress), source)


def _servable(snapshot: Path, source: ModelSource) -> Path:
    """The snapshot itself, or (pickle weights, when allowed) its cached safetensors conversion."""
    if source.allow_pickle_weights and has_only_pickle_weights(snapshot):
        name = f"{source.model_id.replace('/', '--').lower()}-{snapshot.name[:12]}-safetensors"
        return converted_pickle_dir(snapshot, source.cache_dir, name)
    return snapshot


def _offline_message(source: ModelSource, detail: str) -> str:
    at_revision = f" at revision {source.revision!r}" if source.revision else ""
    what = f"{source.gguf_file} of " if source.gguf_file else ""
    fetch = f"tandem-launcher download {source.model_id}" + (
        f" --revision {source.revision}" if source.revision else ""
    )
    return (
        f"model {what}{source.model_id!r}{at_revision} is neither a local directory, a .gguf file, nor complete in the "
        f"local Hugging Face cache ({detail}), and HF_HUB_OFFLINE=1 forbids downloading it: unset HF_HUB_OFFLINE to "
        f"let the launcher download it, or fetch it where the Hub is reachable (`{fetch}`, or `hf download`) into "
        "this cache (HF_HOME), or pass a directory"
    )


def download_in_child(python: str, log_level: str = "info", json_output: bool = False) -> Downloader:
    """Runs `tandem-launcher download` in a child process sharing the launcher's terminal or log; a shutdown signal
    (raised in the launcher's main thread) stops it at once."""

    def download(source: ModelSource) -> None:
        argv = [
            python,
            "-m",
            "tandem_launcher",
            "download",
            source.model_id,
            "--model-cache-dir",
            str(source.cache_dir),
        ]
        argv += ["--log-level", log_level]
        for flag, value in (("--revision", source.revision), ("--gguf-file", source.gguf_file)):
            if value is not None:
                argv += [flag, value]
        if source.hf_token_file is not None:
            argv += ["--hf-token-file", str(source.hf_token_file)]
        if source.allow_pickle_weights:
            argv.append("--allow-pickle-weights")
        if json_output:
            argv.append("--json-output")
        with tempfile.TemporaryDirectory(prefix="tandem-download-") as scratch:
            error_file = Path(scratch) / "error"
            environ = {name: value for name, value in os.environ.items() if name not in _SOURCE_VARIABLES}
            status = _run_child([*argv, "--error-file", str(error_file)], environ)
            if status != 0:
                message = error_file.read_text().strip() if error_file.is_file() else ""
                raise ModelResolutionError(message or f"downloading {source.model_id} failed (exit status {status})")

    return download


def _run_child(argv: list[str], environ: Mapping[str, str]) -> int:
    # The kernel kills the download child if the launcher dies, even by SIGKILL.
    child = subprocess.Popen(guarded_argv(argv), stdin=subprocess.DEVNULL, env=environ)
    try:
        return child.wait()
    except BaseException:
        child.send_signal(signal.SIGTERM)
        try:
            child.wait(timeout=_CHILD_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        raise


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
    """The context length declared in config.json (or its text_config), if any, as the shard serves it."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelResolutionError(f"cannot read {path / 'config.json'}: {error}") from error
    for section in (config, config.get("text_config") or {}):
        for key in _POSITION_KEYS:
            value = section.get(key)
            if isinstance(value, int) and value > 0:
                return served_positions(section, value)
    return None
