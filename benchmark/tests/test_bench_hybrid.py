"""`tandem-bench hybrid`: the tiny hybrids' configs, the chats it sends, the turn-by-turn arithmetic and its tables."""

from __future__ import annotations

import asyncio

import pytest
from bench_sse_server import Script, serve
from tandem_bench import hybrid_run
from tandem_bench.cli import SUBCOMMANDS
from tandem_bench.client import Endpoint, RequestResult
from tandem_bench.cpu_features import CpuFeatures, parse_cpuinfo
from tandem_bench.hybrid_model import FAMILIES, describe_model, hybrid_config
from tandem_bench.hybrid_report import ChatRun, ThroughputFigures, format_throughput, format_turns
from tandem_bench.hybrid_run import CACHE_OFF_FLAGS, build_parser, interleaved_chats, throughput_prompts
from tandem_bench.multi_turn import ChatShape, TurnTimings, build_conversations, run_chats, turn_ratios


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_mixes_recurrent_layers_with_attention_and_speaks_the_given_tokenizer(family: str) -> None:
    config = hybrid_config(family, vocab_size=49152, bos_token_id=1, eos_token_id=2)
    kinds = set(config["layer_types"])
    assert len(kinds) == 2 and kinds & {"linear_attention", "mamba"} and kinds & {"full_attention", "attention"}
    assert len(config["layer_types"]) == config["num_hidden_layers"]
    assert (config["vocab_size"], config["bos_token_id"], config["eos_token_id"]) == (49152, 1, 2)


def test_the_model_is_described_by_its_layers_kinds() -> None:
    config = {**hybrid_config("qwen3_5", 100, 1, 2), "architectures": ["Qwen3_5ForCausalLM"]}
    assert describe_model(config) == (
        "Qwen3_5ForCausalLM, 8 layers (6 recurrent, 2 attention), hidden 512, vocabulary 100"
    )


def test_conversations_share_one_system_prompt_and_differ_in_their_messages() -> None:
    shape = ChatShape(conversations=3, turns=5, system_words=500, user_words=20, output_len=7, seed=1)
    conversations = build_conversations(shape)
    assert conversations == build_conversations(shape)
    assert len({conversation.system for conversation in conversations}) == 1
    assert len(str(conversations[0].system).split()) >= 500
    assert all(len(conversation.turns) == 5 for conversation in conversations)
    messages = [turn.text for conversation in conversations for turn in conversation.turns]
    assert len(set(messages)) == len(messages)
    assert all(len(text.split()) == 20 for text in messages)
    assert {turn.output_len for conversation in conversations for turn in conversation.turns} == {7}


def _result(ttft: float, prompt_tokens: int, success: bool = True) -> RequestResult:
    return RequestResult(success=success, ttft=ttft, prompt_tokens=prompt_tokens)


def test_timings_group_by_turn_and_leave_failures_out() -> None:
    timings = TurnTimings.from_conversations(
        [
            [_result(0.1, 100), _result(0.4, 200)],
            [_result(0.3, 102), _result(0.0, 0, success=False)],
        ]
    )
    assert timings.ttft_s == [[0.1, 0.3], [0.4]]
    assert timings.median_ttft_ms() == pytest.approx([200.0, 400.0])
    assert timings.mean_prompt_tokens() == [101.0, 200.0]
    assert timings.failed == 1


def test_turn_ratios_divide_cached_by_uncached_and_skip_empty_turns() -> None:
    assert turn_ratios([100.0, 50.0, 10.0], [100.0, 200.0, 0.0]) == [1.0, 0.25, None]


def _chat_run(medians_s: list[float], hits: float, prefix_caching: bool) -> ChatRun:
    timings = TurnTimings([[value] for value in medians_s], [[100 * (turn + 1)] for turn in range(len(medians_s))], 0)
    return ChatRun(timings, prefix_caching, queried_tokens=1000.0, hit_tokens=hits)


def test_the_turn_table_reports_every_turn_the_last_ratio_and_the_hit_tokens() -> None:
    table = format_turns(_chat_run([0.5, 0.1], 600.0, True), _chat_run([0.5, 0.4], 0.0, False))
    assert "| 2 | 200 | 100 | 400 | 0.25x |" in table
    assert "Turn 2 with the defaults / prefix cache off: 0.25x" in table
    assert "prefix_caching=true, tandem_prefix_cache_hits_tokens_total 600 of 1000 queried prompt tokens (60%)" in table


def test_rounds_pool_their_timings_by_turn_and_sum_their_cache_counts() -> None:
    first, second = _chat_run([0.1, 0.2], 10.0, True), _chat_run([0.3], 5.0, True)
    combined = ChatRun.combine([first, second])
    assert combined.timings.ttft_s == [[0.1, 0.3], [0.2]]
    assert (combined.hit_tokens, combined.queried_tokens, combined.prefix_caching) == (15.0, 2000.0, True)


def test_chat_rounds_alternate_the_servers_order_and_draw_new_chats_each_round(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls: list[tuple[str, int]] = []

    async def no_warm_up(endpoint: Endpoint, count: int, seed: int) -> None:
        return None

    def fake_chat_run(endpoint: Endpoint, shape: ChatShape, timeout_s: float) -> ChatRun:
        calls.append((endpoint.base_url, shape.seed))
        return _chat_run([0.1], 0.0, False)

    monkeypatch.setattr(hybrid_run, "chat_endpoint", lambda base_url: Endpoint(name=base_url, base_url=base_url))
    monkeypatch.setattr(hybrid_run, "warm_up", no_warm_up)
    monkeypatch.setattr(hybrid_run, "chat_run", fake_chat_run)
    on, off = interleaved_chats(["on", "off"], ChatShape(seed=7), rounds=3, timeout_s=1.0)
    assert calls == [("on", 7), ("off", 7), ("off", 8), ("on", 8), ("on", 9), ("off", 9)]
    assert len(on.timings.ttft_s[0]) == len(off.timings.ttft_s[0]) == 3


def test_throughput_compares_tandem_with_static_batching() -> None:
    figures = ThroughputFigures(streams=32, tandem_tok_s=300.0, transformers_tok_s=100.0, transformers_runs=2)
    assert figures.ratio == 3.0
    assert "Tandem / transformers: 3.00x" in format_throughput(figures, rounds=2)


def test_throughput_prompts_are_seeded_and_one_per_stream() -> None:
    prompts = throughput_prompts(4, 10)
    assert prompts == throughput_prompts(4, 10) and len(set(prompts)) == 4
    assert all(len(prompt.split()) == 10 for prompt in prompts)


def test_hybrid_is_a_subcommand_running_both_workloads_at_32_streams_and_5_turns_by_default() -> None:
    assert "hybrid" in SUBCOMMANDS
    args = build_parser().parse_args([])
    assert (args.streams, args.turns, args.conversations, args.family) == (32, 5, 4, "qwen3_5")
    assert args.chat_rounds == 2
    assert args.only == ["throughput", "multi-turn"]
    assert CACHE_OFF_FLAGS == ["--prefix-caching", "false"]


def test_chats_resend_their_history_and_are_timed_turn_by_turn() -> None:
    script = Script(first_delay_s=0.05, pieces=("answer",), gaps_s=())
    conversations = build_conversations(ChatShape(conversations=2, turns=3, system_words=5, user_words=3))

    async def go() -> TurnTimings:
        async with serve(script) as base_url:
            endpoint = Endpoint(name="fake", base_url=base_url, api="chat", model="m")
            return await run_chats(endpoint, conversations, timeout_s=30)

    timings = asyncio.run(go())
    assert [len(turn) for turn in timings.ttft_s] == [2, 2, 2]
    assert all(ttft >= 0.05 for turn in timings.ttft_s for ttft in turn)
    assert max(len(body["messages"]) for body in script.received) == 1 + 3 + 2


def test_cpu_features_name_the_vector_and_matrix_instructions() -> None:
    text = "model name\t: Some CPU\nflags\t\t: fpu avx avx2 avx512f avx512_bf16 avx512_vnni amx_tile sse4_2\n"
    model, flags = parse_cpuinfo(text)
    assert (model, flags) == ("Some CPU", ("amx_tile", "avx", "avx2", "avx512_bf16", "avx512_vnni", "avx512f"))
    assert CpuFeatures(model, 2, flags).describe() == "Some CPU, 2 cores: AVX-512 with BF16 and VNNI, AMX"
    assert CpuFeatures("Old CPU", 4, ("avx", "avx2")).describe() == "Old CPU, 4 cores: AVX2, no AMX"
