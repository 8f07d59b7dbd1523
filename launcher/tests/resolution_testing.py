"""Test helper: model resolution from plain arguments rather than a whole launcher configuration."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from tandem_launcher.model_resolution import Downloader, ModelSource, ResolvedModel, resolve_source


def resolve_model(
    model_id: str,
    revision: str | None,
    cache_dir: Path,
    allow_pickle_weights: bool = False,
    *,
    gguf_file: str | None = None,
    environ: Mapping[str, str] | None = None,
    download: Downloader | None = None,
) -> ResolvedModel:
    """The model to serve; a repo id missing from the HF cache is downloaded first (unless HF_HUB_OFFLINE is set)."""
    source = ModelSource(model_id, revision, cache_dir, allow_pickle_weights, gguf_file)
    return resolve_source(source, environ, download)
