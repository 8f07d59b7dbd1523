"""A client that goes away mid-stream cancels its request and gives back its KV blocks."""

from __future__ import annotations

import http.client
import json
import socket
import time
from urllib.parse import urlparse

from tandem_harness import TandemServer


def test_disconnect_mid_stream_frees_kv_blocks_and_counts_a_cancellation(tandem: TandemServer) -> None:
    cancelled_before = tandem.metric("tandem_cancelled_requests_total")
    url = urlparse(tandem.base_url)
    connection = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = {"inputs": "Once upon a time, in a faraway kingdom,", "parameters": {"max_new_tokens": 1000}}
    connection.request("POST", "/generate_stream", json.dumps(body), {"content-type": "application/json"})
    response = connection.getresponse()
    assert response.status == 200
    events = 0
    while events < 3:
        if response.readline().startswith(b"data:"):
            events += 1
    assert tandem.metric("tandem_kv_blocks_used") > 0
    connection.sock.shutdown(socket.SHUT_RDWR)
    connection.close()
    disconnected_at = time.monotonic()
    assert tandem.wait_for_metric("tandem_kv_blocks_used", 0, timeout=2.0) == 0
    assert time.monotonic() - disconnected_at < 2.0
    assert tandem.metric("tandem_cancelled_requests_total") == cancelled_before + 1
