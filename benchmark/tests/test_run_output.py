"""A measurement's ending: the command as run, its table, and its results as JSON where `--output` names a file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tandem_bench.run_output import print_and_save


def test_the_command_and_table_are_printed_and_the_results_written_where_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "nested" / "kv.json"
    print_and_save("tandem-bench kv-memory", ["--fill", "2 x"], "| table |", {"peak": 1491}, output)
    printed = capsys.readouterr().out
    assert printed == f"\n`tandem-bench kv-memory --fill '2 x'`\n| table |\nresults: {output}\n"
    assert json.loads(output.read_text()) == {"peak": 1491}
    print_and_save("tandem-bench soak", [], "| other |", {}, None)
    assert "results" not in capsys.readouterr().out
