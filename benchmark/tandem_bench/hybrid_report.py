"""What `tandem-bench hybrid` prints and writes: both workloads' figures as Markdown tables and one JSON document."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tandem_bench.multi_turn import TurnTimings, turn_ratios

# The targets: Tandem at least twice static batching; the last turn's TTFT with the cache at most 0.3x without.
THROUGHPUT_TARGET = 2.0
LAST_TURN_TTFT_TARGET = 0.3


@dataclass(frozen=True)
class ThroughputFigures:
    """Output tokens per second of Tandem's concurrent streams and of `transformers` static batching."""

    streams: int
    tandem_tok_s: float
    transformers_tok_s: float
    transformers_runs: int

    @property
    def ratio(self) -> float:
        return self.tandem_tok_s / self.transformers_tok_s

    def to_dict(self) -> dict[str, Any]:
        return {
            "streams": self.streams,
            "tandem_tok_s": self.tandem_tok_s,
            "transformers_tok_s": self.transformers_tok_s,
            "transformers_runs": self.transformers_runs,
            "ratio": self.ratio,
            "target": THROUGHPUT_TARGET,
        }


@dataclass(frozen=True)
class ChatRun:
    """One server's multi-turn run: its timings by turn, whether `/info` said it reuses prefixes, and the prompt tokens
    its prefix cache was asked for and found during the run (from `/metrics`)."""

    timings: TurnTimings
    prefix_caching: bool
    queried_tokens: float
    hit_tokens: float

    @classmethod
    def combine(cls, runs: list[ChatRun]) -> ChatRun:
        """Several rounds on one server: their timings pooled, their prefix cache counts summed."""
        return cls(
            TurnTimings.merge([run.timings for run in runs]),
            runs[0].prefix_caching,
            sum(run.queried_tokens for run in runs),
            sum(run.hit_tokens for run in runs),
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            **self.timings.to_dict(),
            "prefix_caching": self.prefix_caching,
            "prefix_cache_queries_tokens": self.queried_tokens,
            "prefix_cache_hits_tokens": self.hit_tokens,
        }


def format_throughput(figures: ThroughputFigures, rounds: int) -> str:
    """The throughput table and the ratio against the target."""
    return "\n".join(
        [
            "| engine | output tok/s |",
            "|---|---|",
            f"| transformers static batch (mean of {figures.transformers_runs}) | {figures.transformers_tok_s:.1f} |",
            f"| Tandem, {figures.streams} streams ({rounds} rounds) | {figures.tandem_tok_s:.1f} |",
            f"\nTandem / transformers: {figures.ratio:.2f}x (target: at least {THROUGHPUT_TARGET:.0f}x)",
        ]
    )


def _ratio_cell(ratio: float | None) -> str:
    return "n/a" if ratio is None else f"{ratio:.2f}x"


def format_turns(cached: ChatRun, uncached: ChatRun) -> str:
    """Each turn's median TTFT with the server's default settings and with the prefix cache off, and their ratio."""
    on, off = cached.timings.median_ttft_ms(), uncached.timings.median_ttft_ms()
    ratios = turn_ratios(on, off)
    lines = [
        "| turn | prompt tokens (mean) | TTFT median, defaults (ms) | TTFT median, prefix cache off (ms) | ratio |",
        "|---|---|---|---|---|",
    ]
    for turn, tokens in enumerate(cached.timings.mean_prompt_tokens()):
        lines.append(f"| {turn + 1} | {tokens:.0f} | {on[turn]:.0f} | {off[turn]:.0f} | {_ratio_cell(ratios[turn])} |")
    hit_share = cached.hit_tokens / cached.queried_tokens if cached.queried_tokens else 0.0
    lines += [
        f"\nTurn {len(on)} with the defaults / prefix cache off: {_ratio_cell(ratios[-1] if ratios else None)} "
        f"(target: at most {LAST_TURN_TTFT_TARGET}x).",
        f"Defaults: /info prefix_caching={str(cached.prefix_caching).lower()}, tandem_prefix_cache_hits_tokens_total "
        f"{cached.hit_tokens:.0f} of {cached.queried_tokens:.0f} queried prompt tokens ({hit_share:.0%}); "
        f"prefix cache off: {uncached.hit_tokens:.0f} hit tokens.",
    ]
    failed = cached.timings.failed + uncached.timings.failed
    if failed:
        lines.append(f"{failed} requests failed and are left out of the medians.")
    return "\n".join(lines)


def multi_turn_document(cached: ChatRun, uncached: ChatRun) -> dict[str, Any]:
    """Both runs and the per-turn ratios, for the results file."""
    ratios = turn_ratios(cached.timings.median_ttft_ms(), uncached.timings.median_ttft_ms())
    return {
        "defaults": cached.to_dict(),
        "prefix_cache_off": uncached.to_dict(),
        "ttft_ratio_by_turn": ratios,
        "last_turn_ratio": ratios[-1] if ratios else None,
        "target": LAST_TURN_TTFT_TARGET,
    }
