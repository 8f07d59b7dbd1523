"""`--torch-compile background` on a single CPU rank: single streams' steady decode steps run the decode package
(`decode_package.py`) once it is loaded, and every other step runs eagerly.

At the first Warmup a thread loads the package from the cache, or first has a child process build it (about a
minute for the embedded model on 2 cores, at the lowest CPU priority) and then loads it. Steps run eagerly until
then, so the shard is ready as soon as eager steps are. A failed build leaves the steps eager and logs why, with the
build's log beside the package. The package reads the KV cache and the decode mirror as inputs, so a later Warmup's
new cache needs no new package.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from tandem_server.execution.decode_package import KEPT_PACKAGES, DecodePackage, DecodePackageSpec, prune_cache
from tandem_server.execution.decode_program import flat_inputs, is_single_mirror_decode, steady_program_arguments
from tandem_server.execution.kv_cache import KVCache
from tandem_server.execution.protocol import ExecutionPlan, PlannedStep
from tandem_server.freed_memory import return_freed_memory
from tandem_server.metrics import CompilationState
from tandem_server.models.registry import CausalLM

logger = logging.getLogger(__name__)

_BUILD_MODULE = "tandem_server.execution.decode_package_build"


class DecodePackageError(RuntimeError):
    """The decode package could not be built or loaded."""


class DecodePackageExecutor:
    """Runs steady one-row decode steps through the decode package once it is loaded."""

    name = "decode-package"

    def __init__(self, model: CausalLM, spec: DecodePackageSpec) -> None:
        self._model = model
        self._spec = spec
        # Set once, by the loading thread; the step thread only reads it.
        self._package: DecodePackage | None = None
        self._loading: threading.Thread | None = None
        # Whether this shard built the package (False: it came from the cache), once loaded; why not, on failure.
        self.built: bool | None = None
        self.failure: str | None = None
        self.steps = 0

    def prepare(self, cache: KVCache, plan: ExecutionPlan) -> None:
        if self._package is None and self._loading is None:
            self._loading = threading.Thread(target=self._obtain, name="decode-package", daemon=True)
            self._loading.start()

    @property
    def package(self) -> DecodePackage | None:
        """The loaded package; None until it is loaded."""
        return self._package

    def serves(self, step: PlannedStep) -> bool:
        # The package runs the base model on token embeddings at sequence positions: rows under an adapter, on given
        # embeddings or at three-axis rotary positions run eagerly.
        return (
            self._package is not None
            and step.batch.runs_base_model
            and is_single_mirror_decode(step.batch, step.prepared.metadata)
        )

    def run(self, step: PlannedStep) -> torch.Tensor:
        package = self._package
        if package is None:
            raise RuntimeError("invariant: the decode package runs only steps it serves")
        self.steps += 1
        return package.run(flat_inputs(steady_program_arguments(step.batch, step.prepared)))

    def stop(self) -> None:
        """Nothing to stop: the build reads no cache, and its child process ends with the shard."""

    def wait(self, timeout: float | None = None) -> bool:
        """Waits for the package to load or fail; whether it loaded."""
        loading = self._loading
        if loading is not None:
            loading.join(timeout)
        return self._package is not None

    def compilation(self) -> CompilationState:
        loading = self._loading
        building = loading is not None and loading.is_alive()
        return CompilationState((1,) if self._package is not None else (), building)

    def _obtain(self) -> None:
        path = self._spec.package_path()
        started = time.perf_counter()
        try:
            built = not path.exists()
            if built:
                _build(self._spec, path)
            self._package = DecodePackage(path, self._model, len(self._model.spec.cache_shapes))
            # The package's own copy of the weights, read to find their twins in the model, is freed by now.
            return_freed_memory()
            self.built = built
            for stale in prune_cache(path):
                logger.info("decode package: removed %s, the least recently used beyond %d", stale, KEPT_PACKAGES)
        except Exception as error:
            self.failure = str(error)
            logger.warning("decode package: %s; single streams' decode steps stay eager", error)
            return
        logger.info(
            "decode package: %s %s in %.1fs (weights: %.1f MiB shared with the model, %.1f MiB its own); single "
            "streams' steady decode steps run it",
            "built and loaded" if built else "loaded",
            path,
            time.perf_counter() - started,
            self._package.shared_bytes / 2**20,
            self._package.copied_bytes / 2**20,
        )


def _build(spec: DecodePackageSpec, path: Path) -> None:
    """Runs the build in a child process, which dies with the shard; its output goes to a log beside the package."""
    path.parent.mkdir(parents=True, exist_ok=True)
    log = path.with_suffix(".log")
    logger.info("decode package: building %s in a child process (log: %s)", path.name, log)
    command = [sys.executable, "-m", _BUILD_MODULE, "--spec", spec.to_json(), "--output", str(path)]
    command += ["--parent-pid", str(os.getpid())]
    with log.open("w") as output:
        code = subprocess.call(command, stdout=output, stderr=subprocess.STDOUT)
    if code != 0 or not path.exists():
        raise DecodePackageError(f"the build exited with status {code} ({_last_line(log)}; full log: {log})")


def _last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no output"
