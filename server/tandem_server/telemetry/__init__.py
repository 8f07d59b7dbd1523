"""Tracing of Steps with OpenTelemetry (docs/tracing.md), off unless `--otlp-endpoint` is set.

The router sends a traced Step with its `step` span's W3C `traceparent` in the call's gRPC metadata; the shard makes a
`forward` span, child of that span, for its handling of the Step. A Step without a sampled `traceparent` makes no span.
Off, this package never imports opentelemetry (`otel.py` is loaded only by `start_tracing` with an endpoint) and the
servicer runs its Steps without a tracer.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from tandem_server.rpc.generated import shard_pb2

TRACES_PATH = "/v1/traces"
DEFAULT_SERVICE_NAME = "tandem.shard"
# gRPC metadata: (key, value) pairs, as grpc.aio's ServicerContext.invocation_metadata() gives them.
Metadata = Sequence[tuple[str, str | bytes]]


@dataclass(frozen=True)
class TracingConfig:
    """Where the shard's spans go; `endpoint` None turns tracing off."""

    endpoint: str | None = None
    service_name: str = DEFAULT_SERVICE_NAME


class StepSpan(Protocol):
    """A Step's span, open while the Step runs."""

    def record(self, response: shard_pb2.StepResponse) -> None: ...


class StepTracer(Protocol):
    """Makes a Step's span when the router's call carries a sampled `traceparent`."""

    def step(self, metadata: Metadata | None, request: shard_pb2.StepRequest) -> AbstractContextManager[StepSpan]: ...

    def shut_down(self) -> None: ...


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: `endpoint` with `/v1/traces` appended, unless it ends with it (as the router)."""
    base = endpoint.rstrip("/")
    return base if base.endswith(TRACES_PATH) else base + TRACES_PATH


def add_tracing_flags(parser: argparse.ArgumentParser) -> None:
    """The shard's tracing flags; the launcher passes them when its own `--otlp-endpoint` is set."""
    parser.add_argument(
        "--otlp-endpoint",
        default=None,
        help="export the spans of traced Steps to this OTLP/HTTP (protobuf) receiver, e.g. http://otel-collector:4318 "
        "(/v1/traces is appended); unset: no tracing",
    )
    parser.add_argument("--otlp-service-name", default=DEFAULT_SERVICE_NAME, help="service.name of the shard's spans")


def tracing_config(args: argparse.Namespace) -> TracingConfig:
    """The tracing flags as parsed."""
    return TracingConfig(endpoint=args.otlp_endpoint, service_name=args.otlp_service_name)


def start_tracing(config: TracingConfig, rank: int) -> StepTracer | None:
    """The Step tracer exporting to `config.endpoint`; None, with opentelemetry never imported, when it is unset."""
    if config.endpoint is None:
        return None
    from tandem_server.telemetry.otel import OtelStepTracer  # noqa: PLC0415  (only with tracing on)

    return OtelStepTracer(traces_url(config.endpoint), config.service_name, rank)
