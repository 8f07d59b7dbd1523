"""Runs every load point against every server, interleaved run by run so all servers see the same conditions."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import aiohttp
from tqdm import tqdm

from tandem_bench.client import Endpoint, RequestResult, discover_model, stream_request
from tandem_bench.datasets import Conversation, DatasetConfig, build_dataset, total_turns
from tandem_bench.load import LoadPoint, run_load
from tandem_bench.metrics import Summary, summarize

WARMUP_SEED_OFFSET = 1_000_003


@dataclass(frozen=True)
class BenchConfig:
    """Everything one invocation measures: servers (the first is the baseline), load points and the workload."""

    endpoints: list[Endpoint]
    points: list[LoadPoint]
    dataset: DatasetConfig
    warmup_requests: int = 1
    show_progress: bool = True
    request_timeout_s: float = 600.0


@dataclass
class RunRecord:
    """One (server, load point) run: its summary and every request's timings."""

    server: str
    base_url: str
    model: str
    point: LoadPoint
    summary: Summary
    requests: list[RequestResult] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "base_url": self.base_url,
            "model": self.model,
            "load": self.point.label,
            **{key: value for key, value in asdict(self.point).items() if value is not None},
            "summary": self.summary.to_dict(),
            "requests": [asdict(request) for request in self.requests],
        }


async def resolve_models(endpoints: list[Endpoint]) -> list[Endpoint]:
    """Fills in each endpoint's model name from `/v1/models` when the user gave none."""
    resolved = []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for endpoint in endpoints:
            model = endpoint.model or await discover_model(session, endpoint.base_url, endpoint.api_key)
            resolved.append(replace(endpoint, model=model))
    return resolved


async def warm_up(endpoint: Endpoint, count: int, seed: int) -> None:
    """Sends `count` short requests at once first, so neither model load or compilation nor a server's first batch
    of that size (its buffers' first allocation) lands in a measured run."""
    warmup = build_dataset(DatasetConfig(kind="fixed", num_prompts=count, input_len=16, output_len=8, seed=seed))
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        results = await asyncio.gather(
            *(
                stream_request(session, endpoint, [{"role": "user", "content": conversation.turns[0].text}], 8)
                for conversation in warmup
            )
        )
    for result in results:
        if not result.success:
            raise RuntimeError(f"warm-up request to {endpoint.name} ({endpoint.url}) failed: {result.error}")


async def _run_one(
    endpoint: Endpoint, conversations: list[Conversation], point: LoadPoint, config: BenchConfig
) -> RunRecord:
    description = f"{endpoint.name} {point.label}"
    with tqdm(total=total_turns(conversations), desc=description, disable=not config.show_progress) as bar:
        outcome = await run_load(
            endpoint,
            conversations,
            point,
            config.dataset.seed,
            on_result=lambda _: bar.update(1),
            timeout_s=config.request_timeout_s,
        )
    return RunRecord(
        server=endpoint.name,
        base_url=endpoint.base_url,
        model=endpoint.model,
        point=point,
        summary=summarize(outcome.results, outcome.duration),
        requests=outcome.results,
    )


async def run_benchmark(config: BenchConfig) -> list[RunRecord]:
    """Warms each server, then for each load point runs every server in turn on identical prompts."""
    endpoints = await resolve_models(config.endpoints)
    for endpoint in endpoints:
        await warm_up(endpoint, config.warmup_requests, config.dataset.seed + WARMUP_SEED_OFFSET)
    records = []
    for index, point in enumerate(config.points):
        # Each load point gets fresh prompts, so a later run never hits prefixes cached by an earlier one.
        conversations = build_dataset(replace(config.dataset, seed=config.dataset.seed + index))
        for endpoint in endpoints:
            records.append(await _run_one(endpoint, conversations, point, config))
    return records


def run_benchmark_sync(config: BenchConfig) -> list[RunRecord]:
    """Blocking entry point for the CLI and the standard suite."""
    return asyncio.run(run_benchmark(config))
