"""Starts the shards then the router, restarts the shard group when it fails, and stops everything in order.

In a multi-node group the leader (node 0) runs the router and its local ranks, a worker node only its local ranks;
a failure on any node ends that node's launch with status 1, so that the whole group restarts together.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from tandem_launcher.api_keys import first_key, write_key_file
from tandem_launcher.child_environment import router_environment, shard_environment
from tandem_launcher.cluster import worker_addresses
from tandem_launcher.commands import free_tcp_port, probe_base_url, router_argv, shard_argv
from tandem_launcher.config import LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.liveness_watch import LivenessWatch, Watched, shard_answers_health, tcp_port_accepts
from tandem_launcher.logs import LOGGER, forward_child_line, phase
from tandem_launcher.model_resolution import ResolvedModel
from tandem_launcher.processes import ChildProcess, ChildStartError, LineSink, stop_children
from tandem_launcher.readiness import (
    POLL_INTERVAL_S,
    PROBE_TIMEOUT_S,
    ChildExitedError,
    RouterIdentityError,
    StartTimeoutError,
    fetch_router_info,
    router_is_healthy,
    shard_is_ready,
    wait_until_ready,
)
from tandem_launcher.restarts import RestartBudget, RestartBudgetSpentError
from tandem_launcher.runtime_dir import RuntimeDir
from tandem_launcher.signals import AbortRequested, ShutdownFlag, ShutdownRequested

# A failed group is stopped quickly: a surviving rank may hang in a collective waiting for the dead one.
FAILED_GROUP_STOP_TIMEOUT_S = 10.0
# The router drains for --graceful-termination-timeout, then needs a moment to close its connections.
ROUTER_EXIT_MARGIN_S = 10.0
# The longest one Health probe of a local shard waits (a peer's probe waits PROBE_TIMEOUT_S).
LOCAL_SHARD_PROBE_TIMEOUT_S = 5.0


class GroupLostError(Exception):
    """A multi-node group lost a rank or a node: it restarts only as a whole, so this node's launch ends."""

    def __init__(self, failure: str) -> None:
        super().__init__(f"{failure}\na multi-node group restarts only as a whole: stopping this node")


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: the configuration, the resolved model and the derived token limits."""

    config: LauncherConfig
    model: ResolvedModel
    limits: TokenLimits


class Supervisor:
    """Owns the child processes of one launch and the runtime directory holding their sockets."""

    def __init__(self, plan: LaunchPlan, shutdown: ShutdownFlag, sink: LineSink = forward_child_line) -> None:
        self._plan = plan
        self._shutdown = shutdown
        self._sink = sink
        self._shards: list[ChildProcess] = []
        self._router: ChildProcess | None = None
        self._watch: LivenessWatch | None = None
        self._peers: LivenessWatch | None = None
        self._budget = RestartBudget(plan.config.max_restarts, plan.config.restart_window)
        # A 0700 directory: sockets, the key file and the launch id are the launching user's alone.
        self._runtime = RuntimeDir()
        self._key_file = write_key_file(self._runtime.path, plan.config.api_key)
        self._groups_started = 0

    def run(self) -> int:
        """Serves until a shutdown signal (exit 0), a failure it cannot restart from, or an abort (exit 1)."""
        try:
            return self._run_then_stop()
        except AbortRequested as request:
            LOGGER.error("%s: killing every child now", request)
            for child in self._children():
                child.kill()
            return 1
        finally:
            self._stop_watch()
            for child in self._children():
                child.kill_group()  # no child, nor anything it started, outlives the launcher
            self._runtime.remove()

    def _run_then_stop(self) -> int:
        try:
            config = self._plan.config
            with phase(f"start {config.layout.local} shard(s) on {config.device}{_node_label(config)}"):
                self._start_shards()
            if config.is_leader:
                self._start_router()
            else:
                self._watch_peers(_leader_peer(config))
                LOGGER.info("worker node %d: its ranks serve the leader's router over TCP", config.node_rank)
            return self._serve()
        except ShutdownRequested:
            LOGGER.info("shutdown requested during start-up or restart")
            return 0
        except (
            ChildExitedError, StartTimeoutError, ChildStartError, RestartBudgetSpentError, RouterIdentityError,
        ) as error:  # fmt: skip
            LOGGER.error("%s", error)
            return 1
        except GroupLostError as error:
            LOGGER.error("%s", error)
            # The surviving ranks may hang in a collective with the lost one: they get the short stop.
            self._stop_shards(min(self._plan.config.graceful_termination_timeout, FAILED_GROUP_STOP_TIMEOUT_S))
            return 1
        finally:
            self._stop_all()

    def reload_router_keys(self) -> None:
        """SIGHUP: the router reads its key files again."""
        if self._router is not None and self._router.poll() is None:
            LOGGER.info("SIGHUP: the router reloads its API key files")
            self._router.signal(signal.SIGHUP)

    def _children(self) -> list[ChildProcess]:
        return [*self._shards, *([self._router] if self._router else [])]

    def _uds_paths(self) -> list[Path]:
        """This node's shard sockets, by local rank."""
        return [self._runtime.path / f"shard-{local}.sock" for local in range(self._plan.config.layout.local)]

    def _start_shards(self) -> None:
        """Spawns every rank (same socket paths each time, a fresh rendezvous port) and waits until all answer.

        Only the first group gets the test-only fault flags, so the group restarted after a fault runs clean."""
        config = self._plan.config
        # One node picks a fresh port each time; the nodes of a group meet at the one they were all given.
        master_port = free_tcp_port() if config.nnodes == 1 else config.master_port
        first_group = self._groups_started == 0
        self._groups_started += 1
        for local, uds_path in enumerate(self._uds_paths()):
            uds_path.unlink(missing_ok=True)
            argv = shard_argv(config, self._plan.model, local, uds_path, master_port, inject_faults=first_group)
            name = f"shard-{config.layout.global_rank(local)}"
            self._shards.append(ChildProcess.spawn(name, argv, self._sink, shard_environment(os.environ)))
        for shard, uds_path in zip(self._shards, self._uds_paths(), strict=True):
            ready = lambda path=uds_path: shard_is_ready(path)  # noqa: E731
            wait_until_ready(shard, ready, config.shard_start_timeout, self._children(), self._shutdown)
        shards = local_shards_watched(config, self._uds_paths())
        self._watch = LivenessWatch(shards, config.shard_health_timeout, LOCAL_SHARD_PROBE_TIMEOUT_S).start()

    def _start_router(self) -> None:
        config = self._plan.config
        base_url = probe_base_url(config.hostname, config.port)
        with phase("start router"):
            argv = router_argv(
                config, self._plan.model, self._plan.limits, self._uds_paths(), self._key_file,
                self._runtime.launch_id_file,
            )  # fmt: skip
            self._router = ChildProcess.spawn("router", argv, self._sink, router_environment(os.environ))
            wait_until_ready(
                self._router,
                lambda: router_is_healthy(base_url, self._runtime.launch_id),
                config.router_start_timeout_s,
                self._children(),
                self._shutdown,
            )
        if config.nnodes > 1:
            self._watch_peers(_worker_shard_peers(config))
        self._announce(base_url)

    def _announce(self, base_url: str) -> None:
        config = self._plan.config
        try:
            info = fetch_router_info(base_url, first_key(config.api_key, config.api_key_file))
        except (OSError, ValueError) as error:
            LOGGER.warning("cannot read the KV capacity from %s/info: %s", base_url, error)
        else:
            tokens = int(info.get("kv_cache_tokens", 0))
            max_total = int(info.get("max_total_tokens", self._plan.limits.max_total_tokens))
            LOGGER.info(
                "KV cache: %s blocks, %d tokens = %d request(s) at the maximum length of %d tokens",
                info.get("kv_cache_blocks", "?"),
                tokens,
                tokens // max_total if max_total else 0,
                max_total,
            )
        LOGGER.info("Tandem is ready at http://%s:%d", config.hostname, config.port)

    def _serve(self) -> int:
        """Watches the children; a failed shard group is restarted, a failed router ends the launch."""
        while True:
            failure = self._wait_for_failure()
            if failure is None:
                LOGGER.info("shutdown requested: draining the router, then stopping the shards")
                return 0
            if self._plan.config.nnodes > 1:
                raise GroupLostError(failure)
            self._restart_shards(failure)

    def _wait_for_failure(self) -> str | None:
        """Why the shard group must restart, or None on a shutdown request; raises if the router died."""
        while not self._shutdown.wait(POLL_INTERVAL_S):
            if self._router is not None and (status := self._router.poll()) is not None:
                raise ChildExitedError(self._router, status, "while serving")
            for shard in self._shards:
                if (status := shard.poll()) is not None:
                    return str(ChildExitedError(shard, status, "while serving"))
            if self._watch is not None and (problem := self._watch.problem()) is not None:
                return problem
            if self._peers is not None and (problem := self._peers.problem()) is not None:
                return problem
        return None

    def _watch_peers(self, peers: list[Watched]) -> None:
        self._peers = LivenessWatch(peers, self._plan.config.shard_health_timeout, PROBE_TIMEOUT_S).start()

    def _restart_shards(self, failure: str) -> None:
        """Stops the whole group (a TP group cannot lose one rank) and respawns it after a backoff."""
        config = self._plan.config
        while True:
            delay = self._budget.next_delay(time.monotonic())
            if delay is None:
                raise RestartBudgetSpentError(failure, config.max_restarts, config.restart_window)
            LOGGER.error(
                "%s\nrestarting all %d shard(s) in %gs (restart %d of at most %d within %gs)",
                failure,
                config.num_shard,
                delay,
                self._budget.used(),
                config.max_restarts,
                config.restart_window,
            )
            self._stop_shards(min(config.graceful_termination_timeout, FAILED_GROUP_STOP_TIMEOUT_S))
            if self._shutdown.wait(delay):
                raise ShutdownRequested
            try:
                with phase("restart shards"):
                    self._start_shards()
            except (ChildExitedError, StartTimeoutError) as error:
                if error.child_name == "router":
                    raise
                failure = str(error)
                continue
            LOGGER.info("shards restarted; the router resumes once it has warmed them up")
            return

    def _stop_watch(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._peers is not None:
            self._peers.stop()
            self._peers = None

    def _stop_shards(self, timeout: float) -> None:
        self._stop_watch()
        for name, status in stop_children(self._shards, timeout).items():
            LOGGER.info("%s exited with status %d", name, status)
        self._shards = []

    def _stop_all(self) -> None:
        """The router goes first so it can drain requests while the shards still run."""
        timeout = self._plan.config.graceful_termination_timeout
        if self._router is not None:
            for name, status in stop_children([self._router], timeout + ROUTER_EXIT_MARGIN_S).items():
                LOGGER.info("%s exited with status %d", name, status)
        self._stop_shards(timeout)


def _node_label(config: LauncherConfig) -> str:
    if config.nnodes == 1:
        return ""
    ranks = f"{config.layout.first_rank}..{config.layout.global_rank(config.layout.local - 1)}"
    return f" (node {config.node_rank} of {config.nnodes}, ranks {ranks} of {config.num_shard})"


def local_shards_watched(config: LauncherConfig, uds_paths: list[Path]) -> list[Watched]:
    """This node's shards, by local rank, asked for a shallow Health over their sockets and named by global rank as
    their logs are."""
    return [
        Watched(f"shard-{config.layout.global_rank(local)}", partial(shard_answers_health, f"unix://{path}"), "Health")
        for local, path in enumerate(uds_paths)
    ]


def _leader_peer(config: LauncherConfig) -> list[Watched]:
    """A worker watches the leader's rendezvous port, which rank 0 serves for as long as it lives."""
    host, port = config.master_addr, config.master_port
    return [Watched(f"the leader's rendezvous at {host}:{port}", partial(tcp_port_accepts, host, port))]


def _worker_shard_peers(config: LauncherConfig) -> list[Watched]:
    """The leader watches every remote rank's TCP port with a shallow Health carrying the cluster secret."""
    secret_file = config.cluster_secret_file
    if secret_file is None:
        return []
    peers = []
    for node, host in enumerate(worker_addresses(config.nnodes, config.worker_addr, config.master_addr), start=1):
        for local in range(config.layout.local):
            target = f"{host}:{config.shard_grpc_port + local}"
            name = f"shard-{node * config.layout.local + local} on node {node} ({target})"
            peers.append(Watched(name, partial(shard_answers_health, target, secret_file=secret_file)))
    return peers
