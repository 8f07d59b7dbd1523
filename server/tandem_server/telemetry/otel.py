"""The Step tracer on the OpenTelemetry SDK: spans batched to an OTLP/HTTP (protobuf) receiver. Imported only when
tracing is on."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TYPE_CHECKING

from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import Span, SpanKind, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from tandem_server.telemetry import Metadata, StepSpan

if TYPE_CHECKING:
    from tandem_server.rpc.generated import shard_pb2

logger = logging.getLogger(__name__)

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"


class _NoSpan:
    """A Step without a sampled parent: nothing is recorded."""

    def record(self, response: shard_pb2.StepResponse) -> None:
        return None


class _ForwardSpan:
    """A traced Step's `forward` span: the engine's timings become its attributes."""

    def __init__(self, span: Span) -> None:
        self._span = span

    def record(self, response: shard_pb2.StepResponse) -> None:
        self._span.set_attributes(
            {
                "tandem.prepare_ms": response.prepare_ms,
                "tandem.forward_ms": response.forward_ms,
                "tandem.sampling_ms": response.sampling_ms,
                "tandem.shard_total_ms": response.shard_total_ms,
                "tandem.step.generations": len(response.generations),
                "tandem.step.failures": len(response.failures),
            }
        )


def _carrier(metadata: Metadata | None) -> dict[str, str]:
    """The call's trace-context entries, as text."""
    carrier: dict[str, str] = {}
    for key, value in metadata or ():
        if key in (TRACEPARENT, TRACESTATE) and isinstance(value, str):
            carrier[key] = value
    return carrier


class OtelStepTracer:
    """Makes a `forward` span under each Step's sampled `traceparent`; a Step without one is not traced (the router
    decides what is sampled: the shard's sampler follows the parent and drops every root)."""

    def __init__(self, url: str, service_name: str, rank: int, exporter: SpanExporter | None = None) -> None:
        """Exports to `url` over OTLP/HTTP, or to `exporter` (tests)."""
        self._provider = TracerProvider(
            sampler=ParentBased(root=ALWAYS_OFF),
            resource=Resource.create({"service.name": service_name, "tandem.rank": rank}),
        )
        self._provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=url)))
        self._tracer = self._provider.get_tracer("tandem-shard")
        self._propagator = TraceContextTextMapPropagator()
        self._rank = rank
        logger.info("exporting the spans of traced steps to %s as %s", url, service_name)

    def step(self, metadata: Metadata | None, request: shard_pb2.StepRequest) -> AbstractContextManager[StepSpan]:
        """The Step's span, open while the Step runs, when the call carries a sampled `traceparent`."""
        return self._step(metadata, request)

    @contextmanager
    def _step(self, metadata: Metadata | None, request: shard_pb2.StepRequest) -> Iterator[StepSpan]:
        parent = self._propagator.extract(_carrier(metadata))
        if not get_current_span(parent).get_span_context().trace_flags.sampled:
            yield _NoSpan()
            return
        attributes = {
            "tandem.rank": self._rank,
            "tandem.step.id": request.step_id,
            "tandem.step.requests": len(request.scheduled),
            "tandem.step.new_requests": len(request.new_requests),
            "tandem.step.tokens": sum(span.num_tokens for span in request.scheduled),
        }
        with self._tracer.start_as_current_span(
            "forward", context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            yield _ForwardSpan(span)

    def shut_down(self) -> None:
        """Exports the spans still queued."""
        self._provider.shutdown()
