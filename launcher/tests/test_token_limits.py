"""Token limits derived from the model's context length unless flags set them."""

from __future__ import annotations

import pytest
from tandem_launcher.config import LauncherConfig
from tandem_launcher.limits import TokenLimitError, TokenLimits, derive_token_limits


def test_total_is_the_context_capped_at_4096_and_input_one_less() -> None:
    assert derive_token_limits(LauncherConfig(), 8192) == TokenLimits(4095, 4096)
    assert derive_token_limits(LauncherConfig(), 2048) == TokenLimits(2047, 2048)


def test_flags_override_the_derived_limits() -> None:
    assert derive_token_limits(LauncherConfig(max_input_tokens=100), 8192) == TokenLimits(100, 4096)
    assert derive_token_limits(LauncherConfig(max_total_tokens=1000), 8192) == TokenLimits(999, 1000)


def test_input_must_leave_room_for_output() -> None:
    with pytest.raises(TokenLimitError, match="--max-input-tokens 4096 must be less than --max-total-tokens 4096"):
        derive_token_limits(LauncherConfig(max_input_tokens=4096), 8192)


def test_total_may_not_exceed_the_model_context() -> None:
    with pytest.raises(TokenLimitError, match="exceeds the model's context length 2048"):
        derive_token_limits(LauncherConfig(max_total_tokens=3000), 2048)


def test_a_model_without_context_length_needs_a_flag() -> None:
    with pytest.raises(TokenLimitError, match="pass --max-total-tokens"):
        derive_token_limits(LauncherConfig(), None)
    assert derive_token_limits(LauncherConfig(max_total_tokens=300), None) == TokenLimits(299, 300)
