"""The shard's expert-load series of a mixture-of-experts model, read from the MoE blocks' counts at each scrape.

Per layer, always: the token-expert pairs routed, and the most and least loaded expert's share against an even
split. Per expert only while layers x experts stays within `MAX_EXPERT_SERIES`: a 48-layer model of 128 experts
would otherwise add 6,144 series to every rank's scrape.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# Mixtral (32 x 8) and OLMoE (16 x 64) get per-expert series; Qwen1.5-MoE (24 x 60) and Qwen3-MoE (48 x 128) do not.
MAX_EXPERT_SERIES = 1024

# (decoder layer, tokens routed to each expert) per MoE layer, as `ExpertTokenCounters.read` returns them.
ExpertTokens = Sequence[tuple[int, Sequence[int]]]


def load_ratios(counts: Sequence[int]) -> tuple[float, float] | None:
    """The most and least loaded expert's tokens over the mean per expert (1 and 1: even; None: no token yet)."""
    total = sum(counts)
    if not total:
        return None
    mean = total / len(counts)
    return max(counts) / mean, min(counts) / mean


def expert_series_fit(layers: ExpertTokens, limit: int = MAX_EXPERT_SERIES) -> bool:
    """Whether one series per (layer, expert) stays within `limit`."""
    return sum(len(counts) for _, counts in layers) <= limit


class ExpertTokensCollector(Collector):
    """Converts the counts `read()` returns into Prometheus families at scrape time."""

    def __init__(self, read: Callable[[], ExpertTokens], rank: str) -> None:
        self._read = read
        self._rank = rank

    def collect(self) -> list[Metric]:
        layers = self._read()
        routed = CounterMetricFamily(
            "tandem_shard_moe_routed_tokens",
            "Token-expert pairs an MoE layer routed (tokens times the experts each chose)",
            labels=["rank", "layer"],
        )
        most = GaugeMetricFamily(
            "tandem_shard_moe_expert_load_max_ratio",
            "The most loaded expert's routed tokens over the mean per expert, since start (1: even)",
            labels=["rank", "layer"],
        )
        least = GaugeMetricFamily(
            "tandem_shard_moe_expert_load_min_ratio",
            "The least loaded expert's routed tokens over the mean per expert, since start (0: an expert unused)",
            labels=["rank", "layer"],
        )
        for layer, counts in layers:
            routed.add_metric([self._rank, str(layer)], float(sum(counts)))
            ratios = load_ratios(counts)
            if ratios is not None:
                most.add_metric([self._rank, str(layer)], ratios[0])
                least.add_metric([self._rank, str(layer)], ratios[1])
        families: list[Metric] = [routed, most, least]
        if expert_series_fit(layers):
            families.append(self._per_expert(layers))
        return families

    def _per_expert(self, layers: ExpertTokens) -> CounterMetricFamily:
        tokens = CounterMetricFamily(
            "tandem_shard_moe_expert_tokens",
            "Tokens an MoE layer routed to one expert",
            labels=["rank", "layer", "expert"],
        )
        for layer, counts in layers:
            for expert, count in enumerate(counts):
                tokens.add_metric([self._rank, str(layer), str(expert)], float(count))
        return tokens
