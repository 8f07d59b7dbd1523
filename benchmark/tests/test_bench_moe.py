"""`tandem-bench moe`: the tiny model's config and the comparison's arithmetic."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_bench import moe_run
from tandem_bench.cli import SUBCOMMANDS
from tandem_bench.moe_run import StaticBatches, StreamsResult, build_parser, output_lengths, speedup, tiny_moe_config
from tandem_bench.peers import StaticBatchResult


def test_the_tiny_model_is_mixtral_with_eight_experts_of_which_each_token_takes_two() -> None:
    config = tiny_moe_config(vocab_size=49152, bos_token_id=1, eos_token_id=2, dtype="bfloat16")
    assert config["architectures"] == ["MixtralForCausalLM"]
    assert (config["num_local_experts"], config["num_experts_per_tok"]) == (8, 2)
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (49152, 1, 2)
    assert config["dtype"] == "bfloat16"
    # The experts' grouped GEMMs need a hidden size that is a multiple of 8.
    assert config["hidden_size"] % 8 == 0


def test_speedup_compares_output_tokens_per_second() -> None:
    tandem = StreamsResult(streams=32, tokens=4096, seconds=2.0)
    baseline = StaticBatchResult(
        batch=32, input_len=50, output_len=128, seconds=8.0, output_throughput=512.0, decode_step_ms=60.0
    )
    assert tandem.output_throughput == 2048.0
    assert speedup(tandem, baseline) == 4.0


def test_moe_is_a_subcommand_defaulting_to_32_streams_in_bfloat16() -> None:
    assert "moe" in SUBCOMMANDS
    args = build_parser().parse_args([])
    assert (args.streams, args.dtype, args.output_len_spread, args.requests) == (32, "bfloat16", 0.0, None)


def test_without_spread_every_request_asks_for_the_same_length() -> None:
    assert output_lengths(5, 128, 0.0) == [128] * 5


def test_spread_lengths_are_seeded_and_stay_within_their_range() -> None:
    lengths = output_lengths(200, 100, 0.75, seed=3)
    assert lengths == output_lengths(200, 100, 0.75, seed=3)
    assert min(lengths) >= 25 and max(lengths) <= 175
    assert len(set(lengths)) > 50


def test_static_batches_run_each_batch_to_its_longest_request_and_count_only_requested_tokens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[int, int]] = []

    def fake_static(batch: int, input_len: int, output_len: int, dtype: str, model_dir: Path) -> StaticBatchResult:
        calls.append((batch, output_len))
        return StaticBatchResult(batch, input_len, output_len, output_len / 10, 0.0, 0.0, dtype)

    monkeypatch.setattr(moe_run, "run_transformers_static", fake_static)
    result = moe_run.static_batches([10, 40, 20, 30, 50], 2, 8, "bfloat16", Path("m"))
    assert calls == [(2, 40), (2, 30), (1, 50)]
    assert (result.tokens, result.seconds) == (150, 12.0)
    assert StaticBatches.mean([result, StaticBatches(150, 18.0)]).seconds == 15.0
