"""Supervision of one node of a multi-node group, with fake children: any lost peer or rank ends the launch with
status 1 (the group restarts as a whole), never an in-place restart, and no process is left behind."""

from __future__ import annotations

from pathlib import Path

import pytest
from launch_harness import pid_is_alive
from tandem_launcher.commands import free_tcp_port


@pytest.fixture
def secret(tmp_path: Path) -> str:
    path = tmp_path / "cluster-secret"
    path.write_text("s3cret\n")
    return str(path)


def group(secret: str, node_rank: int, **extra: object) -> dict[str, object]:
    return {
        "num_shard": 2,
        "nnodes": 2,
        "node_rank": node_rank,
        "master_port": free_tcp_port(),  # nobody listens there: the leader is gone
        "shard_grpc_port": free_tcp_port(),  # nor there: the worker's rank is gone
        "worker_addr": ["127.0.0.1"],
        "cluster_secret_file": secret,
        "shard_health_timeout": 1.0,
        **extra,
    }


def test_a_worker_whose_leader_is_gone_exits_without_a_router(launch_fakes, secret: str) -> None:
    config = group(secret, 1)
    launch = launch_fakes(**config)
    assert launch.finish(timeout=30) == 1, launch.output
    assert f"the leader's rendezvous at 127.0.0.1:{config['master_port']} has not answered for 1s" in launch.output
    assert "a multi-node group restarts only as a whole: stopping this node" in launch.output
    assert "ranks 1..1 of 2" in launch.output
    assert not [event for event in launch.events() if event.startswith("router pid")]
    shard_argv = next(event for event in launch.events() if event.startswith("shard-1 pid"))
    assert "--grpc-port" in shard_argv and "--cluster-secret-file" in shard_argv
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_a_leader_whose_worker_rank_is_gone_exits_after_its_router(launch_fakes, secret: str) -> None:
    config = group(secret, 0)
    launch = launch_fakes(**config)
    assert launch.finish(timeout=30) == 1, launch.output
    target = f"127.0.0.1:{config['shard_grpc_port']}"
    assert f"shard-1 on node 1 ({target}) has not answered for 1s" in launch.output
    router_argv = next(event for event in launch.events() if event.startswith("router pid"))
    assert f"--shard-uri http://{target}" in router_argv
    assert "router stopped" in launch.events()
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())


def test_a_crashed_rank_ends_a_node_of_a_group_instead_of_restarting(launch_fakes, secret: str) -> None:
    launch = launch_fakes(shard="crash-after-ready", shard_args=("--crash-delay", "0.5"), **group(secret, 1))
    assert launch.finish(timeout=30) == 1, launch.output
    assert "shard-1 exited with status" in launch.output
    assert "restarting all" not in launch.output
    assert all(not pid_is_alive(pid) for pid in launch.child_pids())
