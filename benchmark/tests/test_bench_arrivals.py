"""Open-loop arrival statistics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from tandem_bench.load import arrival_offsets


def _gaps(rate: float, burstiness: float, count: int = 20000) -> np.ndarray:
    return np.diff(arrival_offsets(count, rate, burstiness, seed=1))


def test_poisson_arrivals_have_mean_gap_one_over_rate_and_unit_cv() -> None:
    gaps = _gaps(rate=4.0, burstiness=1.0)
    assert gaps.mean() == pytest.approx(0.25, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


def test_burstiness_keeps_the_rate_and_sets_the_spread() -> None:
    bursty, smooth = _gaps(rate=4.0, burstiness=0.25), _gaps(rate=4.0, burstiness=4.0)
    for gaps in (bursty, smooth):
        assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    # A gamma gap of shape k has coefficient of variation 1/sqrt(k).
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.08)
    assert smooth.std() / smooth.mean() == pytest.approx(0.5, rel=0.05)


def test_arrivals_start_at_zero_increase_and_repeat_with_the_seed() -> None:
    offsets = arrival_offsets(100, 10.0, 1.0, seed=7)
    assert offsets[0] == 0.0 and len(offsets) == 100
    assert all(b >= a for a, b in itertools.pairwise(offsets))
    assert offsets == arrival_offsets(100, 10.0, 1.0, seed=7)


def test_infinite_rate_sends_everything_at_once() -> None:
    assert arrival_offsets(5, math.inf, 1.0, seed=0) == [0.0] * 5


def test_non_positive_rate_is_rejected() -> None:
    with pytest.raises(ValueError):
        arrival_offsets(5, 0.0, 1.0, seed=0)
