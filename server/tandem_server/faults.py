"""Test-only fault injection: one rank fails or hangs in a chosen Step, to exercise the router's recovery.

A planned fault names `RANK:STEP`. STEP counts, from 1, the Step RPCs this shard process received since it
started that schedule at least one request (forward passes); Warmup, Health and Steps that only register or
forget requests do not count, and Reset does not restart the count. Only the shard whose rank is RANK acts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from tandem_server.errors import ConfigError, ShardError

_TARGET = re.compile(r"^\s*(\d+)\s*:\s*(\d+)\s*$")


class FaultKind(Enum):
    """What the faulty rank does in the planned step."""

    ERROR = "error"
    HANG = "hang"


class InjectedFaultError(ShardError):
    """Raised in place of a forward pass by `--fault-inject-step-error` (or by a released injected hang)."""


@dataclass(frozen=True)
class FaultTarget:
    """The rank that faults and the 1-based number of its forward-pass Step that faults."""

    rank: int
    step: int

    @classmethod
    def parse(cls, text: str, flag: str) -> FaultTarget:
        """Parses `RANK:STEP` (STEP ≥ 1); a malformed value is a ConfigError naming `flag`."""
        match = _TARGET.match(text)
        if match is None or int(match.group(2)) < 1:
            raise ConfigError(f"{flag} expects RANK:STEP with STEP >= 1 (e.g. 0:5), got {text!r}")
        return cls(rank=int(match.group(1)), step=int(match.group(2)))


@dataclass(frozen=True)
class FaultPlan:
    """The faults planned for the whole group; empty (the default) injects nothing."""

    step_error: FaultTarget | None = None
    step_hang: FaultTarget | None = None


class StepFaults:
    """Counts this rank's forward-pass Steps and says which one carries the planned fault."""

    def __init__(self, plan: FaultPlan, rank: int) -> None:
        self._error_step = plan.step_error.step if plan.step_error and plan.step_error.rank == rank else None
        self._hang_step = plan.step_hang.step if plan.step_hang and plan.step_hang.rank == rank else None
        self._rank = rank
        self._steps = 0

    @property
    def armed(self) -> bool:
        """True when this rank has a fault planned."""
        return self._error_step is not None or self._hang_step is not None

    def on_step(self, num_scheduled: int) -> FaultKind | None:
        """Records a Step scheduling `num_scheduled` requests; the fault it must suffer, if any."""
        if num_scheduled == 0:
            return None
        self._steps += 1
        if self._steps == self._hang_step:
            return FaultKind.HANG
        if self._steps == self._error_step:
            return FaultKind.ERROR
        return None

    def raise_error(self) -> None:
        """Fails the current forward pass as `--fault-inject-step-error` asked."""
        raise InjectedFaultError(
            f"injected fault: rank {self._rank} fails its forward pass in step {self._steps} "
            "(--fault-inject-step-error)"
        )
