"""Test-only fault injection: one rank fails or hangs in a chosen Step, to exercise the router's recovery.

A planned fault names `RANK:STEP`. STEP counts, from 1, the Steps this shard process ran since it started that
schedule at least one request (forward passes); Warmup, Health and Steps that only register or forget requests do
not count, and Reset does not restart the count. Only the shard whose rank is RANK acts. The faults live in a wrapper
around the runner, installed only when a fault flag names this rank.
"""

from __future__ import annotations

import logging
import re
import threading
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING

from tandem_server.errors import ConfigError, ShardError
from tandem_server.metrics import CompilationState

if TYPE_CHECKING:
    import torch

    from tandem_server.engine.launched import LaunchedStep
    from tandem_server.engine.model_runner import ExecutionOptions, ModelRunner
    from tandem_server.engine.step import StepInput, StepOutput, WarmupPlan, WarmupResult
    from tandem_server.lora import LoraRegistry

logger = logging.getLogger(__name__)

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


class FaultInjectingRunner:
    """The runner's interface to the servicer, with this rank's planned fault in its forward-pass Steps."""

    def __init__(self, runner: ModelRunner, faults: StepFaults) -> None:
        self._runner = runner
        self._faults = faults
        # Set by `release`: lets an injected hang end so the process can exit.
        self._released = threading.Event()

    @property
    def options(self) -> ExecutionOptions:
        return self._runner.options

    @property
    def device(self) -> torch.device:
        return self._runner.device

    def warmup(self, plan: WarmupPlan) -> WarmupResult:
        return self._runner.warmup(plan)

    def health_check(self) -> None:
        self._runner.health_check()

    def reset(self) -> None:
        self._runner.reset()

    def compilation(self) -> CompilationState:
        return self._runner.compilation()

    @property
    def lora(self) -> LoraRegistry:
        return self._runner.lora

    def launch(self, step: StepInput) -> LaunchedStep:
        """The runner's launch, unless this is the Step planned to fail or hang."""
        fault = self._faults.on_step(len(step.scheduled))
        if fault is FaultKind.HANG:
            logger.warning("injected fault: this step never returns (--fault-inject-step-hang)")
            self._released.wait()
            raise InjectedFaultError("injected hang released at shutdown (--fault-inject-step-hang)")
        if fault is FaultKind.ERROR:
            self._faults.raise_error()
        return self._runner.launch(step)

    def complete(self, launched: LaunchedStep) -> StepOutput:
        return self._runner.complete(launched)

    def release(self) -> None:
        """Ends an injected hang (at shutdown)."""
        self._released.set()


def inject_faults(runner: ModelRunner, plan: FaultPlan, rank: int) -> FaultInjectingRunner | None:
    """A fault-injecting wrapper around `runner` when `plan` names this rank; None (serve the runner as it is)
    otherwise."""
    faults = StepFaults(plan, rank)
    if not faults.armed:
        return None
    logger.warning("fault injection armed (tests only): %s", plan)
    return FaultInjectingRunner(runner, faults)
