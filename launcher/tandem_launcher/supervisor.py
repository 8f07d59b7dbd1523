"""Starts the shards then the router, watches them, and stops the whole group in order."""

from __future__ import annotations

import shutil
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from tandem_launcher.commands import free_tcp_port, probe_base_url, router_argv, shard_argv
from tandem_launcher.config import LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.logs import LOGGER, forward_child_line, phase
from tandem_launcher.model_resolution import ResolvedModel
from tandem_launcher.processes import ChildProcess, ChildStartError, LineSink, stop_children
from tandem_launcher.readiness import (
    POLL_INTERVAL_S,
    ChildExitedError,
    StartTimeoutError,
    fetch_router_info,
    router_is_healthy,
    shard_is_ready,
    wait_until_ready,
)
from tandem_launcher.signals import ShutdownRequested


@dataclass(frozen=True)
class LaunchPlan:
    """What to run: the configuration, the resolved model and the derived token limits."""

    config: LauncherConfig
    model: ResolvedModel
    limits: TokenLimits


class Supervisor:
    """Owns the child processes of one launch and the runtime directory holding their sockets."""

    def __init__(self, plan: LaunchPlan, shutdown: threading.Event, sink: LineSink = forward_child_line) -> None:
        self._plan = plan
        self._shutdown = shutdown
        self._sink = sink
        self._shards: list[ChildProcess] = []
        self._router: ChildProcess | None = None

    def run(self) -> int:
        """Serves until a shutdown signal (exit 0) or a failing child (exit 1)."""
        runtime_dir = Path(tempfile.mkdtemp(prefix="tandem-"))
        try:
            self._start_shards(runtime_dir)
            self._start_router(runtime_dir)
            return self._watch()
        except ShutdownRequested:
            LOGGER.info("shutdown requested during start-up")
            return 0
        except (ChildExitedError, StartTimeoutError, ChildStartError) as error:
            LOGGER.error("%s", error)
            return 1
        finally:
            self._stop_all()
            shutil.rmtree(runtime_dir, ignore_errors=True)

    def _children(self) -> list[ChildProcess]:
        return [*self._shards, *([self._router] if self._router else [])]

    def _start_shards(self, runtime_dir: Path) -> None:
        config = self._plan.config
        master_port = free_tcp_port()
        with phase(f"start {config.num_shard} shard(s) on {config.device}"):
            for rank in range(config.num_shard):
                argv = shard_argv(config, self._plan.model, rank, runtime_dir / f"shard-{rank}.sock", master_port)
                self._shards.append(ChildProcess.spawn(f"shard-{rank}", argv, self._sink))
            for rank, shard in enumerate(self._shards):
                uds_path = runtime_dir / f"shard-{rank}.sock"
                ready = lambda path=uds_path: shard_is_ready(path)  # noqa: E731
                wait_until_ready(shard, ready, config.shard_start_timeout, self._shards, self._shutdown)

    def _start_router(self, runtime_dir: Path) -> None:
        config = self._plan.config
        uds_paths = [runtime_dir / f"shard-{rank}.sock" for rank in range(config.num_shard)]
        base_url = probe_base_url(config.hostname, config.port)
        with phase("start router"):
            argv = router_argv(config, self._plan.model, self._plan.limits, uds_paths)
            self._router = ChildProcess.spawn("router", argv, self._sink)
            wait_until_ready(
                self._router,
                lambda: router_is_healthy(base_url),
                config.router_start_timeout,
                self._children(),
                self._shutdown,
            )
        self._announce(base_url)

    def _announce(self, base_url: str) -> None:
        config = self._plan.config
        try:
            info = fetch_router_info(base_url)
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

    def _watch(self) -> int:
        while not self._shutdown.wait(POLL_INTERVAL_S):
            for child in self._children():
                status = child.poll()
                if status is not None:
                    raise ChildExitedError(child, status, "while serving")
        LOGGER.info("shutdown requested: draining the router, then stopping the shards")
        return 0

    def _stop_all(self) -> None:
        """The router goes first so it can drain requests while the shards still run."""
        timeout = self._plan.config.graceful_termination_timeout
        groups = [[self._router] if self._router else [], self._shards]
        for group in groups:
            for name, status in stop_children(group, timeout).items():
                LOGGER.info("%s exited with status %d", name, status)
        for child in self._children():
            child.tail()
