"""Multi-node flags: their env vars, LeaderWorkerSet's variables as defaults, and the group they must describe."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.cluster import lws_worker_address, worker_addresses


@pytest.fixture
def secret(tmp_path: Path) -> str:
    path = tmp_path / "cluster-secret"
    path.write_text("s3cret\n")
    return str(path)


def test_one_node_is_the_default_and_needs_no_secret() -> None:
    config = parse_config([], {})
    assert (config.nnodes, config.node_rank, config.master_addr, config.master_port) == (1, 0, "127.0.0.1", 29500)
    assert (config.shard_grpc_port, config.cluster_secret_file, config.rendezvous_timeout) == (50051, None, 300.0)
    assert config.is_leader
    assert config.layout.local == 1


def test_flags_describe_a_worker_node_and_its_global_ranks(secret: str) -> None:
    argv = ["--num-shard", "4", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.0.0.5"]
    argv += ["--master-port", "29600", "--shard-grpc-port", "6000", "--cluster-secret-file", secret]
    config = parse_config(argv, {})
    assert not config.is_leader
    assert config.layout.local == 2
    assert [config.layout.global_rank(local) for local in range(2)] == [2, 3]
    assert (config.master_addr, config.master_port, config.shard_grpc_port) == ("10.0.0.5", 29600, 6000)
    assert config.cluster_secret_file == Path(secret)


def test_leaderworkerset_variables_fill_in_absent_flags(secret: str) -> None:
    environ = {"LWS_LEADER_ADDRESS": "tandem-0.tandem.ns", "LWS_GROUP_SIZE": "2", "LWS_WORKER_INDEX": "1"}
    config = parse_config(["--num-shard", "2", "--cluster-secret-file", secret], environ)
    assert (config.master_addr, config.nnodes, config.node_rank) == ("tandem-0.tandem.ns", 2, 1)


def test_flags_and_their_own_variables_win_over_leaderworkerset(secret: str) -> None:
    environ = {"LWS_GROUP_SIZE": "4", "NNODES": "2", "LWS_WORKER_INDEX": "3", "LWS_LEADER_ADDRESS": "lws-0.lws"}
    config = parse_config(
        ["--num-shard", "2", "--node-rank", "0", "--master-addr", "10.1.1.1"], environ | {"CLUSTER_SECRET_FILE": secret}
    )
    assert (config.nnodes, config.node_rank, config.master_addr) == (2, 0, "10.1.1.1")


def test_an_unset_num_shard_counts_one_rank_per_node_on_cpu(secret: str) -> None:
    config = parse_config(["--nnodes", "3", "--cluster-secret-file", secret, "--device", "cpu"], {})
    assert config.num_shard == 3


def test_worker_addresses_follow_leaderworkerset_pod_names_unless_given() -> None:
    assert lws_worker_address("tandem-0.tandem.default", 2) == "tandem-0-2.tandem.default"
    assert worker_addresses(3, (), "tandem-1.tandem") == ("tandem-1-1.tandem", "tandem-1-2.tandem")
    assert worker_addresses(2, ("10.0.0.9",), "tandem-1.tandem") == ("10.0.0.9",)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--num-shard", "3", "--nnodes", "2"],
            "--num-shard 3 (ranks across all nodes) must be a multiple of --nnodes 2",
        ),
        (
            ["--num-shard", "2", "--nnodes", "2", "--node-rank", "2"],
            "--node-rank must be in 0..1 for --nnodes 2, got 2",
        ),
        (["--nnodes", "0"], "--nnodes must be positive, got 0"),
        (["--master-port", "70000"], "--master-port must be in 1..65535, got 70000"),
        (["--shard-grpc-port", "0"], "--shard-grpc-port must be in 1..65535, got 0"),
        (["--rendezvous-timeout", "0"], "--rendezvous-timeout must be positive, got 0"),
        (["--num-shard", "4", "--nnodes", "2", "--worker-addr", "a", "--worker-addr", "b"], "--worker-addr is given 2"),
    ],
)
def test_bad_cluster_flags_exit_naming_the_flag(capsys, secret: str, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit):
        parse_config([*argv, "--cluster-secret-file", secret], {})
    assert message in capsys.readouterr().err


def test_several_nodes_need_a_cluster_secret_file(capsys) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--num-shard", "2", "--nnodes", "2"], {})
    assert "--nnodes > 1 needs --cluster-secret-file" in capsys.readouterr().err


def test_a_missing_cluster_secret_file_is_refused(capsys, tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--cluster-secret-file", str(tmp_path / "absent")], {})
    assert f"--cluster-secret-file {tmp_path / 'absent'} is not a readable file" in capsys.readouterr().err
