"""A single-machine tensor-parallel group listens on loopback only: its store, gloo's and NCCL's sockets."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys

import pytest
from tandem_server.rendezvous import (
    SOCKET_INTERFACE_VARIABLES,
    bind_collectives_to_loopback,
    is_loopback,
    loopback_interface,
)

RANK_PROGRAM = """
import json, sys
import psutil, torch
from tandem_server.distributed import GroupAddress, init_distributed, shutdown_distributed
rank, port = int(sys.argv[1]), int(sys.argv[2])
context = init_distributed(rank, 2, GroupAddress("127.0.0.1", port), "cpu")
total = context.all_reduce(torch.ones(1))
listening = sorted({c.laddr.ip for c in psutil.Process().net_connections(kind="inet") if c.status == "LISTEN"})
print(json.dumps({"sum": total.item(), "listening": listening}), flush=True)
context.all_reduce(torch.ones(1))  # nobody leaves before both ranks looked at their sockets
shutdown_distributed()
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("localhost", True),
        ("10.0.0.5", False),
        ("node-0", False),
    ],
)
def test_loopback_master_addresses_are_recognised(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_collectives_bind_loopback_for_a_loopback_master_unless_set(monkeypatch: pytest.MonkeyPatch) -> None:
    # A private copy of the environment, so nothing set here outlives the test.
    environ = {name: value for name, value in os.environ.items() if name not in SOCKET_INTERFACE_VARIABLES}
    monkeypatch.setattr(os, "environ", environ)
    bind_collectives_to_loopback("10.0.0.5")
    assert not any(variable in environ for variable in SOCKET_INTERFACE_VARIABLES)

    environ["NCCL_SOCKET_IFNAME"] = "ib0"
    bind_collectives_to_loopback("127.0.0.1")
    assert environ["GLOO_SOCKET_IFNAME"] == loopback_interface()
    assert environ["NCCL_SOCKET_IFNAME"] == "ib0"


@pytest.mark.timeout(120)
def test_a_two_rank_gloo_group_listens_on_loopback_only() -> None:
    port = free_port()
    ranks = [
        subprocess.Popen([sys.executable, "-c", RANK_PROGRAM, str(rank), str(port)], stdout=subprocess.PIPE, text=True)
        for rank in range(2)
    ]
    reports = []
    for process in ranks:
        out, _ = process.communicate(timeout=100)
        assert process.returncode == 0
        reports.append(json.loads(out.strip().splitlines()[-1]))
    assert [report["sum"] for report in reports] == [2.0, 2.0]
    assert reports[0]["listening"], "rank 0 serves the rendezvous store"
    for report in reports:
        assert all(ipaddress.ip_address(address).is_loopback for address in report["listening"]), report
