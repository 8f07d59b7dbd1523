"""A multi-node group's children: global ranks on each node, worker ranks on TCP with the secret, the leader's router
reaching every rank in rank order, and the watches that notice a lost node."""

from __future__ import annotations

import socket
import time
from pathlib import Path

from argv_testing import MODEL, flag_values
from tandem_launcher.commands import router_argv, shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.liveness_watch import LivenessWatch, Watched, tcp_port_accepts
from tandem_launcher.readiness import PROBE_TIMEOUT_S
from tandem_launcher.supervisor import local_shards_watched

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))


def group_config(secret: Path, node_rank: int, **extra: object) -> LauncherConfig:
    return LauncherConfig(
        num_shard=4,
        nnodes=2,
        node_rank=node_rank,
        master_addr="10.0.0.1",
        master_port=29600,
        shard_grpc_port=6000,
        cluster_secret_file=secret,
        hostname="0.0.0.0",
        commands=COMMANDS,
        **extra,  # type: ignore[arg-type]
    )


def test_a_worker_nodes_shards_take_global_ranks_and_serve_tcp_with_the_secret(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    values = flag_values(shard_argv(group_config(secret, 1), MODEL, 1, Path("/run/shard-1.sock"), 29600))
    assert (values["--rank"], values["--local-rank"], values["--world-size"]) == (["3"], ["1"], ["4"])
    assert (values["--master-addr"], values["--master-port"]) == (["10.0.0.1"], ["29600"])
    assert (values["--grpc-port"], values["--grpc-host"]) == (["6001"], ["0.0.0.0"])
    assert values["--cluster-secret-file"] == [str(secret)]
    assert values["--rendezvous-timeout"] == ["300.0"]


def test_the_leaders_shards_stay_on_unix_sockets(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    values = flag_values(shard_argv(group_config(secret, 0), MODEL, 1, Path("/run/shard-1.sock"), 29600))
    assert (values["--rank"], values["--local-rank"]) == (["1"], ["1"])
    assert "--grpc-port" not in values and "--cluster-secret-file" not in values


def test_the_leaders_router_reaches_every_rank_in_rank_order(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    config = group_config(secret, 0, worker_addr=("10.0.0.2",))
    sockets = [Path("/run/shard-0.sock"), Path("/run/shard-1.sock")]
    values = flag_values(router_argv(config, MODEL, TokenLimits(100, 200), sockets))
    assert values["--shard-uri"] == [
        "unix:///run/shard-0.sock",
        "unix:///run/shard-1.sock",
        "http://10.0.0.2:6000",
        "http://10.0.0.2:6001",
    ]
    assert values["--cluster-secret-file"] == [str(secret)]
    assert "--shard-uds-path" not in values


def test_leaderworkerset_names_the_workers_when_no_address_is_given(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    config = group_config(secret, 0)
    config = LauncherConfig(**{**vars(config), "master_addr": "tandem-0.tandem.ns", "num_shard": 2})
    values = flag_values(router_argv(config, MODEL, TokenLimits(100, 200), [Path("/run/shard-0.sock")]))
    assert values["--shard-uri"] == ["unix:///run/shard-0.sock", "http://tandem-0-1.tandem.ns:6000"]


def test_one_node_keeps_the_socket_flags_and_no_secret() -> None:
    values = flag_values(router_argv(LauncherConfig(commands=COMMANDS), MODEL, TokenLimits(100, 200), [Path("/s")]))
    assert values["--shard-uds-path"] == ["/s"]
    assert "--shard-uri" not in values and "--cluster-secret-file" not in values


def test_a_peer_silent_for_the_timeout_is_named() -> None:
    answers = iter([True, True])
    watch = LivenessWatch([Watched("node 1", lambda _timeout: next(answers, False))], 0.6, PROBE_TIMEOUT_S).start()
    deadline = time.monotonic() + 10
    while watch.problem() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert watch.problem() == "node 1 has not answered for 0.6s"


def test_a_silent_local_shard_is_named_with_the_question_it_did_not_answer() -> None:
    watch = LivenessWatch([Watched("shard-0", lambda _timeout: False, "Health")], 0.6, PROBE_TIMEOUT_S).start()
    deadline = time.monotonic() + 10
    while watch.problem() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    watch.stop()
    assert watch.problem() == "shard-0 has not answered Health for 0.6s"


def test_a_worker_nodes_hung_shard_is_named_by_its_global_rank(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("s")
    paths = [tmp_path / "shard-0.sock", tmp_path / "shard-1.sock"]
    watched = local_shards_watched(group_config(secret, 1), paths)
    assert [shard.silence(1.0) for shard in watched] == [
        "shard-2 has not answered Health for 1s",
        "shard-3 has not answered Health for 1s",
    ]
    single_node = local_shards_watched(LauncherConfig(commands=COMMANDS, num_shard=2), paths)
    assert [shard.name for shard in single_node] == ["shard-0", "shard-1"]


def test_tcp_probe_tells_a_listening_port_from_a_closed_one() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        assert tcp_port_accepts("127.0.0.1", port, 1.0)
    assert not tcp_port_accepts("127.0.0.1", port, 1.0)
