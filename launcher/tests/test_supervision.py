"""The supervisor against fake children: start-up, readiness, failures, timeouts and orderly shutdown."""

from __future__ import annotations

import json
import signal
import time

from launch_harness import pid_is_alive


def test_sigterm_drains_router_first_then_stops_shards_and_exits_zero(launch_fakes) -> None:
    launch = launch_fakes(num_shard=2)
    launch.wait_for_output("Tandem is ready at http://127.0.0.1:")
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output
    stops = [event for event in launch.events() if event.endswith("stopped")]
    assert stops[0] == "router stopped"
    assert sorted(stops[1:]) == ["shard-0 stopped", "shard-1 stopped"]
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())
    assert launch.runtime_dirs() and all(not path.exists() for path in launch.runtime_dirs())


def test_sigint_stops_the_group_like_sigterm(launch_fakes) -> None:
    launch = launch_fakes()
    launch.wait_for_output("Tandem is ready")
    launch.process.send_signal(signal.SIGINT)
    assert launch.finish() == 0, launch.output
    assert "router stopped" in launch.events() and "shard-0 stopped" in launch.events()


def test_ready_message_reports_kv_capacity_from_router_info(launch_fakes) -> None:
    launch = launch_fakes(block_size=32)
    launch.wait_for_output("Tandem is ready")
    assert "KV cache: 100 blocks, 3200 tokens = 1 request(s) at the maximum length of 2048 tokens" in launch.output
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0


def test_shard_dying_without_a_restart_budget_takes_the_group_down_with_its_last_lines(launch_fakes) -> None:
    launch = launch_fakes(shard="crash-after-ready", max_restarts=0)
    assert launch.finish() == 1, launch.output
    assert "shard-0 exited with status 3" in launch.output
    assert "[shard-0] fake shard 0: device lost, aborting" in launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())
    assert all(not path.exists() for path in launch.runtime_dirs())


def test_router_dying_while_serving_stops_the_shards(launch_fakes) -> None:
    launch = launch_fakes(router="crash-after-ready")
    assert launch.finish() == 1, launch.output
    assert "router exited with status 4" in launch.output
    assert "lost connection to shard 0" in launch.output
    assert "shard-0 stopped" in launch.events()


def test_shard_failing_at_start_is_reported_with_its_output_and_the_router_never_starts(launch_fakes) -> None:
    launch = launch_fakes(shard="fail-at-start")
    assert launch.finish() == 1, launch.output
    assert "shard-0 exited with status 2 during start-up" in launch.output
    assert "unsupported architecture" in launch.output
    assert not any(event.startswith("router") for event in launch.events())


def test_shard_that_never_becomes_ready_hits_the_start_timeout(launch_fakes) -> None:
    started = time.monotonic()
    launch = launch_fakes(shard="never-ready", shard_start_timeout=1.5)
    assert launch.finish() == 1, launch.output
    assert "shard-0 was not ready after 1.5s" in launch.output
    assert "[shard-0] still loading ..." in launch.output
    assert time.monotonic() - started < 15
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_child_ignoring_sigterm_is_killed_after_the_grace_timeout(launch_fakes) -> None:
    launch = launch_fakes(shard="ignore-sigterm", graceful_termination_timeout=0.5)
    launch.wait_for_output("still loading")
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output
    assert "shard-0 exited with status -9" in launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_missing_child_program_is_a_clear_start_error(launch_fakes, tmp_path) -> None:
    launch = launch_fakes(shard_command=[str(tmp_path / "no-such-shard")])
    assert launch.finish() == 1, launch.output
    assert "cannot start shard-0" in launch.output and "no-such-shard" in launch.output


def test_json_output_tags_launcher_and_child_lines(launch_fakes) -> None:
    launch = launch_fakes(json_output=True)
    launch.wait_for_output("Tandem is ready")
    launch.process.send_signal(signal.SIGTERM)
    assert launch.finish() == 0, launch.output
    records = [json.loads(line) for line in launch.lines]
    targets = {record["target"] for record in records}
    assert {"launcher", "shard-0", "router"} <= targets
    assert any(record["message"].startswith("Tandem is ready") for record in records)
    assert "--json-output" in next(event for event in launch.events() if event.startswith("router pid"))


def test_unresolvable_model_fails_before_any_child_starts(launch_fakes, tmp_path) -> None:
    launch = launch_fakes(model_id=str(tmp_path / "no-model"))
    assert launch.finish() == 1
    assert "no such model directory" in launch.output
    assert launch.events() == []
