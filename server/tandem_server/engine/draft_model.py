"""The draft model: a smaller model with the target's vocabulary that proposes a drafting request's next tokens."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

from tandem_server.engine.requests import RequestState
from tandem_server.errors import NotWarmedUpError
from tandem_server.execution.batch import ScheduledSpan, build_step_batch
from tandem_server.execution.chain import Execution
from tandem_server.execution.kv_cache import CacheGeometry, KVCache
from tandem_server.execution.protocol import ExecutionPlan
from tandem_server.models.registry import CausalLM


@dataclass(frozen=True)
class DraftRow:
    """A request that drafts this step, and how many tokens it asks the draft model for."""

    state: RequestState
    count: int


@dataclass(frozen=True)
class _Written:
    """What a request's draft keys and values hold: its own tokens at positions 0..computed-1, then the drafts it
    ran after them, which are its own too while they equal its tokens."""

    computed: int
    drafts: tuple[int, ...] = ()

    def confirmed(self, token_ids: Sequence[int]) -> int:
        """Leading positions that hold the keys and values of `token_ids` themselves."""
        kept = 0
        for draft, token in zip(self.drafts, token_ids[self.computed :], strict=False):
            if draft != token:
                break
            kept += 1
        return self.computed + kept


class DraftModel:
    """Proposes drafts greedily from its own model and KV cache.

    The cache has the target's block size and block ids, so the router's block tables address both; a request's
    draft keys and values are written when it drafts, catching up from where they last matched its tokens. They
    only decide which drafts are proposed: the target keeps a draft only where it equals its own draw, so nothing
    they hold can change a request's tokens.
    """

    def __init__(self, model: CausalLM, architecture: str, cache_dtype: torch.dtype, device: torch.device) -> None:
        self.model = model
        self.architecture = architecture
        self.cache_dtype = cache_dtype
        self.cache: KVCache | None = None
        # CUDA: the plan's shapes replay as graphs over `cache`, from Warmup on.
        self.execution = Execution.build(model, device)
        # Bounds the tokens of one catch-up forward pass, like the router bounds a step's.
        self._max_forward_tokens = 1
        self._written: dict[int, _Written] = {}

    def describe(self) -> str:
        """The draft model as Info reports it."""
        num_layers = self.model.spec.num_layers
        return f"{self.architecture}, {num_layers} layer{'s' if num_layers != 1 else ''}"

    def geometry(self, block_size: int) -> CacheGeometry:
        spec = self.model.spec
        return CacheGeometry.of(spec, block_size, self.cache_dtype)

    def bind(self, cache: KVCache, plan: ExecutionPlan) -> None:
        """Drafts into `cache` from now on, in forward passes of at most the plan's tokens; nothing written before
        counts."""
        self._written.clear()
        self.cache = None
        self.execution.prepare(cache, plan)
        self.cache = cache
        self._max_forward_tokens = max(1, plan.max_batch_tokens)

    def forget(self, request_ids: Iterable[int]) -> None:
        ids = list(request_ids)
        for request_id in ids:
            self._written.pop(request_id, None)
        self.execution.forget(ids)

    def clear(self) -> None:
        self._written.clear()
        self.execution.clear()

    def propose(self, rows: Sequence[DraftRow]) -> dict[int, tuple[int, ...]]:
        """`row.count` greedy drafts after each row's last token, by request id.

        Invariant: each row's tokens are all known and its block table holds positions up to its last token plus
        `count`, as for drafts the router proposes.
        """
        try:
            drafts = {row.state.id: [token] for row, token in zip(rows, self._catch_up(rows), strict=True)}
            for depth in range(1, max((row.count for row in rows), default=0)):
                deeper = [row for row in rows if row.count > depth]
                spans = [
                    ScheduledSpan(
                        [drafts[row.state.id][-1]],
                        len(row.state.token_ids) + depth - 1,
                        row.state.block_table,
                        row.state.id,
                    )
                    for row in deeper
                ]
                for row, token in zip(deeper, self._greedy(spans), strict=True):
                    drafts[row.state.id].append(token)
        except BaseException:
            # A layer may have stopped halfway through what the backend keeps between steps: nothing kept is whole.
            self.clear()
            raise
        for row in rows:
            # Every draft but the last ran through the model, at the positions after the request's tokens.
            self._written[row.state.id] = _Written(len(row.state.token_ids), tuple(drafts[row.state.id][:-1]))
        return {request_id: tuple(tokens) for request_id, tokens in drafts.items()}

    def _catch_up(self, rows: Sequence[DraftRow]) -> list[int]:
        """Runs each row's tokens from its first unconfirmed position through its last, in forward passes of at
        most `_max_forward_tokens` tokens; returns each row's first draft."""
        starts = {row.state.id: self._confirmed(row.state) for row in rows}
        first: dict[int, int] = {}
        while len(first) < len(rows):
            budget = self._max_forward_tokens
            spans, finishing = [], []
            for row in rows:
                state = row.state
                if state.id in first or budget == 0:
                    continue
                start = starts[state.id]
                end = min(len(state.token_ids), start + budget)
                spans.append(ScheduledSpan(state.token_ids[start:end], start, state.block_table, state.id))
                budget -= end - start
                starts[state.id] = end
                finishing.append(state.id if end == len(state.token_ids) else None)
            tokens = self._greedy(spans)
            first.update(
                (request_id, token)
                for request_id, token in zip(finishing, tokens, strict=True)
                if request_id is not None
            )
        return [first[row.state.id] for row in rows]

    def _confirmed(self, state: RequestState) -> int:
        written = self._written.get(state.id)
        # The last token always runs: its hidden state proposes the first draft.
        confirmed = written.confirmed(state.token_ids) if written is not None else 0
        return min(confirmed, len(state.token_ids) - 1)

    def _greedy(self, spans: list[ScheduledSpan]) -> list[int]:
        """The most likely token after each span, once its keys and values are written."""
        cache = self._require_cache()
        batch = build_step_batch(spans, cache.block_size, cache.layers[0].key.device)
        hidden = self.execution.forward(batch, cache.layers)
        rows = torch.tensor(batch.last_rows, dtype=torch.long, device=hidden.device)
        return self.model.compute_logits(hidden[rows]).argmax(dim=-1).tolist()

    def _require_cache(self) -> KVCache:
        if self.cache is None:
            raise NotWarmedUpError("the draft model has no KV cache; call Warmup first")
        return self.cache
