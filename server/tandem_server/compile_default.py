"""The shard's `--torch-compile auto`: decode graphs compile beside serving on CPUs with a C++ compiler.

Inductor builds CPU kernels with a C++ compiler at run time, so a machine without one serves eagerly. CUDA steps
replay CUDA graphs instead. A value the user gave is kept as given.
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
        f"--torch-compile background: decode graphs compile beside serving with {compiler}, between steps and at "
        "the lowest CPU priority; each serves its steps once ready, and steps run eagerly until then"
    )
