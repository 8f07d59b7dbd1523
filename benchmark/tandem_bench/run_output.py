"""How a `tandem-bench` measurement ends: its command line and table on standard output, and its results as JSON
where `--output` names a file."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def print_and_save(command: str, argv: Sequence[str], table: str, results: dict[str, Any], output: Path | None) -> None:
    """Prints the command as run and `table`; writes `results` to `output` when given."""
    print(f"\n`{shlex.join([*command.split(), *argv])}`")
    print(table)
    if output:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"results: {output}")
