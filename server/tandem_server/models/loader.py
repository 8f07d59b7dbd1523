"""Builds the registered model on its device and dtype, then fills it from the checkpoint."""

from __future__ import annotations

import logging
from contextlib import nullcontext

import torch
from torch import nn

from tandem_server.distributed import ParallelContext
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import AttentionBackend
from tandem_server.layers.meta_storage import UninitialisedOnMeta, allocate
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.mxfp4_experts import Mxfp4SwiGLUExperts
from tandem_server.models.config import CheckpointConfig
from tandem_server.models.registry import CausalLM, model_factory
from tandem_server.weights.loader import load_weights, quantized_parameters

logger = logging.getLogger(__name__)


def load_model(
    checkpoint: CheckpointConfig,
    dtype: torch.dtype,
    device: torch.device,
    parallel: ParallelContext,
    backend: AttentionBackend,
    allow_pickle_weights: bool = False,
    gguf_blocks: bool = False,
) -> CausalLM:
    """The model of `checkpoint.family`, loaded for this rank; an FP8 checkpoint's float8 layers (a GPTQ or AWQ
    checkpoint's int4 ones, GGUF blocks with `gguf_blocks`) are ready once `quantize_model` has run.

    The weights the checkpoint holds quantized never get float storage: they stay on meta, carrying their values for
    `quantize_model`, so loading takes the quantized model's memory, not the float model's.
    """
    factory = model_factory(checkpoint.family)
    quantized = gguf_blocks or checkpoint.fp8 is not None or checkpoint.int4 is not None
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device, UninitialisedOnMeta() if quantized else nullcontext():
            model = factory(checkpoint.hf, parallel, backend)
    finally:
        torch.set_default_dtype(previous_dtype)
    if checkpoint.mxfp4 and not any(isinstance(module, Mxfp4SwiGLUExperts) for module in model.modules()):
        raise ConfigError(f"{checkpoint.path}: MXFP4 weights are served only as gpt-oss's experts, not in this model")
    layout = model.checkpoint_layout()
    text_part = checkpoint.text_part
    if text_part is not None:
        layout = text_part.checkpoint_layout(layout)
        skipped = ", ".join(checkpoint.skipped_parts) or "no other part"
        logger.info(
            "%s: serving its text decoder as %s; not loaded: %s",
            checkpoint.architecture,
            checkpoint.family,
            skipped,
        )
    if quantized:
        params = dict(model.named_parameters(remove_duplicate=False))
        names = quantized_parameters(checkpoint.path, layout, gguf_blocks, checkpoint.fp8, checkpoint.int4)
        _refuse_quantized_experts_split(model, names)
        held_quantized = {id(params[name]) for name in names if name in params}
        allocate(model, device, lambda param: id(param) not in held_quantized)
    load_weights(model, checkpoint.path, layout, allow_pickle_weights, gguf_blocks, checkpoint.fp8, checkpoint.int4)
    return model.eval()


def _refuse_quantized_experts_split(model: nn.Module, quantized: set[str]) -> None:
    """Expert parallelism serves float experts only: a checkpoint holding them quantized stops start-up before any
    of it is read."""
    for name, module in model.named_modules():
        if isinstance(module, RoutedExperts) and module.split_across_ranks:
            if any(param_name.startswith(f"{name}.") for param_name in quantized):
                raise ConfigError(
                    "--expert-parallel serves float experts only, and this checkpoint stores them quantized "
                    f"({name}); start without --expert-parallel"
                )
