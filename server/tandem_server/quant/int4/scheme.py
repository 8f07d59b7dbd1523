"""Reads a GPTQ or AWQ checkpoint's `quantization_config` (config.json); torch-free.

Both store each quantized linear layer as 4-bit values packed eight to an int32 (`qweight`), 4-bit zero points packed
the same way (`qzeros`) and float16 `scales`, one row of zeros and scales per group of input features:
- GPTQ (AutoGPTQ, GPTQModel, optimum): `qweight` `[in / 8, out]` packed along the inputs, `qzeros` `[groups, out / 8]`,
  `g_idx` `[in]` (each input's group). `checkpoint_format` "gptq" stores each zero point minus one, "gptq_v2" as is.
- AWQ (AutoAWQ, version "gemm"): `qweight` `[in, out / 8]` packed along the outputs in the nibble order
  `AWQ_NIBBLE_ORDER`, `qzeros` `[groups, out / 8]` the same way.
Either way `w = (q - z) * s` per group. An act-order GPTQ checkpoint (`desc_act`: `g_idx` puts inputs in groups out
of order) is read from its `g_idx`, so the config's flag needs no check.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem_server.errors import ConfigError

INT4_METHODS = ("gptq", "awq")
GPTQ_FORMATS = ("gptq", "gptq_v2")
# The group sizes a checkpoint may use: each must split into groups the CPU kernel takes (32 to 256 inputs).
GROUP_MULTIPLE = 32
_SUPPORTED = (
    "Tandem serves 4-bit GPTQ checkpoints (checkpoint_format gptq or gptq_v2) and AWQ version gemm "
    "(zero_point true), any group size that is a multiple of 32 or -1"
)


@dataclass(frozen=True)
class Int4Scheme:
    """How a GPTQ or AWQ checkpoint packs its int4 weights.

    `group_size` None: one group spans all input features. `zeros_offset`: what to add to a stored zero point (GPTQ's
    v1 format stores it minus one).
    """

    method: str
    group_size: int | None
    zeros_offset: int = 0

    @property
    def packed_along_inputs(self) -> bool:
        """GPTQ packs `qweight` along the input features, AWQ along the outputs."""
        return self.method == "gptq"


def checkpoint_int4_scheme(config: dict[str, Any]) -> Int4Scheme:
    """The scheme of a `quantization_config` whose `quant_method` is in `INT4_METHODS`; what Tandem cannot serve is
    refused naming the setting."""
    method = config.get("quant_method")
    bits = config.get("bits", config.get("w_bit"))
    if bits != 4:
        raise ConfigError(f"{method} quantization_config: bits {bits!r} is not supported; {_SUPPORTED}")
    group_size = _group_size(method, config.get("group_size", config.get("q_group_size")))
    if method == "gptq":
        return _gptq(config, group_size)
    version = str(config.get("version", "gemm")).lower()
    if version != "gemm":
        raise ConfigError(
            f"awq quantization_config: version {version!r} is not supported (its packing differs); {_SUPPORTED}"
        )
    if not config.get("zero_point", True):
        raise ConfigError(f"awq quantization_config: zero_point false is not supported; {_SUPPORTED}")
    return Int4Scheme("awq", group_size)


def _gptq(config: dict[str, Any], group_size: int | None) -> Int4Scheme:
    checkpoint_format = config.get("checkpoint_format", "gptq")
    if checkpoint_format not in GPTQ_FORMATS:
        raise ConfigError(
            f"gptq quantization_config: checkpoint_format {checkpoint_format!r} is not supported; {_SUPPORTED}"
        )
    return Int4Scheme("gptq", group_size, zeros_offset=1 if checkpoint_format == "gptq" else 0)


def _group_size(method: str | None, value: Any) -> int | None:
    if value == -1:
        return None
    if not isinstance(value, int) or value <= 0 or value % GROUP_MULTIPLE:
        raise ConfigError(f"{method} quantization_config: group_size {value!r} is not supported; {_SUPPORTED}")
    return value
