"""The GGUF metadata of mixture-of-experts files that transformers' GGUF loader leaves out of the config, read from the
file itself.

transformers maps a file's expert count and experts per token, but not the experts' own feed-forward width: without
it a Qwen-MoE conversion would build experts of the config class's default width and refuse the file's tensors.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFReader

# GGUF key (after `{architecture}.`) -> config.json field, per GGUF architecture.
MOE_CONFIG_KEYS: dict[str, dict[str, str]] = {
    "qwen2moe": {
        "expert_feed_forward_length": "moe_intermediate_size",
        "expert_shared_feed_forward_length": "shared_expert_intermediate_size",
    },
    "qwen3moe": {"expert_feed_forward_length": "moe_intermediate_size"},
}


def moe_config_overrides(gguf_path: Path) -> dict[str, Any]:
    """The config fields the file's metadata gives that transformers' GGUF loader does not map (none for a dense
    model)."""
    fields = GGUFReader(gguf_path).fields
    architecture = str(fields["general.architecture"].contents())
    overrides: dict[str, Any] = {}
    for key, config_field in MOE_CONFIG_KEYS.get(architecture, {}).items():
        field = fields.get(f"{architecture}.{key}")
        if field is not None:
            overrides[config_field] = field.contents()
    return overrides
