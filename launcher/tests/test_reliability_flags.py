"""Admission, start and step timeouts, API-key and bind flags: parsed with env vars, passed to the router, keys
never on argv."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from tandem_launcher.api_keys import first_key, write_key_file
from tandem_launcher.child_environment import router_environment
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import router_argv
from tandem_launcher.config import ChildCommands
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel

MODEL = ResolvedModel(path=Path("/models/m"), served_name="org/m", max_position_embeddings=4096)
COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))


def argv_of(argv: list[str], environ: dict[str, str], key_file: Path | None = None) -> list[str]:
    config = parse_config(argv, environ)
    config = type(config)(**{**config.__dict__, "commands": COMMANDS})
    return router_argv(config, MODEL, TokenLimits(100, 200), [Path("/run/s.sock")], key_file)


def values_of(argv: list[str], flag: str) -> list[str]:
    return [argv[index + 1] for index, word in enumerate(argv) if word == flag]


def test_the_shells_hostname_variable_never_becomes_the_bind_address() -> None:
    assert parse_config([], {"HOSTNAME": "pod-7f9c"}).hostname == "127.0.0.1"
    assert parse_config([], {"TANDEM_HOSTNAME": "0.0.0.0"}).hostname == "0.0.0.0"
    assert parse_config(["--hostname", "::1"], {"TANDEM_HOSTNAME": "0.0.0.0"}).hostname == "::1"


def test_admission_and_step_timeout_flags_reach_the_router() -> None:
    argv = argv_of(["--max-queued-tokens", "8192", "--step-timeout", "2.5"], {})
    assert values_of(argv, "--max-queued-tokens") == ["8192"]
    assert values_of(argv, "--step-timeout") == ["3"]
    defaults = argv_of([], {})
    assert values_of(defaults, "--max-queued-tokens") == []
    assert values_of(defaults, "--step-timeout") == ["120"]
    from_env = parse_config([], {"MAX_QUEUED_TOKENS": "4096", "STEP_TIMEOUT": "9"})
    assert (from_env.forwarded["max_queued_tokens"], from_env.step_timeout) == (4096, 9.0)


def test_the_router_start_timeout_leaves_room_for_compiling_at_warmup() -> None:
    # The start-up Warmup compiles every graph under --torch-compile: 120 s ended a cold-cache start on 2 cores.
    assert parse_config([], {}).router_start_timeout_s == 120.0
    assert parse_config(["--device", "cpu", "--torch-compile"], {}).router_start_timeout_s == 900.0
    # A background compile runs after the shards are ready: it needs no longer start-up.
    assert parse_config(["--device", "cpu", "--torch-compile", "background"], {}).router_start_timeout_s == 120.0
    given = ["--device", "cpu", "--torch-compile", "--router-start-timeout", "30"]
    assert parse_config(given, {}).router_start_timeout_s == 30.0


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--router-start-timeout", "0"], "--router-start-timeout must be positive"),
        (["--max-queued-tokens", "0"], "--max-queued-tokens must be positive"),
        (["--step-timeout", "0"], "--step-timeout must be positive"),
        (["--api-key", "two words"], "--api-key number 1 must be printable ASCII"),
        (["--api-key-file", "/nonexistent/keys"], "--api-key-file /nonexistent/keys is not a readable file"),
    ],
)
def test_bad_reliability_flags_exit_naming_the_flag(capsys, argv: list[str], message: str) -> None:
    with pytest.raises(SystemExit):
        parse_config(argv, {})
    error = capsys.readouterr().err
    assert message in error
    assert "two words" not in error, "a rejected key is never echoed"


def test_api_keys_are_repeatable_comma_separated_and_read_from_the_env() -> None:
    config = parse_config(["--api-key", "sk-a,sk-b", "--api-key", "sk-c"], {"API_KEY": "sk-env"})
    assert config.api_key == ("sk-a", "sk-b", "sk-c"), "flags replace the env list"
    assert parse_config([], {"API_KEY": "sk-env, sk-env2"}).api_key == ("sk-env", "sk-env2")


def test_keys_reach_the_router_in_a_private_file_never_on_its_argv(tmp_path: Path) -> None:
    user_file = tmp_path / "keys.txt"
    user_file.write_text("# rotated monthly\nsk-from-file\n")
    keys = ("sk-secret-1", "sk-secret-2")
    key_file = write_key_file(tmp_path, keys)
    assert key_file is not None
    assert stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert key_file.read_text().splitlines() == list(keys)
    argv = argv_of(["--api-key", ",".join(keys), "--api-key-file", str(user_file)], {}, key_file)
    assert values_of(argv, "--api-key-file") == [str(key_file), str(user_file)]
    assert "--api-key" not in argv
    assert not any("sk-secret" in word for word in argv)
    assert write_key_file(tmp_path / "none", ()) is None


def test_the_launcher_finds_a_key_for_its_own_info_request(tmp_path: Path) -> None:
    user_file = tmp_path / "keys.txt"
    user_file.write_text("# comment\n\n  sk-from-file \n")
    assert first_key(("sk-inline",), (user_file,)) == "sk-inline"
    assert first_key((), (tmp_path / "missing", user_file)) == "sk-from-file"
    assert first_key((), ()) is None


def test_the_launcher_sends_the_key_of_a_weighted_key_file_line_without_its_weight(tmp_path: Path) -> None:
    weighted = tmp_path / "weighted.txt"
    weighted.write_text("# tenants\n sk-heavy   weight=4\nsk-light\n")
    assert first_key((), (weighted,)) == "sk-heavy"


def test_the_config_never_shows_its_keys() -> None:
    config = parse_config(["--api-key", "sk-hidden"], {})
    assert "sk-hidden" not in repr(config)


def test_the_router_never_inherits_the_key_variables() -> None:
    environ = {"PATH": "/bin", "API_KEY": "sk-overridden", "API_KEY_FILE": "/old/keys", "HF_HOME": "/data"}
    assert router_environment(environ) == {"PATH": "/bin"}
