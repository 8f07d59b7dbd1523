"""One converted model directory per source in the model cache, built once and never seen half-written."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from tandem_launcher.logs import LOGGER, phase


def converted_once(cache_dir: Path, cache_name: str, description: str, convert: Callable[[Path], None]) -> Path:
    """`cache_dir/cache_name`, first filled by `convert(directory)` unless a complete conversion is already there.

    The conversion is built beside its target and renamed into place, so the target is always complete, also when
    several launchers share the cache and convert at once (the first rename wins, the others use it).
    """
    target = cache_dir / cache_name
    if target.is_dir():
        LOGGER.info("using converted model %s", target)
        return target
    cache_dir.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(dir=cache_dir, prefix=f".{cache_name}.partial-"))
    try:
        with phase(f"{description} into {target}"):
            convert(partial)
        partial.chmod(0o755)
        try:
            partial.rename(target)
        except OSError:
            if not target.is_dir():
                raise
            LOGGER.info("another launcher converted %s first", target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return target
