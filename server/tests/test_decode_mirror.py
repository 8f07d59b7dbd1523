"""The decode mirror: rows 0..B-1 for each step's decodes, copies only what a row lacks, equals the gather path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shard_testing import make_runner, new_request, staggered_decodes, warmed, write_tiny_llama
from tandem_server.cli import config_from_args
from tandem_server.engine.model_runner import ModelRunner
from tandem_server.engine.step import ScheduledRequest, StepInput
from tandem_server.errors import ConfigError
from tandem_server.layers.attention import TorchAttentionBackend
from tandem_server.layers.attention.torch_decode_mirror import COLUMN_QUANTUM, DecodeMirror, MirrorGeometry, MirrorSlot
from tandem_server.sampling import SamplingParams

GEOMETRY = MirrorGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype=torch.float32)
# Keys and values of one position in both layers: 2 * 2 layers * 2 heads * 8 dims * 4 bytes.
POSITION_BYTES = 256


def mirror(budget_bytes: int = 1 << 30) -> DecodeMirror:
    return DecodeMirror(GEOMETRY, budget_bytes, torch.device("cpu"))


def test_each_step_gives_its_decodes_rows_zero_to_batch_size_and_keeps_continuing_rows() -> None:
    placed = mirror()
    assert placed.bytes_per_position == POSITION_BYTES
    first = placed.place([(10, 5), (11, 3), (12, 9)])
    assert first == {10: MirrorSlot(0, 0), 11: MirrorSlot(1, 0), 12: MirrorSlot(2, 0)}
    # A continuing request keeps its row and reports the context it already holds; a newcomer takes a free row.
    second = placed.place([(12, 10), (13, 2), (10, 6)])
    assert second == {12: MirrorSlot(2, 9), 13: MirrorSlot(1, 0), 10: MirrorSlot(0, 5)}
    # The batch shrinks to two: row 2 is outside 0..1, so request 12 moves into row 1 and copies everything again.
    third = placed.place([(12, 11), (10, 7)])
    assert third == {12: MirrorSlot(1, 0), 10: MirrorSlot(0, 6)}


def test_forgotten_requests_and_steps_without_decodes_release_every_row() -> None:
    placed = mirror()
    placed.place([(1, 4), (2, 4)])
    placed.forget([1])
    assert placed.place([(1, 5), (2, 5)]) == {1: MirrorSlot(0, 0), 2: MirrorSlot(1, 4)}
    assert placed.place([]) == {}
    assert placed.place([(2, 6)]) == {2: MirrorSlot(0, 0)}
    placed.clear()
    assert placed.place([(2, 7)]) == {2: MirrorSlot(0, 0)}


def test_reallocation_recopies_every_row_fits_the_need_and_respects_the_budget() -> None:
    placed = mirror(budget_bytes=8 * COLUMN_QUANTUM * 2 * POSITION_BYTES)
    placed.place([(1, 10), (2, 20)])
    assert (placed.capacity, placed.nbytes) == (COLUMN_QUANTUM, 8 * COLUMN_QUANTUM * POSITION_BYTES)
    assert placed.place([(1, 11), (2, COLUMN_QUANTUM + 1)]) == {1: MirrorSlot(0, 0), 2: MirrorSlot(1, 0)}
    assert placed.capacity == 2 * COLUMN_QUANTUM
    # Nine rows would need 9 x 512 positions, over the budget: no placement, and the rows already held stay valid.
    assert placed.place([(i, 2 * COLUMN_QUANTUM) for i in range(9)]) is None
    assert placed.place([(1, 12), (2, COLUMN_QUANTUM + 2)]) == {
        1: MirrorSlot(0, 11),
        2: MirrorSlot(1, COLUMN_QUANTUM + 1),
    }
    # Nine short contexts: 16 rows of 256 positions, not 16 rows of the 512 positions the long one needed before.
    assert placed.place([(i, 100) for i in range(9)]) is not None
    assert (placed.capacity, placed.nbytes) == (COLUMN_QUANTUM, 16 * COLUMN_QUANTUM * POSITION_BYTES)
    # A step without decodes hands the memory back.
    assert placed.place([]) == {}
    assert placed.nbytes == 0


def test_a_budget_below_the_rounded_size_still_leaves_room_to_grow_in_place() -> None:
    placed = mirror(budget_bytes=1024 * POSITION_BYTES)
    assert placed.place([(1, 4)]) == {1: MirrorSlot(0, 0)}
    assert (placed.capacity, placed.nbytes) == (128, 1024 * POSITION_BYTES)  # 8 rows of 128, not 1 row of 4
    assert placed.place([(1, 5)]) == {1: MirrorSlot(0, 4)}


def test_a_budget_smaller_than_one_request_never_places_it() -> None:
    placed = mirror(budget_bytes=POSITION_BYTES * 3)
    assert placed.place([(1, 4)]) is None
    assert placed.nbytes == 0


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(path)
    return path


def mirror_of(runner: ModelRunner) -> DecodeMirror | None:
    """The decode mirror of the runner's torch attention backend."""
    backend = runner.model.backend
    assert isinstance(backend, TorchAttentionBackend)
    return backend.mirror


def staggered_run(runner: ModelRunner) -> tuple[dict[int, list[int]], list[torch.Tensor]]:
    return staggered_decodes(runner, SamplingParams(temperature=0.8, seed=3))


def test_decodes_through_the_mirror_equal_decodes_through_gathered_blocks(checkpoint: Path) -> None:
    mirrored = warmed(make_runner(checkpoint, kv_cache_memory=1 << 20))
    gathered = warmed(make_runner(checkpoint, kv_cache_memory=1 << 20, decode_mirror_memory=0))
    mirrored_tokens, mirrored_logits = staggered_run(mirrored)
    gathered_tokens, gathered_logits = staggered_run(gathered)
    assert mirror_of(gathered) is None
    mirror = mirror_of(mirrored)
    assert mirror is not None and mirror.nbytes > 0
    assert mirrored_tokens == gathered_tokens
    assert len(mirrored_logits) == len(gathered_logits)
    for got, want in zip(mirrored_logits, gathered_logits, strict=True):
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def record_placements(runner: ModelRunner) -> list[dict[int, MirrorSlot] | None]:
    """Every placement the runner's mirror makes from now on, None for a step that gathered instead."""
    mirror = mirror_of(runner)
    assert mirror is not None
    placements: list[dict[int, MirrorSlot] | None] = []
    place = mirror.place

    def recording(decodes: list[tuple[int, int]]) -> dict[int, MirrorSlot] | None:
        placements.append(place(decodes))
        return placements[-1]

    mirror.place = recording  # type: ignore[method-assign]
    return placements


def test_a_mirror_too_small_for_the_batch_falls_back_to_gathering_with_the_same_tokens(checkpoint: Path) -> None:
    # Room for 64 positions (keys and values of 2 layers x 2 heads x 16 dims each): early decodes fit, later ones
    # gather from the blocks.
    small = warmed(make_runner(checkpoint, kv_cache_memory=1 << 20, decode_mirror_memory=64 * 2 * 2 * 2 * 16 * 4))
    gathered = warmed(make_runner(checkpoint, kv_cache_memory=1 << 20, decode_mirror_memory=0))
    placements = record_placements(small)
    assert staggered_run(small)[0] == staggered_run(gathered)[0]
    assert None in placements
    assert any(placement for placement in placements)


def test_a_failed_forward_pass_leaves_no_row_assumed_whole(checkpoint: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runner = warmed(make_runner(checkpoint, kv_cache_memory=1 << 20))
    placements = record_placements(runner)
    runner.step(StepInput(new_requests=(new_request(1, [3, 4, 5]),), scheduled=(ScheduledRequest(1, 3, (0, 1), 0),)))
    runner.step(StepInput(scheduled=(ScheduledRequest(1, 1, (), 3),)))
    fifth_position = StepInput(scheduled=(ScheduledRequest(1, 1, (), 4),))

    def failing(*args: object) -> torch.Tensor:
        raise RuntimeError("device lost")

    monkeypatch.setattr(runner.model, "forward", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        runner.step(fifth_position)
    monkeypatch.undo()
    runner.step(fifth_position)
    # The failed step found row 0 holding 4 positions; its retry finds nothing assumed copied.
    assert placements == [{}, {1: MirrorSlot(0, 0)}, {1: MirrorSlot(0, 4)}, {1: MirrorSlot(0, 0)}]


def test_decode_mirror_memory_flag_defaults_to_half_the_kv_cache_on_cpu_and_is_refused_on_cuda() -> None:
    base = ["--model-path", "m", "--uds-path", "s", "--kv-cache-memory", "2GiB"]
    assert config_from_args(base).decode_mirror_memory == 1024**3
    assert config_from_args([*base, "--decode-mirror-memory", "auto"]).decode_mirror_memory == 1024**3
    assert config_from_args([*base, "--decode-mirror-memory", "512MiB"]).decode_mirror_memory == 512 * 1024**2
    assert config_from_args([*base, "--decode-mirror-memory", "0"]).decode_mirror_memory == 0
    assert config_from_args([*base, "--device", "cuda"]).decode_mirror_memory == 0
    assert config_from_args([*base, "--device", "cuda", "--decode-mirror-memory", "auto"]).decode_mirror_memory == 0
    with pytest.raises(ConfigError, match="--decode-mirror-memory is a CPU option"):
        config_from_args([*base, "--device", "cuda", "--decode-mirror-memory", "1GiB"])
    with pytest.raises(ConfigError, match="invalid size 'lots'"):
        config_from_args([*base, "--decode-mirror-memory", "lots"])
