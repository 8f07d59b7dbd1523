"""Speculative decoding flags, and their JSON form, reach the router as `--speculate` and `--speculative-method`;
a draft model reaches every shard as `--draft-model-path`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import router_argv, shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.limits import TokenLimits
from tandem_launcher.model_resolution import ResolvedModel

MODEL = ResolvedModel(path=Path("/models/m"), served_name="org/m", max_position_embeddings=4096)
COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))


def _router_flags(argv: list[str]) -> tuple[str, str, str]:
    config = parse_config(argv, {})
    router = router_argv(
        LauncherConfig(**{**vars(config), "commands": COMMANDS}), MODEL, TokenLimits(100, 200), [Path("/s.sock")]
    )
    count, method, batch = (
        router[router.index(flag) + 1]
        for flag in ("--speculate", "--speculative-method", "--speculative-disable-by-batch-size")
    )
    return count, method, batch


def test_speculation_is_off_with_prompt_lookup_by_default() -> None:
    assert _router_flags([]) == ("0", "ngram", "4")


def test_flags_and_their_json_form_set_the_same_router_flags() -> None:
    flags = _router_flags(
        ["--speculate", "3", "--speculative-method", "radix", "--speculative-disable-by-batch-size", "4"]
    )
    json_form = '{"method": "radix", "num_speculative_tokens": 3, "disable_by_batch_size": 4}'
    assert flags == _router_flags(["--speculative-config", json_form]) == ("3", "radix", "4")
    assert _router_flags(["--speculative-config", '{"num_speculative_tokens": 2}']) == ("2", "ngram", "4")


def test_a_speculative_model_selects_the_draft_method_unless_a_method_is_given() -> None:
    assert _router_flags(["--speculate", "4", "--speculative-model", "org/draft"]) == ("4", "draft", "4")
    explicit = ["--speculate", "4", "--speculative-model", "org/draft", "--speculative-method", "draft"]
    assert _router_flags(explicit) == ("4", "draft", "4")
    config = parse_config([], {"SPECULATE": "3", "SPECULATIVE_MODEL": "org/draft"})
    assert (config.speculative_method, config.speculative_model, config.speculative_model_revision) == (
        "draft",
        "org/draft",
        None,
    )


def test_a_draft_model_needs_no_prefix_cache() -> None:
    config = parse_config(["--speculate", "2", "--speculative-model", "org/draft", "--prefix-caching", "false"], {})
    assert (config.speculative_method, config.forwarded["prefix_caching"]) == ("draft", False)


@pytest.mark.parametrize("method", [None, "draft", "draft_model"])
def test_the_json_form_names_the_draft_model_with_vllms_keys(method: str | None) -> None:
    given = {"model": "org/draft", "num_speculative_tokens": 4, "revision": "v2"}
    json_form = json.dumps(given if method is None else {**given, "method": method})
    config = parse_config(["--speculative-config", json_form], {})
    assert (config.speculate, config.speculative_method) == (4, "draft")
    assert (config.speculative_model, config.speculative_model_revision) == ("org/draft", "v2")


def test_every_shard_gets_the_draft_model_directory_and_none_without_one() -> None:
    config = LauncherConfig(speculate=4, speculative_method="draft", speculative_model="org/d", commands=COMMANDS)
    drafted = replace(MODEL, draft_path=Path("/models/draft"))
    for rank in (0, 1):
        argv = shard_argv(config, drafted, rank, Path(f"/s{rank}.sock"), 1)
        assert argv[argv.index("--draft-model-path") + 1] == "/models/draft"
    assert "--draft-model-path" not in shard_argv(LauncherConfig(commands=COMMANDS), MODEL, 0, Path("/s.sock"), 1)


def test_the_json_form_is_read_from_its_environment_variable() -> None:
    config = parse_config([], {"SPECULATIVE_CONFIG": '{"method": "radix", "num_speculative_tokens": 5}'})
    assert (config.speculate, config.speculative_method) == (5, "radix")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speculative-method", "eagle"], "invalid choice: 'eagle'"),
        (["--speculative-config", "{method"], "--speculative-config is not JSON"),
        (["--speculative-config", "[4]"], "--speculative-config must be a JSON object"),
        (["--speculative-config", '{"method": "eagle", "num_speculative_tokens": 2}'], "method must be one of"),
        (["--speculative-config", '{"num_speculative_tokens": 0}'], "num_speculative_tokens must be a positive"),
        (["--speculative-config", '{"method": "ngram"}'], "num_speculative_tokens is required"),
        (["--speculative-config", '{"num_speculative_tokens": 2, "disable_by_batch_size": 0}'], "disable_by_batch"),
        (["--speculative-disable-by-batch-size", "0"], "--speculative-disable-by-batch-size must be positive"),
        (["--speculative-config", '{"num_speculative_tokens": true}'], "num_speculative_tokens must be a positive"),
        (
            ["--speculative-config", '{"num_speculative_tokens": 2, "prompt_lookup_max": 4}'],
            "unsupported key(s) prompt_lookup_max",
        ),
        (
            ["--speculate", "2", "--speculative-config", '{"num_speculative_tokens": 2}'],
            "either --speculative-config or the --speculate/--speculative-* flags",
        ),
        (
            ["--speculate", "2", "--speculative-method", "radix", "--prefix-caching", "false"],
            "--speculative-method radix drafts from the prefix cache: it needs --prefix-caching true",
        ),
        (
            ["--speculate", "2", "--speculative-method", "draft"],
            "--speculative-method draft drafts with a draft model: it needs --speculative-model",
        ),
        (
            ["--speculative-config", '{"method": "draft_model", "num_speculative_tokens": 2}'],
            "--speculative-method draft drafts with a draft model: it needs --speculative-model",
        ),
        (
            ["--speculate", "2", "--speculative-method", "ngram", "--speculative-model", "org/d"],
            "--speculative-model is the draft model of --speculative-method draft; --speculative-method ngram does "
            "not use it",
        ),
        (
            ["--speculative-config", '{"method": "radix", "num_speculative_tokens": 2, "model": "org/d"}'],
            "--speculative-model is the draft model of --speculative-method draft; --speculative-method radix does "
            "not use it",
        ),
        (
            ["--speculative-model", "org/d"],
            "--speculative-model drafts only with --speculate N > 0 (draft tokens per decode step)",
        ),
        (
            ["--speculative-model-revision", "v2"],
            "--speculative-model-revision is the revision of a --speculative-model: give that too",
        ),
        (["--speculative-config", '{"num_speculative_tokens": 2, "model": 7}'], "model must be a non-empty string"),
        (["--speculative-config", '{"num_speculative_tokens": 2, "revision": ""}'], "revision must be a non-empty"),
        (["--speculative-config", '{"method": ["draft"], "num_speculative_tokens": 2}'], "method must be one of"),
        (
            ["--speculative-model", "org/d", "--speculative-config", '{"num_speculative_tokens": 2}'],
            "either --speculative-config or the --speculate/--speculative-* flags",
        ),
    ],
)
def test_bad_speculation_flags_exit_naming_the_problem(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    with pytest.raises(SystemExit):
        parse_config(argv, {})
    assert message in capsys.readouterr().err
