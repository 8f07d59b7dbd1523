"""The child process that builds a decode package: `python -m tandem_server.execution.decode_package_build --spec
JSON --output PATH`.

It loads the model as the shard did (`DecodePackageSpec`), decodes a made-up request in a small cache of its own
until a step is a steady one-row mirror decode, exports `DecodeProgram` on that step with every size that varies
marked dynamic, and compiles it with AOTInductor. Weights are frozen into the package and each quantized GEMM takes
the faster of torch's kernel and Inductor's own, as measured by autotuning. The package is written under a
temporary name and renamed, so a reader never sees part of one. The process runs at the lowest CPU priority and is
the first the kernel ends when memory runs out: the shard serves beside it. It peaks at about the model's weights
plus 1.1 GiB (1.2 GiB for the embedded model).
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch

from tandem_server.config import resolve_dtype
from tandem_server.distributed import ParallelContext
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.decode_package import DecodePackageSpec
from tandem_server.execution.decode_program import (
    DecodeProgram,
    dynamic_shapes,
    is_steady_single_decode,
    steady_program_arguments,
)
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.layers.attention.torch_backend import TorchAttentionBackend
from tandem_server.models.config import read_checkpoint_config
from tandem_server.models.loader import load_model
from tandem_server.models.registry import CausalLM
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.pipeline import WeightPreparation, prepare_weights

logger = logging.getLogger("tandem_server.decode_package_build")

_CPU = torch.device("cpu")
_BLOCK_SIZE = 16
_CACHE_BLOCKS = 2
_MIRROR_MEMORY = 16 * 2**20
# The made-up request's context when its step is exported: past the first decode, inside one block.
_EXAMPLE_CONTEXT = 6
_PR_SET_PDEATHSIG = 1
# Short of memory, the kernel ends this process before the shard beside it.
_OOM_SCORE_ADJ = Path("/proc/self/oom_score_adj")
# Frozen weights and autotuned GEMMs; the weights go in a file of their own beside the library, which the loader
# reads into memory: inside the library they would stay resident twice, as its mapped pages and as the tensors.
_INDUCTOR_CONFIGS = {
    "freezing": True,
    "max_autotune": True,
    "aot_inductor.package_constants_in_so": False,
    "aot_inductor.package_constants_on_disk_format": "binary_blob",
}


def build_package(spec: DecodePackageSpec, output: Path) -> None:
    """Compiles the decode program of the model `spec` describes into the package `output`."""
    torch.set_num_threads(spec.num_threads)
    started = time.perf_counter()
    backend = TorchAttentionBackend(_MIRROR_MEMORY)
    model = _load(spec, backend)
    spec_sizes = model.spec
    geometry = CacheGeometry.of(spec_sizes, _BLOCK_SIZE, resolve_dtype(spec.kv_cache_dtype))
    cache = KVCache(geometry, _CACHE_BLOCKS, _CPU)
    backend.bind_cache(cache.layers)
    with torch.no_grad():
        example = _steady_step_arguments(model, cache, backend)
        exported = torch.export.export(
            DecodeProgram(model), example, dynamic_shapes=dynamic_shapes(geometry.num_layers), strict=False
        )
    logger.info("exported the decode program in %.1fs", time.perf_counter() - started)
    partial = output.with_name(f"{output.stem}.{os.getpid()}.partial.pt2")
    torch._inductor.aoti_compile_and_package(exported, package_path=str(partial), inductor_configs=_INDUCTOR_CONFIGS)
    partial.replace(output)
    logger.info("built %s in %.1fs", output, time.perf_counter() - started)


def _load(spec: DecodePackageSpec, backend: TorchAttentionBackend) -> CausalLM:
    checkpoint = read_checkpoint_config(Path(spec.model_path))
    dtype = resolve_dtype(spec.dtype)
    quantize = QuantizeMode(spec.quantize)
    model = load_model(
        checkpoint,
        dtype,
        _CPU,
        ParallelContext(),
        backend,
        spec.allow_pickle_weights,
        gguf_blocks=quantize is QuantizeMode.GGUF,
    )
    # No bfloat16 copies for batches: a one-row step never reads them (they serve 6 rows or more), so the package is
    # the same without them, and the build needs that much less memory beside the shard.
    preparation = WeightPreparation(quantize, 0, 1, spec.packed_gemm_rows, _CPU, dtype)
    prepare_weights(model, preparation)
    return model


def _steady_step_arguments(model: CausalLM, cache: KVCache, backend: TorchAttentionBackend) -> tuple[Any, ...]:
    """Decodes one made-up request position by position; the arguments of its step at `_EXAMPLE_CONTEXT`."""
    blocks = list(range(_CACHE_BLOCKS))
    for context in range(1, _EXAMPLE_CONTEXT + 1):
        batch = build_step_batch([ScheduledSpan([0], context - 1, blocks, 0)], _BLOCK_SIZE, _CPU)
        prepared = backend.prepare(batch.metadata, cache.layers)
        if context == _EXAMPLE_CONTEXT:
            if not is_steady_single_decode(batch, prepared.metadata):
                raise RuntimeError("invariant: a request's later decodes are steady mirror decodes")
            return steady_program_arguments(batch, prepared)
        model(batch.input_ids, batch.positions, prepared.layers, prepared.metadata)
    raise AssertionError("unreachable")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Builds the shard's one-row decode package (AOTInductor).")
    parser.add_argument("--spec", required=True, help="the DecodePackageSpec as JSON")
    parser.add_argument("--output", required=True, type=Path, help="the package to write")
    parser.add_argument("--parent-pid", type=int, default=None, help="end with this process (the shard)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.parent_pid is not None and not _dies_with_parent(args.parent_pid):
        return 1
    os.nice(19)
    _OOM_SCORE_ADJ.write_text("1000")
    build_package(DecodePackageSpec.from_json(args.spec), args.output)
    return 0


def _dies_with_parent(parent_pid: int) -> bool:
    """Has the kernel kill this process when the thread that started it ends; False when the parent is gone."""
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    return os.getppid() == parent_pid


if __name__ == "__main__":
    sys.exit(main())
