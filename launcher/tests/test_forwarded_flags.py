"""Every flag forwarded to a child is declared once: the launcher's `--help` lists it, and a value given to the
launcher reaches the child's argv under the same name."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from argv_testing import MODEL
from tandem_launcher.cli import build_parser, parse_config
from tandem_launcher.commands import router_argv, shard_argv
from tandem_launcher.config import FORWARDED_FLAGS, ChildCommands, LauncherConfig
from tandem_launcher.flags import bool_value
from tandem_launcher.forwarded import Child, Forwarded, expanded_path
from tandem_launcher.limits import TokenLimits
from tandem_launcher.shard_flags import memory_or_auto, memory_size

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))
# A value other than the default for each kind of flag; a new kind needs a sample here.
SAMPLE_BY_KIND = {int: "7", float: "0.5", str: "sample", bool_value: "false", memory_size: "256MiB"}
SAMPLE_BY_KIND[memory_or_auto] = "256MiB"
SAMPLES = {
    "--cuda-graphs": "1,8",
    "--packed-gemm-rows": "16",
    "--kv-events-endpoint": "tcp://*:5557",
    "--torch-compile": "background",
    "--encoder-cache-memory": "64MiB",
}
# Flags only a CUDA shard takes; the rest are given to a CPU launch.
CUDA_ONLY = ("--cuda-graphs",)


def given(entry: Forwarded, template: Path) -> list[str]:
    """Launcher argv setting `entry` to a value other than its default, with what that value needs."""
    if entry.switch:
        words = [entry.flag]
    elif entry.flag in SAMPLES:
        words = [entry.flag, SAMPLES[entry.flag]]
    elif entry.choices is not None:
        words = [entry.flag, next(choice for choice in reversed(entry.choices) if choice != entry.default)]
    elif entry.kind is expanded_path:
        words = [entry.flag, str(template)]
    else:
        words = [entry.flag, SAMPLE_BY_KIND[entry.kind]]
    if entry.only_with is not None:
        words += [f"--{entry.only_with.replace('_', '-')}", SAMPLES["--kv-events-endpoint"]]
    return words


def child_argv(config: LauncherConfig, child: Child) -> list[str]:
    config = LauncherConfig(**{**vars(config), "commands": COMMANDS})
    if child is Child.ROUTER:
        return router_argv(config, MODEL, TokenLimits(100, 200), [Path("/s.sock")])
    return shard_argv(config, MODEL, 0, Path("/s.sock"), 1)


@pytest.mark.parametrize("entry", FORWARDED_FLAGS, ids=lambda entry: entry.flag)
def test_every_forwarded_flag_given_to_the_launcher_reaches_its_child(entry: Forwarded, tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0].content }}")
    device = "cuda" if entry.flag in CUDA_ONLY else "cpu"
    words = given(entry, template)
    config = parse_config(["--device", device, *words], {}, count_gpus=lambda: 1)
    argv = child_argv(config, entry.child)
    assert entry.flag in argv
    if not entry.switch:
        expected = entry.word(entry.kind(words[1]))
        assert argv[argv.index(entry.flag) + 1] == expected
        assert entry.default is None or expected != entry.word(entry.default)
    other = Child.SHARD if entry.child is Child.ROUTER else Child.ROUTER
    assert entry.flag not in child_argv(config, other)


def test_the_launchers_help_lists_every_forwarded_flag_with_its_env_var() -> None:
    text = build_parser({}).format_help()
    unwrapped = " ".join(text.split())
    for entry in FORWARDED_FLAGS:
        assert re.search(rf"^\s+{re.escape(entry.flag)}\b", text, re.MULTILINE), entry.flag
        assert f"env: {entry.dest.upper()}" in unwrapped


def test_each_forwarded_flag_is_declared_once() -> None:
    flags = [entry.flag for entry in FORWARDED_FLAGS]
    assert len(flags) == len(set(flags))


def test_an_unknown_forwarded_name_is_refused() -> None:
    with pytest.raises(ValueError, match="not forwarded flags: max_bogus"):
        LauncherConfig(forwarded={"max_bogus": 1})
