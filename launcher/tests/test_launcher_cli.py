"""Flags and their environment variables become one validated LauncherConfig."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_launcher.cli import build_parser, parse_config
from tandem_launcher.config import EMBEDDED_MODEL_ID, LauncherConfig


def test_defaults_serve_the_embedded_model_on_localhost_3000() -> None:
    config = parse_config([], {})
    assert config.model_id == EMBEDDED_MODEL_ID
    assert (config.hostname, config.port, config.num_shard, config.device) == ("127.0.0.1", 3000, 1, "cpu")
    assert (config.max_input_tokens, config.max_total_tokens) == (None, None)
    forwarded = config.forwarded
    assert (forwarded["max_batch_prefill_tokens"], forwarded["max_batch_size"], config.block_size) == (512, 64, 16)
    assert forwarded["kv_cache_memory"] == "auto"
    assert config.model_cache_dir == Path("~/.cache/tandem/models").expanduser()
    assert config.shard_start_timeout == 300.0
    assert not config.json_output


def test_flags_use_tgi_names_and_types() -> None:
    argv = [
        "--model-id", "/models/llama", "--revision", "abc", "--num-shard", "2", "--dtype", "bfloat16",
        "--port", "8080", "--max-input-tokens", "1000", "--max-total-tokens", "2000",
        "--kv-cache-memory", "24MiB", "--kv-cache-dtype", "bfloat16", "--json-output",
        "--model-cache-dir", "/tmp/cache",
    ]  # fmt: skip
    config = parse_config(argv, {})
    assert config.model_id == "/models/llama" and config.revision == "abc"
    assert (config.num_shard, config.forwarded["dtype"], config.port) == (2, "bfloat16", 8080)
    assert (config.max_input_tokens, config.max_total_tokens) == (1000, 2000)
    assert config.forwarded["kv_cache_memory"] == "24MiB" and config.json_output
    assert config.forwarded["kv_cache_dtype"] == "bfloat16"
    assert config.model_cache_dir == Path("/tmp/cache")


def test_every_flag_reads_its_upper_case_env_var() -> None:
    environ = {"MODEL_ID": "/m", "NUM_SHARD": "4", "PORT": "9000", "MAX_TOTAL_TOKENS": "512", "JSON_OUTPUT": "true"}
    config = parse_config([], environ)
    assert (config.model_id, config.num_shard, config.port, config.max_total_tokens) == ("/m", 4, 9000, 512)
    assert config.json_output


def test_a_flag_overrides_its_env_var() -> None:
    assert parse_config(["--port", "1234"], {"PORT": "9000"}).port == 1234


def test_help_names_each_env_var() -> None:
    text = build_parser({}).format_help()
    for env in ("MODEL_ID", "NUM_SHARD", "PORT", "KV_CACHE_MEMORY", "SHARD_START_TIMEOUT", "JSON_OUTPUT"):
        assert f"env: {env}" in text


@pytest.mark.parametrize(
    ("argv", "environ", "message"),
    [
        (["--port", "http"], {}, "invalid int value"),
        (["--kv-cache-memory", "lots"], {}, "not a size"),
        (["--device", "tpu"], {}, "invalid choice"),
        (["--kv-cache-dtype", "int4"], {}, "invalid choice"),
        ([], {"KV_CACHE_DTYPE": "fp8"}, "--kv-cache-dtype must be one of auto, float32, bfloat16, float16"),
        ([], {"DEVICE": "tpu"}, "--device must be one of cpu, cuda"),
        ([], {"NUM_SHARD": "0"}, "--num-shard must be positive"),
        (["--port", "70000"], {}, "--port must be in 1..65535"),
    ],
)
def test_bad_values_exit_with_a_message_naming_the_flag(capsys, argv, environ, message) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(argv, environ)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_bad_boolean_env_var_is_rejected() -> None:
    with pytest.raises(SystemExit, match="JSON_OUTPUT"):
        parse_config([], {"JSON_OUTPUT": "maybe"})


def test_config_is_frozen() -> None:
    config = LauncherConfig()
    with pytest.raises(AttributeError):
        config.port = 1  # type: ignore[misc]


def test_kv_events_flags_read_their_environment_variables() -> None:
    config = parse_config([], {"KV_EVENTS_ENDPOINT": "tcp://*:5557", "KV_EVENTS_TOPIC": "kv@pod@model"})
    events = config.forwarded
    assert (events["kv_events_endpoint"], events["kv_events_topic"]) == ("tcp://*:5557", "kv@pod@model")
    assert events["kv_events_replay_endpoint"] is None
