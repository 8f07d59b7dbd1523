"""The client-facing API flags reach the router as flags of the same names."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import router_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel

MODEL = ResolvedModel(path=Path("/models/m"), served_name="org/m", max_position_embeddings=4096)
COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))


def _router_argv(config: LauncherConfig) -> list[str]:
    return router_argv(config, MODEL, TokenLimits(100, 200), [Path("/s.sock")])


def _value(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_defaults_are_tgis_and_reach_the_router() -> None:
    config = parse_config([], {})
    argv = _router_argv(LauncherConfig(commands=COMMANDS))
    expected = {
        "--max-stop-sequences": "4",
        "--max-top-n-tokens": "5",
        "--max-best-of": "2",
        "--max-client-batch-size": "4",
        "--generation-config": "auto",
        "--reasoning-parser": "auto",
    }
    assert {flag: _value(argv, flag) for flag in expected} == expected
    forwarded = config.forwarded
    assert (forwarded["max_best_of"], forwarded["payload_limit"], forwarded["chat_template"]) == (2, None, None)
    # The router sizes the body limit for the model it serves.
    for absent in (
        "--always-include-usage", "--disable-chat-completions", "--chat-template", "--tool-call-parser",
        "--payload-limit",
    ):  # fmt: skip
        assert absent not in argv


def test_flags_and_env_vars_set_the_api_options(tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0].content }}")
    argv = ["--max-best-of", "3", "--payload-limit", "1000", "--always-include-usage", "--chat-template", str(template),
            "--tool-call-parser", "llama3_json"]  # fmt: skip
    environ = {
        "MAX_CLIENT_BATCH_SIZE": "8", "DISABLE_CHAT_COMPLETIONS": "true", "MAX_STOP_SEQUENCES": "6",
        "GENERATION_CONFIG": "none", "REASONING_PARSER": "qwen3",
    }  # fmt: skip
    config = parse_config(argv, environ)
    forwarded = config.forwarded
    assert (forwarded["max_best_of"], forwarded["payload_limit"], forwarded["max_client_batch_size"]) == (3, 1000, 8)
    assert forwarded["always_include_usage"] and forwarded["disable_chat_completions"]
    assert forwarded["chat_template"] == template
    router = _router_argv(LauncherConfig(**{**vars(config), "commands": COMMANDS}))
    assert _value(router, "--max-best-of") == "3" and _value(router, "--max-stop-sequences") == "6"
    assert _value(router, "--chat-template") == str(template)
    assert "--always-include-usage" in router and "--disable-chat-completions" in router
    assert _value(router, "--generation-config") == "none"
    assert _value(router, "--tool-call-parser") == "llama3_json"
    assert _value(router, "--reasoning-parser") == "qwen3"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-best-of", "0"], "--max-best-of must be positive"),
        (["--payload-limit", "0"], "--payload-limit must be positive"),
        (["--max-client-batch-size", "-1"], "--max-client-batch-size must be positive"),
        (["--max-stop-sequences", "-1"], "--max-stop-sequences must not be negative"),
        (["--speculate", "-1"], "--speculate must not be negative"),
        (["--chat-template", "/nonexistent/chat.jinja"], "--chat-template must be a readable file"),
        (["--generation-config", "vllm"], "--generation-config"),
        (["--tool-call-parser", "pythonic"], "--tool-call-parser"),
        (["--reasoning-parser", "granite"], "--reasoning-parser"),
    ],
)
def test_bad_api_values_exit_naming_the_flag(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit):
        parse_config(argv, {})
    assert message in capsys.readouterr().err


def test_a_bad_generation_config_from_the_environment_exits_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config([], {"GENERATION_CONFIG": "vllm"})
    assert "--generation-config must be one of auto, none, got 'vllm'" in capsys.readouterr().err


BOUNDS = {
    "--max-stop-sequence-length": ("512", "MAX_STOP_SEQUENCE_LENGTH", "32"),
    "--max-stop-token-ids": ("64", "MAX_STOP_TOKEN_IDS", "0"),
    "--max-logit-bias": ("300", "MAX_LOGIT_BIAS", "10"),
    "--max-tools": ("128", "MAX_TOOLS", "3"),
    "--max-grammar-bytes": ("131072", "MAX_GRAMMAR_BYTES", "4096"),
    "--max-choices": ("16", "MAX_CHOICES", "2"),
    "--max-images-per-request": ("8", "MAX_IMAGES_PER_REQUEST", "0"),
    "--max-image-bytes": ("20971520", "MAX_IMAGE_BYTES", "1000"),
    "--max-image-pixels": ("16777216", "MAX_IMAGE_PIXELS", "4096"),
    "--media-fetch-timeout": ("10", "MEDIA_FETCH_TIMEOUT", "3"),
    "--max-connections": ("1024", "MAX_CONNECTIONS", "50"),
    "--header-read-timeout": ("10", "HEADER_READ_TIMEOUT", "3"),
}


def test_request_and_connection_bounds_reach_the_router_from_flags_or_env_vars() -> None:
    defaults = _router_argv(LauncherConfig(commands=COMMANDS))
    assert {flag: _value(defaults, flag) for flag in BOUNDS} == {flag: given[0] for flag, given in BOUNDS.items()}
    environ = {variable: value for _, variable, value in BOUNDS.values()}
    config = parse_config([], environ)
    router = _router_argv(LauncherConfig(**{**vars(config), "commands": COMMANDS}))
    assert {flag: _value(router, flag) for flag in BOUNDS} == {flag: given[2] for flag, given in BOUNDS.items()}


@pytest.mark.parametrize("flag", ["--max-stop-sequence-length", "--max-grammar-bytes", "--max-choices",
                                  "--max-image-bytes", "--max-image-pixels", "--max-connections",
                                  "--header-read-timeout"])  # fmt: skip
def test_bounds_that_must_allow_something_refuse_zero(capsys: pytest.CaptureFixture[str], flag: str) -> None:
    with pytest.raises(SystemExit):
        parse_config([flag, "0"], {})
    assert f"{flag} must be positive" in capsys.readouterr().err


def test_counted_bounds_refuse_negatives(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--max-logit-bias", "-1"], {})
    assert "--max-logit-bias must not be negative" in capsys.readouterr().err


def test_the_responses_store_bounds_reach_the_router_from_flags_or_env_vars() -> None:
    defaults = _router_argv(LauncherConfig(commands=COMMANDS))
    assert _value(defaults, "--responses-store-max-entries") == "1024"
    assert _value(defaults, "--responses-store-max-bytes") == str(64 << 20)
    config = parse_config(["--responses-store-max-entries", "2"], {"RESPONSES_STORE_MAX_BYTES": "4096"})
    router = _router_argv(LauncherConfig(**{**vars(config), "commands": COMMANDS}))
    assert _value(router, "--responses-store-max-entries") == "2"
    assert _value(router, "--responses-store-max-bytes") == "4096"


def test_a_negative_responses_store_bound_exits_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--responses-store-max-bytes", "-1"], {})
    assert "--responses-store-max-bytes must not be negative" in capsys.readouterr().err


def test_media_fetching_reaches_the_router_only_when_hosts_are_allowed() -> None:
    defaults = _router_argv(LauncherConfig(commands=COMMANDS))
    assert "--allowed-media-domains" not in defaults
    assert "--allow-private-media-addresses" not in defaults
    config = parse_config(
        ["--allowed-media-domains", "media.example.com,cdn.example.com"], {"ALLOW_PRIVATE_MEDIA_ADDRESSES": "true"}
    )
    router = _router_argv(LauncherConfig(**{**vars(config), "commands": COMMANDS}))
    assert _value(router, "--allowed-media-domains") == "media.example.com,cdn.example.com"
    assert "--allow-private-media-addresses" in router
