"""Builds the registered model on its device and dtype, then fills it from the checkpoint."""

from __future__ import annotations

import torch

from tandem_server.distributed import ParallelContext
from tandem_server.layers.attention import AttentionBackend
from tandem_server.models.config import CheckpointConfig
from tandem_server.models.registry import CausalLM, model_factory
from tandem_server.weights.loader import load_weights


def load_model(
    checkpoint: CheckpointConfig,
    dtype: torch.dtype,
    device: torch.device,
    parallel: ParallelContext,
    backend: AttentionBackend,
    allow_pickle_weights: bool = False,
    gguf_blocks: bool = False,
) -> CausalLM:
    """The model of `checkpoint.architecture`, loaded for this rank; an FP8 checkpoint's float8 layers (a GPTQ or AWQ
    checkpoint's int4 ones) are ready once `quantize_model` has run (their float parameters are left unfilled)."""
    factory = model_factory(checkpoint.architecture)
    previous_dtype = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with device:
            model = factory(checkpoint.hf, parallel, backend)
    finally:
        torch.set_default_dtype(previous_dtype)
    layout = model.checkpoint_layout()
    load_weights(model, checkpoint.path, layout, allow_pickle_weights, gguf_blocks, checkpoint.fp8, checkpoint.int4)
    return model.eval()
