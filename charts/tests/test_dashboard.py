"""The Grafana dashboard the chart ships: panels laid out without overlap, every query on the datasource variable and
over series docs/metrics.md lists (so a renamed or misspelt series fails here, not as an empty panel)."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "charts" / "tandem" / "dashboards" / "tandem.json"
METRICS_DOC = ROOT / "docs" / "metrics.md"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
SERIES = re.compile(r"\b(?:tandem_|vllm:)[a-z0-9_:]+")
DOC_ROW = re.compile(r"^\| `((?:tandem_|vllm:)[a-z0-9_:]+)` \| (\w+) \|", re.MULTILINE)


def panels() -> list[dict[str, Any]]:
    return json.loads(DASHBOARD.read_text())["panels"]


def documented_types() -> dict[str, str]:
    """Series name -> Prometheus type, from the tables of docs/metrics.md."""
    return dict(DOC_ROW.findall(METRICS_DOC.read_text()))


def exposed_series(name: str, types: dict[str, str]) -> bool:
    """Whether `name` is a documented series or a `_bucket`/`_sum`/`_count` of a documented histogram."""
    if name in types:
        return types[name] != "histogram"
    return any(
        name.endswith(suffix) and types.get(name.removesuffix(suffix)) == "histogram" for suffix in HISTOGRAM_SUFFIXES
    )


def test_panel_ids_are_unique_and_panels_do_not_overlap() -> None:
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    cells = {
        panel["id"]: {
            (x, y)
            for x in range(panel["gridPos"]["x"], panel["gridPos"]["x"] + panel["gridPos"]["w"])
            for y in range(panel["gridPos"]["y"], panel["gridPos"]["y"] + panel["gridPos"]["h"])
        }
        for panel in panels()
    }
    for (a, cells_a), (b, cells_b) in itertools.combinations(cells.items(), 2):
        assert not cells_a & cells_b, (a, b)
    assert all(x + 1 <= 24 for panel_cells in cells.values() for x, _ in panel_cells)


def test_every_panel_and_query_uses_the_datasource_variable() -> None:
    for panel in panels():
        assert panel["datasource"] == DATASOURCE, panel["title"]
        ref_ids = [target["refId"] for target in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)) > 0, panel["title"]
        assert all(target["datasource"] == DATASOURCE for target in panel["targets"]), panel["title"]


@pytest.mark.parametrize("panel", panels(), ids=lambda panel: panel["title"])
def test_every_query_reads_series_the_metrics_doc_lists(panel: dict[str, Any]) -> None:
    types = documented_types()
    names = {name for target in panel["targets"] for name in SERIES.findall(target["expr"])}
    assert names, panel["title"]
    assert sorted(name for name in names if not exposed_series(name, types)) == []


def test_the_doc_check_rejects_an_unknown_series_and_a_counter_read_as_a_histogram() -> None:
    types = documented_types()
    assert types["tandem_speculative_accepted_length"] == "histogram"
    assert exposed_series("tandem_speculative_accepted_length_sum", types)
    assert not exposed_series("tandem_speculative_acceptance_ratio", types)
    assert not exposed_series("tandem_speculative_draft_tokens_total_sum", types)
    assert not exposed_series("tandem_speculative_accepted_length", types)


def test_speculative_decoding_has_acceptance_rate_throughput_and_mean_length_panels() -> None:
    queries = {
        panel["title"]: " ".join(target["expr"] for target in panel["targets"])
        for panel in panels()
        if "speculative" in panel["title"].lower()
    }
    acceptance = queries["Speculative acceptance rate"]
    assert "sum by (method)" in acceptance
    assert acceptance.index("tandem_speculative_accepted_tokens_total") < acceptance.index("/")
    assert "tandem_speculative_draft_tokens_total" in acceptance.split("/", 1)[1]
    throughput = queries["Speculative draft and accepted tokens"]
    assert {"tandem_speculative_draft_tokens_total", "tandem_speculative_accepted_tokens_total"} <= set(
        SERIES.findall(throughput)
    )
    length = queries["Speculative mean accepted length"]
    assert length.index("tandem_speculative_accepted_length_sum") < length.index("/")
    assert length.index("/") < length.index("tandem_speculative_accepted_length_count")
