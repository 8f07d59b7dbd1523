"""The restart policy: exponential backoff and a bounded number of restarts per sliding window."""

from __future__ import annotations

from tandem_launcher.restarts import MAX_DELAY_S, RestartBudget


def test_backoff_doubles_from_one_second() -> None:
    budget = RestartBudget(max_restarts=4, window=600.0)
    assert [budget.next_delay(t) for t in (0.0, 1.0, 2.0, 3.0)] == [1.0, 2.0, 4.0, 8.0]


def test_budget_is_spent_after_max_restarts_within_the_window() -> None:
    budget = RestartBudget(max_restarts=3, window=600.0)
    assert all(budget.next_delay(t) is not None for t in (0.0, 10.0, 20.0))
    assert budget.next_delay(30.0) is None


def test_restarts_older_than_the_window_no_longer_count() -> None:
    budget = RestartBudget(max_restarts=2, window=100.0)
    assert budget.next_delay(0.0) == 1.0
    assert budget.next_delay(50.0) == 2.0
    assert budget.next_delay(60.0) is None
    assert budget.next_delay(101.0) == 2.0  # the restart at 0 s left the window; the one at 50 s still counts


def test_zero_restarts_means_never_restart() -> None:
    assert RestartBudget(max_restarts=0, window=600.0).next_delay(0.0) is None


def test_backoff_is_capped() -> None:
    budget = RestartBudget(max_restarts=20, window=1e9)
    delays = [budget.next_delay(float(t)) for t in range(20)]
    assert max(d for d in delays if d is not None) == MAX_DELAY_S
