"""The client against a real local SSE server with known delays."""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from bench_sse_server import Script, serve
from tandem_bench.client import Endpoint, RequestResult, stream_request
from tandem_bench.datasets import Conversation, Turn
from tandem_bench.load import LoadPoint, run_load
from tandem_bench.runner import resolve_models

# Scheduling noise on a busy machine can delay any chunk's delivery, so a gap may look longer or (after a late
# chunk) shorter; the scripted gaps differ by more than the noise allowed, so each must match its own delay.
SLACK_S = 0.08


async def _one_request(script: Script, api: str) -> RequestResult:
    async with serve(script) as base_url, aiohttp.ClientSession() as session:
        endpoint = Endpoint(name="fake", base_url=base_url, api=api, model="m")
        return await stream_request(session, endpoint, [{"role": "user", "content": "hello there"}], 4)


@pytest.mark.parametrize("api", ["completions", "chat"])
def test_measured_ttft_and_itl_match_the_server_delays(api: str) -> None:
    script = Script()
    result = asyncio.run(_one_request(script, api))
    assert result.success, result.error
    assert script.first_delay_s <= result.ttft < script.first_delay_s + SLACK_S
    assert len(result.itl) == len(script.gaps_s)
    for measured, expected in zip(result.itl, script.gaps_s, strict=True):
        assert abs(measured - expected) < SLACK_S
    assert result.output_tokens == 4
    assert result.prompt_tokens == 7
    assert result.text == "abcd"
    assert result.e2e == pytest.approx(result.ttft + sum(result.itl), abs=0.02)
    assert result.tpot == pytest.approx((result.e2e - result.ttft) / 3)


def test_request_body_asks_for_usage_and_merges_extra_body() -> None:
    script = Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0))

    async def go() -> None:
        async with serve(script) as base_url, aiohttp.ClientSession() as session:
            endpoint = Endpoint(name="fake", base_url=base_url, model="m", extra_body={"ignore_eos": True})
            await stream_request(session, endpoint, [{"role": "user", "content": "x"}], 9)

    asyncio.run(go())
    body = script.received[0]
    assert body["stream_options"] == {"include_usage": True}
    assert body["max_tokens"] == 9 and body["temperature"] == 0.0 and body["ignore_eos"] is True
    assert body["prompt"] == "x"


def test_output_tokens_fall_back_to_counting_chunks_without_usage() -> None:
    result = asyncio.run(_one_request(Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0), send_usage=False), "chat"))
    assert result.success
    assert result.output_tokens == 4
    assert result.prompt_tokens is None


def test_http_error_is_recorded_as_a_failure_with_its_status() -> None:
    result = asyncio.run(_one_request(Script(status=429), "completions"))
    assert not result.success
    assert "HTTP 429" in result.error and "overloaded" in result.error


def test_error_object_in_the_stream_fails_the_request() -> None:
    result = asyncio.run(_one_request(Script(first_delay_s=0.0, error_after_first=True), "completions"))
    assert not result.success
    assert "shard failed" in result.error


def test_unreachable_server_is_a_failure_not_an_exception() -> None:
    async def go() -> RequestResult:
        async with aiohttp.ClientSession() as session:
            endpoint = Endpoint(name="none", base_url="http://127.0.0.1:9", model="m")
            return await stream_request(session, endpoint, [{"role": "user", "content": "x"}], 4)

    result = asyncio.run(go())
    assert not result.success and result.error


def test_multi_turn_requests_carry_earlier_answers() -> None:
    script = Script(first_delay_s=0.0, pieces=("ans",), gaps_s=())
    conversation = Conversation(system="sys", turns=(Turn("first", 1, 1), Turn("second", 1, 1)))

    async def go() -> None:
        async with serve(script) as base_url:
            endpoint = Endpoint(name="fake", base_url=base_url, api="chat", model="m")
            outcome = await run_load(endpoint, [conversation], LoadPoint(concurrency=1), seed=0)
            assert [r.success for r in outcome.results] == [True, True]

    asyncio.run(go())
    assert script.received[1]["messages"] == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "first"},
        {"role": "assistant", "content": "ans"},
        {"role": "user", "content": "second"},
    ]


def test_model_name_comes_from_v1_models_when_not_given() -> None:
    async def go() -> list[Endpoint]:
        async with serve(Script()) as base_url:
            return await resolve_models([Endpoint(name="fake", base_url=base_url)])

    assert asyncio.run(go())[0].model == "fake-model"


def test_closed_loop_keeps_exactly_n_requests_in_flight() -> None:
    script = Script(first_delay_s=0.1, pieces=("x",), gaps_s=())
    conversations = [Conversation(None, (Turn("p", 1, 1),)) for _ in range(8)]

    async def go() -> list[RequestResult]:
        async with serve(script) as base_url:
            endpoint = Endpoint(name="fake", base_url=base_url, model="m")
            return (await run_load(endpoint, conversations, LoadPoint(concurrency=4), seed=0)).results

    results = asyncio.run(go())
    starts = sorted(r.start for r in results)
    # Two waves of four: the second wave starts only after the first answers (~0.1 s later).
    assert starts[3] - starts[0] < 0.05
    assert starts[4] - starts[0] >= 0.09
