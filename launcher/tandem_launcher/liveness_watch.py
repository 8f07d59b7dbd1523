"""Notices, from a background thread, that a shard or another node of the group stopped answering.

Each launcher probes its own shards (a shallow `Health` over their sockets), so a hung shard restarts the group. In
a multi-node group the leader also probes each worker node's shards (a shallow `Health` over TCP, with the cluster
secret), and a worker probes the leader's rendezvous port, which rank 0 serves for as long as it lives. A peer silent
for the timeout ends the launch, so that the whole group restarts together (LeaderWorkerSet's
`RecreateGroupOnPodRestart`).
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Answers whether the shard or peer responded within the given seconds.
Probe = Callable[[float], bool]


@dataclass(frozen=True)
class Watched:
    """A named shard or peer and how to ask whether it is alive."""

    name: str
    probe: Probe
    # What the probe asks, named in the problem ("Health"); empty where the name already says it.
    question: str = ""

    def silence(self, timeout: float) -> str:
        """The problem once it has not answered for `timeout` seconds."""
        asked = f" {self.question}" if self.question else ""
        return f"{self.name} has not answered{asked} for {timeout:g}s"


def tcp_port_accepts(host: str, port: int, timeout: float) -> bool:
    """Whether `host:port` accepts a TCP connection within `timeout` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def shard_answers_health(target: str, timeout: float, secret_file: Path | None = None) -> bool:
    """Whether the shard at gRPC `target` (`unix://` socket or host:port) answers a shallow `Health` within `timeout`
    seconds; a remote shard is asked with the cluster secret read from `secret_file`."""
    import grpc  # noqa: PLC0415  (grpc is only needed once shards run)
    from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc  # noqa: PLC0415

    metadata = None
    if secret_file is not None:
        try:
            metadata = (("authorization", f"Bearer {secret_file.read_text(encoding='utf-8').strip()}"),)
        except OSError:
            return False
    with grpc.insecure_channel(target) as channel:
        try:
            shard_pb2_grpc.ShardServiceStub(channel).Health(
                shard_pb2.HealthRequest(deep=False), timeout=timeout, metadata=metadata
            )
        except grpc.RpcError:
            return False
    return True


class LivenessWatch:
    """Probes everything watched each interval; the first one silent for `timeout` seconds becomes the problem."""

    def __init__(self, watched: Sequence[Watched], timeout: float, probe_timeout: float) -> None:
        self._watched = list(watched)
        self._timeout = timeout
        self._interval = max(0.2, timeout / 4)
        # No single probe waits longer than this, nor longer than the interval.
        self._probe_timeout = min(self._interval, probe_timeout)
        self._stop = threading.Event()
        self._problem: str | None = None
        self._thread = threading.Thread(target=self._run, name="liveness-watch", daemon=True)

    def start(self) -> LivenessWatch:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self._timeout + self._probe_timeout + 1.0)

    def problem(self) -> str | None:
        """Which shard or peer went silent, and for how long; None while all answer."""
        return self._problem

    def _run(self) -> None:
        last_answer = [time.monotonic()] * len(self._watched)
        while not self._stop.wait(self._interval):
            for index, watched in enumerate(self._watched):
                now = time.monotonic()
                if watched.probe(self._probe_timeout):
                    last_answer[index] = now
                elif now - last_answer[index] >= self._timeout and not self._stop.is_set():
                    self._problem = watched.silence(self._timeout)
                    return
