"""What a launch keeps to itself: its port (an API key goes only to its own router), its environment (children
get only what their libraries read), and its processes and runtime directory (nothing outlives a killed launcher
for long)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launch_harness import pid_is_alive
from squatter import Squatter, squatting
from tandem_launcher import processes
from tandem_launcher.child_environment import router_environment, shard_environment
from tandem_launcher.processes import ChildProcess, ChildStartError
from tandem_launcher.runtime_dir import OWNER_FILE_NAME, RuntimeDir, remove_stale_runtime_dirs

LAUNCHER_SECRETS = {
    "HF_TOKEN": "hf_secret",
    "HUGGING_FACE_HUB_TOKEN": "hf_secret",
    "API_KEY": "sk-env",
    "API_KEY_FILE": "/keys",
    "OPENAI_API_KEY": "sk-other",
    "AWS_SECRET_ACCESS_KEY": "aws",
    "NCCL_SOCKET_TOKEN": "nccl",
}
LAUNCHER_FLAG_VARIABLES = {"PORT": "1", "MAX_INPUT_TOKENS": "7", "LOG_REQUESTS": "true", "MODEL_ID": "x"}
LIBRARY_SETTINGS = {"NCCL_DEBUG": "INFO", "CUDA_VISIBLE_DEVICES": "0", "OMP_NUM_THREADS": "2", "RUST_LOG": "debug"}


@pytest.fixture
def squatter() -> Iterator[Squatter]:
    with squatting() as held:
        yield held


def test_a_squatted_port_fails_the_start_and_the_squatter_never_gets_the_key(launch_fakes, squatter) -> None:
    launch = launch_fakes(router="slow-warmup", port=squatter.port, api_key=("sk-launch-secret",))
    assert launch.finish() == 1, launch.output
    assert f"http://127.0.0.1:{squatter.port} is answered by another process" in launch.output
    assert "Tandem is ready" not in launch.output
    assert squatter.paths and squatter.authorizations == []
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_the_router_answers_health_with_the_launch_id_the_launcher_wrote(launch_fakes) -> None:
    launch = launch_fakes()
    launch.wait_for_output("Tandem is ready")
    argv = next(event for event in launch.events() if event.startswith("router pid")).split()
    launch_id_file = Path(argv[argv.index("--launch-id-file") + 1])
    assert launch_id_file.parent in launch.runtime_dirs()
    assert launch_id_file.stat().st_mode & 0o777 == 0o600
    assert len(launch_id_file.read_text()) == 32
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output


def test_children_get_only_the_variables_their_libraries_read(launch_fakes) -> None:
    environ = {**LAUNCHER_SECRETS, **LAUNCHER_FLAG_VARIABLES, **LIBRARY_SETTINGS}
    launch = launch_fakes(num_shard=2, environ=environ)
    launch.wait_for_output("Tandem is ready")
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output
    seen = {event.split()[0]: set(event.split()[2:]) for event in launch.events() if " environment " in event}
    assert set(seen) == {"router", "shard-0", "shard-1"}
    for child, names in seen.items():
        assert not names & {*LAUNCHER_SECRETS, *LAUNCHER_FLAG_VARIABLES}, child
        assert "PATH" in names, child
    assert {"NCCL_DEBUG", "CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS"} <= seen["shard-0"]
    assert "RUST_LOG" in seen["router"] and not seen["router"] & {"NCCL_DEBUG", "CUDA_VISIBLE_DEVICES"}


def test_the_environment_lists_keep_credentials_out_even_under_an_allowed_prefix() -> None:
    environ = {**LAUNCHER_SECRETS, "TOKENIZERS_PARALLELISM": "false", "LC_ALL": "C", "TORCH_HOME": "/t"}
    assert router_environment(environ) == {"TOKENIZERS_PARALLELISM": "false", "LC_ALL": "C"}
    assert shard_environment(environ) == {"LC_ALL": "C", "TORCH_HOME": "/t"}


def test_a_killed_launchers_runtime_dir_is_removed_by_the_next_start(launch_fakes) -> None:
    killed = launch_fakes()
    killed.wait_for_output("Tandem is ready")
    left_behind = killed.runtime_dirs()
    killed.process.send_signal(signal.SIGKILL)
    killed.finish()
    assert left_behind and all((path / OWNER_FILE_NAME).exists() for path in left_behind)
    restarted = launch_fakes()
    restarted.wait_for_output("Tandem is ready")
    assert all(not path.exists() for path in left_behind)
    assert all(f"removed {path}" in restarted.output for path in left_behind)
    restarted.process.send_signal(signal.SIGTERM)
    assert restarted.finish() == 0, restarted.output


def test_runtime_dirs_of_running_launchers_and_of_other_programs_are_kept(tmp_path: Path) -> None:
    running = RuntimeDir(tmp_path)
    foreign = tmp_path / "tandem-not-a-launch"
    foreign.mkdir()
    stale = tmp_path / "tandem-stale"
    stale.mkdir()
    (stale / OWNER_FILE_NAME).write_text(f"{os.getpid()} 1\n")  # this pid, but a process started at another time
    assert remove_stale_runtime_dirs(tmp_path) == [stale]
    assert running.path.exists() and foreign.exists() and not stale.exists()
    running.remove()


def test_a_child_whose_launcher_died_before_its_death_signal_was_armed_kills_itself(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    not_the_parent = os.getpid() + 1_000_000
    monkeypatch.setattr(processes.os, "getpid", lambda: not_the_parent)
    child = ChildProcess.spawn("orphan", ["sleep", "30"], lambda _name, _line: None)
    deadline = time.monotonic() + 5
    while child.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        assert child.poll() == -signal.SIGKILL
    finally:
        child.kill()


_FORK_HANDLER_CALLS: list[int] = []
_RECORD_FORKS = [False]


def _record_fork() -> None:
    if _RECORD_FORKS[0]:
        _FORK_HANDLER_CALLS.append(os.getpid())


os.register_at_fork(before=_record_fork)


def test_spawning_a_child_runs_no_fork_handlers_so_other_threads_locks_cannot_hang_it() -> None:
    """gRPC's fork handler waits for its own threads, and a forked child inherits every other thread's locks held:
    either can block a start forever. A child started without `preexec_fn` is cloned with `vfork`, which runs none."""
    _RECORD_FORKS[0] = True
    try:
        child = ChildProcess.spawn("quiet", ["true"], lambda _name, _line: None)
        assert child.wait(10.0) == 0
    finally:
        _RECORD_FORKS[0] = False
    assert _FORK_HANDLER_CALLS == []


def test_a_program_that_does_not_exist_fails_the_spawn_with_its_name() -> None:
    with pytest.raises(ChildStartError, match="no-such-tandem-program"):
        ChildProcess.spawn("missing", ["no-such-tandem-program"], lambda _name, _line: None)
