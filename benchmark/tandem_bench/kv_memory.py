"""The pure parts of `tandem-bench kv-memory`: how many long prompts fill the KV cache, and how the shards' memory
before and while filling it is printed."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True)
class FillPlan:
    """Distinct prompts of `prompt_tokens` each, `output_len` tokens out, `requests` of them, `concurrency` at once."""

    prompt_tokens: int
    output_len: int
    requests: int
    concurrency: int

    @property
    def tokens(self) -> int:
        return self.requests * (self.prompt_tokens + self.output_len)


def plan_fill(
    kv_cache_tokens: int, max_input_tokens: int, concurrency: int, output_len: int, fill: float, prompt_tokens: int = 0
) -> FillPlan:
    """Enough prompts that their tokens reach `fill` times the cache, and at least one wave of `concurrency` of them;
    `prompt_tokens` 0: each as long as the prompt limit allows, less the output and a tenth for tokenization slack."""
    longest = max(16, int(max_input_tokens * 0.9) - output_len)
    prompt_tokens = min(prompt_tokens, longest) if prompt_tokens > 0 else longest
    wanted = int(kv_cache_tokens * fill)
    requests = max(concurrency, -(-wanted // (prompt_tokens + output_len)))
    return FillPlan(prompt_tokens, output_len, requests, concurrency)


@dataclass(frozen=True)
class KvMemoryReport:
    """The shards' resident memory (bytes, summed over their process tree) idle, at the peak of the fill and after
    it; the cache's size and how full the router reported it."""

    idle_rss: int
    peak_rss: int
    after_rss: int
    kv_cache_tokens: int
    kv_cache_bytes: int
    plan: FillPlan
    prompt_tokens_sent: int
    failed: int
    peak_kv_usage: float
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def format_report(report: KvMemoryReport) -> str:
    """A Markdown table, one row per measurement."""
    plan = report.plan
    rows = [
        ("shards' RSS idle", f"{report.idle_rss / MIB:,.0f} MiB"),
        ("shards' RSS peak while filling the KV cache", f"{report.peak_rss / MIB:,.0f} MiB"),
        ("shards' RSS after the fill", f"{report.after_rss / MIB:,.0f} MiB"),
        ("KV cache", f"{report.kv_cache_tokens:,} tokens, {report.kv_cache_bytes / MIB:,.0f} MiB"),
        (
            "load",
            f"{plan.requests} distinct prompts of ~{plan.prompt_tokens:,} tokens, {plan.output_len} out, "
            f"{plan.concurrency} concurrent ({report.prompt_tokens_sent:,} prompt tokens sent)",
        ),
        ("peak share of KV blocks running requests held", f"{report.peak_kv_usage:.0%}"),
        ("failed requests", str(report.failed)),
        ("duration", f"{report.seconds:.0f} s"),
    ]
    return "\n".join(["| measurement | value |", "|---|---|", *(f"| {name} | {value} |" for name, value in rows)])
