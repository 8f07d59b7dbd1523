"""A stand-in for `tandem-router`: accepts its flags, answers /health and /info, acts out a behaviour."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import FrameType

from forwarded_flags import add_forwarded_flags
from tandem_launcher.router_flags import ROUTER_FLAGS

BEHAVIOURS = ("serve", "crash-after-ready", "slow-drain", "slow-warmup")
SLOW_DRAIN_S = 60.0
# Like the real router, which binds its port only once the shards are warm.
SLOW_WARMUP_S = 1.0


def record(events: Path | None, text: str) -> None:
    if events is not None:
        with events.open("a") as handle:
            handle.write(text + "\n")


def handler_for(info: dict[str, int], launch_id: str | None) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            routes = {"/health": b"", "/info": json.dumps(info).encode()}
            if self.path not in routes:
                self.send_error(404)
                return
            self.send_response(200)
            if launch_id is not None and self.path == "/health":
                self.send_header("X-Tandem-Launch-Id", launch_id)
            self.send_header("Content-Length", str(len(routes[self.path])))
            self.end_headers()
            self.wfile.write(routes[self.path])

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--behaviour", choices=BEHAVIOURS, default="serve")
    parser.add_argument("--events", type=Path)
    shards = parser.add_mutually_exclusive_group(required=True)
    shards.add_argument("--shard-uds-path", action="append")
    shards.add_argument("--shard-uri", action="append")
    parser.add_argument("--cluster-secret-file")
    for flag in ("--hostname", "--tokenizer-path", "--model-id"):
        parser.add_argument(flag, required=True)
    for flag in (
        "--port", "--max-input-tokens", "--max-total-tokens", "--block-size", "--shard-connect-timeout",
        "--graceful-termination-timeout", "--step-timeout", "--speculate", "--speculative-disable-by-batch-size",
    ):  # fmt: skip
        parser.add_argument(flag, type=int, required=True)
    parser.add_argument("--speculative-method", required=True)
    parser.add_argument("--json-output", action="store_true")
    parser.add_argument("--api-key-file", action="append", type=Path, default=[])
    parser.add_argument("--launch-id-file", type=Path)
    add_forwarded_flags(parser, ROUTER_FLAGS)
    args = parser.parse_args()
    record(args.events, f"router pid {os.getpid()} argv {' '.join(sys.argv[1:])}")
    record(args.events, f"router environment {' '.join(sorted(os.environ))}")
    info = {"kv_cache_blocks": 100, "kv_cache_tokens": 100 * args.block_size, "max_total_tokens": args.max_total_tokens}
    launch_id = args.launch_id_file.read_text() if args.launch_id_file else None
    if args.behaviour == "slow-warmup":
        time.sleep(SLOW_WARMUP_S)
    try:
        server = ThreadingHTTPServer((args.hostname, args.port), handler_for(info, launch_id))
    except OSError as error:
        print(f"cannot listen on {args.hostname}:{args.port}: {error}", flush=True)
        return 1
    exit_status = {"value": 0}

    def stop(_signum: int, _frame: FrameType | None) -> None:
        if args.behaviour == "slow-drain":
            record(args.events, "router draining")
            threading.Timer(SLOW_DRAIN_S, server.shutdown).start()
            return
        record(args.events, "router stopped")
        threading.Thread(target=server.shutdown).start()

    def crash() -> None:
        print("router: lost connection to shard 0", flush=True)
        exit_status["value"] = 4
        server.shutdown()

    signal.signal(signal.SIGTERM, stop)
    if args.behaviour == "crash-after-ready":
        threading.Timer(0.5, crash).start()
    print(f"listening on http://{args.hostname}:{args.port}", flush=True)
    server.serve_forever(poll_interval=0.05)
    return exit_status["value"]


if __name__ == "__main__":
    sys.exit(main())
