"""The fake children accept the flags the launcher forwards to the real ones, each required unless it may be unset."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from tandem_launcher.forwarded import Forwarded


def add_forwarded_flags(parser: argparse.ArgumentParser, entries: Iterable[Forwarded]) -> None:
    """Switches are optional; a flag with a default and no condition must be on the argv."""
    for entry in entries:
        if entry.switch:
            parser.add_argument(entry.flag, action="store_true")
        else:
            always = entry.default is not None and entry.only_with is None
            parser.add_argument(entry.flag, choices=entry.choices, required=always)
