"""A real Prometheus scrapes the router and the shard under load; every dashboard panel's query returns data."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import requests
from metrics_scrape import MetricsTandem, send_mixed_load
from tandem_harness import free_port

DASHBOARD = Path(__file__).resolve().parents[1] / "charts" / "tandem" / "dashboards" / "tandem.json"
SCRAPE_INTERVAL_S = 1
TARGETS_UP_TIMEOUT_S = 30.0
LOAD_ROUNDS = 3
# Grafana fills $__rate_interval in; a window over the whole short test stands in for it.
RATE_INTERVAL = "2m"
# A histogram has no series before its first observation, and this server runs without --speculate: the panels over
# these answer (the query is valid) but hold no data. The chart tests check their names against docs/metrics.md.
RECORDED_ONLY_WHILE_DRAFTING = ("tandem_speculative_accepted_length_",)


def panel_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of the dashboard."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], target["expr"].replace("$__rate_interval", RATE_INTERVAL))
        for panel in dashboard["panels"]
        for target in panel["targets"]
    ]


@pytest.fixture(scope="module")
def prometheus(metrics_tandem: MetricsTandem, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus on loopback scraping the router and rank 0's shard every second; its base URL."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus (Debian package prometheus) is not installed")
    workdir = tmp_path_factory.mktemp("prometheus")
    router = urlsplit(metrics_tandem.server.base_url).netloc
    shard = f"127.0.0.1:{metrics_tandem.shard_metrics_port}"
    config = workdir / "prometheus.yml"
    config.write_text(
        f"global:\n  scrape_interval: {SCRAPE_INTERVAL_S}s\n  evaluation_interval: {SCRAPE_INTERVAL_S}s\n"
        f"scrape_configs:\n"
        f"  - job_name: tandem-router\n    static_configs: [{{targets: ['{router}']}}]\n"
        f"  - job_name: tandem-shard\n    static_configs: [{{targets: ['{shard}']}}]\n"
    )
    port = free_port()
    argv = [
        binary, f"--config.file={config}", f"--storage.tsdb.path={workdir / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]  # fmt: skip
    with (workdir / "prometheus.log").open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        base_url = f"http://127.0.0.1:{port}"
        wait_for_targets_up(base_url, process, workdir / "prometheus.log")
        yield base_url
    finally:
        process.terminate()
        process.wait(timeout=30)


def wait_for_targets_up(base_url: str, process: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + TARGETS_UP_TIMEOUT_S
    while time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")
        try:
            targets = requests.get(f"{base_url}/api/v1/targets", timeout=2).json()["data"]["activeTargets"]
            if len(targets) == 2 and all(target["health"] == "up" for target in targets):
                return
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    raise AssertionError(f"targets not up after {TARGETS_UP_TIMEOUT_S}s:\n{log.read_text(errors='replace')}")


def query(base_url: str, promql: str) -> list[dict[str, object]]:
    answer = requests.get(f"{base_url}/api/v1/query", params={"query": promql}, timeout=10).json()
    assert answer["status"] == "success", (promql, answer)
    return answer["data"]["result"]


def test_every_dashboard_panel_query_returns_data_under_load(metrics_tandem: MetricsTandem, prometheus: str) -> None:
    for _ in range(LOAD_ROUNDS):
        send_mixed_load(metrics_tandem)
        time.sleep(SCRAPE_INTERVAL_S * 2)
    time.sleep(SCRAPE_INTERVAL_S * 2)
    answers = [(title, promql, query(prometheus, promql)) for title, promql in panel_queries()]
    empty = [
        (title, promql)
        for title, promql, result in answers
        if not result and not any(series in promql for series in RECORDED_ONLY_WHILE_DRAFTING)
    ]
    assert not empty, f"queries without data: {empty}"
    drafting_only = [title for title, promql, _ in answers if any(s in promql for s in RECORDED_ONLY_WHILE_DRAFTING)]
    assert drafting_only == ["Speculative mean accepted length"]
    (info,) = query(prometheus, "tandem_info")
    assert info["metric"]["device"] == "cpu"
