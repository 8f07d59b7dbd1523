"""The argv handed to each child carries every setting as an explicit flag."""

from __future__ import annotations

from pathlib import Path

import pytest
from argv_testing import MODEL, flag_values
from tandem_launcher.commands import probe_base_url, router_argv, shard_argv, threads_per_shard
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin", "--extra"))


def test_shard_argv_names_rank_socket_rendezvous_and_resources() -> None:
    config = LauncherConfig(num_shard=2, forwarded={"dtype": "float32", "kv_cache_memory": "24MiB"}, commands=COMMANDS)
    argv = shard_argv(config, MODEL, 1, Path("/run/t/shard-1.sock"), 29555)
    assert argv[0] == "shard-bin"
    values = flag_values(argv)
    assert values["--model-path"] == ["/models/m"]
    assert values["--uds-path"] == ["/run/t/shard-1.sock"]
    assert (values["--rank"], values["--world-size"], values["--master-port"]) == (["1"], ["2"], ["29555"])
    assert values["--master-addr"] == ["127.0.0.1"]
    assert (values["--device"], values["--dtype"], values["--kv-cache-memory"]) == (["cpu"], ["float32"], ["24MiB"])
    assert values["--num-threads"] == [str(threads_per_shard(2))]
    assert values["--attention-backend"] == ["auto"] and values["--log-level"] == ["info"]
    assert (values["--cuda-memory-fraction"], values["--cuda-graphs"]) == (["0.9"], ["auto"])
    assert values["--packed-gemm-rows"] == ["auto"]
    assert values["--decode-mirror-memory"] == ["auto"]
    assert values["--kv-cache-dtype"] == ["auto"]
    assert values["--encoder-cache-memory"] == ["256MiB"]
    assert values["--step-timeout"] == ["120.0"]


def test_router_argv_lists_shard_sockets_in_rank_order_and_the_limits() -> None:
    config = LauncherConfig(port=8080, json_output=True, commands=COMMANDS)
    sockets = [Path("/run/t/shard-0.sock"), Path("/run/t/shard-1.sock")]
    argv = router_argv(config, MODEL, TokenLimits(100, 200), sockets)
    assert argv[:2] == ["router-bin", "--extra"]
    values = flag_values(argv)
    assert values["--shard-uds-path"] == ["/run/t/shard-0.sock", "/run/t/shard-1.sock"]
    assert values["--tokenizer-path"] == ["/models/m"] and values["--model-id"] == ["org/m"]
    assert (values["--max-input-tokens"], values["--max-total-tokens"]) == (["100"], ["200"])
    assert values["--max-batch-prefill-tokens"] == ["512"] and values["--block-size"] == ["16"]
    assert (values["--hostname"], values["--port"]) == (["127.0.0.1"], ["8080"])
    assert argv[-1] == "--json-output"


def test_threads_split_the_cpus_between_shards_but_never_drop_to_zero() -> None:
    assert threads_per_shard(1) >= threads_per_shard(2) >= 1
    assert threads_per_shard(10_000) == 1


def test_wildcard_bind_addresses_are_probed_on_loopback() -> None:
    assert probe_base_url("0.0.0.0", 80) == "http://127.0.0.1:80"
    assert probe_base_url("::", 80) == "http://[::1]:80"
    assert probe_base_url("localhost", 80) == "http://localhost:80"


def test_shard_metrics_ports_follow_the_rank_and_stay_off_by_default() -> None:
    config = LauncherConfig(num_shard=2, hostname="0.0.0.0", shard_metrics_port=9100, commands=COMMANDS)
    ports = [flag_values(shard_argv(config, MODEL, rank, Path("/s"), 1))["--metrics-port"] for rank in (0, 1)]
    assert ports == [["9100"], ["9101"]]
    assert flag_values(shard_argv(config, MODEL, 0, Path("/s"), 1))["--metrics-hostname"] == ["0.0.0.0"]
    off = LauncherConfig(commands=COMMANDS)
    assert flag_values(shard_argv(off, MODEL, 0, Path("/s"), 1))["--metrics-port"] == ["0"]


def test_shard_metrics_ports_must_fit_below_65536() -> None:
    with pytest.raises(ValueError, match="--shard-metrics-port"):
        LauncherConfig(num_shard=2, shard_metrics_port=65535, commands=COMMANDS)


@pytest.mark.parametrize(("enabled", "word"), [(True, "true"), (False, "false")])
def test_router_argv_says_whether_prefix_caching_is_on(enabled: bool, word: str) -> None:
    config = LauncherConfig(forwarded={"prefix_caching": enabled}, commands=COMMANDS)
    argv = router_argv(config, MODEL, TokenLimits(100, 200), [Path("/run/t/shard-0.sock")])
    assert flag_values(argv)["--prefix-caching"] == [word]


@pytest.mark.parametrize(("enabled", "word"), [(True, "true"), (False, "false")])
def test_router_argv_says_whether_scheduling_is_asynchronous(enabled: bool, word: str) -> None:
    config = LauncherConfig(forwarded={"async_scheduling": enabled}, commands=COMMANDS)
    argv = router_argv(config, MODEL, TokenLimits(100, 200), [Path("/run/t/shard-0.sock")])
    assert flag_values(argv)["--async-scheduling"] == [word]


def test_router_argv_carries_the_speculative_draft_count() -> None:
    config = LauncherConfig(speculate=4, commands=COMMANDS)
    argv = router_argv(config, MODEL, TokenLimits(100, 200), [Path("/run/t/shard-0.sock")])
    assert flag_values(argv)["--speculate"] == ["4"]


def test_router_argv_passes_kv_events_flags_through_only_when_an_endpoint_is_set() -> None:
    sockets = [Path("/run/t/shard-0.sock")]
    off = router_argv(LauncherConfig(commands=COMMANDS), MODEL, TokenLimits(100, 200), sockets)
    assert not [word for word in off if word.startswith("--kv-events")]
    events = {
        "kv_events_endpoint": "tcp://*:5557",
        "kv_events_replay_endpoint": "tcp://*:5558",
        "kv_events_hash_seed": "42",
    }
    config = LauncherConfig(forwarded=events, commands=COMMANDS)
    values = flag_values(router_argv(config, MODEL, TokenLimits(100, 200), sockets))
    assert values["--kv-events-endpoint"] == ["tcp://*:5557"]
    assert values["--kv-events-replay-endpoint"] == ["tcp://*:5558"]
    assert (values["--kv-events-topic"], values["--kv-events-hash-seed"]) == (["kv-events"], ["42"])
