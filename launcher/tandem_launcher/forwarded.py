"""Flags the launcher forwards to one child as they are: each is declared once, as a `Forwarded` entry, and both the
launcher's option (with its env var and `--help` line) and the child's argv words are made from that entry.

The tables are `router_flags.ROUTER_FLAGS` and `shard_flags.SHARD_FLAGS`; flags the launcher itself reads or
derives (model, devices, token limits, supervision) stay in `cli.py` and `LauncherConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tandem_launcher.flags import FlagAdder, bool_value


class Child(Enum):
    """The child process a forwarded flag belongs to."""

    ROUTER = "router"
    SHARD = "shard"


# What is wrong with a flag's value, as a message naming the flag, or None.
Check = Callable[[str, Any], str | None]


def positive(flag: str, value: Any) -> str | None:
    """Unset or at least 1 (or above 0)."""
    return None if value is None or value > 0 else f"{flag} must be positive, got {value}"


def not_negative(flag: str, value: Any) -> str | None:
    """Unset or at least 0."""
    return None if value is None or value >= 0 else f"{flag} must not be negative, got {value}"


def true_false(value: bool) -> str:
    """A boolean as the router's flags spell it."""
    return "true" if value else "false"


def whole_seconds(value: float) -> str:
    """Seconds rounded up, for the router's integer timeouts."""
    return str(math.ceil(value))


def expanded_path(text: str) -> Path:
    """A path with `~` expanded."""
    return Path(text).expanduser()


@dataclass(frozen=True)
class Forwarded:
    """One flag forwarded to `child` under the same name; an unset (None) value is not passed."""

    flag: str
    child: Child
    kind: Callable[[str], Any]
    default: Any
    help: str
    choices: tuple[str, ...] | None = None
    check: Check | None = None
    # How the child reads the value.
    word: Callable[[Any], str] = str
    # Passed only while this other forwarded flag (by its `dest`) is set.
    only_with: str | None = None
    # A switch: off unless given, passed as the bare flag when on.
    switch: bool = False
    # The value of the flag given alone, without one; None: the flag takes a value.
    alone: str | None = None

    @property
    def dest(self) -> str:
        """The flag's key in parsed values and in `LauncherConfig.forwarded`."""
        return self.flag.removeprefix("--").replace("-", "_")

    def problem(self, value: Any) -> str | None:
        """What is wrong with `value` (an env var's value escapes argparse's choices), or None."""
        if self.choices is not None and value is not None and value not in self.choices:
            return f"{self.flag} must be one of {', '.join(self.choices)}, got {value!r}"
        return None if self.check is None else self.check(self.flag, value)


def switch(flag: str, child: Child, help_text: str) -> Forwarded:
    """A forwarded on/off flag without a value."""
    return Forwarded(flag, child, bool_value, False, help_text, switch=True)


def add_forwarded(add: FlagAdder, entries: Iterable[Forwarded]) -> None:
    """Adds each entry as a launcher flag, reading its env var like every launcher flag."""
    for entry in entries:
        if entry.switch:
            add.switch(entry.flag, entry.help)
        elif entry.alone is not None:
            add.value(entry.flag, entry.kind, entry.default, entry.help, nargs="?", const=entry.alone)
        elif entry.choices is not None:
            add.value(entry.flag, entry.kind, entry.default, entry.help, choices=entry.choices)
        else:
            add.value(entry.flag, entry.kind, entry.default, entry.help)


def defaults(entries: Iterable[Forwarded]) -> dict[str, Any]:
    """Every entry's built-in default, by `dest`."""
    return {entry.dest: entry.default for entry in entries}


def forwarded_argv(entries: Iterable[Forwarded], values: Mapping[str, Any]) -> list[str]:
    """The child's argv words for `values` (by `dest`), in table order."""
    argv: list[str] = []
    for entry in entries:
        value = values[entry.dest]
        if value is None or (entry.only_with is not None and values[entry.only_with] is None):
            continue
        if entry.switch:
            argv += [entry.flag] if value else []
        else:
            argv += [entry.flag, entry.word(value)]
    return argv


def forwarded_problems(entries: Iterable[Forwarded], values: Mapping[str, Any]) -> list[str]:
    """One message per entry whose value in `values` is wrong."""
    problems = (entry.problem(values[entry.dest]) for entry in entries)
    return [problem for problem in problems if problem is not None]
