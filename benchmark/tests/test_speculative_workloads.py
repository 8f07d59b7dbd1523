"""The speculative benchmark's workloads: grounded and free text change every round, the repeated one never does."""

from __future__ import annotations

from tandem_bench.speculative_run import workloads


def test_grounded_and_free_prompts_are_new_each_round_and_the_repeated_one_is_the_same() -> None:
    by_name = {workload.name: workload.prompts for workload in workloads(words=40, requests=4)}
    assert set(by_name) == {"grounded", "free", "repeated"}
    for name in ("grounded", "free"):
        assert len(set(by_name[name])) == 4, name
    assert len(by_name["repeated"]) == 1
    assert all(prompt.startswith("Copy the text below exactly.") for prompt in by_name["grounded"])
