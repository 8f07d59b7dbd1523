"""Runs the launcher in a subprocess against fake children and observes what they did."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class LaunchUnderTest:
    """A launcher process running fake children, with its merged output collected line by line."""

    process: subprocess.Popen[str]
    events_path: Path
    lines: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._reader = threading.Thread(target=self._collect, daemon=True)
        self._reader.start()

    def _collect(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def output(self) -> str:
        return "\n".join(self.lines)

    def events(self) -> list[str]:
        return self.events_path.read_text().splitlines() if self.events_path.exists() else []

    def wait_for_output(self, text: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if time.monotonic() > deadline or self.process.poll() is not None:
                time.sleep(0.2)
                if text in self.output:
                    return
                raise AssertionError(f"{text!r} never appeared; output:\n{self.output}")
            time.sleep(0.05)

    def finish(self, timeout: float = 20.0) -> int:
        try:
            status = self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
        self._reader.join(timeout=5)
        return status

    def child_pids(self) -> list[int]:
        return [int(event.split()[2]) for event in self.events() if " pid " in event]

    def runtime_dirs(self) -> set[Path]:
        dirs = set()
        for event in self.events():
            words = event.split()
            if "--uds-path" in words:
                dirs.add(Path(words[words.index("--uds-path") + 1]).parent)
        return dirs


def pid_is_alive(pid: int) -> bool:
    """True while `pid` runs; a zombie (dead, waiting for a reaper that may never come in a container) is not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"
