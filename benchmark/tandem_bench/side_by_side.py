"""Helpers for benchmarks that start two Tandems with different flags and time them in turns."""

from __future__ import annotations

import json
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from tandem_bench.prometheus import parse_samples
from tandem_bench.server_process import LaunchedServer


def post_completion(base_url: str, body: dict[str, object]) -> dict[str, object]:
    request = urllib.request.Request(
        f"{base_url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return json.loads(response.read())


def completion_tokens(answer: dict[str, object]) -> int:
    usage = answer.get("usage")
    if not isinstance(usage, dict):
        raise ValueError(f"a completion without usage: {answer}")
    return int(usage["completion_tokens"])


def served_model(base_url: str) -> str:
    with urllib.request.urlopen(f"{base_url}/v1/models", timeout=30) as response:
        return str(json.loads(response.read())["data"][0]["id"])


def metric_total(base_url: str, name: str) -> float:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        samples = parse_samples(response.read().decode())
    return sum(value for series, value in samples.items() if series.split("{", 1)[0] == name)


@dataclass
class Timing:
    """Output tokens and the wall time they took, summed over requests."""

    seconds: float = 0.0
    tokens: int = 0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def timed_completions(server: LaunchedServer, bodies: list[dict[str, object]], timing: Timing) -> list[str]:
    """The completions' texts, requested all at once; the wall time until the last one ends and their output tokens
    are added to `timing`."""
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        answers = list(pool.map(lambda body: post_completion(server.base_url, body), bodies))
    timing.seconds += time.perf_counter() - started
    texts = []
    for answer in answers:
        usage, choices = answer["usage"], answer["choices"]
        assert isinstance(usage, dict) and isinstance(choices, list)
        timing.tokens += int(usage["completion_tokens"])
        texts.append(str(choices[0]["text"]))
    return texts


def timed_completion(server: LaunchedServer, body: dict[str, object], timing: Timing) -> str:
    """The completion's text; its wall time and output tokens are added to `timing`."""
    return timed_completions(server, [body], timing)[0]
