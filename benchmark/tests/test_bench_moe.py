"""`tandem-bench moe`: the tiny model's config and the comparison's arithmetic."""

from __future__ import annotations

from tandem_bench.cli import SUBCOMMANDS
from tandem_bench.moe_run import StreamsResult, build_parser, speedup, tiny_moe_config
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
    assert (args.streams, args.dtype) == (32, "bfloat16")
