"""The shard's `--torch-compile auto`: every step eager, for now.

`background` (decode graphs compiled beside serving) stays opt-in until it is safe beside eager steps: Inductor's
passes trace with `torch.fx`, which patches `torch.nn.Module.__call__` for every thread while it traces, and an
eager step on the model thread during such a trace fails. CUDA steps replay CUDA graphs instead. A value the user
gave is kept as given.
"""

from __future__ import annotations

import os
import shutil

from tandem_server.config import CompileMode

AUTO = "auto"
CHOICES = (AUTO, *(mode.value for mode in CompileMode))


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor would run (`CXX`, else g++), where it is on PATH."""
    return shutil.which(os.environ.get("CXX", "g++"))


def choose_compile_mode(value: str, device: str, compiler: str | None) -> tuple[CompileMode, str]:
    """`--torch-compile`'s mode on `device` with `compiler` (see `cpp_compiler`), and the reason it logs."""
    if value != AUTO:
        return CompileMode(value), f"--torch-compile {value}: as given"
    if device != "cpu":
        return CompileMode.OFF, "--torch-compile off: CUDA steps replay CUDA graphs (--cuda-graphs) instead"
    if compiler is None:
        return CompileMode.OFF, "--torch-compile off: no C++ compiler (g++ or CXX) for Inductor's CPU kernels"
    return CompileMode.OFF, (
        "--torch-compile off: compiling is opt-in (background compiles decode graphs beside serving, warmup before "
        "the shard is ready)"
    )
