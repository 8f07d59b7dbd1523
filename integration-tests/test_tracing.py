"""`--otlp-endpoint` through the real stack, against an OTLP/HTTP receiver the test runs (`otlp_receiver.py`).

A streamed request with a client `traceparent` is traced in the client's trace: its HTTP span is the child of the
client's span, with `validation` and `generation` under it and `queue`, `prefill` and `decode` under `generation`. Each
step that ran it is a `step` span (its own trace) linked to that `generation`, and the shard process exports a
`forward` span, child of that step span, under its own service name. A malformed `traceparent` is ignored (the request
is answered and traced in a new trace); an unsampled one turns tracing off for the request. Without `--otlp-endpoint`
no child gets a tracing flag and nothing is exported, even with the OTel SDK's endpoint variables set."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests
from otlp_receiver import OtlpReceiver, ReceivedSpan, otlp_receiver
from tandem_harness import FLOAT32_EAGER, TandemServer, write_tiny_llama

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
UNSAMPLED_TRACE = "1bf7651916cd43dd8448eb211c80319d"
STAGES = ("queue", "prefill", "decode")
WAIT_S = 60.0
# The SDKs' batch processors export every 5 s by default; the test waits less.
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "200"}


def start(root: Path, *flags: str, environ: dict[str, str]) -> TandemServer:
    """A server on a tiny Llama, started with `environ` added to the launcher's (and so its children's) environment."""
    write_tiny_llama(root / "model")
    with pytest.MonkeyPatch.context() as patch:
        for name, value in environ.items():
            patch.setenv(name, value)
        return TandemServer.start(
            root / "launcher.log",
            "--model-id", str(root / "model"), *FLOAT32_EAGER,
            "--kv-cache-memory", "16MiB",
            *flags,
        )  # fmt: skip


@pytest.fixture(scope="module")
def traced(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[TandemServer, OtlpReceiver]]:
    with otlp_receiver() as (receiver, endpoint):
        root = tmp_path_factory.mktemp("traced")
        server = start(root, "--otlp-endpoint", endpoint, environ=FAST_EXPORT)
        yield server, receiver
        assert server.stop() == 0, server.log_tail()


def children_argv(server: TandemServer) -> list[list[str]]:
    return [child.cmdline() for child in psutil.Process(server.process.pid).children(recursive=True)]


def stream_completion(server: TandemServer, headers: dict[str, str]) -> None:
    """A streamed completion of 4 tokens, read to its end."""
    body = {"prompt": "The river", "max_tokens": 4, "ignore_eos": True, "stream": True}
    url = f"{server.base_url}/v1/completions"
    with requests.post(url, json=body, headers=headers, stream=True, timeout=120) as response:
        assert response.status_code == 200, response.text
        events = [line for line in response.iter_lines(decode_unicode=True) if line.startswith("data:")]
    assert events[-1] == "data: [DONE]"
    assert sum(len(json.loads(event[5:])["choices"]) for event in events[:-1]) >= 4


def only(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = [span for span in spans if span.name == name]
    assert len(found) == 1, f"{name}: {found}"
    return found[0]


def request_tree_complete(spans: list[ReceivedSpan]) -> bool:
    """The client's trace holds every stage, and some step linked to it has a shard span under it."""
    mine = [span for span in spans if span.trace_id == CLIENT_TRACE]
    if not {"validation", "generation", *STAGES} <= {span.name for span in mine}:
        return False
    generation = only(mine, "generation")
    steps = {span.span_id for span in spans if (CLIENT_TRACE, generation.span_id) in span.links}
    return any(span.name == "forward" and span.parent_id in steps for span in spans)


def test_a_traced_request_exports_its_tree_and_the_shards_forward_spans(
    traced: tuple[TandemServer, OtlpReceiver],
) -> None:
    server, receiver = traced
    router_argv = next(argv for argv in children_argv(server) if "--otlp-sample-ratio" in argv)
    assert router_argv[router_argv.index("--otlp-service-name") + 1] == "tandem.router"
    stream_completion(server, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01", "x-request-id": "traced-1"})
    spans = receiver.wait_for(request_tree_complete, WAIT_S)
    assert request_tree_complete(spans), f"incomplete trace: {[(s.service, s.name, s.trace_id) for s in spans]}"
    assert {path for path, _ in receiver.posts} == {"/v1/traces"}
    assert {content_type for _, content_type in receiver.posts} == {"application/x-protobuf"}

    mine = [span for span in spans if span.trace_id == CLIENT_TRACE]
    assert {span.service for span in mine} == {"tandem.router"}
    http = only(mine, "POST /v1/completions")
    assert http.parent_id == CLIENT_SPAN, "the HTTP span continues the client's trace"
    assert http.attributes["tandem.request_id"] == "traced-1"
    assert http.attributes["http.response.status_code"] == 200
    generation = only(mine, "generation")
    assert only(mine, "validation").parent_id == http.span_id
    assert generation.parent_id == http.span_id
    assert generation.attributes["gen_ai.usage.output_tokens"] == 4
    queue, prefill, decode = (only(mine, name) for name in STAGES)
    assert {queue.parent_id, prefill.parent_id, decode.parent_id} == {generation.span_id}
    assert queue.span.end_time_unix_nano <= prefill.span.start_time_unix_nano + 1_000_000
    assert prefill.span.end_time_unix_nano <= decode.span.start_time_unix_nano
    # A streamed answer's HTTP span lasts until the stream has been sent.
    assert http.span.end_time_unix_nano >= decode.span.end_time_unix_nano

    steps = [span for span in spans if (CLIENT_TRACE, generation.span_id) in span.links]
    assert steps and {span.name for span in steps} == {"step"}
    assert {span.service for span in steps} == {"tandem.router"}
    assert all(span.trace_id != CLIENT_TRACE and span.parent_id == "" for span in steps)
    assert any(span.attributes["tandem.step.new_requests"] == 1 for span in steps), "the prefill step"
    forwards = [span for span in spans if span.name == "forward"]
    assert {span.service for span in forwards} == {"tandem.shard"}
    by_id = {span.span_id: span for span in steps}
    linked = [span for span in forwards if span.parent_id in by_id]
    assert linked, "no shard span under a step that ran the request"
    for forward in linked:
        step = by_id[forward.parent_id]
        assert forward.trace_id == step.trace_id
        assert forward.attributes["tandem.step.id"] == step.attributes["tandem.step.id"]
        assert forward.attributes["tandem.rank"] == 0


def test_a_malformed_traceparent_is_ignored_and_an_unsampled_one_is_not_traced(
    traced: tuple[TandemServer, OtlpReceiver],
) -> None:
    server, receiver = traced
    stream_completion(server, {"traceparent": f"00-{UNSAMPLED_TRACE}-{CLIENT_SPAN}-00"})
    stream_completion(server, {"traceparent": "00-not-a-trace-01", "x-request-id": "malformed-1"})

    def malformed_done(spans: list[ReceivedSpan]) -> bool:
        return any(span.attributes.get("tandem.request_id") == "malformed-1" for span in spans)

    spans = receiver.wait_for(malformed_done, WAIT_S)
    http = next(span for span in spans if span.attributes.get("tandem.request_id") == "malformed-1")
    assert http.parent_id == "" and http.trace_id not in (CLIENT_TRACE, UNSAMPLED_TRACE)
    assert {"generation", *STAGES} <= {span.name for span in spans if span.trace_id == http.trace_id}
    assert not [span for span in spans if span.trace_id == UNSAMPLED_TRACE]


def test_without_an_endpoint_nothing_is_traced_or_exported(tmp_path: Path) -> None:
    with otlp_receiver() as (receiver, endpoint):
        # Were an exporter started anyway, the OTel SDKs would send to these.
        decoy = {**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_TRACES_EXPORTER": "otlp"}
        decoy["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = f"{endpoint}/v1/traces"
        server = start(tmp_path, environ=decoy)
        try:
            argv = [word for child in children_argv(server) for word in child]
            assert not [word for word in argv if word.startswith("--otlp")]
            stream_completion(server, {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"})
            assert receiver.wait_for(bool, 3.0) == []
            assert receiver.posts == []
        finally:
            assert server.stop() == 0, server.log_tail()
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" not in os.environ
