"""Step ordering: the router may send step N+1 before step N has answered; every rank runs them in id order."""

from __future__ import annotations

import asyncio

from tandem_server.errors import InvalidStepError, StepRefusedError


class StepOrder:
    """Hands out turns to Steps in `step_id` order; one failed Step refuses every later one until `restart`.

    Invariant: a Step holds its turn only while it queues for the servicer's lock, and it queues there before the
    next turn is given, so the lock (FIFO) runs Steps in id order.
    """

    def __init__(self) -> None:
        # None: the next Step may carry any id (the first after Warmup or Reset).
        self._next_id: int | None = None
        self._failed_id: int | None = None
        self._generation = 0
        self._changed = asyncio.Condition()

    async def wait_for_turn(self, step_id: int) -> int:
        """Waits until every earlier Step took its turn; returns the generation the turn belongs to."""
        async with self._changed:
            generation = self._generation
            await self._changed.wait_for(lambda: self._turn_of(step_id, generation))
            self.check_current(step_id, generation)
            if self._next_id is not None and step_id < self._next_id:
                raise InvalidStepError(f"step {step_id} arrived after step {self._next_id - 1} had already run")
            self._next_id = step_id + 1
            self._changed.notify_all()
            return generation

    def check_current(self, step_id: int, generation: int) -> None:
        """Refuses a Step whose turn came before a restart, or after a failed Step."""
        if generation != self._generation:
            raise StepRefusedError(f"step {step_id} was sent before the shard was reset")
        self.check_not_failed(step_id)

    def check_not_failed(self, step_id: int) -> None:
        """Refuses a Step queued behind a Step that failed."""
        if self._failed_id is not None:
            raise StepRefusedError(f"step {step_id} follows step {self._failed_id}, which failed; Reset first")

    def mark_failed(self, step_id: int) -> None:
        """Step `step_id` failed (callable from the model thread, so a Step queued behind it is refused at once)."""
        if self._failed_id is None:
            self._failed_id = step_id

    async def failed(self, step_id: int, generation: int) -> None:
        """Step `step_id` failed: the request state is no longer what later Steps were planned against; Steps
        waiting for their turn are woken to be refused. A Step from before a restart changes nothing."""
        async with self._changed:
            if generation == self._generation:
                self.mark_failed(step_id)
            self._changed.notify_all()

    async def restart(self) -> None:
        """After Warmup or Reset: any id may come next; Steps still waiting from before are refused."""
        async with self._changed:
            self._next_id = None
            self._failed_id = None
            self._generation += 1
            self._changed.notify_all()

    def _turn_of(self, step_id: int, generation: int) -> bool:
        if generation != self._generation or self._failed_id is not None:
            return True
        return self._next_id is None or step_id <= self._next_id
