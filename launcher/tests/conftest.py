"""Shared fixtures: a minimal model directory and a harness that runs the launcher against fake children."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from launch_harness import LaunchUnderTest, pid_is_alive
from tandem_launcher.commands import free_tcp_port

FAKES = Path(__file__).parent / "fakes"


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    """Just the files model resolution checks for; fake children never read the weights."""
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps({"max_position_embeddings": 2048}))
    (directory / "tokenizer.json").write_text("{}")
    (directory / "model.safetensors").write_bytes(b"")
    return directory


@pytest.fixture
def launch_fakes(tmp_path: Path, model_dir: Path) -> Iterator[Any]:
    """Starts the launcher with fake children acting out the given behaviours; cleans up whatever is left."""
    started: list[LaunchUnderTest] = []

    def start(
        shard: str = "serve",
        router: str = "serve",
        shard_command: list[str] | None = None,
        shard_args: tuple[str, ...] = (),
        environ: dict[str, str] | None = None,
        **config: Any,
    ):
        events = tmp_path / "events.log"
        fake_shard = [
            sys.executable, str(FAKES / "fake_shard.py"), "--behaviour", shard, "--events", str(events), *shard_args
        ]  # fmt: skip
        fake_router = [sys.executable, str(FAKES / "fake_router.py"), "--behaviour", router, "--events", str(events)]
        values = {
            "model_id": str(model_dir),
            "port": free_tcp_port(),
            "graceful_termination_timeout": 5.0,
            "commands": {
                "shard": shard_command or fake_shard,
                "router": fake_router,
            },
            **config,
        }
        process = subprocess.Popen(
            [sys.executable, str(FAKES / "run_launcher.py"), json.dumps(values)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, **(environ or {})},
        )
        launch = LaunchUnderTest(process, events)
        started.append(launch)
        return launch

    yield start
    for launch in started:
        if launch.process.poll() is None:
            launch.process.send_signal(signal.SIGKILL)
            launch.process.wait()
        for pid in launch.child_pids():
            if pid_is_alive(pid):
                os.kill(pid, signal.SIGKILL)
