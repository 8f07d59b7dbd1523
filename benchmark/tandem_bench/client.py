"""One streamed request to an OpenAI-compatible server, timed chunk by chunk."""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp

API_PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class StreamError(Exception):
    """The server answered, but not with a usable stream."""


@dataclass(frozen=True)
class Endpoint:
    """A server under test and how to talk to it."""

    name: str
    base_url: str
    api: str = "completions"
    model: str = ""
    temperature: float = 0.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    api_key: str | None = None

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + API_PATHS[self.api]


@dataclass
class RequestResult:
    """Timings of one request, in seconds from its own start; `itl` holds every gap between content chunks."""

    success: bool = False
    prompt_words: int = 0
    prompt_tokens: int | None = None
    # Prompt tokens the server reports it served from its prefix cache (`usage.prompt_tokens_details`), when it does.
    cached_tokens: int | None = None
    output_tokens: int = 0
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    e2e: float = 0.0
    start: float = 0.0
    text: str = ""
    error: str = ""

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - ttft) / (output_tokens - 1)."""
        if not self.success or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def message_text(content: str | list[dict[str, Any]]) -> str:
    """A message's text: the content itself, or its text parts joined (image parts carry none)."""
    if isinstance(content, str):
        return content
    return " ".join(str(part.get("text", "")) for part in content if part.get("type") == "text")


def build_payload(endpoint: Endpoint, messages: list[dict[str, Any]], max_tokens: int) -> dict[str, Any]:
    """The JSON body; `/v1/completions` gets the messages' texts joined into one prompt."""
    payload: dict[str, Any] = {
        "model": endpoint.model,
        "max_tokens": max_tokens,
        "temperature": endpoint.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if endpoint.api == "chat":
        payload["messages"] = messages
    else:
        payload["prompt"] = "\n".join(message_text(message["content"]) for message in messages)
    payload.update(endpoint.extra_body)
    return payload


def _chunk_text(chunk: dict[str, Any]) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        delta = choice["delta"] or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""


class _StreamTimer:
    """Turns SSE `data:` payloads into content timings; a chunk counts only when it carries text."""

    def __init__(self, result: RequestResult, start: float) -> None:
        self.result = result
        self.start = start
        self.last = start
        self.chunks = 0
        self.pieces: list[str] = []

    def on_data(self, data: str, now: float) -> bool:
        """Handles one payload; returns False at `[DONE]`."""
        if data == "[DONE]":
            return False
        chunk = json.loads(data)
        if "error" in chunk:
            raise StreamError(f"server error in stream: {chunk['error']}")
        usage = chunk.get("usage")
        if usage:
            self.result.output_tokens = int(usage.get("completion_tokens") or 0)
            self.result.prompt_tokens = usage.get("prompt_tokens")
            details = usage.get("prompt_tokens_details") or {}
            self.result.cached_tokens = details.get("cached_tokens")
        text = _chunk_text(chunk)
        if text:
            if self.chunks == 0:
                self.result.ttft = now - self.start
            else:
                self.result.itl.append(now - self.last)
            self.last = now
            self.chunks += 1
            self.pieces.append(text)
        return True

    def finish(self, now: float) -> None:
        self.result.e2e = now - self.start
        self.result.text = "".join(self.pieces)
        if self.result.output_tokens == 0:
            self.result.output_tokens = self.chunks
        if self.chunks == 0:
            raise StreamError("stream ended without any generated text")
        self.result.success = True


async def stream_request(
    session: aiohttp.ClientSession, endpoint: Endpoint, messages: list[dict[str, Any]], max_tokens: int
) -> RequestResult:
    """Sends one streamed request; failures are recorded in the result, never raised."""
    result = RequestResult(prompt_words=sum(len(message_text(message["content"]).split()) for message in messages))
    headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
    start = time.perf_counter()
    timer = _StreamTimer(result, start)
    try:
        async with session.post(
            endpoint.url, json=build_payload(endpoint, messages, max_tokens), headers=headers
        ) as response:
            if response.status != 200:
                body = (await response.text())[:300]
                raise StreamError(f"HTTP {response.status}: {body}")
            async for raw_line in response.content:
                line = raw_line.decode("utf-8").strip()
                if not line.startswith("data:"):
                    continue
                if not timer.on_data(line[len("data:") :].strip(), time.perf_counter()):
                    break
        timer.finish(time.perf_counter())
    except StreamError as error:
        result.e2e = time.perf_counter() - start
        result.error = str(error)
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError) as error:
        # ValueError covers malformed JSON and undecodable bytes in the stream.
        result.e2e = time.perf_counter() - start
        result.error = f"{type(error).__name__}: {error}"
    return result


async def discover_model(session: aiohttp.ClientSession, base_url: str, api_key: str | None = None) -> str:
    """The first model id `/v1/models` lists, or "" when it lists none (servers that need no name accept "")."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with session.get(base_url.rstrip("/") + "/v1/models", headers=headers) as response:
            if response.status != 200:
                return ""
            models = (await response.json()).get("data") or []
            return str(models[0]["id"]) if models else ""
    except (aiohttp.ClientError, asyncio.TimeoutError, ValueError, KeyError):
        return ""


def extra_body(text: str) -> dict[str, object]:
    """`--extra-body`'s value: a JSON object merged into every request's body."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"--extra-body is not JSON: {error}") from error
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("--extra-body must be a JSON object")
    return value
