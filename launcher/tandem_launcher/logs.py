"""Logging for the launcher and the forwarded output of its children, as text or JSON lines."""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone

LOGGER = logging.getLogger("tandem_launcher")
_CHILD_LOGGER = logging.getLogger("tandem_launcher.child")


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "timestamp": datetime.fromtimestamp(record.created, tz=timezone.utc).isoformat(),
            "level": record.levelname,
            "target": getattr(record, "child", "launcher"),
            "message": record.getMessage(),
        }
        return json.dumps(entry)


def configure_logging(level: str, json_output: bool) -> None:
    """Launcher records honour `level`; child lines are always forwarded (children filter their own)."""
    launcher_handler = logging.StreamHandler(sys.stderr)
    child_handler = logging.StreamHandler(sys.stderr)
    if json_output:
        launcher_handler.setFormatter(_JsonFormatter())
        child_handler.setFormatter(_JsonFormatter())
    else:
        launcher_handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s launcher: %(message)s"))
        child_handler.setFormatter(logging.Formatter("[%(child)s] %(message)s"))
    LOGGER.handlers[:] = [launcher_handler]
    LOGGER.setLevel(level.upper())
    LOGGER.propagate = False
    _CHILD_LOGGER.handlers[:] = [child_handler]
    _CHILD_LOGGER.setLevel(logging.INFO)
    _CHILD_LOGGER.propagate = False


def forward_child_line(child: str, line: str) -> None:
    """Writes one output line of a child, tagged with the child's name."""
    _CHILD_LOGGER.info(line, extra={"child": child})


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Logs the start of a start-up phase and, when it succeeds, how long it took."""
    LOGGER.info("%s ...", name)
    started = time.monotonic()
    yield
    LOGGER.info("%s: done in %.1fs", name, time.monotonic() - started)
