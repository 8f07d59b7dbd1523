"""Copies checkpoint tensors into model parameters by their checkpoint names, strictly, each rank its slice."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from torch import nn

from tandem_server.errors import WeightsError
from tandem_server.quant.fp8.checkpoint import Fp8Collector, float8_problem
from tandem_server.quant.fp8.scheme import Fp8Scheme
from tandem_server.quant.gguf.blocks import GgufBlocks, iterate_block_tensors, read_blocks
from tandem_server.quant.int4.checkpoint import QWEIGHT, Int4Collector
from tandem_server.quant.int4.scheme import Int4Scheme
from tandem_server.quant.values import FP8_DTYPE
from tandem_server.weights.layout import CheckpointLayout
from tandem_server.weights.pickled import iterate_pickled_tensors
from tandem_server.weights.safetensors import iterate_tensors, tensor_dtypes
from tandem_server.weights.slicing import CheckpointTensor, load_full

# How safetensors headers name float8 e4m3 (`FP8_DTYPE`), the one float8 an FP8 checkpoint may hold.
FP8_HEADER_DTYPE = "F8_E4M3"


@torch.inference_mode()
def load_weights(
    model: nn.Module,
    model_path: Path,
    layout: CheckpointLayout,
    allow_pickle: bool = False,
    gguf_blocks: bool = False,
    fp8: Fp8Scheme | None = None,
    int4: Int4Scheme | None = None,
) -> None:
    """Fills every parameter once, reading only its `checkpoint_slice` (default: all); mismatches are errors.

    With `gguf_blocks`, a parameter whose tensor the checkpoint also holds as GGUF blocks gets them as its
    `gguf_blocks` attribute instead: its float tensor is never read, and quantization decides what it becomes.
    With an `fp8` scheme, a float8 weight and its scales become the parameter's `Fp8Channels` the same way; with an
    `int4` one (GPTQ, AWQ), a layer's packed tensors become its parameters' `Int4Groups`.
    """
    params = dict(model.named_parameters())
    loaded = _attach_gguf_blocks(model_path, layout, params) if gguf_blocks else set()
    collector = Fp8Collector(fp8) if fp8 is not None else None
    int4_collector = Int4Collector(int4, layout, params) if int4 is not None else None
    for checkpoint_name, checkpoint_tensor in _checkpoint_tensors(model_path, allow_pickle):
        if int4_collector is not None and int4_collector.takes(checkpoint_name):
            with _errors_named(checkpoint_name):
                int4_collector.add(checkpoint_name, checkpoint_tensor)
            continue
        if collector is not None and collector.is_companion(checkpoint_name):
            with _errors_named(checkpoint_name):
                collector.add_companion(checkpoint_name, checkpoint_tensor, layout, params)
            continue
        for name, tensor in _parameter_tensors(layout, checkpoint_name, checkpoint_tensor):
            if name in loaded and hasattr(params.get(name), "gguf_blocks"):
                continue
            param = _parameter(params, checkpoint_name, name)
            with _errors_named(name):
                _fill(param, name, tensor.read(getattr(param, "checkpoint_slice", None)), collector)
            loaded.add(name)
    if collector is not None:
        problems = collector.attach(params)
        if problems:
            raise WeightsError(f"FP8 checkpoint ({collector.scheme.method}): {'; '.join(problems[:5])}")
    if int4_collector is not None:
        loaded |= _attach_int4(int4_collector)
    missing = sorted(set(params) - loaded)
    if missing:
        raise WeightsError(f"checkpoint lacks {len(missing)} tensors, e.g. {', '.join(missing[:5])}")


def quantized_parameters(
    model_path: Path,
    layout: CheckpointLayout,
    gguf_blocks: bool = False,
    fp8: Fp8Scheme | None = None,
    int4: Int4Scheme | None = None,
) -> set[str]:
    """The parameters `load_weights` gives quantized values instead of float ones (GGUF blocks, float8 weights,
    packed int4), from the checkpoint's names and headers alone, so their float storage need never exist."""
    names: set[str] = set()
    if gguf_blocks:
        for checkpoint_name, _, _ in iterate_block_tensors(model_path):
            names.update(layout.parameter_names(checkpoint_name))
    if fp8 is None and int4 is None:
        return names
    for checkpoint_name, dtype in tensor_dtypes(model_path):
        prefix, _, suffix = checkpoint_name.rpartition(".")
        if int4 is not None and suffix == QWEIGHT:
            names.update(layout.parameter_names(f"{prefix}.weight"))
        elif fp8 is not None and dtype == FP8_HEADER_DTYPE:
            names.update(layout.parameter_names(checkpoint_name))
    return names


def _attach_gguf_blocks(model_path: Path, layout: CheckpointLayout, params: dict[str, nn.Parameter]) -> set[str]:
    """Gives each parameter the checkpoint holds as GGUF blocks its `gguf_blocks`; returns their names."""
    loaded = set()
    for checkpoint_name, gguf_type, blocks in iterate_block_tensors(model_path):
        for name, tensor in _parameter_tensors(layout, checkpoint_name, blocks):
            param = _parameter(params, checkpoint_name, name)
            with _errors_named(name):
                param.gguf_blocks = _read_blocks(param, tensor, gguf_type)  # type: ignore[attr-defined]  # a loading tag carried on the parameter
            loaded.add(name)
    return loaded


def _attach_int4(collector: Int4Collector) -> set[str]:
    """Hands each int4 layer its `Int4Groups`; returns the parameters filled that way."""
    problems = collector.attach()
    if problems:
        raise WeightsError(f"int4 checkpoint ({collector.scheme.method}): {'; '.join(problems[:5])}")
    return collector.attached


def _fill(param: nn.Parameter, name: str, values: torch.Tensor, collector: Fp8Collector | None) -> None:
    problem = float8_problem(values, collector.scheme if collector is not None else None)
    if problem is not None:
        raise ValueError(problem)
    if collector is not None and values.dtype == FP8_DTYPE:
        collector.add_weight(param, name, values)
        return
    getattr(param, "weight_loader", load_full)(param, values.to(param.dtype))


def _parameter_tensors(
    layout: CheckpointLayout, checkpoint_name: str, tensor: CheckpointTensor
) -> list[tuple[str, CheckpointTensor]]:
    try:
        return list(layout.parameter_tensors(checkpoint_name, tensor))
    except ValueError as error:
        raise WeightsError(str(error)) from error


def _parameter(params: dict[str, nn.Parameter], checkpoint_name: str, name: str) -> nn.Parameter:
    param = params.get(name)
    if param is None:
        raise WeightsError(f"checkpoint tensor {checkpoint_name!r} has no matching model parameter {name!r}")
    return param


def _read_blocks(param: nn.Parameter, tensor: CheckpointTensor, gguf_type: str) -> GgufBlocks:
    blocks = read_blocks(tensor, gguf_type, getattr(param, "checkpoint_slice", None))
    expected = tuple(param.shape)
    if (blocks.raw.shape[0], blocks.in_features) != expected:
        raise ValueError(f"expected shape {expected}, GGUF blocks hold {(blocks.raw.shape[0], blocks.in_features)}")
    return blocks


@contextmanager
def _errors_named(name: str) -> Iterator[None]:
    try:
        yield
    except ValueError as error:
        raise WeightsError(f"{name}: {error}") from error


def _checkpoint_tensors(model_path: Path, allow_pickle: bool) -> Iterator[tuple[str, CheckpointTensor]]:
    """Safetensors whenever the checkpoint has them; pickle files only when allowed and nothing else exists."""
    if allow_pickle and not any(model_path.glob("*.safetensors")):
        return iterate_pickled_tensors(model_path)
    return iterate_tensors(model_path)
