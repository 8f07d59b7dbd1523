"""Test helpers for speculative decoding on the shard: a driver that steps requests to their end, proposing drafts
(tokens, or a count the shard's draft model fills) for every decode, and an oracle that drafts a known answer."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shard_testing import new_request
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import NewRequest, ScheduledRequest, StepInput
from tandem_server.sampling import SamplingParams

BLOCK_SIZE = 4
# The tiny checkpoint's vocabulary.
VOCAB_SIZE = 96
BLOCKS_PER_REQUEST = 16
# (request, its tokens so far) -> the drafts to propose after them.
Drafter = Callable[[int, list[int]], list[int]]


@dataclass
class _Request:
    request: NewRequest
    first_block: int
    tokens: list[int] = field(default_factory=list)
    num_computed: int = 0
    blocks_held: int = 0
    done: bool = False


@dataclass
class Outcome:
    tokens: dict[int, list[int]]
    logprobs: dict[int, list[float]]
    drafted: int = 0
    accepted: int = 0
    steps: int = 0


def run(
    runner: ModelRunner,
    requests: list[NewRequest],
    drafter: Drafter | None,
    max_drafts: int = 4,
    model_drafts: int = 0,
    draft_every: int = 1,
) -> Outcome:
    """Steps every request to its end, one step at a time, proposing drafts for each decode when `drafter` is set,
    or asking the shard's draft model for `model_drafts` of them, in every `draft_every`-th step."""
    tracked = {r.id: _Request(r, index * BLOCKS_PER_REQUEST, list(r.token_ids)) for index, r in enumerate(requests)}
    outcome = Outcome({r.id: [] for r in requests}, {r.id: [] for r in requests})
    first = True
    while any(not t.done for t in tracked.values()):
        scheduled = []
        for rid, t in tracked.items():
            if t.done:
                continue
            num_tokens = len(t.tokens) - t.num_computed
            generated = len(outcome.tokens[rid])
            allowed = t.request.stopping.max_new_tokens - generated - 1
            drafts = drafter(rid, t.tokens)[: min(max_drafts, allowed)] if drafter and generated else []
            drafts_now = generated and outcome.steps % draft_every == 0
            num_model_drafts = max(0, min(model_drafts, allowed)) if drafts_now else 0
            num_drafts = len(drafts) + num_model_drafts
            needed = max(0, -(-(t.num_computed + num_tokens + num_drafts) // BLOCK_SIZE) - t.blocks_held)
            blocks = tuple(range(t.first_block + t.blocks_held, t.first_block + t.blocks_held + needed))
            t.blocks_held += needed
            scheduled.append(ScheduledRequest(rid, num_tokens, blocks, t.num_computed, tuple(drafts), num_model_drafts))
            outcome.drafted += num_drafts
        new = tuple(t.request for t in tracked.values()) if first else ()
        first = False
        output = runner.step(StepInput(new_requests=new, scheduled=tuple(scheduled)))
        outcome.steps += 1
        assert output.failures == ()
        counts: dict[int, int] = {}
        for generation in output.generations:
            t = tracked[generation.id]
            t.tokens.append(generation.token_id)
            outcome.tokens[generation.id].append(generation.token_id)
            outcome.logprobs[generation.id].append(generation.logprob)
            counts[generation.id] = counts.get(generation.id, 0) + 1
            t.done = t.done or generation.finish_reason is not None
        for s in scheduled:
            t = tracked[s.id]
            kept = counts.get(s.id, 1) - 1
            outcome.accepted += kept
            t.num_computed = s.num_computed_tokens + s.num_tokens + kept
    return outcome


def oracle(reference: dict[int, list[int]], prompts: dict[int, int], wrong_every: int = 0) -> Drafter:
    """Drafts the reference continuation; with `wrong_every`, every such draft position is off by one token."""

    def propose(rid: int, tokens: list[int]) -> list[int]:
        generated = len(tokens) - prompts[rid]
        upcoming = reference[rid][generated : generated + 4]
        if wrong_every:
            upcoming = [
                (t + 1) % VOCAB_SIZE if (generated + i) % wrong_every == 1 else t for i, t in enumerate(upcoming)
            ]
        return upcoming

    return propose


def greedy_and_seeded_requests() -> list[NewRequest]:
    """A greedy request and two seeded ones of different lengths, prompts and sampling settings."""
    seeded = SamplingParams(temperature=0.8, top_p=0.95, seed=21)
    return [
        new_request(1, [5, 20, 21, 22], max_new_tokens=14),
        new_request(2, [7, *range(30, 39)], max_new_tokens=11, sampling=seeded),
        new_request(3, [9, 50, 51], max_new_tokens=9, sampling=replace(seeded, seed=5, top_p=1.0)),
    ]
