"""What to fetch from the Hugging Face Hub and how to reach it: the repo, revision and token, and the environment
(HF_ENDPOINT, HF_HUB_OFFLINE, HF_HUB_CACHE) that `huggingface_hub` honours everywhere."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

_TRUE = {"1", "on", "yes", "true"}


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


def hub_offline(environ: Mapping[str, str]) -> bool:
    """HF_HUB_OFFLINE=1 (or TRANSFORMERS_OFFLINE=1): nothing may contact the Hub."""
    from huggingface_hub import constants  # noqa: PLC0415

    flags = (environ.get("HF_HUB_OFFLINE"), environ.get("TRANSFORMERS_OFFLINE"))
    return constants.is_offline_mode() or any((flag or "").strip().lower() in _TRUE for flag in flags)


def hub_cache_dir() -> Path:
    """The HF hub cache (HF_HUB_CACHE, else $HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    from huggingface_hub import constants  # noqa: PLC0415

    return Path(constants.HF_HUB_CACHE).expanduser()
