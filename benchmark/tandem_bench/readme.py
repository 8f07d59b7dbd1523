"""Rewrites the README's benchmark section between its marker comments."""

from __future__ import annotations

START_MARKER = "<!-- bench:start -->"
END_MARKER = "<!-- bench:end -->"


def replace_between_markers(text: str, block: str) -> str:
    """`text` with everything between the markers replaced by `block`; the markers themselves stay."""
    start = text.find(START_MARKER)
    end = text.find(END_MARKER)
    if start < 0 or end < start:
        raise ValueError(f"the README needs {START_MARKER} followed by {END_MARKER}")
    return f"{text[: start + len(START_MARKER)]}\n{block.strip()}\n{text[end:]}"
