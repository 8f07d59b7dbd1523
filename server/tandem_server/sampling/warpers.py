"""Top-k and top-p truncation with per-row parameters, computed on one shared sort."""

from __future__ import annotations

import torch


def apply_top_k_top_p(logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None) -> torch.Tensor:
    """Sets truncated tokens to -inf. top_k 0 keeps all; top_p keeps the smallest head reaching mass top_p."""
    if top_k is None and top_p is None:
        return logits
    sorted_logits, order = logits.sort(dim=-1, descending=True, stable=True)
    vocab = logits.shape[-1]
    ranks = torch.arange(vocab, device=logits.device).expand_as(sorted_logits)
    if top_k is not None:
        keep = torch.where(top_k > 0, top_k, vocab).clamp(max=vocab).unsqueeze(1)
        sorted_logits = sorted_logits.masked_fill(ranks >= keep, float("-inf"))
    if top_p is not None:
        probs = sorted_logits.softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        # The most likely token always survives, so no row is left empty.
        drop = (mass_before >= top_p.unsqueeze(1)) & (ranks > 0)
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(-1, order, sorted_logits)
