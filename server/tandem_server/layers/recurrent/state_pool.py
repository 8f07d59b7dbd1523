"""The recurrent state of hybrid models: one slot per running request in every recurrent layer, keyed by request id.

A recurrent layer (a short convolution, a linear-attention or state-space layer) keeps a fixed-size state per
sequence instead of keys and values per token. The pool holds, per state of each recurrent layer (a layer may keep
several: Gated DeltaNet's convolution inputs and its delta-rule state), a tensor `[slots, *shape]`;
a request takes a slot when its first span runs and gives it back when it is forgotten (finished, cancelled,
preempted), through the same path that forgets the decode mirror's rows.

Beside the slots the pool keeps checkpoints: copies of one sequence's whole state after a block-aligned prefix, which
the router addresses by id (it owns which checkpoint holds which prefix). A request that starts after a cached prefix
restores its slot from one; a span that ends where the router wants a checkpoint saves its slot into one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import torch

from tandem_server.errors import InvalidStepError


@dataclass(frozen=True)
class StepStates:
    """What the recurrent layers of one step read and write: each sequence's slot, in batch order, and the pools.

    Each layer reads `layers[i][slots]` as the state before the step and writes the state after it back there."""

    slots: torch.Tensor
    layers: Sequence[torch.Tensor]


def state_pool_bytes(
    shapes: Sequence[tuple[int, ...]], num_slots: int, dtype: torch.dtype, fixed_dtypes: Sequence[torch.dtype | None]
) -> int:
    """The bytes `RecurrentStatePool(shapes, num_slots, dtype, device, fixed_dtypes)` allocates."""
    dtypes = _pool_dtypes(shapes, dtype, fixed_dtypes)
    return sum(num_slots * math.prod(shape) * each.itemsize for shape, each in zip(shapes, dtypes, strict=True))


def _pool_dtypes(
    shapes: Sequence[tuple[int, ...]], dtype: torch.dtype, fixed_dtypes: Sequence[torch.dtype | None]
) -> list[torch.dtype]:
    fixed = [*fixed_dtypes, *[None] * (len(shapes) - len(fixed_dtypes))]
    return [each or dtype for each in fixed]


@dataclass
class _Slot:
    index: int
    # Tokens the slot's state has absorbed; the request's next span must start here.
    position: int


class RecurrentStatePool:
    """Owns the recurrent layers' state tensors and which request holds which slot.

    Invariants: a slot belongs to at most one request; a slot's state equals the request's state after its first
    `position` tokens, because a request's spans run in order and each starts where the previous one ended.
    """

    def __init__(
        self,
        shapes: Sequence[tuple[int, ...]],
        num_slots: int,
        dtype: torch.dtype,
        device: torch.device,
        fixed_dtypes: Sequence[torch.dtype | None] = (),
    ) -> None:
        """One pool per entry of `shapes`, in `dtype` unless `fixed_dtypes` names another for that entry."""
        if num_slots < 1:
            raise InvalidStepError("the recurrent state needs at least one slot")
        self.num_slots = num_slots
        dtypes = _pool_dtypes(shapes, dtype, fixed_dtypes)
        self.layers = [
            torch.zeros((num_slots, *shape), dtype=each, device=device)
            for shape, each in zip(shapes, dtypes, strict=True)
        ]
        self._slots: dict[int, _Slot] = {}
        self._free = list(range(num_slots - 1, -1, -1))
        self.checkpoints: list[torch.Tensor] = []
        # The position each checkpoint was saved at; absent: it holds no state.
        self._checkpoint_positions: dict[int, int] = {}

    def allocate_checkpoints(self, count: int) -> None:
        """Makes `count` empty checkpoints, replacing any there were."""
        self.checkpoints = [
            torch.zeros((count, *layer.shape[1:]), dtype=layer.dtype, device=layer.device) for layer in self.layers
        ]
        self._checkpoint_positions.clear()

    @property
    def num_checkpoints(self) -> int:
        return self.checkpoints[0].shape[0] if self.checkpoints else 0

    @property
    def checkpoint_bytes(self) -> int:
        return sum(checkpoint.numel() * checkpoint.element_size() for checkpoint in self.checkpoints)

    def restore(self, request_id: int, checkpoint: int, position: int) -> None:
        """Starts `request_id`'s state from `checkpoint`, which must hold the state after exactly `position` tokens."""
        saved_at = self._checkpoint_positions.get(self._check_checkpoint(checkpoint))
        if saved_at != position:
            held = "no state" if saved_at is None else f"the state after {saved_at} tokens"
            raise InvalidStepError(
                f"request {request_id} resumes at position {position} from state checkpoint {checkpoint}, which holds "
                f"{held}"
            )
        slot = self._slots.get(request_id) or self._take(request_id)
        for layer, saved in zip(self.layers, self.checkpoints, strict=True):
            layer[slot.index].copy_(saved[checkpoint])
        slot.position = position

    def restore_all(self, restores: Mapping[int, int], positions: Mapping[int, int]) -> None:
        """`restore` for each request of `restores` (request id to checkpoint), each at its position."""
        for request_id, checkpoint in restores.items():
            self.restore(request_id, checkpoint, positions[request_id])

    def save(self, request_id: int, checkpoint: int) -> None:
        """Copies `request_id`'s state, as it stands now, into `checkpoint`."""
        slot = self._slots.get(request_id)
        if slot is None:
            raise InvalidStepError(f"request {request_id} holds no recurrent state to save")
        self._check_checkpoint(checkpoint)
        for layer, saved in zip(self.layers, self.checkpoints, strict=True):
            saved[checkpoint].copy_(layer[slot.index])
        self._checkpoint_positions[checkpoint] = slot.position

    def _check_checkpoint(self, checkpoint: int) -> int:
        if not 0 <= checkpoint < self.num_checkpoints:
            raise InvalidStepError(
                f"state checkpoint {checkpoint} is outside 0..{self.num_checkpoints - 1}"
                if self.num_checkpoints
                else f"state checkpoint {checkpoint} does not exist: the shard keeps none"
            )
        return checkpoint

    @property
    def held(self) -> int:
        """Slots held by requests."""
        return len(self._slots)

    @property
    def nbytes(self) -> int:
        return sum(layer.numel() * layer.element_size() for layer in self.layers)

    def place(self, spans: Sequence[tuple[int, int, int]]) -> StepStates:
        """The slots of this step's spans, given as (request id, first position, tokens) in batch order.

        A span from position 0 starts its request's state afresh; any other span continues the state its request
        left at exactly that position (an error otherwise: the state of the tokens before it does not exist).
        """
        indices = []
        for request_id, start, num_tokens in spans:
            slot = self._slot_for(request_id, start)
            indices.append(slot.index)
            slot.position = start + num_tokens
        device = self.layers[0].device
        return StepStates(torch.tensor(indices, dtype=torch.long, device=device), self.layers)

    def forget(self, request_ids: Iterable[int]) -> None:
        """Frees the slots of requests that finished, were preempted, or arrive anew under a known id."""
        for request_id in request_ids:
            slot = self._slots.pop(request_id, None)
            if slot is not None:
                self._free.append(slot.index)

    def clear(self) -> None:
        """Frees every slot (after a reset or a failed step, when no state is whole)."""
        self._slots.clear()
        self._free = list(range(self.num_slots - 1, -1, -1))

    def _slot_for(self, request_id: int, start: int) -> _Slot:
        slot = self._slots.get(request_id)
        if start == 0:
            if slot is None:
                slot = self._take(request_id)
            for layer in self.layers:
                layer[slot.index].zero_()
            return slot
        if slot is None or slot.position != start:
            held = "none" if slot is None else f"state through position {slot.position}"
            raise InvalidStepError(
                f"request {request_id} resumes at position {start}, but the shard holds {held}: a recurrent "
                "model's request must run every token from its first, in order"
            )
        return slot

    def _take(self, request_id: int) -> _Slot:
        if not self._free:
            raise InvalidStepError(
                f"request {request_id} needs a recurrent state slot, but all {self.num_slots} are held by running "
                "requests; the router must run at most max_batch_requests requests at once"
            )
        slot = _Slot(self._free.pop(), 0)
        self._slots[request_id] = slot
        return slot
