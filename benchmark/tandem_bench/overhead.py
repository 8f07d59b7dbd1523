"""Per-step overhead of the serving path against the forward pass, from the router's step histograms."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from tandem_bench.prometheus import histogram_delta, total

ROUND_TRIP = "tandem_step_duration_seconds"
SCHEDULING = "tandem_step_scheduling_duration_seconds"
SHARD = "tandem_step_shard_duration_seconds"
PREPARE = "tandem_step_prepare_duration_seconds"
FORWARD = "tandem_step_forward_duration_seconds"
SAMPLING = "tandem_step_sampling_duration_seconds"
FORWARD_GAP = "tandem_step_forward_gap_seconds"
BATCH_SIZE = "tandem_batch_size"
BATCH_TOKENS = "tandem_batch_tokens"


@dataclass(frozen=True)
class StepBreakdown:
    """Mean milliseconds per step over one measurement window, plus what the window achieved."""

    requested_batch: int
    steps: int
    mean_batch: float
    tokens_per_s: float
    scheduling_ms: float
    round_trip_ms: float
    shard_ms: float
    prepare_ms: float
    forward_ms: float
    sampling_ms: float
    # Wall-clock window over steps: what one step costs the decode, whatever overlaps inside it.
    wall_step_ms: float = 0.0
    # The model's idle time between two forward passes (the previous sampling included).
    forward_gap_ms: float = 0.0

    @property
    def transport_ms(self) -> float:
        """gRPC and Unix-socket time: what the router waited for beyond the shard's own handling."""
        return self.round_trip_ms - self.shard_ms

    @property
    def shard_rest_ms(self) -> float:
        """Shard time outside prepare/forward/sampling: protobuf conversion, the lock, the worker-thread hop."""
        return self.shard_ms - self.prepare_ms - self.forward_ms - self.sampling_ms

    @property
    def step_ms(self) -> float:
        """One step as the decode pays for it: the window's wall clock over its steps (with steps overlapping,
        the router's scheduling plus the round trip would count the overlap twice)."""
        return self.wall_step_ms

    @property
    def overhead_ms(self) -> float:
        """Everything in the step that is not the model's forward pass (sampling included)."""
        return self.step_ms - self.forward_ms

    @property
    def overhead_pct(self) -> float:
        return 100.0 * self.overhead_ms / self.step_ms if self.step_ms else 0.0

    def to_dict(self) -> dict[str, float]:
        derived = ("transport_ms", "shard_rest_ms", "step_ms", "overhead_ms", "overhead_pct")
        return {**asdict(self), **{name: getattr(self, name) for name in derived}}


def step_breakdown(
    before: dict[str, float], after: dict[str, float], window_s: float, requested_batch: int
) -> StepBreakdown:
    """The per-step means of the steps that ran between two /metrics scrapes `window_s` seconds apart."""
    round_trip = histogram_delta(before, after, ROUND_TRIP)
    if round_trip.count <= 0:
        raise ValueError("no step ran between the two scrapes")

    def mean_ms(name: str) -> float:
        return histogram_delta(before, after, name).mean * 1000.0

    tokens = total(after, f"{BATCH_TOKENS}_sum") - total(before, f"{BATCH_TOKENS}_sum")
    return StepBreakdown(
        requested_batch=requested_batch,
        steps=int(round_trip.count),
        mean_batch=histogram_delta(before, after, BATCH_SIZE).mean,
        tokens_per_s=tokens / window_s if window_s > 0 else 0.0,
        scheduling_ms=mean_ms(SCHEDULING),
        round_trip_ms=round_trip.mean * 1000.0,
        shard_ms=mean_ms(SHARD),
        prepare_ms=mean_ms(PREPARE),
        forward_ms=mean_ms(FORWARD),
        sampling_ms=mean_ms(SAMPLING),
        wall_step_ms=window_s * 1000.0 / round_trip.count,
        forward_gap_ms=mean_ms(FORWARD_GAP) if histogram_delta(before, after, FORWARD_GAP).count > 0 else 0.0,
    )


TABLE_HEADER = (
    "| batch | steady batch | steps | step ms | router scheduling | gRPC + transport | shard prepare | forward "
    "| sampling | shard other | forward gap | overhead ms | overhead % | decode tok/s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def format_row(row: StepBreakdown) -> str:
    """One markdown table row; times are per-step means in milliseconds."""
    cells = [
        str(row.requested_batch),
        f"{row.mean_batch:.1f}",
        str(row.steps),
        *(
            f"{value:.2f}"
            for value in (
                row.step_ms,
                row.scheduling_ms,
                row.transport_ms,
                row.prepare_ms,
                row.forward_ms,
                row.sampling_ms,
                row.shard_rest_ms,
                row.forward_gap_ms,
                row.overhead_ms,
            )
        ),
        f"{row.overhead_pct:.1f}%",
        f"{row.tokens_per_s:.0f}",
    ]
    return "| " + " | ".join(cells) + " |"


def format_table(rows: list[StepBreakdown]) -> str:
    """The markdown table for several batch sizes."""
    return "\n".join([TABLE_HEADER, *(format_row(row) for row in rows)])
