"""The shard's `--torch-compile auto`: on the CPU, the one-row decode graphs compile in the background.

The server is ready as soon as eager steps run; single streams' decode steps move to their compiled graph once it is
built by a child process (about a minute on 2 cores; `execution/decode_package_executor.py`) or loaded from the
compile cache, and every other step stays eager. Without a C++ compiler nothing compiles, and CUDA steps replay CUDA
graphs instead. A value the user gave is kept as given.
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
    return CompileMode.BACKGROUND, (
        "--torch-compile background: single streams' decode steps move to a graph compiled ahead of time, once it is "
        "built beside serving or loaded from --compile-cache-dir"
    )
