"""What the vision-language launcher tests share: images drawn in-process, data URLs, a launcher started with its
shards' metrics port, and chat calls that must succeed."""

from __future__ import annotations

import base64
import io
from pathlib import Path

import requests
from PIL import Image
from tandem_harness import FLOAT32_EAGER, TandemServer, free_port


def png(colour: str, size: tuple[int, int] = (64, 48)) -> bytes:
    """A PNG of one colour, `size` = (width, height)."""
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def start_with_shard_metrics(root: Path, model_dir: Path, *flags: str) -> TandemServer:
    """The launcher on `model_dir` in float32 without compiling, its shards' metrics at `server.shard_metrics_url`."""
    shard_metrics = free_port()
    server = TandemServer.start(
        root / "launcher.log",
        "--model-id", str(model_dir), *FLOAT32_EAGER,
        "--kv-cache-memory", "32MiB",
        "--shard-metrics-port", str(shard_metrics),
        *flags,
    )  # fmt: skip
    server.shard_metrics_url = f"http://127.0.0.1:{shard_metrics}/metrics"  # type: ignore[attr-defined]
    return server


def shard_metric(server: TandemServer, name: str) -> float:
    """The sum of the shards' samples of metric `name` (a server from `start_with_shard_metrics`)."""
    text = requests.get(server.shard_metrics_url, timeout=10).text  # type: ignore[attr-defined]
    return sum(float(line.rpartition(" ")[2]) for line in text.splitlines() if line.startswith(name))


def chat(server: TandemServer, body: dict[str, object]) -> dict[str, object]:
    """The answer to a chat completion that must succeed."""
    response = requests.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()
