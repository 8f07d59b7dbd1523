"""The JSON results file: the invocation, then every run with its summary and per-request timings."""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from tandem_bench.runner import BenchConfig, RunRecord


def results_document(config: BenchConfig, records: list[RunRecord], command: str) -> dict[str, Any]:
    """Everything needed to reproduce and re-plot a benchmark."""
    return {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "baseline": config.endpoints[0].name,
        "servers": [{"name": e.name, "base_url": e.base_url, "api": e.api} for e in config.endpoints],
        "dataset": asdict(config.dataset),
        "runs": [record.to_dict() for record in records],
    }


def write_results(path: Path, document: dict[str, Any]) -> None:
    """Writes the document as indented JSON, creating parent folders."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
