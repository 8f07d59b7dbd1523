"""A test router that plans step N+1 before step N has answered, as the real router does with two steps in flight."""

from __future__ import annotations

from dataclasses import dataclass, field

from tandem_server.engine.launched import LaunchedStep
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput, StepOutput

BLOCK_SIZE = 4
CHUNK = 6


@dataclass
class _Planned:
    """What a router knows of one request: tokens it scheduled, and how many of its draws are still unanswered."""

    request: NewRequest
    num_computed: int = 0
    next_block: int = 0
    blocks_held: int = 0
    unanswered: int = 0
    generated: list[int] = field(default_factory=list)
    done: bool = False

    @property
    def known_tokens(self) -> int:
        return len(self.request.token_ids) + len(self.generated) + self.unanswered


class PipelinedDriver:
    """Plans step N+1 before step N has answered, as the router does with two steps in flight (test-only): a
    decoding request is scheduled again on the token its previous step is still sampling."""

    def __init__(self, runner: ModelRunner, requests: list[NewRequest], blocks_per_request: int) -> None:
        self.runner = runner
        self.planned = {
            request.id: _Planned(request, next_block=index * blocks_per_request)
            for index, request in enumerate(requests)
        }
        self.step_id = 0
        # Steps whose launch found the step before them still open.
        self.overlapped = 0

    def run(self) -> dict[int, list[int]]:
        open_step: LaunchedStep | None = None
        while True:
            step = self._plan()
            if step is None:
                if open_step is None:
                    return {rid: planned.generated for rid, planned in self.planned.items()}
                self._apply(self.runner.complete(open_step))
                open_step = None
                continue
            launched = self.runner.launch(step)
            if open_step is not None:
                self.overlapped += open_step.outcome is None
                self._apply(self.runner.complete(open_step))
            open_step = launched

    def _plan(self) -> StepInput | None:
        new_requests, scheduled = [], []
        for planned in self.planned.values():
            max_new = planned.request.stopping.max_new_tokens
            if planned.done or len(planned.generated) + planned.unanswered >= max_new:
                continue
            if planned.num_computed == 0 and planned.blocks_held == 0:
                new_requests.append(planned.request)
            num_tokens = min(CHUNK, planned.known_tokens - planned.num_computed)
            needed = -(-(planned.num_computed + num_tokens + 1) // BLOCK_SIZE) - planned.blocks_held
            first = planned.next_block + planned.blocks_held
            blocks = tuple(range(first, first + needed))
            planned.blocks_held += needed
            scheduled.append(ScheduledRequest(planned.request.id, num_tokens, blocks, planned.num_computed))
            planned.num_computed += num_tokens
            planned.unanswered += planned.num_computed == planned.known_tokens
        if not scheduled:
            return None
        self.step_id += 1
        return StepInput(new_requests=tuple(new_requests), scheduled=tuple(scheduled))

    def _apply(self, output: StepOutput) -> None:
        assert output.failures == ()
        for generation in output.generations:
            planned = self.planned[generation.id]
            planned.unanswered -= 1
            planned.generated.append(generation.token_id)
            if generation.finish_reason is not None:
                planned.done = True
