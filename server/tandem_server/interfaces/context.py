"""How many positions a model serves, from its config.json; torch-free, so the launcher derives its token limits
from the same rule the shard sizes its rotary tables by."""

from __future__ import annotations

from typing import Any


def served_positions(config: dict[str, Any], max_position_embeddings: int) -> int:
    """`max_position_embeddings`, or `factor` times as many for dynamic NTK rope scaling, whose base grows with the
    sequence past `max_position_embeddings` (as vLLM serves it)."""
    params = {**(config.get("rope_scaling") or {}), **(config.get("rope_parameters") or {})}
    if params.get("rope_type", params.get("type")) != "dynamic":
        return max_position_embeddings
    return int(max_position_embeddings * float(params.get("factor", 1.0)))
