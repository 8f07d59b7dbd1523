"""The real launcher keeps to itself: killed by SIGKILL it leaves no shard or router running, the next start removes
the runtime directory it left, and a port held by another program fails the start before any API key is sent."""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from tandem_harness import FIRST_START_TIMEOUT_S, LAUNCHER, TandemServer, all_gone, model_cache_dir

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "launcher" / "tests"))

from squatter import Squatter, squatting

ORPHAN_DEADLINE_S = 10.0
API_KEY = "sk-isolation-test-key"


@dataclass
class KilledLaunch:
    children: list[psutil.Process]
    commands: list[str]
    runtime_dir: Path
    log: str


def runtime_dir_of(children: list[psutil.Process]) -> Path:
    for child in children:
        argv = child.cmdline()
        if "--uds-path" in argv:
            return Path(argv[argv.index("--uds-path") + 1]).parent
    raise AssertionError(f"no shard among {[child.cmdline()[:3] for child in children]}")


@pytest.fixture(scope="module")
def killed_launch(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KilledLaunch]:
    """A launcher serving the embedded model, then killed by SIGKILL; whatever it left running is killed after."""
    log_path = tmp_path_factory.mktemp("killed") / "launcher.log"
    flags = ("--model-cache-dir", str(model_cache_dir()), "--kv-cache-memory", "64MiB")
    server = TandemServer.start(log_path, *flags)
    children = psutil.Process(server.process.pid).children(recursive=True)
    runtime_dir = runtime_dir_of(children)
    commands = [" ".join(child.cmdline()) for child in children]
    server.process.send_signal(signal.SIGKILL)
    server.process.wait()
    deadline = time.monotonic() + ORPHAN_DEADLINE_S
    while not all_gone(children) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield KilledLaunch(children, commands, runtime_dir, server.log_tail())
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()


def test_a_launcher_killed_by_sigkill_leaves_no_shard_or_router_running(killed_launch: KilledLaunch) -> None:
    for program in ("tandem-router", "tandem-shard"):
        assert any(program in command for command in killed_launch.commands), killed_launch.commands
    assert all_gone(killed_launch.children), f"still running among {killed_launch.commands}\n{killed_launch.log}"
    assert killed_launch.runtime_dir.is_dir(), "a launcher killed by SIGKILL cannot remove its own directory"


@pytest.fixture
def squatter() -> Iterator[Squatter]:
    with squatting() as held:
        yield held


def test_a_squatted_port_fails_the_start_without_sending_the_key_and_the_stale_directory_goes(
    killed_launch: KilledLaunch, squatter: Squatter, tmp_path: Path
) -> None:
    argv = [
        str(LAUNCHER), "--hostname", "127.0.0.1", "--port", str(squatter.port), "--api-key", API_KEY,
        "--model-cache-dir", str(model_cache_dir()), "--kv-cache-memory", "64MiB",
    ]  # fmt: skip
    log_path = tmp_path / "launcher.log"
    with log_path.open("wb") as log:
        launcher = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        status = launcher.wait(timeout=FIRST_START_TIMEOUT_S)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    output = log_path.read_text(errors="replace")
    assert status == 1, output[-4000:]
    assert f"http://127.0.0.1:{squatter.port} is answered by another process" in output, output[-4000:]
    assert squatter.paths and squatter.authorizations == []
    assert f"removed {killed_launch.runtime_dir}" in output
    assert not killed_launch.runtime_dir.exists()
