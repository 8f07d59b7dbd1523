"""`tandem-bench agent`: the sessions' shape, their round-robin against a stand-in SSE server, and the figures."""

from __future__ import annotations

import asyncio

from bench_sse_server import Script, serve
from tandem_bench.agent_run import AgentFigures, build_parser, build_sessions, format_figures, run_sessions
from tandem_bench.cli import SUBCOMMANDS
from tandem_bench.client import RequestResult


def test_agent_is_a_subcommand_whose_sessions_share_a_system_prompt_and_keep_their_own_context() -> None:
    assert "agent" in SUBCOMMANDS
    args = build_parser().parse_args(["--sessions", "3", "--turns", "4"])
    sessions = build_sessions(args)
    assert len(sessions) == 3
    assert len({session.system for session in sessions}) == 1
    assert len({session.context for session in sessions}) == 3
    assert all(len(session.follow_ups) == 3 for session in sessions)
    assert build_sessions(args) == sessions, "the same seed, the same words"


def test_turns_go_round_robin_and_each_turn_resends_the_whole_history() -> None:
    args = build_parser().parse_args(["--sessions", "2", "--turns", "3"])
    sessions = build_sessions(args)
    script = Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0))

    async def run() -> list[list[RequestResult]]:
        async with serve(script) as base_url:
            return await run_sessions(base_url, sessions, args)

    results = asyncio.run(run())
    assert [len(session) for session in results] == [3, 3]
    contexts = [body["messages"][1]["content"] for body in script.received]
    assert contexts == [sessions[0].context, sessions[1].context] * 3, "one turn of each session in turn"
    assert [len(body["messages"]) for body in script.received] == [2, 2, 4, 4, 6, 6]
    assert script.received[2]["messages"][2] == {"role": "assistant", "content": "abcd"}
    assert script.most_in_flight == 1


def test_the_figures_are_follow_up_medians_and_the_share_served_from_cache() -> None:
    def result(ttft: float, prompt: int, cached: int) -> RequestResult:
        return RequestResult(success=True, ttft=ttft, prompt_tokens=prompt, cached_tokens=cached)

    plain = AgentFigures("no-offload", [result(1.0, 900, 0)], [result(0.8, 1000, 100), result(1.2, 1000, 100)], 0)
    offload = AgentFigures("offload", [result(1.0, 900, 0)], [result(0.1, 1000, 900), result(0.3, 1000, 950)], 120)
    assert (plain.follow_up_ttft_ms, offload.follow_up_ttft_ms) == (1000.0, 200.0)
    assert (plain.cached_share, offload.cached_share) == (0.1, 0.925)
    table = format_figures([plain, offload], build_parser().parse_args([]))
    assert "| offload | 1000 | 200 | 92% | 120 | 0 |" in table
    assert "follow-up TTFT without offload / with offload: 5.00x" in table
