"""Test-only fault flags reach the first shard group only; pickle weights need --allow-pickle-weights."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from resolution_testing import resolve_model
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.model_resolution import ModelResolutionError, ResolvedModel

MODEL = ResolvedModel(path=Path("/models/m"), served_name="org/m", max_position_embeddings=4096)
COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))
CRASH_AFTER_START_UP = ("--crash-delay", "2")


def test_fault_and_pickle_flags_are_off_by_default() -> None:
    config = parse_config([], {})
    assert config.fault_inject_step_error is None and config.fault_inject_step_hang is None
    assert not config.allow_pickle_weights
    argv = shard_argv(LauncherConfig(commands=COMMANDS), MODEL, 0, Path("/s"), 1, inject_faults=True)
    assert not [word for word in argv if word.startswith(("--fault-inject", "--allow-pickle"))]


def test_fault_flags_and_their_env_vars_reach_the_shard_argv_only_when_injecting() -> None:
    environ = {"FAULT_INJECT_STEP_HANG": "1:9", "ALLOW_PICKLE_WEIGHTS": "true"}
    config = parse_config(["--num-shard", "2", "--fault-inject-step-error", "0:4"], environ)
    assert (config.fault_inject_step_error, config.fault_inject_step_hang) == ("0:4", "1:9")
    config = LauncherConfig(**{**vars(config), "commands": COMMANDS})
    injected = shard_argv(config, MODEL, 1, Path("/s"), 1, inject_faults=True)
    assert injected[-5:] == [
        "--allow-pickle-weights",
        "--fault-inject-step-error",
        "0:4",
        "--fault-inject-step-hang",
        "1:9",
    ]
    clean = shard_argv(config, MODEL, 1, Path("/s"), 1, inject_faults=False)
    assert clean[-1] == "--allow-pickle-weights"


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("5", "--fault-inject-step-error expects RANK:STEP with STEP >= 1 (e.g. 0:5), got '5'"),
        ("0:0", "--fault-inject-step-error expects RANK:STEP with STEP >= 1 (e.g. 0:5), got '0:0'"),
        ("2:1", "--fault-inject-step-error names rank 2, but --num-shard is 2"),
    ],
)
def test_malformed_fault_targets_are_usage_errors(value: str, problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        parse_config(["--num-shard", "2", "--fault-inject-step-error", value], {})
    assert exit_info.value.code == 2
    assert problem in capsys.readouterr().err


def test_only_the_first_shard_group_gets_the_fault_flags(launch_fakes) -> None:
    launch = launch_fakes(
        shard="crash-once", shard_args=CRASH_AFTER_START_UP, fault_inject_step_error="0:3", fault_inject_step_hang="0:7"
    )
    launch.wait_for_output("shards restarted", timeout=30)
    argvs = [event for event in launch.events() if event.startswith("shard-0 pid ")]
    assert len(argvs) == 2
    assert "--fault-inject-step-error 0:3" in argvs[0] and "--fault-inject-step-hang 0:7" in argvs[0]
    assert "--fault-inject" not in argvs[1]


def pickle_only(model_dir: Path) -> Path:
    (model_dir / "model.safetensors").unlink()
    (model_dir / "pytorch_model.bin").write_bytes(b"")
    return model_dir


def test_a_pickle_only_model_is_refused_with_the_flag_to_allow_it(model_dir: Path, tmp_path: Path) -> None:
    pickle_only(model_dir)
    with pytest.raises(ModelResolutionError) as refused:
        resolve_model(str(model_dir), None, tmp_path / "cache")
    message = str(refused.value)
    assert "has only pickle weights (pytorch_model.bin)" in message and "--allow-pickle-weights" in message
    assert (
        resolve_model(str(model_dir), None, tmp_path / "cache", allow_pickle_weights=True).path == model_dir.resolve()
    )


def test_allowing_pickle_weights_still_needs_some_weights(model_dir: Path, tmp_path: Path) -> None:
    shutil.move(model_dir / "model.safetensors", tmp_path / "elsewhere.safetensors")
    with pytest.raises(ModelResolutionError, match=r"missing \*\.safetensors weights"):
        resolve_model(str(model_dir), None, tmp_path / "cache", allow_pickle_weights=True)
