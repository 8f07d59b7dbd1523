"""Probes that tell when a shard or the router is ready, and the wait loop that polls them."""

from __future__ import annotations

import hmac
import http.client
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tandem_launcher.processes import ChildProcess
from tandem_launcher.signals import ShutdownFlag, ShutdownRequested

POLL_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 2.0


class ChildExitedError(Exception):
    """A child exited while the launcher needed it; carries its last lines."""

    def __init__(self, child: ChildProcess, status: int, during: str) -> None:
        self.child_name = child.name
        self.status = status
        self.tail = child.tail()
        shown = "\n".join(f"  [{child.name}] {line}" for line in self.tail) or "  (no output)"
        super().__init__(f"{child.name} exited with status {status} {during}; its last lines:\n{shown}")


class StartTimeoutError(Exception):
    """A child did not become ready within its start timeout."""

    def __init__(self, child: ChildProcess, timeout: float) -> None:
        self.child_name = child.name
        shown = "\n".join(f"  [{child.name}] {line}" for line in child.tail()) or "  (no output)"
        super().__init__(f"{child.name} was not ready after {timeout:g}s; its last lines:\n{shown}")


def shard_is_ready(uds_path: Path) -> bool:
    """A shard is ready once its socket exists and answers `Info`."""
    if not uds_path.exists():
        return False
    import grpc  # noqa: PLC0415  (grpc is only needed once shards run)
    from tandem_server.rpc.generated import shard_pb2, shard_pb2_grpc  # noqa: PLC0415

    with grpc.insecure_channel(f"unix://{uds_path}") as channel:
        try:
            shard_pb2_grpc.ShardServiceStub(channel).Info(shard_pb2.InfoRequest(), timeout=PROBE_TIMEOUT_S)
        except grpc.RpcError:
            return False
    return True


# The router answers every /health with the id from its --launch-id-file; only the launcher that wrote it knows it.
LAUNCH_ID_HEADER = "X-Tandem-Launch-Id"


class RouterIdentityError(Exception):
    """Something other than this launch's router answers on the router's address."""

    def __init__(self, base_url: str) -> None:
        super().__init__(
            f"{base_url} is answered by another process, not by the router this launch started "
            "(is the port already in use?); nothing was sent to it"
        )


def router_is_healthy(base_url: str, launch_id: str) -> bool:
    """The router is ready once `GET /health` answers 200 with this launch's id; any listener that answers without
    it is another process holding the port, and the start fails before an API key could reach it."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=PROBE_TIMEOUT_S) as response:
            status, answered_id = response.status, response.headers.get(LAUNCH_ID_HEADER)
    except urllib.error.HTTPError as error:
        status, answered_id = error.code, error.headers.get(LAUNCH_ID_HEADER)
    except http.client.HTTPException:
        raise RouterIdentityError(base_url) from None  # it answers, but not in HTTP
    except (urllib.error.URLError, OSError):
        return False
    if answered_id is None or not hmac.compare_digest(answered_id, launch_id):
        raise RouterIdentityError(base_url)
    return status == 200


def fetch_router_info(base_url: str, api_key: str | None = None) -> dict[str, Any]:
    """`GET /info` as JSON (a protected route: it needs a key when keys are configured)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(f"{base_url}/info", headers=headers)
    with urllib.request.urlopen(request, timeout=PROBE_TIMEOUT_S) as response:
        return json.loads(response.read())


def wait_until_ready(
    child: ChildProcess,
    is_ready: Callable[[], bool],
    timeout: float,
    watched: Sequence[ChildProcess],
    shutdown: ShutdownFlag,
) -> None:
    """Polls `is_ready` until it holds; fails fast if any `watched` child exits or on shutdown."""
    deadline = time.monotonic() + timeout
    while True:
        if shutdown.is_set():
            raise ShutdownRequested
        for other in watched:
            status = other.poll()
            if status is not None:
                raise ChildExitedError(other, status, "during start-up")
        if is_ready():
            return
        if time.monotonic() >= deadline:
            raise StartTimeoutError(child, timeout)
        shutdown.wait(POLL_INTERVAL_S)
