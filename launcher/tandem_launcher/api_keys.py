"""API keys reach the router through a 0600 file in the launch's private runtime directory, never
through its argv (visible to every local user in `ps`)."""

from __future__ import annotations

import os
from pathlib import Path

KEY_FILE_NAME = "api-keys"


def write_key_file(runtime_dir: Path, keys: tuple[str, ...]) -> Path | None:
    """Writes `keys`, one per line, to a file only the launching user can read; None without keys."""
    if not keys:
        return None
    path = runtime_dir / KEY_FILE_NAME
    path.unlink(missing_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write("".join(f"{key}\n" for key in keys))
    return path


def first_key(keys: tuple[str, ...], key_files: tuple[Path, ...]) -> str | None:
    """A key the launcher itself can send to the router's protected routes (`/info`). A key file line is the key,
    optionally followed by its scheduling weight and its name for metrics (`KEY weight=4 name=team-a`)."""
    if keys:
        return keys[0]
    for path in key_files:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            continue
        for line in lines:
            words = line.split()
            if words and not words[0].startswith("#"):
                return words[0]
    return None
