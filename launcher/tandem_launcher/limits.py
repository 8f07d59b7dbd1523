"""Per-request token limits: given by flags or derived from the model's context length."""

from __future__ import annotations

from dataclasses import dataclass

from tandem_launcher.config import LauncherConfig

DEFAULT_MAX_TOTAL_TOKENS = 4096


class TokenLimitError(Exception):
    """The token flags contradict each other or the model."""


@dataclass(frozen=True)
class TokenLimits:
    """Invariant: 0 < max_input_tokens < max_total_tokens."""

    max_input_tokens: int
    max_total_tokens: int


def derive_token_limits(config: LauncherConfig, max_position_embeddings: int | None) -> TokenLimits:
    """total = min(context, 4096) and input = total - 1 unless the flags say otherwise."""
    total = config.max_total_tokens
    if total is None:
        if max_position_embeddings is None:
            if config.max_input_tokens is None:
                raise TokenLimitError("the model's config.json declares no context length; pass --max-total-tokens")
            total = config.max_input_tokens + 1
        else:
            total = min(max_position_embeddings, DEFAULT_MAX_TOTAL_TOKENS)
    if max_position_embeddings is not None and total > max_position_embeddings:
        raise TokenLimitError(
            f"--max-total-tokens {total} exceeds the model's context length {max_position_embeddings}"
        )
    max_input = total - 1 if config.max_input_tokens is None else config.max_input_tokens
    if max_input >= total:
        raise TokenLimitError(f"--max-input-tokens {max_input} must be less than --max-total-tokens {total}")
    if max_input <= 0:
        raise TokenLimitError(f"--max-total-tokens {total} leaves no room for a prompt")
    return TokenLimits(max_input_tokens=max_input, max_total_tokens=total)
