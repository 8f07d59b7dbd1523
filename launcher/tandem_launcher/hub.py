"""The Hugging Face Hub side of model resolution: which files of a repo serving needs, whether the local HF cache
already holds them all, and fetching the rest through `huggingface_hub` (so `HF_ENDPOINT` mirrors, `HF_TOKEN` and
`HF_HUB_OFFLINE` work as everywhere else).

Only the launcher's `download` step calls this; shards never download.
"""

from __future__ import annotations

import errno
import glob
import json
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

from tandem_launcher.logs import LOGGER

# What the router and the shards read besides the weights (special_tokens_map.json is for tools such as transformers
# reading the same directory). Nothing in a subdirectory (`original/`, ...) is ever fetched.
SERVING_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)
REQUIRED_FILES = ("config.json", "tokenizer.json")
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_INDEX = "pytorch_model.bin.index.json"
PICKLE_WEIGHTS = "pytorch_model*.bin"
# Mistral-style repos ship one `consolidated.safetensors` beside the sharded files: the same weights twice.
_DUPLICATE_PREFIXES = ("consolidated",)
# A `*.incomplete` download untouched this long belongs to a process that died; live downloads write every second.
STALE_PARTIAL_S = 600.0
_TRUE = {"1", "on", "yes", "true"}


class HubError(Exception):
    """The model cannot be fetched; the message says what to do."""


@dataclass(frozen=True)
class RepoFile:
    """One file of a repo at a commit."""

    path: str
    size: int


@dataclass(frozen=True)
class Selection:
    """The files of a repo that serving needs."""

    files: tuple[RepoFile, ...]
    pickled: bool

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(file.path for file in self.files)

    @property
    def size(self) -> int:
        return sum(file.size for file in self.files)


@dataclass(frozen=True)
class HubRequest:
    """What to fetch and how to reach the Hub."""

    repo_id: str
    revision: str | None = None
    allow_pickle_weights: bool = False
    token: str | None = None  # None: huggingface_hub's own (HF_TOKEN, then the stored login)
    endpoint: str | None = None  # None: HF_ENDPOINT, else huggingface.co

    @property
    def label(self) -> str:
        return f"{self.repo_id} (revision {self.revision})" if self.revision else self.repo_id

    @property
    def shown_endpoint(self) -> str:
        from huggingface_hub import constants  # noqa: PLC0415  (only repo ids need huggingface_hub)

        return (self.endpoint or constants.ENDPOINT).rstrip("/")


@dataclass(frozen=True)
class CacheState:
    """A revision's snapshot in the local HF cache: where it is and which served files it still lacks."""

    snapshot: Path | None
    missing: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.snapshot is not None and not self.missing


def hub_offline(environ: Mapping[str, str]) -> bool:
    """HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): nothing may contact the Hub."""
    from huggingface_hub import constants  # noqa: PLC0415

    flags = (environ.get("HF_HUB_OFFLINE"), environ.get("TRANSFORMERS_OFFLINE"))
    return constants.is_offline_mode() or any((flag or "").strip().lower() in _TRUE for flag in flags)


def hub_cache_dir() -> Path:
    """The HF hub cache (HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants  # noqa: PLC0415

    return Path(constants.HF_HUB_CACHE).expanduser()


def read_token_file(path: Path) -> str:
    """A token from a file (a mounted Kubernetes secret): its first non-empty line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as error:
        raise HubError(f"cannot read the Hugging Face token file {path}: {error.strerror or error}") from error
    token = next((line.strip() for line in lines if line.strip()), "")
    if not token:
        raise HubError(f"the Hugging Face token file {path} is empty")
    return token


def select_serving_files(files: Iterable[RepoFile], label: str, allow_pickle_weights: bool) -> Selection:
    """Config, tokenizer, chat template and safetensors weights with their index; pickle weights only when allowed and
    there are no safetensors. Raises with what to do when the repo has nothing Tandem can serve."""
    top = {file.path: file for file in files if "/" not in file.path}
    chosen = [top[name] for name in SERVING_FILES if name in top]
    safetensors = sorted(
        (
            file
            for name, file in top.items()
            if name.endswith(".safetensors") and not name.startswith(_DUPLICATE_PREFIXES)
        ),
        key=lambda file: file.path,
    )
    pickled = False
    if safetensors:
        weights = safetensors + ([top[SAFETENSORS_INDEX]] if SAFETENSORS_INDEX in top else [])
    else:
        pickles = sorted((file for name, file in top.items() if fnmatch(name, PICKLE_WEIGHTS)), key=lambda f: f.path)
        if not pickles:
            raise HubError(_no_weights_message(label, top))
        if not allow_pickle_weights:
            shown = ", ".join(file.path for file in pickles[:3])
            raise HubError(
                f"{label} has only pickle weights ({shown}), which Tandem does not load by default because unpickling "
                "can run arbitrary code: pass --allow-pickle-weights if you trust the repo (they are then downloaded "
                "and converted to safetensors once), or pick a repo with *.safetensors weights"
            )
        pickled = True
        weights = pickles + ([top[PICKLE_INDEX]] if PICKLE_INDEX in top else [])
    missing = [name for name in REQUIRED_FILES if name not in top]
    if missing:
        raise HubError(
            f"{label} has no {' and no '.join(missing)} at its top level, which Tandem needs to serve it "
            "(the router needs the fast tokenizer's tokenizer.json): pick a transformers-format repo"
        )
    return Selection(files=tuple(chosen + weights), pickled=pickled)


def _no_weights_message(label: str, top: Mapping[str, RepoFile]) -> str:
    ggufs = sorted(name for name in top if name.endswith(".gguf"))
    if ggufs:
        shown = ", ".join(ggufs[:4]) + (", ..." if len(ggufs) > 4 else "")
        return f"{label} holds GGUF files ({shown}) and no safetensors weights: pass --gguf-file with one of them"
    return f"{label} has no *.safetensors weights at its top level (nor pytorch_model*.bin), so Tandem cannot serve it"


def cache_state(request: HubRequest, cache_dir: Path) -> CacheState:
    """Whether the cache holds every served file of the revision, with no network access.

    The file list comes from the tree listing huggingface_hub caches beside a snapshot it downloaded; a snapshot
    without one (written by another tool) is judged by its contents: config, tokenizer, and every weight file its
    index names."""
    from huggingface_hub import get_cached_repo_tree  # noqa: PLC0415
    from huggingface_hub.errors import CachedRepoTreeNotFoundError  # noqa: PLC0415

    commit = cached_commit(request.repo_id, request.revision, cache_dir)
    if commit is None:
        return CacheState(None)
    snapshot = repo_storage(request.repo_id, cache_dir) / "snapshots" / commit
    if not snapshot.is_dir():
        return CacheState(None)
    try:
        tree = get_cached_repo_tree(request.repo_id, revision=commit, cache_dir=cache_dir)
    except CachedRepoTreeNotFoundError:
        return CacheState(snapshot, tuple(_missing_by_contents(snapshot)))
    files = [RepoFile(entry.path, int(entry.size or 0)) for entry in tree]
    selection = select_serving_files(files, request.label, request.allow_pickle_weights)
    return CacheState(snapshot, tuple(name for name in selection.names if not (snapshot / name).is_file()))


def cached_commit(repo_id: str, revision: str | None, cache_dir: Path) -> str | None:
    """The commit a branch or tag points to in the cache (a commit hash stands for itself)."""
    from huggingface_hub.file_download import REGEX_COMMIT_HASH  # noqa: PLC0415

    if revision is not None and REGEX_COMMIT_HASH.fullmatch(revision):
        return revision
    ref = repo_storage(repo_id, cache_dir) / "refs" / (revision or "main")
    try:
        return ref.read_text().strip() or None
    except OSError:
        return None


def repo_storage(repo_id: str, cache_dir: Path) -> Path:
    return cache_dir / f"models--{repo_id.replace('/', '--')}"


def _missing_by_contents(snapshot: Path) -> list[str]:
    missing = [name for name in REQUIRED_FILES if not (snapshot / name).is_file()]
    for index_name in (SAFETENSORS_INDEX, PICKLE_INDEX):
        index = snapshot / index_name
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text()).get("weight_map", {})
            except (OSError, json.JSONDecodeError):
                return [*missing, index_name]
            missing += sorted({name for name in weight_map.values() if not (snapshot / name).is_file()})
            return missing
    has_weights = any(snapshot.glob("*.safetensors")) or any(snapshot.glob(PICKLE_WEIGHTS))
    return missing if has_weights else [*missing, "*.safetensors weights"]


def list_remote_files(request: HubRequest) -> tuple[str, list[RepoFile]]:
    """The commit the revision points to and its files with their sizes (one API call)."""
    from huggingface_hub import HfApi  # noqa: PLC0415

    api = HfApi(endpoint=request.endpoint, token=request.token, library_name="tandem-launcher")
    info = api.model_info(request.repo_id, revision=request.revision, files_metadata=True)
    if not info.sha:
        raise HubError(f"{request.shown_endpoint} answered without a commit for {request.label}: is it a Hub endpoint?")
    return info.sha, [RepoFile(sibling.rfilename, int(sibling.size or 0)) for sibling in info.siblings or []]


ProgressFactory = Callable[[str, int, int], Any]


def fetch_snapshot(request: HubRequest, cache_dir: Path, progress: ProgressFactory) -> Path:
    """Downloads every served file of the revision that the cache lacks; the snapshot directory.

    `progress(label, total_bytes, files)` returns a reporter with a `tqdm_class` attribute and a `close()` method.
    When the Hub cannot be reached, a complete cached snapshot is used with a warning."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415

    try:
        commit, files = list_remote_files(request)
    except Exception as error:
        if not is_unreachable(error):
            raise translate_hub_error(error, request) from error
        state = cache_state(request, cache_dir)
        if state.complete:
            LOGGER.warning(
                "cannot reach %s (%s); using the complete copy of %s in the local cache",
                request.shown_endpoint,
                describe(error),
                request.label,
            )
            return state.snapshot  # type: ignore[return-value]
        raise translate_hub_error(error, request) from error
    selection = select_serving_files(files, request.label, request.allow_pickle_weights)
    snapshot = repo_storage(request.repo_id, cache_dir) / "snapshots" / commit
    todo = [file for file in selection.files if not (snapshot / file.path).is_file()]
    if not todo and cached_commit(request.repo_id, request.revision, cache_dir) == commit:
        LOGGER.info("%s is complete in %s at commit %s: nothing to fetch", request.label, cache_dir, commit[:12])
        return snapshot
    remove_stale_partials(repo_storage(request.repo_id, cache_dir))
    check_free_space(request.label, sum(file.size for file in todo), len(todo), cache_dir)
    LOGGER.info(
        "fetching %d of %d files (%s) of %s at commit %s from %s into %s",
        len(todo),
        len(selection.files),
        format_bytes(sum(file.size for file in todo)),
        request.label,
        commit[:12],
        request.shown_endpoint,
        cache_dir,
    )
    reporter = progress(request.repo_id, sum(file.size for file in todo), len(todo))
    try:
        path = snapshot_download(
            request.repo_id,
            revision=request.revision,
            cache_dir=cache_dir,
            endpoint=request.endpoint,
            token=request.token,
            allow_patterns=[glob.escape(name) for name in selection.names],
            tqdm_class=reporter.tqdm_class,
            library_name="tandem-launcher",
        )
    except Exception as error:
        raise translate_hub_error(error, request, cache_dir) from error
    finally:
        reporter.close()
    snapshot = Path(path)
    absent = [name for name in selection.names if not (snapshot / name).is_file()]
    if absent:
        raise HubError(
            f"{request.label} changed on {request.shown_endpoint} during the download ({', '.join(absent[:3])} "
            "missing): run it again, or pin --revision to a commit"
        )
    return snapshot


def fetch_file(request: HubRequest, filename: str, cache_dir: Path, progress: ProgressFactory) -> Path:
    """One file of the repo (a GGUF), from the cache when there, else downloaded; its path in the snapshot."""
    from huggingface_hub import hf_hub_download  # noqa: PLC0415

    try:
        commit, files = list_remote_files(request)
    except Exception as error:
        if is_unreachable(error):
            cached = cached_file(request, filename, cache_dir)
            if cached is not None:
                LOGGER.warning(
                    "cannot reach %s (%s); using the cached %s", request.shown_endpoint, describe(error), cached
                )
                return cached
        raise translate_hub_error(error, request) from error
    sizes = {file.path: file.size for file in files}
    if filename not in sizes:
        ggufs = sorted(name for name in sizes if name.endswith(".gguf"))
        shown = ", ".join(ggufs[:6]) or "none"
        raise HubError(f"{request.label} has no file {filename!r}; its GGUF files: {shown}")
    snapshot = repo_storage(request.repo_id, cache_dir) / "snapshots" / commit
    needed = 0 if (snapshot / filename).is_file() else sizes[filename]
    remove_stale_partials(repo_storage(request.repo_id, cache_dir))
    check_free_space(request.label, needed, 1 if needed else 0, cache_dir)
    LOGGER.info(
        "fetching %s (%s) of %s from %s into %s",
        filename,
        format_bytes(sizes[filename]),
        request.label,
        request.shown_endpoint,
        cache_dir,
    )
    reporter = progress(f"{request.repo_id}/{filename}", needed, 1 if needed else 0)
    try:
        path = hf_hub_download(
            request.repo_id,
            filename,
            revision=request.revision,
            cache_dir=cache_dir,
            endpoint=request.endpoint,
            token=request.token,
            tqdm_class=reporter.tqdm_class,
            library_name="tandem-launcher",
        )
    except Exception as error:
        raise translate_hub_error(error, request, cache_dir) from error
    finally:
        reporter.close()
    return Path(path)


def cached_file(request: HubRequest, filename: str, cache_dir: Path) -> Path | None:
    """The cached copy of one file of the revision, without network access."""
    commit = cached_commit(request.repo_id, request.revision, cache_dir)
    if commit is None:
        return None
    path = repo_storage(request.repo_id, cache_dir) / "snapshots" / commit / filename
    return path if path.is_file() else None


def check_free_space(label: str, needed: int, files: int, cache_dir: Path) -> None:
    """Refuses before downloading anything when the cache's volume cannot hold what is still missing."""
    if needed <= 0:
        return
    probe = cache_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    if needed > free:
        raise HubError(
            f"not enough disk space: {label} needs {format_bytes(needed)} for {files} file(s), but the volume of "
            f"{cache_dir} has only {format_bytes(free)} free: free some space, give the cache a larger volume "
            "(HF_HOME or HF_HUB_CACHE; in the Helm chart, modelCache.size), or pick a smaller model"
        )


def remove_stale_partials(storage: Path, now: float | None = None) -> None:
    """Deletes `*.incomplete` files left by downloads that were killed (another launcher's live one is kept)."""
    now = time.time() if now is None else now
    for partial in (storage / "blobs").glob("*.incomplete"):
        try:
            if now - partial.stat().st_mtime > STALE_PARTIAL_S:
                partial.unlink()
                LOGGER.info("removed %s, left by an interrupted download", partial.name)
        except OSError:
            continue


def is_unreachable(error: BaseException) -> bool:
    """The endpoint did not answer at all (refused, DNS, timeout, dropped connection, offline mode) or answered 5xx."""
    from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled  # noqa: PLC0415

    if isinstance(error, HfHubHTTPError):
        return error.response is not None and error.response.status_code >= 500
    return any(isinstance(cause, (OfflineModeIsEnabled, *_transport_errors())) for cause in _chain(error))


def _transport_errors() -> tuple[type[BaseException], ...]:
    """huggingface_hub's HTTP client's connection-level errors (connect, timeout, protocol, proxy)."""
    try:
        import httpx2 as httpx  # noqa: PLC0415  (huggingface_hub >= 2 talks through httpx2)
    except ImportError:  # pragma: no cover
        import httpx  # type: ignore[no-redef]  # noqa: PLC0415
    return (httpx.TransportError,)


def _chain(error: BaseException) -> Iterable[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def describe(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__


def translate_hub_error(error: BaseException, request: HubRequest, cache_dir: Path | None = None) -> HubError:
    """A HubError whose message names the cause as the user sees it and what to do about it."""
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError  # noqa: PLC0415

    if isinstance(error, HubError):
        return error
    endpoint = request.shown_endpoint
    status = error.response.status_code if isinstance(error, HfHubHTTPError) and error.response is not None else None
    refusal = _refusal_message(error, request, status)
    if refusal is not None:
        message = refusal
    elif _is_disk_full(error):
        message = (
            f"the disk filled up while downloading {request.label} into {cache_dir or hub_cache_dir()} (no space left "
            "on device): free some space or give the cache a larger volume (HF_HOME or HF_HUB_CACHE; in the Helm "
            "chart, modelCache.size); the files already complete are kept"
        )
    elif is_unreachable(error) or isinstance(error, LocalEntryNotFoundError):
        message = (
            f"cannot reach the Hugging Face Hub at {endpoint} ({describe(error)}) and {request.label} is not complete "
            "in the local cache: check the network or proxy, point HF_ENDPOINT at a reachable mirror, or fetch the "
            f"model where the Hub is reachable (`tandem-launcher download {request.repo_id}`) and copy the cache "
            "(HF_HOME) here"
        )
    elif status is not None:
        message = f"{endpoint} answered {status} for {request.label}: {describe(error)}"
    else:
        message = f"downloading {request.label} from {endpoint} failed: {describe(error)}"
    return HubError(message)


def _refusal_message(error: BaseException, request: HubRequest, status: int | None) -> str | None:
    """The Hub's answer when it refused the repo, the revision, a file or the token (401/403/404)."""
    from huggingface_hub.errors import (  # noqa: PLC0415
        GatedRepoError,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    endpoint = request.shown_endpoint
    page = f"{endpoint}/{request.repo_id}"
    token_hint = "set HF_TOKEN (or --hf-token-file) to a token of an account that has access"
    messages = [
        (
            isinstance(error, GatedRepoError) and status == 403,
            f"{request.repo_id} is a gated model and the token's account has no access to it yet (403 Forbidden): "
            f"accept its licence on {page} with that account, or use the token of an account that has",
        ),
        (
            isinstance(error, GatedRepoError),
            f"{request.repo_id} is a gated model and no token was sent ({status} Unauthorized): accept its licence "
            f"on {page}, then {token_hint}",
        ),
        (
            isinstance(error, RevisionNotFoundError),
            f"{request.repo_id} has no revision {request.revision!r} on {endpoint} (404): check --revision "
            "(a branch, a tag or a commit hash)",
        ),
        (
            isinstance(error, RemoteEntryNotFoundError),
            f"{request.label} has no such file on {endpoint} (404): {describe(error)}",
        ),
        (
            isinstance(error, RepositoryNotFoundError),
            f"{request.repo_id} was not found on {endpoint} ({status}): check the model id (org/name) and "
            f"--revision; if it is a private repo, {token_hint}",
        ),
        (
            status == 401,
            f"{endpoint} refused the Hugging Face token (401 Unauthorized: invalid credentials): check HF_TOKEN or "
            "--hf-token-file",
        ),
        (
            status == 403,
            f"{endpoint} forbids access to {request.repo_id} (403 Forbidden): {token_hint}, and accept the model's "
            f"licence on {page} if it has one",
        ),
    ]
    return next((message for applies, message in messages if applies), None)


def _is_disk_full(error: BaseException) -> bool:
    return any(isinstance(cause, OSError) and cause.errno in (errno.ENOSPC, errno.EDQUOT) for cause in _chain(error))


def format_bytes(size: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
