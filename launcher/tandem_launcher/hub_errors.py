"""Why a Hub download failed, told as the user sees it: refusals (401/403/404), an unreachable endpoint, a full disk.

Every failure of the download step leaves as one `HubError` whose message says what to do."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from pathlib import Path

from tandem_launcher.hub_request import HubRequest, hub_cache_dir


class HubError(Exception):
    """The model cannot be fetched; the message says what to do."""


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
