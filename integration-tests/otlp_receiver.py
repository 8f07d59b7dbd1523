"""A small OTLP/HTTP receiver for tests: `POST /v1/traces` with a protobuf `ExportTraceServiceRequest` body (gzip
too), decoded with the `opentelemetry-proto` package and kept in memory, answered as a collector answers."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

TRACES_PATH = "/v1/traces"
PROTOBUF = "application/x-protobuf"


def attributes(pairs: list[KeyValue] | object) -> dict[str, object]:
    """OTLP attributes as a dict of their plain values."""
    values: dict[str, object] = {}
    for pair in pairs:  # type: ignore[attr-defined]
        which = pair.value.WhichOneof("value")
        values[pair.key] = getattr(pair.value, which) if which else None
    return values


@dataclass(frozen=True)
class ReceivedSpan:
    """One exported span with the `service.name` of the process that sent it."""

    service: str
    span: Span

    @property
    def name(self) -> str:
        return self.span.name

    @property
    def trace_id(self) -> str:
        return self.span.trace_id.hex()

    @property
    def span_id(self) -> str:
        return self.span.span_id.hex()

    @property
    def parent_id(self) -> str:
        return self.span.parent_span_id.hex()

    @property
    def attributes(self) -> dict[str, object]:
        return attributes(self.span.attributes)

    @property
    def links(self) -> list[tuple[str, str]]:
        """(trace id, span id) of every link."""
        return [(link.trace_id.hex(), link.span_id.hex()) for link in self.span.links]


class OtlpReceiver:
    """What the receiver got: every span, and every request's path and content type."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spans: list[ReceivedSpan] = []
        self.posts: list[tuple[str, str]] = []

    def receive(self, path: str, content_type: str, body: bytes) -> None:
        request = ExportTraceServiceRequest()
        request.ParseFromString(body)
        received = []
        for resource_spans in request.resource_spans:
            service = str(attributes(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                received += [ReceivedSpan(service, span) for span in scope_spans.spans]
        with self._lock:
            self.posts.append((path, content_type))
            self._spans += received

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def wait_for(self, found: Callable[[list[ReceivedSpan]], bool], timeout: float) -> list[ReceivedSpan]:
        """Polls until `found` holds for the spans received; those spans (found or not at the deadline)."""
        deadline = time.monotonic() + timeout
        while not found(self.spans()) and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.spans()


def _handler(receiver: OtlpReceiver) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != TRACES_PATH:
                self.send_error(404)
                return
            receiver.receive(self.path, self.headers.get("Content-Type", ""), body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", PROTOBUF)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: object) -> None:
            return None

    return Handler


@contextmanager
def otlp_receiver() -> Iterator[tuple[OtlpReceiver, str]]:
    """A receiver listening on a free loopback port, and its base URL (the OTLP/HTTP endpoint)."""
    receiver = OtlpReceiver()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(receiver))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield receiver, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
