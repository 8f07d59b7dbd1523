"""A streaming client that dies by SIGKILL at a chosen point, as a crashed or killed client process would.

Run as `python killed_client.py HOST PORT BODY_JSON PHASE ARG`:
- `queued DELAY_S`: dies DELAY_S after its request is written, whatever it has received by then;
- `headers DELAY_S`: dies DELAY_S after the response status line arrives (queued or mid-prefill);
- `decode EVENTS`: dies after reading EVENTS `data:` events (mid-decode).
Prints `done` and exits 0 if the stream ended before its point (the test counts these).
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    host, port, body, phase, argument = sys.argv[1], int(sys.argv[2]), sys.argv[3].encode(), sys.argv[4], sys.argv[5]
    path = "/v1/completions"
    connection = socket.create_connection((host, port), timeout=120)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    connection.sendall(head + body)
    if phase == "queued":
        time.sleep(float(argument))
        die()
    stream = connection.makefile("rb")
    status = stream.readline()
    if not status.startswith(b"HTTP/1.1 200"):
        print(f"status {status!r}", flush=True)
        sys.exit(1)
    if phase == "headers":
        time.sleep(float(argument))
        die()
    events = 0
    for line in stream:
        if line.startswith(b"data: [DONE]"):
            break
        if line.startswith(b"data:"):
            events += 1
            if events >= int(argument):
                die()
    print("done", flush=True)


if __name__ == "__main__":
    main()
