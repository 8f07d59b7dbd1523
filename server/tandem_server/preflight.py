"""Before any weight loads, every rank checks that the whole group arrived and that one collective runs.

A rank that never arrives (a worker node that did not start, a wrong --master-addr, a blocked port) fails start-up
within the rendezvous timeout with an error naming the missing ranks, instead of a hang inside the first Step.
"""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tandem_server.errors import ConfigError
from tandem_server.rendezvous import SOCKET_INTERFACE_VARIABLES

_POLL_INTERVAL_S = 0.1


class RendezvousError(ConfigError):
    """The tensor-parallel group could not form: a rank is missing or a collective did not complete."""


def _arrival_key(rank: int) -> str:
    return f"tandem/arrived/{rank}"


def collective_interface(backend: str) -> str:
    """The interface the collective's sockets use, as the operator would set it."""
    variable = SOCKET_INTERFACE_VARIABLES[0] if backend == "gloo" else SOCKET_INTERFACE_VARIABLES[1]
    if variable in os.environ:
        return f"{variable}={os.environ[variable]}"
    return f"the address host name {socket.gethostname()!r} resolves to ({variable} unset)"


def where(master_addr: str, master_port: int, backend: str) -> str:
    """The rendezvous address and collective interface, for error messages."""
    return f"the rendezvous at {master_addr}:{master_port} ({backend} over {collective_interface(backend)})"


def await_every_rank(store: dist.Store, rank: int, world_size: int, timeout_s: float, place: str) -> None:
    """Announces `rank` and waits until every rank of the group has; names the missing ones past `timeout_s`."""
    store.set(_arrival_key(rank), "1")
    deadline = time.monotonic() + timeout_s
    while True:
        missing = [other for other in range(world_size) if not store.check([_arrival_key(other)])]
        if not missing:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(str(other) for other in missing)
            raise RendezvousError(
                f"rank(s) {names} of {world_size} never arrived at {place} within {timeout_s:g}s "
                "(--rendezvous-timeout): check that every node started and can reach the master address"
            )
        time.sleep(_POLL_INTERVAL_S)


def check_collective(world_size: int, device: torch.device, timeout_s: float, place: str) -> None:
    """One small all-reduce, which must sum to `world_size` within `timeout_s`."""
    total = torch.ones(1, device=device)
    try:
        work = dist.all_reduce(total, async_op=True)
        if work is None or not work.wait(timeout=timedelta(seconds=timeout_s)):
            raise RendezvousError(f"the pre-flight all-reduce did not complete within {timeout_s:g}s at {place}")
    except RuntimeError as error:
        raise RendezvousError(f"the pre-flight all-reduce failed at {place}: {error}") from error
    if int(total.item()) != world_size:
        raise RendezvousError(f"the pre-flight all-reduce summed to {total.item():g}, expected {world_size}")
