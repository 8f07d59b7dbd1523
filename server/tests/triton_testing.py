"""Testing Triton kernels without a GPU: cases run under Triton's interpreter, and ahead-of-time compiles (the
architectures checked, their shared memory, and a pool that compiles a matrix of cases two at a time into a kept
cache).

Triton ships its compiler and ptxas, so no GPU is needed. The compiled kernels are kept under
$HOME/.cache/tandem/triton (unless TRITON_CACHE_DIR says otherwise), beside the project's other build caches: a
missing or emptied cache means compiling again, never a different result.
"""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import TypeVar

import pytest

# Shared memory one block may opt into (bytes), for every architecture Tandem supports (CUDA C++ Programming Guide,
# compute capabilities): sm80 (A100) 163 KiB; sm86 (A10, A40, RTX 30xx) and sm89 (L4, L40S, RTX 40xx) 99 KiB;
# sm90 (H100, H200) and sm100 (B200) 227 KiB.
SHARED_MEMORY_PER_BLOCK = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024, 100: 227 * 1024}
# The architectures the int4 GEMM's compile test checks.
SHARED_MEMORY = {arch: SHARED_MEMORY_PER_BLOCK[arch] for arch in (80, 90)}
KERNEL_CACHE = Path.home() / ".cache" / "tandem" / "triton"

Case = TypeVar("Case")
Result = TypeVar("Result")


def compile_all(cases: Sequence[Case], compile_case: Callable[[Case], Result]) -> dict[Case, Result]:
    """Each case's result, compiled in two forked processes with the kept cache."""
    with pytest.MonkeyPatch.context() as environment:
        if "TRITON_CACHE_DIR" not in os.environ:
            environment.setenv("TRITON_CACHE_DIR", str(KERNEL_CACHE))
        with ProcessPoolExecutor(max_workers=2, mp_context=multiprocessing.get_context("fork")) as pool:
            return dict(zip(cases, pool.map(compile_case, cases), strict=True))


def assert_cases_pass_under_the_interpreter(cases_file: str) -> None:
    """Runs the pytest file `cases_file` (beside this one) with TRITON_INTERPRET=1, which must be set before Triton
    is first imported, and asserts that its cases ran and passed."""
    cases = Path(__file__).with_name(cases_file)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(cases)]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "skipped" not in result.stdout, result.stdout[-2000:]


def widen_bfloat16_dots() -> None:
    """Makes the interpreter multiply bfloat16 tiles as the float32 values they are (see `int4_triton_cases`)."""
    import numpy as np  # noqa: PLC0415
    from triton import language as tl  # noqa: PLC0415
    from triton.runtime import interpreter  # noqa: PLC0415

    original = interpreter.InterpreterBuilder.create_dot

    def widened(operand: interpreter.TensorHandle) -> interpreter.TensorHandle:
        if operand.dtype.scalar != tl.bfloat16:
            return operand
        # bfloat16 is the top half of a float32.
        bits = operand.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def create_dot(self: object, a: object, b: object, *rest: object) -> object:
        return original(self, widened(a), widened(b), *rest)

    interpreter.InterpreterBuilder.create_dot = create_dot


def interpret_library_kernels() -> None:
    """Lets the interpreter run a library's autotuned kernels as a GPU compiles them (see `recurrent_kernel_cases`).

    Autotuning times each config on a GPU, which the interpreter lacks: every config computes the same numbers, so
    the first one runs. A compiled loop over `range` gives its index as a tensor, on which kernels call `.to`; the
    interpreter gives a Python int, so while a kernel runs, `range` in its module yields int32 scalar tensors.
    """
    import numpy as np  # noqa: PLC0415
    from triton import language as tl  # noqa: PLC0415
    from triton.runtime import autotuner, interpreter  # noqa: PLC0415

    def first_config(self: autotuner.Autotuner, kwargs: dict[str, object]) -> list[object]:
        return self.configs[:1]

    def tensor_range(*bounds: object) -> Iterator[tl.tensor]:
        for index in range(*(int(bound) for bound in bounds)):  # type: ignore[call-overload]
            yield tl.tensor(interpreter.TensorHandle(np.array([index], dtype=np.int32), tl.int32), tl.int32)

    patch_lang = interpreter._patch_lang

    def patch_lang_and_range(fn: Callable[..., object]) -> object:
        scope = patch_lang(fn)
        scope.set_attr(sys.modules[fn.__module__], "range", tensor_range)
        return scope

    autotuner.Autotuner.prune_configs = first_config
    interpreter._patch_lang = patch_lang_and_range
