"""PEFT's `adapter_config.json`: the rank, the scaling and the target modules of a LoRA adapter, checked for what
the shard serves."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tandem_server.errors import LoraAdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# The base model's projections an adapter may change, by their checkpoint names.
TARGET_MODULES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# PEFT's shorthand for every linear layer but the output head.
ALL_LINEAR = "all-linear"


@dataclass(frozen=True)
class LoraConfig:
    """What the shard reads of an adapter's configuration."""

    rank: int
    # Multiplies B @ A: lora_alpha / r, or lora_alpha / sqrt(r) with rsLoRA.
    scaling: float
    # The module names the configuration allows, when it lists them; None: a regular expression or `all-linear`,
    # so the tensors present decide.
    target_modules: frozenset[str] | None


def read_adapter_config(name: str, directory: Path) -> LoraConfig:
    """Reads and checks `directory/adapter_config.json` of adapter `name`."""
    path = directory / CONFIG_FILE
    if not path.is_file():
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path} is missing (expected PEFT's adapter_config.json)")
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path} is not readable JSON: {error}") from error
    if not isinstance(raw, dict):
        raise LoraAdapterError(f"LoRA adapter {name!r}: {path} must hold a JSON object")
    _refuse_unsupported(name, raw)
    rank = raw.get("r")
    alpha = raw.get("lora_alpha", rank)
    if not isinstance(rank, int) or isinstance(rank, bool) or rank < 1:
        raise LoraAdapterError(f"LoRA adapter {name!r}: `r` must be a positive integer, got {rank!r}")
    if not isinstance(alpha, int | float) or isinstance(alpha, bool):
        raise LoraAdapterError(f"LoRA adapter {name!r}: `lora_alpha` must be a number, got {alpha!r}")
    scaling = alpha / math.sqrt(rank) if raw.get("use_rslora", False) else alpha / rank
    return LoraConfig(rank, float(scaling), _target_modules(name, raw.get("target_modules")))


def _refuse_unsupported(name: str, raw: dict[str, Any]) -> None:
    """Options whose weights the shard would apply wrongly are refused, never ignored."""
    if raw.get("peft_type", "LORA") != "LORA":
        raise LoraAdapterError(f"LoRA adapter {name!r}: peft_type is {raw['peft_type']!r}; only LORA is served")
    if raw.get("bias", "none") != "none":
        raise LoraAdapterError(f"LoRA adapter {name!r}: bias is {raw['bias']!r}; only adapters with bias 'none'")
    for option in ("modules_to_save", "rank_pattern", "alpha_pattern"):
        if raw.get(option):
            raise LoraAdapterError(
                f"LoRA adapter {name!r}: {option} is set ({raw[option]!r}); adapters with {option} are not supported"
            )
    for flag in ("use_dora", "lora_bias"):
        if raw.get(flag):
            raise LoraAdapterError(f"LoRA adapter {name!r}: {flag} is set; only plain LoRA adapters are served")


def _target_modules(name: str, targets: object) -> frozenset[str] | None:
    if isinstance(targets, str):
        if targets == ALL_LINEAR:
            return None
        try:
            re.compile(targets)
        except re.error as error:
            raise LoraAdapterError(
                f"LoRA adapter {name!r}: target_modules {targets!r} is not a regular expression: {error}"
            ) from error
        return None
    if not isinstance(targets, list) or not targets or not all(isinstance(target, str) for target in targets):
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: target_modules must be a list of module names or a regular expression, "
            f"got {targets!r}"
        )
    unknown = sorted(set(targets) - set(TARGET_MODULES))
    if unknown:
        raise LoraAdapterError(
            f"LoRA adapter {name!r}: unknown target module(s) {unknown}; supported: {', '.join(TARGET_MODULES)}"
        )
    return frozenset(targets)
