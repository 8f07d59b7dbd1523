"""`--torch-compile`: each decoder layer's two stages through `torch.compile` (Inductor), attention left eager.

A decode step on the CPU spends more time between operators than in them once the GEMMs read quantized weights:
Inductor fuses each stage's norms, casts, rotations, activations and residual adds into a few generated kernels and
calls the GEMMs as they are. The attention backend stays eager, since it reads per-step metadata and the paged cache.

Every layer of one class shares one compiled stage: the layer is an argument, its weights inputs, so a model
compiles each stage once per shape class (one row; more rows; the weight formats' row thresholds), not per layer.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from tandem_server.errors import ConfigError
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.eager import forward_step
from tandem_server.execution.kv_cache import KVCache
from tandem_server.layers.moe.quantized_experts import keep_out_of_compiled_graphs
from tandem_server.models.decoder import StagedLayer
from tandem_server.models.registry import CausalLM

logger = logging.getLogger(__name__)

STAGES = ("attention_inputs", "after_attention")


def require_cpp_compiler() -> None:
    """Inductor builds its CPU kernels with a C++ compiler at run time: without one, start-up fails here, not at the
    first compile."""
    # Imported here, not at module level: Inductor (and Dynamo, Triton under it) cost a shard that never compiles
    # about 200 MiB of resident memory.
    from torch._inductor.cpp_builder import get_cpp_compiler  # noqa: PLC0415
    from torch._inductor.exc import InvalidCxxCompiler  # noqa: PLC0415

    try:
        get_cpp_compiler()
    except InvalidCxxCompiler as error:
        raise ConfigError(f"--torch-compile needs a C++ compiler such as g++ on this machine: {error}") from error


def compile_layers(model: nn.Module) -> int:
    """Replaces the stages of every `StagedLayer` in `model` with compiled ones; returns how many layers."""
    compiled: dict[tuple[type, str], Callable[..., Any]] = {}
    keep_out_of_compiled_graphs()
    layers = [module for module in model.modules() if isinstance(module, StagedLayer)]
    for layer in layers:
        for stage in STAGES:
            key = (type(layer), stage)
            if key not in compiled:
                # Automatic dynamic shapes: a graph is first compiled for its row count, then once more with the rows
                # symbolic, serving every count (one row and the weight formats' row thresholds aside); the features
                # stay static, which the generated kernels need to vectorise well.
                compiled[key] = torch.compile(getattr(type(layer), stage), dynamic=None)
            # An instance attribute: `forward` reads it before the class's method.
            setattr(layer, stage, functools.partial(compiled[key], layer))
    return len(layers)


def warmup_rows(max_batch_tokens: int) -> tuple[int, ...]:
    """Row counts that compile every graph a step of at most `max_batch_tokens` rows can need: one, then each power
    of two up to the limit and the limit itself, so each row threshold of the weight formats is crossed."""
    rows = [1]
    while rows[-1] * 2 < max_batch_tokens:
        rows.append(rows[-1] * 2)
    return (*rows, max_batch_tokens) if max_batch_tokens > 1 else (1,)


def warm_compiled_layers(model: CausalLM, cache: KVCache, max_batch_tokens: int) -> None:
    """Runs a step of each row count `warmup_rows` names into the reserved block, compiling every stage graph a
    model with compiled stages needs for steps of up to `max_batch_tokens` rows; logs how long it took."""
    started = time.perf_counter()
    rows = warmup_rows(max_batch_tokens)
    device = cache.layers[0].key.device
    for row_count in rows:
        num_tokens = min(row_count, model.spec.max_position_embeddings)
        # Every position wraps into the reserved block, so real blocks are never touched.
        blocks = [cache.reserved_block] * -(-num_tokens // cache.block_size)
        batch = build_step_batch([ScheduledSpan([0] * num_tokens, 0, blocks)], cache.block_size, device)
        forward_step(model, batch, cache.layers)
    logger.info("compiled steps of %s rows in %.1fs", ", ".join(map(str, rows)), time.perf_counter() - started)
