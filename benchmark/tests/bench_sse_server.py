"""A tiny OpenAI-style streaming server for client tests: emits SSE chunks after scripted delays."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from aiohttp import web


@dataclass
class Script:
    """What the server answers: a first-token delay, then one gap before each later piece."""

    first_delay_s: float = 0.3
    pieces: tuple[str, ...] = ("a", "b", "c", "d")
    gaps_s: tuple[float, ...] = (0.1, 0.2, 0.3)
    send_usage: bool = True
    cached_tokens: int | None = None
    status: int = 200
    error_after_first: bool = False
    received: list[dict[str, Any]] = field(default_factory=list)
    # Each request's Authorization header (None without one) and its arrival (monotonic seconds), in order.
    authorizations: list[str | None] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)
    in_flight: int = 0
    most_in_flight: int = 0


def _chunk(api_chat: bool, text: str) -> dict[str, Any]:
    choice = {"index": 0, "delta": {"content": text}} if api_chat else {"index": 0, "text": text}
    return {"choices": [choice]}


async def _stream(request: web.Request, script: Script, api_chat: bool) -> web.StreamResponse:
    body = await request.json()
    script.received.append(body)
    script.authorizations.append(request.headers.get("Authorization"))
    script.arrivals.append(time.monotonic())
    script.in_flight += 1
    script.most_in_flight = max(script.most_in_flight, script.in_flight)
    try:
        return await _answer(request, script, api_chat)
    finally:
        script.in_flight -= 1


async def _answer(request: web.Request, script: Script, api_chat: bool) -> web.StreamResponse:
    if script.status != 200:
        return web.json_response({"error": {"message": "overloaded"}}, status=script.status)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)

    async def send(payload: object) -> None:
        data = payload if isinstance(payload, str) else json.dumps(payload)
        await response.write(f"data: {data}\n\n".encode())

    if api_chat:
        # A role-only chunk before any token must not count as the first token.
        await send({"choices": [{"index": 0, "delta": {"role": "assistant"}}]})
    await response.write(b": keep-alive\n\n")
    await asyncio.sleep(script.first_delay_s)
    for index, piece in enumerate(script.pieces):
        if index > 0:
            await asyncio.sleep(script.gaps_s[index - 1])
        await send(_chunk(api_chat, piece))
        if script.error_after_first:
            await send({"error": {"message": "shard failed", "type": "generation"}})
            break
    if script.send_usage:
        usage: dict[str, Any] = {"prompt_tokens": 7, "completion_tokens": len(script.pieces)}
        if script.cached_tokens is not None:
            usage["prompt_tokens_details"] = {"cached_tokens": script.cached_tokens}
        await send({"choices": [], "usage": usage})
    await send("[DONE]")
    await response.write_eof()
    return response


async def _models(_: web.Request) -> web.Response:
    return web.json_response({"data": [{"id": "fake-model"}]})


@asynccontextmanager
async def serve(script: Script) -> AsyncIterator[str]:
    """Runs the server on a free loopback port and yields its base URL."""
    app = web.Application()
    app.router.add_post("/v1/completions", partial(_stream, script=script, api_chat=False))
    app.router.add_post("/v1/chat/completions", partial(_stream, script=script, api_chat=True))
    app.router.add_get("/v1/models", _models)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    try:
        yield f"http://{host}:{port}"
    finally:
        await runner.cleanup()
