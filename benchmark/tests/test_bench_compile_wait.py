"""The suite measures a Tandem once its background compile has finished: `compiling` steps the server once, then
reads /info."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from tandem_bench.server_process import compiling


class _Tandem(BaseHTTPRequestHandler):
    # /info's `compiling` answers, in turn; each /generate is counted.
    answers: ClassVar[list[bool]] = []
    generated = 0

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert body["parameters"]["max_new_tokens"] == 1
        type(self).generated += 1
        self._answer({"generated_text": "b"})

    def do_GET(self) -> None:
        assert self.path == "/info"
        self._answer({"compiled_decode_rows": 1, "compiling": type(self).answers.pop(0)})

    def _answer(self, payload: dict[str, object]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def tandem() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Tandem)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_compiling_steps_the_server_then_reads_info(tandem: str) -> None:
    _Tandem.answers, _Tandem.generated = [True, False], 0
    assert compiling(tandem)
    assert not compiling(tandem)
    assert _Tandem.generated == 2
