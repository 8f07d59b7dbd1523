"""`--torch-compile`: auto compiles in the background on a CPU with a C++ compiler, a given mode is kept, and
compiling is refused where it cannot."""

from __future__ import annotations

import pytest
from tandem_server.cli import config_from_args
from tandem_server.compile_default import choose_compile_mode
from tandem_server.config import CompileMode
from tandem_server.errors import ConfigError

PATHS = ["--model-path", "m", "--uds-path", "s"]


def test_auto_compiles_in_the_background_on_a_cpu_with_a_cpp_compiler() -> None:
    mode, reason = choose_compile_mode("auto", "cpu", "/usr/bin/g++")
    assert mode is CompileMode.BACKGROUND
    assert reason.startswith("--torch-compile background: single streams' decode steps move to a graph compiled ahead")


def test_auto_is_off_without_a_compiler_and_on_cuda() -> None:
    mode, reason = choose_compile_mode("auto", "cpu", None)
    assert mode is CompileMode.OFF and "no C++ compiler" in reason
    mode, reason = choose_compile_mode("auto", "cuda", "/usr/bin/g++")
    assert mode is CompileMode.OFF and "CUDA graphs" in reason


def test_a_given_mode_is_kept() -> None:
    for value in ("off", "warmup", "background"):
        assert choose_compile_mode(value, "cpu", None) == (CompileMode(value), f"--torch-compile {value}: as given")


def test_the_flag_alone_compiles_at_warmup_and_its_reason_is_logged_with_the_weights() -> None:
    assert config_from_args([*PATHS, "--torch-compile"]).torch_compile is CompileMode.WARMUP
    assert config_from_args([*PATHS, "--torch-compile", "off"]).torch_compile is CompileMode.OFF
    config = config_from_args(PATHS)
    assert any(reason.startswith("--torch-compile ") for reason in config.auto_reasons)


def test_compiling_is_refused_on_cuda_and_auto_stays_off_there() -> None:
    assert config_from_args([*PATHS, "--device", "cuda"]).torch_compile is CompileMode.OFF
    for value in ([], ["background"]):
        with pytest.raises(ConfigError, match="--torch-compile is a CPU option"):
            config_from_args([*PATHS, "--device", "cuda", "--torch-compile", *value])


def test_an_unknown_mode_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        config_from_args([*PATHS, "--torch-compile", "sometimes"])
    assert "invalid choice: 'sometimes'" in capsys.readouterr().err


def test_a_background_compile_without_a_compiler_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "tandem-no-such-compiler")
    assert config_from_args(PATHS).torch_compile is CompileMode.OFF
    with pytest.raises(ConfigError, match="--torch-compile background needs a C\\+\\+ compiler"):
        config_from_args([*PATHS, "--torch-compile", "background"])
