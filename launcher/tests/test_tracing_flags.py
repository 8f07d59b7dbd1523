"""`--otlp-endpoint`, `--otlp-sample-ratio` and `--otlp-service-name`: read from flags or env vars, checked, and passed
to the router and every shard as argv only when an endpoint is set."""

from __future__ import annotations

from pathlib import Path

import pytest
from argv_testing import MODEL, flag_values
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import router_argv, shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))
TRACING_FLAGS = ("--otlp-endpoint", "--otlp-sample-ratio", "--otlp-service-name")


def children(argv: list[str], environ: dict[str, str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """The router's and rank 0's flag values for a launcher started with `argv` and `environ`."""
    config = parse_config(["--device", "cpu", *argv], environ)
    config = LauncherConfig(**{**vars(config), "commands": COMMANDS})
    router = router_argv(config, MODEL, TokenLimits(100, 200), [Path("/s.sock")])
    shard = shard_argv(config, MODEL, 0, Path("/s.sock"), 1)
    return flag_values(router), flag_values(shard)


def test_tracing_is_off_and_no_child_gets_a_tracing_flag_by_default() -> None:
    router, shard = children([], {})
    assert not set(TRACING_FLAGS) & (set(router) | set(shard))


def test_an_endpoint_reaches_the_router_with_its_ratio_and_every_shard_with_its_own_service_name() -> None:
    router, shard = children(
        ["--otlp-endpoint", "http://collector:4318", "--otlp-sample-ratio", "0.25", "--otlp-service-name", "chat"], {}
    )
    assert router["--otlp-endpoint"] == ["http://collector:4318"]
    assert router["--otlp-sample-ratio"] == ["0.25"]
    assert router["--otlp-service-name"] == ["chat.router"]
    assert shard["--otlp-endpoint"] == ["http://collector:4318"]
    assert shard["--otlp-service-name"] == ["chat.shard"]
    # The router decides what is sampled; the shards follow the trace context it sends.
    assert "--otlp-sample-ratio" not in shard


def test_the_tracing_flags_read_their_environment_variables() -> None:
    environ = {"OTLP_ENDPOINT": "https://otel:4318", "OTLP_SAMPLE_RATIO": "0.5", "OTLP_SERVICE_NAME": "edge"}
    router, shard = children([], environ)
    assert router["--otlp-endpoint"] == ["https://otel:4318"]
    assert router["--otlp-sample-ratio"] == ["0.5"]
    assert (router["--otlp-service-name"], shard["--otlp-service-name"]) == (["edge.router"], ["edge.shard"])
    router, _ = children(["--otlp-endpoint", "http://other:4318"], environ)
    assert router["--otlp-endpoint"] == ["http://other:4318"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--otlp-endpoint", "collector:4317"], "--otlp-endpoint must be an http:// or https:// URL"),
        (["--otlp-endpoint", "http://c:4318", "--otlp-sample-ratio", "1.5"], "--otlp-sample-ratio must be from 0 to 1"),
        (["--otlp-sample-ratio", "-0.1"], "--otlp-sample-ratio must be from 0 to 1"),
        (["--otlp-service-name", " "], "--otlp-service-name must not be empty"),
    ],
)
def test_wrong_tracing_values_are_usage_errors(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--device", "cpu", *argv], {})
    assert message in capsys.readouterr().err
