"""Turns a loaded model's GEMM weights into quantized ones: kept GGUF blocks, an FP8 checkpoint's float8 weights, or
float weights quantized at load.

GGUF blocks keep their values exactly: Q4_0/Q4_1 as int4 groups, Q8_0 as int8 groups of 32 (two int4 planes). An FP8
checkpoint's float8 weights stay float8 in every mode, per-tensor scales widened to per-channel; a GPTQ or AWQ
checkpoint's int4 weights stay int4 (served with `--quantize none` only). Float weights become int4 groups (`int4`,
LM head int8 per channel on CPU, float on CUDA), int8 per channel (`int8`) or float8 e4m3 per channel (`fp8`). A tied
embedding looks its rows up in the LM head's quantized copy. A layer's routed experts held as GGUF blocks (with
`--quantize gguf`) or float8 become one quantized weight per expert and projection, the same way. A GGUF, float8 or
int4 tensor no quantized kernel can take (a stack mixing block types, or quantized and float parts) is dequantized
into its float parameter, exactly.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from tandem_server.errors import ConfigError
from tandem_server.freed_memory import return_freed_memory
from tandem_server.layers.embedding import Embedding, LMHead
from tandem_server.layers.gemm import GemmModule
from tandem_server.layers.meta_storage import allocate
from tandem_server.layers.moe.experts import RoutedExperts
from tandem_server.layers.moe.quantized_experts import ExpertWeight, QuantizedExperts
from tandem_server.quant.fp8.checkpoint import FP8_VALUES
from tandem_server.quant.fp8.weight import Fp8Weight
from tandem_server.quant.gguf.blocks import GgufBlocks
from tandem_server.quant.int4.checkpoint import INT4_VALUES
from tandem_server.quant.int8.weight import Int8Weight
from tandem_server.quant.kernels import QuantizedWeight, quantized_weight
from tandem_server.quant.mode import QuantizeMode
from tandem_server.quant.values import Fp8Channels, Int4Groups, Int8Groups, quantize_fp8, quantize_int4, quantize_int8

# The attributes the loader sets on a parameter whose checkpoint values stay quantized, until quantization takes them.
KEPT_VALUES = ("gguf_blocks", FP8_VALUES, INT4_VALUES)


@dataclass
class QuantizationReport:
    """Each weight's stored format by role (`qkv_proj: Q4_1 as int4`) and the bytes all weights take."""

    formats: Counter[str] = field(default_factory=Counter)
    weight_bytes: int = 0

    def format_by_role(self) -> str:
        """`role: format` for every kind of weight, without counts (what Info reports)."""
        return ", ".join(sorted(self.formats))

    def describe(self) -> str:
        formats = ", ".join(f"{count} {what}" for what, count in sorted(self.formats.items()))
        return f"weights take {self.weight_bytes / 2**20:.1f} MiB: {formats}"


@torch.inference_mode()
def quantize_model(model: nn.Module, mode: QuantizeMode) -> QuantizationReport:
    """Quantizes `model`'s GEMMs as `mode` says (GGUF: the blocks the loader attached) and reports the result; a
    weight the format cannot take (its shape) is a start-up error naming it."""
    report = QuantizationReport()
    device = _float_device(model)
    for name, module in model.named_modules():
        role = name.rsplit(".", 1)[-1]
        if isinstance(module, GemmModule):
            try:
                report.formats[f"{role}: {_quantize_gemm(module, mode, device)}"] += 1
            except ValueError as error:
                raise ConfigError(f"--quantize {mode.value}: {name}: {error}") from error
        elif isinstance(module, RoutedExperts):
            try:
                report.formats[f"{role}: {_quantize_experts(module, mode, device)}"] += 1
            except ValueError as error:
                raise ConfigError(f"--quantize {mode.value}: {name}: {error}") from error
    for name, module in model.named_modules():
        if isinstance(module, Embedding):
            report.formats[f"{name.rsplit('.', 1)[-1]}: {_quantize_embedding(model, module)}"] += 1
    # Values no quantized kernel took are dequantized into float storage, which a weight loaded on meta lacks.
    allocate(model, device, _keeps_values)
    for param in model.parameters():
        for attribute in KEPT_VALUES:
            kept = getattr(param, attribute, None)
            if kept is not None:
                param.data.copy_(kept.dequantize())
                delattr(param, attribute)
    report.weight_bytes = _weight_bytes(model)
    return_freed_memory()
    return report


def _float_device(model: nn.Module) -> torch.device:
    """Where the model's float tensors live (its norms always are; weights held quantized may be on meta)."""
    return next(param.device for param in model.parameters() if not param.is_meta)


def _keeps_values(param: nn.Parameter) -> bool:
    return any(hasattr(param, attribute) for attribute in KEPT_VALUES)


def _quantize_gemm(module: GemmModule, mode: QuantizeMode, device: torch.device) -> str:
    parts = module.weight_parts()
    served = _serve_checkpoint_values(module, parts, device)
    if served is not None:
        return served
    blocks: list[GgufBlocks | None] = [getattr(part, "gguf_blocks", None) for part in parts]
    if mode is QuantizeMode.NONE or (mode is QuantizeMode.GGUF and not all(blocks)):
        return module.weight_format.name
    if mode is QuantizeMode.GGUF:
        source = [block.unpack() for block in blocks if block]
        if len({type(values) for values in source}) > 1:
            return "mixed GGUF types, dequantized"
        label = "/".join(sorted({block.gguf_type for block in blocks if block}))
        quantized = quantized_weight(source[0] if len(source) == 1 else _concat_rows(source))
        if isinstance(module, LMHead) and not quantized.serves_rows:
            # A tied embedding looks its rows up in the head's copy; int8 channels always can.
            quantized = Int8Weight(quantize_int8(torch.cat([values.dequantize() for values in source])))
    elif isinstance(module, LMHead) and mode is QuantizeMode.INT4 and device.type == "cuda":
        # int4's LM head is int8 per row, which has no CUDA kernel here: it stays float (and a tied embedding too).
        return module.weight_format.name
    else:
        label = "float"
        quantized = _quantize_float(module, mode)
    _use(module, quantized)
    return f"{label} as {quantized.name}"


def _serve_checkpoint_values(module: GemmModule, parts: list[torch.Tensor], device: torch.device) -> str | None:
    """Serves `module` from an FP8 or int4 checkpoint's values when every part has them (what it became); a stack
    only some of whose parts have them is dequantized into its float parts (None)."""
    for attribute in (FP8_VALUES, INT4_VALUES):
        kept: list[Fp8Channels | Int4Groups | None] = [getattr(part, attribute, None) for part in parts]
        if all(kept):
            fp8 = [values for values in kept if isinstance(values, Fp8Channels)]
            if fp8:
                stacked = fp8[0] if len(fp8) == 1 else Fp8Channels.concat(fp8)
                _use(module, Fp8Weight(stacked.to(device)))
                return "float8 checkpoint as fp8"
            int4 = [values for values in kept if isinstance(values, Int4Groups)]
            groups = int4[0] if len(int4) == 1 else Int4Groups.concat(int4)
            _use(module, quantized_weight(groups.to(device), module.weight.dtype))
            return "int4 checkpoint as int4"
        for part, values in zip(parts, kept, strict=True):
            if values is not None:
                part.data.copy_(values.dequantize())
                delattr(part, attribute)
    return None


def _quantize_experts(experts: RoutedExperts, mode: QuantizeMode, device: torch.device) -> str:
    """Serves the experts from their checkpoint values when every expert's three projections have them: float8 in
    any mode, GGUF blocks with `--quantize gguf`; else they stay float (what they became)."""
    projections = experts.projections()
    fp8 = [[getattr(part, FP8_VALUES, None) for part in parts] for parts in projections]
    blocks = [[getattr(part, "gguf_blocks", None) for part in parts] for parts in projections]
    if all(all(values) for values in fp8):
        gate_up: list[ExpertWeight] = []
        down: list[ExpertWeight] = []
        for *inputs, down_values in fp8:
            gate_up.append(Fp8Weight(Fp8Channels.concat(inputs).to(device)))  # type: ignore[arg-type]  # all set
            down.append(Fp8Weight(down_values.to(device)))  # type: ignore[union-attr]  # all set
        label = "float8 checkpoint as fp8"
    elif mode is QuantizeMode.GGUF and all(all(values) for values in blocks):
        gate_up, down = [], []
        for *input_blocks, down_blocks in blocks:
            unpacked = [block.unpack() for block in input_blocks]  # type: ignore[union-attr]  # all set
            if len({type(values) for values in unpacked}) > 1:
                return f"{_float_name(experts)} (gate and up in different GGUF kinds, dequantized)"
            gate_up.append(quantized_weight(_concat_rows(unpacked)))
            down.append(quantized_weight(down_blocks.unpack()))  # type: ignore[union-attr]  # all set
        types = sorted({part.gguf_type for parts in blocks for part in parts if part is not None})
        names = sorted({weight.name for weight in (*gate_up, *down)})
        label = f"{'/'.join(types)} as {'/'.join(names)}"
    else:
        return _float_name(experts)
    for part in (param for parts in projections for param in parts):
        for attribute in KEPT_VALUES:
            if hasattr(part, attribute):
                delattr(part, attribute)
    experts.use_quantized(QuantizedExperts(gate_up, down, label))
    return label


def _float_name(experts: RoutedExperts) -> str:
    return str(experts.gate_up.dtype).removeprefix("torch.")


def _quantize_float(module: GemmModule, mode: QuantizeMode) -> QuantizedWeight:
    if mode is QuantizeMode.FP8:
        return Fp8Weight(quantize_fp8(module.weight))
    if mode is QuantizeMode.INT8 or isinstance(module, LMHead):
        return Int8Weight(quantize_int8(module.weight))
    return quantized_weight(quantize_int4(module.weight), module.weight.dtype)


def _use(module: GemmModule, quantized: QuantizedWeight) -> None:
    """Serves `module` from `quantized`, dropping what the loader kept for its parts."""
    for part in module.weight_parts():
        for attribute in KEPT_VALUES:
            if hasattr(part, attribute):
                delattr(part, attribute)
    module.use_quantized(quantized)


def _quantize_embedding(model: nn.Module, embedding: Embedding) -> str:
    """Shares a tied LM head's quantized copy, or keeps a GGUF embedding's blocks; else it stays float."""
    head = next((m for m in model.modules() if isinstance(m, LMHead) and m.weight is embedding.weight), None)
    shared = None if head is None else head.weight_format.quantized
    if shared is not None:
        embedding.use_quantized(shared)
        return f"{shared.name}, shared with the tied LM head"
    blocks: GgufBlocks | None = getattr(embedding.weight, "gguf_blocks", None)
    if blocks is not None:
        quantized = quantized_weight(blocks.unpack())
        if quantized.serves_rows:
            embedding.use_quantized(quantized)
            del embedding.weight.gguf_blocks  # type: ignore[attr-defined]  # the loading tag, no longer needed
            return f"{blocks.gguf_type} as {quantized.name}"
    return str(embedding.weight.dtype).removeprefix("torch.")


def _weight_bytes(model: nn.Module) -> int:
    """The parameters' bytes and each quantized weight's once (a tied embedding shares its head's)."""
    dense = sum(param.numel() * param.element_size() for param in model.parameters())
    quantized = {id(weight): weight.nbytes for weight in _quantized_weights(model)}
    experts = [module.quantized for module in model.modules() if isinstance(module, RoutedExperts)]
    return dense + sum(quantized.values()) + sum(held.nbytes for held in experts if held is not None)


def _quantized_weights(model: nn.Module) -> Iterator[QuantizedWeight]:
    for module in model.modules():
        weight = module.weight_format.quantized if isinstance(module, GemmModule) else None
        if isinstance(module, Embedding):
            weight = module.quantized
        if weight is not None:
            yield weight


def _concat_rows(parts: list[Int4Groups | Int8Groups]) -> Int4Groups | Int8Groups:
    """Parts of one GGUF kind (the caller checked) stacked along their output rows."""
    int4 = [part for part in parts if isinstance(part, Int4Groups)]
    if len(int4) == len(parts):
        return Int4Groups.concat(int4)
    return Int8Groups.concat([part for part in parts if isinstance(part, Int8Groups)])
