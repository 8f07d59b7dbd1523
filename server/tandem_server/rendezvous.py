"""Where the tensor-parallel ranks meet: a TCPStore, and the interface gloo's and NCCL's sockets bind.

On a loopback master address (one machine, the launcher's default) nothing listens beyond loopback: torch's own
store would listen on every interface, gloo on the address the host name resolves to, and NCCL's bootstrap on the
first interface it finds.
"""

from __future__ import annotations

import ipaddress
import os
import socket
from datetime import timedelta

import torch.distributed as dist


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback IP literals (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def loopback_interface() -> str:
    """The name of the loopback network interface (`lo` on Linux, `lo0` on macOS)."""
    names = {name for _, name in socket.if_nameindex()}
    return "lo" if "lo" in names or "lo0" not in names else "lo0"


def rendezvous_store(master_addr: str, master_port: int, rank: int, world_size: int, timeout: timedelta) -> dist.Store:
    """The store every rank meets at; rank 0 serves it, listening on `master_addr` alone when that is loopback."""
    # Rank 0 does not wait for the others here: the pre-flight check waits, and names whoever is missing.
    if rank != 0 or not is_loopback(master_addr):
        return dist.TCPStore(
            master_addr, master_port, world_size, rank == 0, timeout, wait_for_workers=False, use_libuv=False
        )
    family = socket.AF_INET6 if ":" in master_addr else socket.AF_INET
    listener = socket.create_server((master_addr, master_port), family=family, backlog=world_size * 4)
    # The store owns the listening socket from here on (detach hands over the descriptor).
    return dist.TCPStore(
        master_addr,
        master_port,
        world_size,
        True,
        timeout,
        wait_for_workers=False,
        master_listen_fd=listener.detach(),
        use_libuv=False,
    )


# The settings gloo and NCCL read for the interface their sockets use.
SOCKET_INTERFACE_VARIABLES = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")


def bind_collectives_to_loopback(master_addr: str) -> None:
    """Makes gloo and NCCL open their sockets on the loopback interface for a single-machine group (explicit settings
    win)."""
    if is_loopback(master_addr):
        interface = loopback_interface()
        for variable in SOCKET_INTERFACE_VARIABLES:
            os.environ.setdefault(variable, interface)
