"""Checks of the test-only fault-injection flags (`--fault-inject-step-error`, `--fault-inject-step-hang`)."""

from __future__ import annotations

import re

_FAULT_TARGET = re.compile(r"^(\d+):(\d+)$")


def fault_problems(step_error: str | None, step_hang: str | None, num_shard: int) -> list[str]:
    """What is wrong with the RANK:STEP targets of the fault-injection flags given."""
    problems = []
    for flag, value in (("--fault-inject-step-error", step_error), ("--fault-inject-step-hang", step_hang)):
        if value is None:
            continue
        match = _FAULT_TARGET.match(value.strip())
        if match is None or int(match.group(2)) < 1:
            problems.append(f"{flag} expects RANK:STEP with STEP >= 1 (e.g. 0:5), got {value!r}")
        elif int(match.group(1)) >= num_shard:
            problems.append(f"{flag} names rank {match.group(1)}, but --num-shard is {num_shard}")
    return problems
