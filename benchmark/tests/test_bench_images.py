"""`tandem-bench images`: the requests it builds, the figures it computes from their results, and one whole run
against a local fake server."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from bench_sse_server import Script, serve
from PIL import Image
from tandem_bench.client import Endpoint, RequestResult
from tandem_bench.images import (
    FRESH,
    POOLED,
    ImageWorkload,
    build_requests,
    priming_requests,
    split_rounds,
    warmup_requests,
)
from tandem_bench.images_report import ImagesReport, ModeRun, format_report, pooled_over_fresh
from tandem_bench.images_run import LoadShape, main, measure

SMALL = ImageWorkload(requests=6, pool_size=2, width=24, height=16, output_len=4, seed=3)


def image_part(messages: list[dict[str, Any]]) -> dict[str, Any]:
    (message,) = messages
    return next(part for part in message["content"] if part["type"] == "image_url")


def image_digest(messages: list[dict[str, Any]]) -> str:
    url = image_part(messages)["image_url"]["url"]
    prefix = "data:image/png;base64,"
    assert url.startswith(prefix)
    return hashlib.sha256(base64.b64decode(url[len(prefix) :])).hexdigest()


def texts(messages: list[dict[str, Any]]) -> list[str]:
    return [part["text"] for part in messages[0]["content"] if part["type"] == "text"]


@pytest.mark.parametrize("kind", ["noise", "solid"])
def test_every_request_is_a_user_message_with_text_around_a_png_data_url_of_the_asked_size(kind: str) -> None:
    workload = ImageWorkload(requests=3, pool_size=1, width=40, height=30, kind=kind, seed=1)
    for messages in build_requests(workload, FRESH):
        assert messages[0]["role"] == "user"
        assert [part["type"] for part in messages[0]["content"]] == ["text", "image_url", "text"]
        url = image_part(messages)["image_url"]["url"]
        image = Image.open(io.BytesIO(base64.b64decode(url.partition(",")[2])))
        assert (image.format, image.size, image.mode) == ("PNG", (40, 30), "RGB")


@pytest.mark.parametrize("kind", ["noise", "solid"])
def test_fresh_images_are_all_distinct_and_none_is_a_pool_or_warm_up_image(kind: str) -> None:
    workload = ImageWorkload(requests=50, pool_size=4, width=8, height=8, kind=kind, seed=5)
    fresh = [image_digest(messages) for messages in build_requests(workload, FRESH)]
    pool = {image_digest(messages) for messages in priming_requests(workload)}
    warmup = {image_digest(messages) for messages in warmup_requests(workload, 3)}
    assert len(set(fresh)) == 50
    assert len(pool) == 4 and len(warmup) == 3
    assert not set(fresh) & (pool | warmup) and not pool & warmup


def test_pooled_requests_cycle_through_the_primed_pool() -> None:
    pooled = [image_digest(messages) for messages in build_requests(SMALL, POOLED)]
    primed = [image_digest(messages) for messages in priming_requests(SMALL)]
    assert pooled == [primed[index % 2] for index in range(6)]


def test_both_modes_send_the_same_texts_request_by_request_and_priming_asks_none_of_their_questions() -> None:
    fresh, pooled = build_requests(SMALL, FRESH), build_requests(SMALL, POOLED)
    assert [texts(m) for m in fresh] == [texts(m) for m in pooled]
    preambles = {texts(m)[0] for m in fresh + priming_requests(SMALL)}
    assert len(preambles) == 1
    questions = [texts(m)[1] for m in fresh]
    assert len(set(questions)) == len(questions)
    assert len(questions[0].split()) == SMALL.question_words
    assert not {texts(m)[1] for m in priming_requests(SMALL)} & set(questions)


def test_the_same_seed_draws_the_same_requests_and_another_seed_other_images() -> None:
    again = ImageWorkload(requests=6, pool_size=2, width=24, height=16, output_len=4, seed=3)
    other = ImageWorkload(requests=6, pool_size=2, width=24, height=16, output_len=4, seed=4)
    assert build_requests(SMALL, FRESH) == build_requests(again, FRESH)
    first = {image_digest(m) for m in build_requests(SMALL, FRESH)}
    assert not first & {image_digest(m) for m in build_requests(other, FRESH)}


def test_rounds_split_the_requests_in_order_into_near_equal_slices() -> None:
    assert split_rounds(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]  # type: ignore[arg-type]


def test_an_unknown_image_kind_is_refused() -> None:
    with pytest.raises(ValueError, match="image kind"):
        ImageWorkload(kind="gradient")


def test_more_rounds_than_requests_is_a_usage_error() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["--base-url", "http://127.0.0.1:9", "--requests", "2", "--rounds", "3"])
    assert exit_info.value.code == 2


def done(ttft: float, cached: int | None = None, tokens: int = 4) -> RequestResult:
    return RequestResult(success=True, ttft=ttft, e2e=ttft + 0.1, output_tokens=tokens, cached_tokens=cached)


def test_percentiles_throughput_and_the_pooled_over_fresh_ratio_come_from_the_measured_requests() -> None:
    fresh = ModeRun(FRESH)
    fresh.add_round([done(0.1 * n, cached=32) for n in range(1, 6)], 1.0)
    fresh.add_round([done(0.1 * n, cached=32) for n in range(6, 11)], 1.5)
    pooled = ModeRun(POOLED)
    pooled.add_round([done(0.05 * n, cached=48) for n in range(1, 11)], 2.0)
    report = ImagesReport(fresh, pooled)
    summary = fresh.summary()
    assert summary.ttft.median == pytest.approx(550.0)
    assert summary.ttft.p90 == pytest.approx(910.0)
    assert summary.ttft.p99 == pytest.approx(991.0)
    assert summary.request_throughput == pytest.approx(10 / 2.5)
    ratios = report.ratios()
    assert ratios["ttft_p50"] == pytest.approx(0.5)
    assert ratios["ttft_p99"] == pytest.approx(0.5)
    assert ratios["request_throughput"] == pytest.approx(5.0 / 4.0)
    assert (fresh.mean_cached_tokens(), pooled.mean_cached_tokens()) == (32.0, 48.0)
    table = format_report(report)
    assert "| fresh image every request | 10/0 | 550.0 | 910.0 | 991.0 |" in table
    assert "TTFT p50 0.50x, p90 0.50x, p99 0.50x; requests/s 1.25x" in table


def test_failed_requests_are_counted_apart_and_a_ratio_over_nothing_is_none() -> None:
    fresh = ModeRun(FRESH, [RequestResult(success=False, error="HTTP 400: bad image")], 1.0)
    pooled = ModeRun(POOLED, [done(0.2)], 1.0)
    report = ImagesReport(fresh, pooled)
    assert report.failed == 1
    assert pooled_over_fresh(fresh.summary(), pooled.summary())["ttft_p50"] is None
    assert fresh.mean_cached_tokens() is None
    table = format_report(report)
    assert "| fresh image every request | 0/1 |" in table and "fresh error: HTTP 400: bad image" in table
    assert json.loads(json.dumps(report.to_dict()))["pooled_over_fresh"]["ttft_p50"] is None


def test_a_run_against_a_fake_server_sends_warm_up_priming_and_both_modes_at_the_asked_concurrency() -> None:
    script = Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0), cached_tokens=32)

    async def go() -> ImagesReport:
        async with serve(script) as base_url:
            endpoint = Endpoint(name="fake", base_url=base_url, api="chat", model="m")
            return await measure(endpoint, SMALL, LoadShape(concurrency=2, rounds=2, warmup=1))

    report = asyncio.run(go())
    assert len(script.received) == 1 + 2 + 6 + 6
    assert script.most_in_flight <= 2
    sent = [image_digest(body["messages"]) for body in script.received]
    measured_pooled = {image_digest(m) for m in build_requests(SMALL, POOLED)}
    assert set(sent[1:3]) == measured_pooled
    assert all(body["stream"] and body["max_tokens"] == 4 for body in script.received)
    assert len(report.fresh.results) == len(report.pooled.results) == 6
    assert all(result.success for result in report.fresh.results + report.pooled.results)
    # Words of the text parts only ("Look at the picture below." and the preamble, then the question).
    assert report.fresh.results[0].prompt_words == 5 + SMALL.preamble_words + SMALL.question_words
    assert report.pooled.mean_cached_tokens() == 32.0


def test_the_command_writes_its_results_for_a_running_server(tmp_path: Path) -> None:
    script = Script(first_delay_s=0.0, gaps_s=(0.0, 0.0, 0.0))
    output = tmp_path / "images.json"

    async def go() -> int:
        async with serve(script) as base_url:
            argv = ["--base-url", base_url, "--requests", "2", "--pool-size", "1", "--image-size", "8", "8"]
            argv += ["--rounds", "2", "--warmup", "0", "--seed", "9", "--output", str(output)]
            return await asyncio.to_thread(main, argv)

    assert asyncio.run(go()) == 0
    results = json.loads(output.read_text())
    assert results["model"] == "fake-model" and results["workload"]["seed"] == 9
    assert results["modes"]["fresh"]["summary"]["completed"] == 2
    assert set(results["pooled_over_fresh"]) >= {"ttft_p50", "ttft_p90", "ttft_p99"}
