"""The shard's own Prometheus endpoint: process and device memory, KV cache size, forward time by phase, an MoE
model's expert load, and a vision-language model's image encoder."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from prometheus_client import CollectorRegistry, Gauge, Histogram, ProcessCollector, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from tandem_server.expert_metrics import ExpertTokens, ExpertTokensCollector

if TYPE_CHECKING:
    from tandem_server.vision.embedder import EncoderCounts

logger = logging.getLogger(__name__)

FORWARD_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
PHASES = ("prefill", "decode", "mixed")


class _CudaMemoryCollector(Collector):
    """Reads the caching allocator's counters at scrape time (CUDA shards only)."""

    def __init__(self, device: torch.device, rank: str) -> None:
        self._device = device
        self._rank = rank

    def collect(self) -> list[GaugeMetricFamily]:
        allocated = GaugeMetricFamily(
            "tandem_shard_device_memory_allocated_bytes", "Device memory held by tensors", labels=["rank"]
        )
        allocated.add_metric([self._rank], float(torch.cuda.memory_allocated(self._device)))
        reserved = GaugeMetricFamily(
            "tandem_shard_device_memory_reserved_bytes",
            "Device memory reserved by the caching allocator",
            labels=["rank"],
        )
        reserved.add_metric([self._rank], float(torch.cuda.memory_reserved(self._device)))
        return [allocated, reserved]


@dataclass(frozen=True)
class CompilationState:
    """What `--torch-compile` has compiled: the decode steps' row counts with a graph, and whether a background
    compile still runs."""

    compiled_decode_rows: tuple[int, ...]
    compiling: bool


class _CompilationCollector(Collector):
    """Reads the runner's compiled decode graphs at scrape time."""

    def __init__(self, state: Callable[[], CompilationState], rank: str) -> None:
        self._state = state
        self._rank = rank

    def collect(self) -> list[GaugeMetricFamily]:
        state = self._state()
        rows = GaugeMetricFamily(
            "tandem_shard_compiled_decode_rows",
            "1 for each row count whose decode steps run a compiled graph (steps of counts between two listed ones "
            "share the larger one's graph)",
            labels=["rank", "rows"],
        )
        for count in state.compiled_decode_rows:
            rows.add_metric([self._rank, str(count)], 1.0)
        compiling = GaugeMetricFamily(
            "tandem_shard_compiling", "1 while decode graphs compile in the background", labels=["rank"]
        )
        compiling.add_metric([self._rank], 1.0 if state.compiling else 0.0)
        return [rows, compiling]


class _ImageEncoderCollector(Collector):
    """Reads the image embedder's counts at scrape time."""

    def __init__(self, counts: Callable[[], EncoderCounts], rank: str) -> None:
        self._counts = counts
        self._rank = rank

    def collect(self) -> list[CounterMetricFamily]:
        counts = self._counts()
        runs = CounterMetricFamily(
            "tandem_shard_image_encoder_runs", "Images the vision encoder encoded", labels=["rank"]
        )
        runs.add_metric([self._rank], float(counts.runs))
        hits = CounterMetricFamily(
            "tandem_shard_image_encoder_cache_hits", "Images served from the encoder cache", labels=["rank"]
        )
        hits.add_metric([self._rank], float(counts.cache_hits))
        seconds = CounterMetricFamily(
            "tandem_shard_image_encoder_seconds",
            "Time spent decoding, preprocessing and encoding images (CUDA: until the encoder's kernels are queued)",
            labels=["rank"],
        )
        seconds.add_metric([self._rank], counts.seconds)
        return [runs, hits, seconds]


class ShardMetrics:
    """One shard's metrics in a private registry, every series labelled with the shard's rank."""

    def __init__(self, rank: int, device: torch.device) -> None:
        self.registry = CollectorRegistry()
        self._rank = str(rank)
        ProcessCollector(namespace="tandem_shard", registry=self.registry)
        if device.type == "cuda":
            self.registry.register(_CudaMemoryCollector(device, self._rank))
        self._kv_cache_bytes = Gauge(
            "tandem_shard_kv_cache_bytes", "Bytes of the allocated KV cache", ["rank"], registry=self.registry
        )
        self._kv_cache_bytes.labels(self._rank).set(0)
        self._forward = Histogram(
            "tandem_shard_forward_duration_seconds",
            "Forward-pass time of one step, by phase",
            ["rank", "phase"],
            buckets=FORWARD_BUCKETS,
            registry=self.registry,
        )
        self._sampling = Histogram(
            "tandem_shard_sampling_duration_seconds",
            "Sampling time of one step",
            ["rank"],
            buckets=FORWARD_BUCKETS,
            registry=self.registry,
        )
        for phase in PHASES:
            self._forward.labels(self._rank, phase)
        self._sampling.labels(self._rank)

    def watch_compilation(self, state: Callable[[], CompilationState]) -> None:
        """Reports `state()` at each scrape."""
        self.registry.register(_CompilationCollector(state, self._rank))

    def watch_expert_tokens(self, read: Callable[[], ExpertTokens]) -> None:
        """Reports the MoE layers' routed tokens that `read()` returns at each scrape (MoE models only)."""
        self.registry.register(ExpertTokensCollector(read, self._rank))

    def watch_image_encoder(self, counts: Callable[[], EncoderCounts]) -> None:
        """Reports the image embedder's `counts()` at each scrape (vision-language models only)."""
        self.registry.register(_ImageEncoderCollector(counts, self._rank))

    def kv_cache_allocated(self, num_bytes: int) -> None:
        """Records the KV cache size after a warmup."""
        self._kv_cache_bytes.labels(self._rank).set(num_bytes)

    def step_done(self, phase: str | None, forward_ms: float, sampling_ms: float) -> None:
        """Records the timings of one step of `phase` (`StepInput.phase`); None: nothing ran, nothing is recorded."""
        if phase is None:
            return
        self._forward.labels(self._rank, phase).observe(forward_ms / 1000.0)
        self._sampling.labels(self._rank).observe(sampling_ms / 1000.0)

    def serve(self, port: int, host: str = "0.0.0.0") -> None:
        """Serves `/metrics` on `host:port` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
        logger.info("metrics: serving on http://%s:%d/metrics", host, port)
