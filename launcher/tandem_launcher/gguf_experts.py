"""A mixture-of-experts layer's expert stacks in a GGUF file, and how transformers joins them.

llama.cpp stores a layer's experts as three 3-D tensors `blk.N.ffn_{gate,up,down}_exps` `[experts, rows, columns]`;
transformers holds the gate and up stacks as one `mlp.experts.gate_up_proj` (the gate stack's rows, then the up
stack's) and the down stack as `mlp.experts.down_proj`. The float conversion and the kept blocks join them alike.
"""

from __future__ import annotations

import re

import numpy as np

EXPERT_STACK = re.compile(r"(?P<stack>.*\.ffn_(?P<part>gate|up|down)_exps)\.weight$")
GATE_UP_ORDER = ("gate", "up")


def stack_gate_up(parts: dict[str, np.ndarray]) -> np.ndarray:
    """The gate and up stacks (floats, or rows of blocks of one type) as one `[experts, 2 * rows, columns]` array."""
    missing = [part for part in GATE_UP_ORDER if part not in parts]
    if missing:
        raise ValueError(f"an expert layer has no {' or '.join(missing)} stack")
    return np.concatenate([parts[part] for part in GATE_UP_ORDER], axis=1)
