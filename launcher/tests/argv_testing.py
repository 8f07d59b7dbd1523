"""What the child-argv tests share: a resolved model and reading flag values back out of an argv."""

from __future__ import annotations

from pathlib import Path

from tandem_launcher.model_resolution import ResolvedModel

MODEL = ResolvedModel(path=Path("/models/m"), served_name="org/m", max_position_embeddings=4096)


def flag_values(argv: list[str]) -> dict[str, list[str]]:
    """Every `--flag value` pair of `argv`, values in order per flag."""
    values: dict[str, list[str]] = {}
    for index, word in enumerate(argv):
        if word.startswith("--") and index + 1 < len(argv) and not argv[index + 1].startswith("--"):
            values.setdefault(word, []).append(argv[index + 1])
    return values
