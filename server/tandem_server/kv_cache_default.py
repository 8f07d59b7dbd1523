"""`--kv-cache-memory auto`: the CPU KV cache's budget, chosen from the model and the machine at Warmup (once the
cache's bytes per token are known), with the reason it logs.

The cache holds `AUTO_KV_TOKENS` tokens of the model's keys and values, like a llama.cpp context of that many tokens:
room for three sequences at the default 4096-token limit, or 32 streams of 384 tokens. On the embedded model that is
270 MiB, and with the decode mirror (half of it) and the weights the shard stays under 1.5 GiB with the cache full.
Two bounds keep it from taking more than earlier releases did or than the machine has: `AUTO_KV_MAX_BYTES`, and a
share of the memory available once the weights are loaded, split between the ranks on the node. A value the user gave
is kept as given.
"""

from __future__ import annotations

from dataclasses import dataclass

from tandem_server.config import parse_byte_size

AUTO = "auto"
AUTO_KV_TOKENS = 12_288
AUTO_KV_MAX_BYTES = 1024**3
# At most this share of the memory available after loading (split between the node's ranks) goes to the cache.
AUTO_KV_AVAILABLE_SHARE = 4


def parse_kv_cache_memory(text: str) -> int | None:
    """Bytes for the KV cache; `auto` is None (the shard sizes it from the model at Warmup)."""
    return None if text.strip() == AUTO else parse_byte_size(text)


@dataclass(frozen=True)
class CacheFootprint:
    """What one token of the cache takes on this rank, and how the budget's reason describes it."""

    bytes_per_token: int
    description: str
    # Tokens the cache keeps beside those the router may use (the block reserved for health checks).
    reserved_tokens: int = 0


def auto_kv_cache_memory(footprint: CacheFootprint, available_bytes: int, ranks_on_node: int) -> tuple[int, str]:
    """`auto`'s budget in bytes and the sentence logged with it."""
    wanted = (AUTO_KV_TOKENS + footprint.reserved_tokens) * footprint.bytes_per_token
    machine = available_bytes // (AUTO_KV_AVAILABLE_SHARE * max(1, ranks_on_node))
    budget = min(wanted, AUTO_KV_MAX_BYTES, machine)
    room = f"room for {AUTO_KV_TOKENS} tokens of {footprint.bytes_per_token} bytes ({footprint.description})"
    if budget == wanted:
        reason = room
    elif budget == AUTO_KV_MAX_BYTES:
        reason = f"{room} would take over {_mebibytes(AUTO_KV_MAX_BYTES)}"
    else:
        split = f", split between {ranks_on_node} ranks" if ranks_on_node > 1 else ""
        reason = f"{room} would take over a quarter of the {_mebibytes(available_bytes)} available{split}"
    if budget < wanted:
        reason += f", so it holds {budget // footprint.bytes_per_token - footprint.reserved_tokens} tokens"
    return budget, f"--kv-cache-memory {_mebibytes(budget)}: {reason}"


def _mebibytes(size: int) -> str:
    return f"{size / 2**20:.0f}MiB"
