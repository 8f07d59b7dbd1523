"""The shard's Step spans (`--otlp-endpoint`): a `forward` span under the router's sampled `traceparent` and no span
otherwise; with tracing off the shard never imports opentelemetry."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from tandem_server.cli import config_from_args
from tandem_server.rpc.generated import shard_pb2
from tandem_server.telemetry import TracingConfig, start_tracing, traces_url
from tandem_server.telemetry.otel import OtelStepTracer

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
STEP = shard_pb2.StepRequest(
    step_id=5,
    new_requests=[shard_pb2.NewRequest(id=1)],
    scheduled=[shard_pb2.ScheduledRequest(id=1, num_tokens=6), shard_pb2.ScheduledRequest(id=2, num_tokens=1)],
)


@pytest.fixture
def traced() -> Iterator[tuple[OtelStepTracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    tracer = OtelStepTracer("http://unused", "tandem.shard", rank=1, exporter=exporter)
    yield tracer, exporter
    tracer.shut_down()


def run_step(tracer: OtelStepTracer, metadata: list[tuple[str, str | bytes]]) -> None:
    with tracer.step(metadata, STEP) as span:
        span.record(shard_pb2.StepResponse(forward_ms=3.5, sampling_ms=0.5))


def test_a_sampled_step_makes_a_forward_span_under_the_routers_step_span(
    traced: tuple[OtelStepTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = traced
    run_step(tracer, [("user-agent", "grpc"), ("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01")])
    tracer.shut_down()
    (span,) = exporter.get_finished_spans()
    assert span.name == "forward" and span.kind == SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None and format(span.parent.span_id, "016x") == PARENT_ID
    attributes = dict(span.attributes or {})
    assert attributes["tandem.step.id"] == 5 and attributes["tandem.rank"] == 1
    assert (attributes["tandem.step.requests"], attributes["tandem.step.new_requests"]) == (2, 1)
    assert attributes["tandem.step.tokens"] == 7 and attributes["tandem.forward_ms"] == 3.5
    assert span.resource.attributes["service.name"] == "tandem.shard"


@pytest.mark.parametrize(
    "metadata",
    [
        [],
        [("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-00")],
        [("traceparent", "garbage")],
        [("traceparent", f"00-{'0' * 32}-{PARENT_ID}-01")],
    ],
    ids=["none", "not-sampled", "malformed", "zero-trace-id"],
)
def test_a_step_without_a_sampled_traceparent_makes_no_span(
    traced: tuple[OtelStepTracer, InMemorySpanExporter], metadata: list[tuple[str, str | bytes]]
) -> None:
    tracer, exporter = traced
    run_step(tracer, metadata)
    tracer.shut_down()
    assert exporter.get_finished_spans() == ()


def test_a_failed_step_ends_its_span_with_the_error(traced: tuple[OtelStepTracer, InMemorySpanExporter]) -> None:
    tracer, exporter = traced
    with pytest.raises(RuntimeError), tracer.step([("traceparent", f"00-{TRACE_ID}-{PARENT_ID}-01")], STEP):
        raise RuntimeError("device lost")
    tracer.shut_down()
    (span,) = exporter.get_finished_spans()
    assert span.status.status_code == StatusCode.ERROR


def test_the_flags_turn_tracing_on_and_the_traces_path_is_appended_once() -> None:
    config = config_from_args(["--model-path", "m", "--uds-path", "s"])
    assert config.tracing == TracingConfig() and start_tracing(config.tracing, 0) is None
    on = config_from_args(["--model-path", "m", "--uds-path", "s", "--otlp-endpoint", "http://c:4318/"])
    assert on.tracing == TracingConfig("http://c:4318/", "tandem.shard")
    assert traces_url("http://c:4318/") == "http://c:4318/v1/traces"
    assert traces_url("http://c/otlp/v1/traces") == "http://c/otlp/v1/traces"


def test_with_tracing_off_the_shard_never_imports_opentelemetry() -> None:
    probe = (
        "import sys; import tandem_server.cli, tandem_server.rpc.servicer; "
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    loaded = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    assert loaded.strip() == "[]"
