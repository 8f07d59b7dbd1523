"""Test helper: another local program holding a port, answering every GET with 200 and keeping what it was sent."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Squatter:
    """Keeps the path and any Authorization header of every request it answers."""

    def __init__(self) -> None:
        self.authorizations: list[str] = []
        self.paths: list[str] = []
        squatter = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                squatter.paths.append(self.path)
                if "Authorization" in self.headers:
                    squatter.authorizations.append(self.headers["Authorization"])
                self.send_response(200)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"{}")

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = int(self.server.server_address[1])
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()


@contextmanager
def squatting() -> Iterator[Squatter]:
    """A squatter for the duration of the block."""
    held = Squatter()
    try:
        yield held
    finally:
        held.server.shutdown()
        held.server.server_close()
