"""schemathesis over the served `/openapi.json`, positive and negative: no 5xx, every response as documented.

Generation requests are kept small by `schemathesis_hooks.py` (at most 4 new tokens, 2 sequences), so the run
is bounded; the number of cases run is printed (`pytest -s`) and must be above a floor."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import requests
from tandem_harness import TandemServer

SCHEMATHESIS = Path(sys.executable).parent / "schemathesis"
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)
MAX_EXAMPLES_PER_OPERATION = 50
MIN_CASES = 300
RUN_TIMEOUT_S = 900


def test_generated_requests_get_no_5xx_and_documented_responses(tandem: TandemServer, tmp_path: Path) -> None:
    spec = requests.get(f"{tandem.base_url}/openapi.json", timeout=30).json()
    assert len(spec["paths"]) == 15
    argv = [
        str(SCHEMATHESIS), "run", f"{tandem.base_url}/openapi.json",
        "--checks", ",".join(CHECKS),
        "--mode", "all",
        # Fuzzing only: the hooks shape generated bodies, not the schema's fixed examples.
        "--phases", "fuzzing",
        "--max-examples", str(MAX_EXAMPLES_PER_OPERATION),
        "--seed", "20261130",
        "--request-timeout", "120",
        "--no-shrink",
    ]  # fmt: skip
    hooks_dir = str(Path(__file__).parent)
    environ = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "schemathesis_hooks",
        "PYTHONPATH": os.pathsep.join(filter(None, [hooks_dir, os.environ.get("PYTHONPATH")])),
        "NO_COLOR": "1",
    }
    run = subprocess.run(
        argv, env=environ, cwd=tmp_path, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
    )
    summary = run.stdout[-6000:]
    print(summary)
    assert run.returncode == 0, summary + run.stderr[-2000:]
    generated = re.search(r"(\d+) generated", run.stdout)
    assert generated is not None, summary
    assert int(generated.group(1)) >= MIN_CASES, summary
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=10) == 0
