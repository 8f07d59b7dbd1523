"""Supervision with fake children: shard-group restarts with backoff, the restart budget, hung shards,
a second signal that aborts at once, and no process left behind on any path."""

from __future__ import annotations

import signal
import time

import pytest
from launch_harness import pid_is_alive

# The slow tier (waits out restart back-offs and health timeouts): `make test` runs it, `make test-fast` does not.
pytestmark = pytest.mark.slow

# Failing while the router starts is a start-up failure (never restarted); these fail once serving.
CRASH_AFTER_START_UP = ("--crash-delay", "2")


def shard_pids(launch) -> list[int]:
    return [int(event.split()[2]) for event in launch.events() if event.startswith("shard-") and " pid " in event]


def test_a_crashed_shard_group_is_restarted_while_the_router_stays_up(launch_fakes) -> None:
    launch = launch_fakes(shard="crash-once", num_shard=2, shard_args=CRASH_AFTER_START_UP)
    launch.wait_for_output("shards restarted", timeout=30)
    assert "restarting all 2 shard(s) in 1s (restart 1 of at most 3 within 600s)" in launch.output
    assert "fake shard" in launch.output and "device lost" in launch.output
    assert len(shard_pids(launch)) == 4  # two generations of two ranks
    assert len([event for event in launch.events() if event.startswith("router pid")]) == 1
    first_generation = shard_pids(launch)[:2]
    assert all(not pid_is_alive(pid) for pid in first_generation)
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_restarts_back_off_and_the_launcher_exits_non_zero_when_the_budget_is_spent(launch_fakes) -> None:
    started = time.monotonic()
    launch = launch_fakes(shard="crash-after-ready", max_restarts=2, shard_args=CRASH_AFTER_START_UP)
    assert launch.finish(timeout=40) == 1, launch.output
    assert "in 1s (restart 1 of at most 2 within 600s)" in launch.output
    assert "in 2s (restart 2 of at most 2 within 600s)" in launch.output
    assert "giving up: 2 restart(s) within 600s already used (--max-restarts)" in launch.output
    assert len(shard_pids(launch)) == 3
    assert time.monotonic() - started >= 3.0  # the two backoffs alone
    assert "router stopped" in launch.events()
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_a_shard_that_stops_answering_health_is_killed_and_counted_as_a_failure(launch_fakes) -> None:
    launch = launch_fakes(
        shard="freeze-after-ready",
        shard_args=CRASH_AFTER_START_UP,
        max_restarts=1,
        shard_health_timeout=1.0,
        graceful_termination_timeout=1.0,
    )
    assert launch.finish(timeout=40) == 1, launch.output
    assert "shard-0 has not answered Health for 1s" in launch.output
    assert "shard-0 exited with status -9" in launch.output  # frozen: SIGTERM is not enough
    assert "giving up: 1 restart(s)" in launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_shards_that_answer_health_are_left_running_past_the_health_timeout(launch_fakes) -> None:
    launch = launch_fakes(num_shard=2, shard_health_timeout=1.0)
    launch.wait_for_output("Tandem is ready")
    time.sleep(3.0)
    assert "has not answered" not in launch.output and len(shard_pids(launch)) == 2
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output


def test_a_second_signal_during_the_drain_kills_everything_at_once(launch_fakes) -> None:
    launch = launch_fakes(router="slow-drain", shard_args=("--grandchild",), graceful_termination_timeout=60.0)
    launch.wait_for_output("Tandem is ready")
    launch.process.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while "router draining" not in launch.events() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "router draining" in launch.events()
    aborted_at = time.monotonic()
    launch.process.send_signal(signal.SIGINT)
    assert launch.finish(timeout=10) == 1, launch.output
    assert time.monotonic() - aborted_at < 3.0
    assert "received a second SIGINT: killing every child now" in launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_processes_started_by_a_child_do_not_outlive_an_orderly_shutdown(launch_fakes) -> None:
    launch = launch_fakes(shard_args=("--grandchild",), num_shard=2)
    launch.wait_for_output("Tandem is ready")
    grandchildren = [int(e.split()[2]) for e in launch.events() if e.startswith("grandchild-")]
    assert len(grandchildren) == 2 and all(pid_is_alive(pid) for pid in grandchildren)
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_children_die_with_a_launcher_killed_by_sigkill(launch_fakes) -> None:
    launch = launch_fakes(num_shard=2)
    launch.wait_for_output("Tandem is ready")
    children = [int(e.split()[2]) for e in launch.events() if " pid " in e]
    launch.process.send_signal(signal.SIGKILL)
    launch.finish()
    deadline = time.monotonic() + 5
    while any(pid_is_alive(pid) for pid in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert all(not pid_is_alive(pid) for pid in children)
