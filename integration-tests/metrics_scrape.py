"""Scraping and loading helpers of the metrics tests: parsed exposition text and a short mixed load."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import requests
from prometheus_client.parser import text_string_to_metric_families
from tandem_harness import TandemServer


@dataclass(frozen=True)
class MetricsTandem:
    """A server of its own (so request counts are exact) whose shard serves metrics on `shard_metrics_port`; its
    key file names `api_key` `KEY_NAME`, so the per-key series exist."""

    server: TandemServer
    shard_metrics_port: int
    api_key: str

    @property
    def shard_metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.shard_metrics_port}/metrics"


# Sample name -> {frozenset(labels) -> value}.
Scrape = dict[str, dict[frozenset[tuple[str, str]], float]]

KEY_NAME = "dashboard-team"
PROMPTS = [f"Question {i}: name one colour of the rainbow. Answer:" for i in range(4)]
MAX_NEW_TOKENS = 6


def scrape(url: str) -> tuple[Scrape, dict[str, str]]:
    """Every sample of `url`'s exposition, and each family's type."""
    text = requests.get(url, timeout=10).text
    samples: Scrape = {}
    types = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return samples, types


def total(samples: Scrape, name: str, **labels: str) -> float:
    """Sum of `name` over the series whose labels include `labels`."""
    wanted = set(labels.items())
    return sum(value for key, value in samples.get(name, {}).items() if wanted <= key)


def send_mixed_load(metrics_tandem: MetricsTandem) -> int:
    """Completed requests over three routes (one streamed) plus one invalid request, all with the server's key;
    returns the completed count."""
    base_url = metrics_tandem.server.base_url
    headers = {"Authorization": f"Bearer {metrics_tandem.api_key}"}

    def native(prompt: str) -> None:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW_TOKENS}}
        assert requests.post(f"{base_url}/generate", json=body, headers=headers, timeout=300).status_code == 200

    def openai(prompt: str) -> None:
        body = {"model": "tandem", "prompt": prompt, "max_tokens": MAX_NEW_TOKENS}
        assert requests.post(f"{base_url}/v1/completions", json=body, headers=headers, timeout=300).status_code == 200

    def streamed(prompt: str) -> None:
        body = {"inputs": prompt, "parameters": {"max_new_tokens": MAX_NEW_TOKENS}}
        url = f"{base_url}/generate_stream"
        with requests.post(url, json=body, headers=headers, stream=True, timeout=300) as response:
            assert response.status_code == 200
            for _ in response.iter_lines():
                pass

    calls = [(native, PROMPTS[0]), (native, PROMPTS[1]), (openai, PROMPTS[2]), (streamed, PROMPTS[3])]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        for future in [pool.submit(call, prompt) for call, prompt in calls]:
            future.result()
    invalid = {"inputs": PROMPTS[0], "parameters": {"max_new_tokens": 4, "temperature": -1.0}}
    assert requests.post(f"{base_url}/generate", json=invalid, headers=headers, timeout=60).status_code == 422
    return len(calls)
