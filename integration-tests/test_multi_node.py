"""Two launchers on this machine act as two nodes (distinct ports on 127.0.0.1): rank 0 with the router on the
leader, rank 1 on the worker, reached over TCP with the cluster secret; one TP = 2 group over gloo."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
from reference import Reference
from tandem_harness import (
    LAUNCHER,
    MAX_INPUT_TOKENS,
    MAX_TOTAL_TOKENS,
    TandemServer,
    all_gone,
    free_port,
    model_cache_dir,
)

MAX_NEW_TOKENS = 16
PROMPTS = ("The capital of France is", "def fibonacci(n):\n")
# How long a silent node may go unnoticed; short, so losing one ends the launch within seconds.
PEER_TIMEOUT_S = 4


@dataclass
class NodePorts:
    """What both nodes must agree on: the rendezvous and the worker's shard port; and the shared secret."""

    master_port: int
    shard_grpc_port: int
    secret_file: Path

    def flags(self, node_rank: int, *extra: str) -> list[str]:
        return [
            "--model-cache-dir", str(model_cache_dir()),
            "--device", "cpu",
            "--num-shard", "2",
            "--nnodes", "2",
            "--node-rank", str(node_rank),
            "--master-addr", "127.0.0.1",
            "--master-port", str(self.master_port),
            "--shard-grpc-port", str(self.shard_grpc_port),
            "--worker-addr", "127.0.0.1",
            "--cluster-secret-file", str(self.secret_file),
            "--shard-health-timeout", str(PEER_TIMEOUT_S),
            "--kv-cache-memory", "128MiB",
            "--max-input-tokens", str(MAX_INPUT_TOKENS),
            "--max-total-tokens", str(MAX_TOTAL_TOKENS),
            *extra,
        ]  # fmt: skip


def node_ports(directory: Path) -> NodePorts:
    secret_file = directory / "cluster-secret"
    secret_file.write_text("a-shared-secret-for-the-test\n")
    secret_file.chmod(0o600)
    return NodePorts(free_port(), free_port(), secret_file)


def start_worker(ports: NodePorts, log_path: Path) -> subprocess.Popen[bytes]:
    # Eager, as the leader's harness runs it (tandem_harness.TandemServer.start).
    argv = [str(LAUNCHER), "--hostname", "127.0.0.1", "--port", str(free_port()), *ports.flags(1)]
    argv += ["--torch-compile", "off"]
    with log_path.open("wb") as log:
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)


@dataclass
class TwoNodes:
    leader: TandemServer
    worker: subprocess.Popen[bytes]
    worker_log: Path
    start_seconds: float


def start_group(directory: Path) -> TwoNodes:
    """Starts the worker's launcher, then the leader's, and waits until the leader's router is healthy."""
    ports = node_ports(directory)
    started = time.monotonic()
    worker = start_worker(ports, directory / "worker.log")
    try:
        leader = TandemServer.start(directory / "leader.log", *ports.flags(0))
    except RuntimeError:
        worker.kill()
        raise
    return TwoNodes(leader, worker, directory / "worker.log", time.monotonic() - started)


def descendants_of(group: TwoNodes) -> list[psutil.Process]:
    launchers = [psutil.Process(group.leader.process.pid), psutil.Process(group.worker.pid)]
    return [child for launcher in launchers for child in launcher.children(recursive=True)]


def assert_all_gone(processes: list[psutil.Process]) -> None:
    deadline = time.monotonic() + 20
    while not all_gone(processes) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all_gone(processes), [process.pid for process in processes if process.is_running()]


def stop_group(group: TwoNodes) -> None:
    for process in (group.leader.process, group.worker):
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in (group.leader.process, group.worker):
        try:
            process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            process.kill()
            raise


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory, tandem: TandemServer) -> Iterator[TwoNodes]:
    """The group, started after the session server converted the model; the last test using it kills its worker."""
    group = start_group(tmp_path_factory.mktemp("two-nodes"))
    print(f"two-node TP=2 group healthy {group.start_seconds:.1f}s after both launchers started")
    yield group
    stop_group(group)


def test_two_nodes_serve_one_group_of_two_ranks(two_nodes: TwoNodes) -> None:
    assert two_nodes.leader.info()["num_shard"] == 2
    worker_log = two_nodes.worker_log.read_text(errors="replace")
    assert "serving on tcp 127.0.0.1:" in worker_log and "cluster secret required" in worker_log


def test_two_nodes_give_the_greedy_tokens_of_one_shard(
    tandem: TandemServer, two_nodes: TwoNodes, reference: Reference
) -> None:
    for prompt in PROMPTS:
        expected = tandem.generate_ids(prompt, MAX_NEW_TOKENS)
        actual = two_nodes.leader.generate_ids(prompt, MAX_NEW_TOKENS)
        print(f"{prompt!r}: TP=1 {expected}, two nodes {actual}")
        assert len(actual) == len(expected) > 0, f"{prompt!r}: {actual} vs {expected}"
        # Row-parallel sums round differently from one matmul, so only a genuine near-tie may flip a token.
        reference.assert_same_greedy(prompt, expected, actual)


def test_killing_the_worker_launcher_ends_the_leader_with_no_process_left(two_nodes: TwoNodes) -> None:
    """Runs last: the leader notices the silent rank, stops its router and shard, and exits 1 for a group restart."""
    descendants = descendants_of(two_nodes)
    assert len(descendants) >= 3  # the router, rank 0 and rank 1
    killed = time.monotonic()
    two_nodes.worker.send_signal(signal.SIGKILL)
    status = two_nodes.leader.process.wait(timeout=PEER_TIMEOUT_S + 60)
    print(f"leader exited {time.monotonic() - killed:.1f}s after the worker launcher was killed")
    assert status == 1, two_nodes.leader.log_tail()
    log = two_nodes.leader.log_path.read_text(errors="replace")
    assert "shard-1 on node 1" in log and "restarts only as a whole" in log
    assert_all_gone(descendants)


def test_killing_the_leader_launcher_ends_the_worker_with_no_process_left(tmp_path: Path, tandem: TandemServer) -> None:
    """A group of its own (started once `tandem` converted the model): the worker notices that its leader's rendezvous
    port closed, stops its rank, and exits 1 for a group restart."""
    group = start_group(tmp_path)
    try:
        descendants = descendants_of(group)
        killed = time.monotonic()
        group.leader.process.send_signal(signal.SIGKILL)
        status = group.worker.wait(timeout=PEER_TIMEOUT_S + 60)
        print(f"worker exited {time.monotonic() - killed:.1f}s after the leader launcher was killed")
        log = group.worker_log.read_text(errors="replace")
        assert status == 1, log[-3000:]
        assert "the leader's rendezvous at 127.0.0.1:" in log and "restarts only as a whole" in log
        assert_all_gone(descendants)
    finally:
        stop_group(group)


def test_a_leader_alone_names_the_rank_that_never_arrived(tmp_path: Path) -> None:
    ports = node_ports(tmp_path)
    log_path = tmp_path / "leader.log"
    argv = [str(LAUNCHER), "--hostname", "127.0.0.1", "--port", str(free_port())]
    argv += ports.flags(0, "--rendezvous-timeout", "3")
    with log_path.open("wb") as log:
        status = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, timeout=180, check=False).returncode
    output = log_path.read_text(errors="replace")
    assert status == 1, output
    expected = f"rank(s) 1 of 2 never arrived at the rendezvous at 127.0.0.1:{ports.master_port} (gloo over"
    assert expected in output, output
    assert "GLOO_SOCKET_IFNAME=lo" in output
