"""Fetching a model from the Hugging Face Hub: the revision's file listing, then whatever served files the local HF
cache lacks, through `huggingface_hub` (so `HF_ENDPOINT` mirrors, `HF_TOKEN` and `HF_HUB_OFFLINE` work as everywhere
else); which files serving needs is `hub_files`, what the cache holds `hub_cache`, why a fetch failed `hub_errors`.

Only the launcher's `download` step calls this; shards never download.
"""

from __future__ import annotations

import glob
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tandem_launcher.hub_cache import (
    cache_state,
    cached_commit,
    cached_file,
    check_free_space,
    format_bytes,
    remove_stale_partials,
    repo_storage,
)
from tandem_launcher.hub_errors import HubError, describe, is_unreachable, translate_hub_error
from tandem_launcher.hub_files import RepoFile, select_serving_files
from tandem_launcher.hub_request import HubRequest
from tandem_launcher.logs import LOGGER


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
