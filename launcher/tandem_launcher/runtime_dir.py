"""The per-launch runtime directory: shard sockets, the key file and the router's launch id, all private to the
launching user; a directory whose launcher is gone is removed by the next start."""

from __future__ import annotations

import os
import secrets
import shutil
import tempfile
from pathlib import Path

from tandem_launcher.logs import LOGGER

PREFIX = "tandem-"
OWNER_FILE_NAME = "launcher.pid"
LAUNCH_ID_FILE_NAME = "launch-id"


def _start_time(pid: int) -> str | None:
    """The kernel's start time of `pid` (clock ticks since boot): with the pid, it names one process for good."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_is_running(owner: str) -> bool:
    pid_text, _, start_time = owner.partition(" ")
    pid = int(pid_text)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return not start_time or _start_time(pid) in (None, start_time)


def remove_stale_runtime_dirs(parent: Path) -> list[Path]:
    """Removes this user's runtime directories whose launcher no longer runs (one killed by SIGKILL cannot clean
    up); the directories removed."""
    removed = []
    for path in parent.glob(f"{PREFIX}*"):
        try:
            if path.is_symlink() or not path.is_dir() or path.stat().st_uid != os.getuid():
                continue
            owner = (path / OWNER_FILE_NAME).read_text().strip()
            if _owner_is_running(owner):
                continue
        except (OSError, ValueError):
            continue  # not a launcher's directory, or one still being set up
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _write_private(path: Path, text: str) -> None:
    """Writes `text` to a new file only the launching user can read, complete before its name appears."""
    partial = path.with_name(f".{path.name}.partial")
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as file:
        file.write(text)
    partial.rename(path)


class RuntimeDir:
    """A fresh 0700 directory owned by this launcher process, with the launch id its router must answer with."""

    def __init__(self, parent: Path | None = None) -> None:
        parent = Path(tempfile.gettempdir()) if parent is None else parent
        for stale in remove_stale_runtime_dirs(parent):
            LOGGER.info("removed %s, left behind by a launcher that no longer runs", stale)
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        pid = os.getpid()
        _write_private(self.path / OWNER_FILE_NAME, f"{pid} {_start_time(pid) or ''}\n")
        self.launch_id = secrets.token_hex(16)
        self.launch_id_file = self.path / LAUNCH_ID_FILE_NAME
        _write_private(self.launch_id_file, self.launch_id)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
