"""The local HF cache, read without network access: which snapshot a revision points to, which served files it still
lacks, partial files left by killed downloads, and whether the volume can hold what is missing."""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from tandem_launcher.hub_errors import HubError
from tandem_launcher.hub_files import (
    PICKLE_INDEX,
    PICKLE_WEIGHTS,
    REQUIRED_FILES,
    SAFETENSORS_INDEX,
    RepoFile,
    select_serving_files,
)
from tandem_launcher.hub_request import HubRequest
from tandem_launcher.logs import LOGGER

# A `*.incomplete` download untouched this long belongs to a process that died; live downloads write every second.
STALE_PARTIAL_S = 600.0


@dataclass(frozen=True)
class CacheState:
    """A revision's snapshot in the local HF cache: where it is and which served files it still lacks."""

    snapshot: Path | None
    missing: tuple[str, ...] = ()

    @property
    def complete(self) -> bool:
        return self.snapshot is not None and not self.missing


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


def format_bytes(size: float) -> str:
    """1536 -> '1.5 KiB'."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
