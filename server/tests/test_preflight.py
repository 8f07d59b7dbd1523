"""The pre-flight check fails start-up within the rendezvous timeout, naming the rank that never arrived."""

from __future__ import annotations

import os
import socket
import time

import pytest
from tandem_server.distributed import GroupAddress, init_distributed
from tandem_server.preflight import RendezvousError


@pytest.fixture(autouse=True)
def private_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """The interface variables the rendezvous sets stay inside the test."""
    monkeypatch.setattr(os, "environ", dict(os.environ))


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_rank_zero_names_the_ranks_that_never_arrived() -> None:
    port = free_port()
    started = time.monotonic()
    with pytest.raises(RendezvousError) as refused:
        init_distributed(0, 3, GroupAddress("127.0.0.1", port, 1.5), "cpu")
    message = str(refused.value)
    assert f"rank(s) 1, 2 of 3 never arrived at the rendezvous at 127.0.0.1:{port}" in message
    assert "gloo over GLOO_SOCKET_IFNAME=lo" in message
    assert "--rendezvous-timeout" in message
    assert time.monotonic() - started < 10


def test_a_rank_that_cannot_reach_the_master_says_where_it_looked() -> None:
    port = free_port()
    with pytest.raises(RendezvousError) as refused:
        init_distributed(1, 2, GroupAddress("127.0.0.1", port, 1.0), "cpu")
    assert f"rank 1 could not reach the rendezvous at 127.0.0.1:{port}" in str(refused.value)
