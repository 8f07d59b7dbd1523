"""A vision-language model through the real stack: a tiny random LLaVA served by the launcher answers chat with images
as `transformers` does, reuses the prefix cache and the encoder cache for the same image, shares no KV past the text
before a different image, and refuses bad images with a 4xx that leaves a concurrent stream unchanged."""

from __future__ import annotations

import base64
import http.server
import io
import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import anthropic
import openai
import pytest
import requests
import torch
from PIL import Image
from tandem_harness import FLOAT32_EAGER, LLAVA_IMAGE_TOKEN, TandemServer, write_tiny_llava
from tokenizers import Tokenizer
from transformers import AutoImageProcessor, LlavaForConditionalGeneration
from vision_serving import chat, data_url, png, shard_metric, start_with_shard_metrics

# Long enough that the text before the image fills whole KV blocks of 16 tokens.
PREAMBLE = "Look closely at the picture below and describe its colours, its shapes and its mood in a few words. " * 2
TOKENS_PER_IMAGE = 16
MAX_PIXELS = 100 * 100


def chat_body(*urls: str, max_tokens: int = 8, **extra: object) -> dict[str, object]:
    images = [{"type": "image_url", "image_url": {"url": url}} for url in urls]
    content = [{"type": "text", "text": PREAMBLE}, *images]
    return {
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        **extra,
    }


@pytest.fixture(scope="module")
def llava_dir(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlavaForConditionalGeneration]:
    directory = tmp_path_factory.mktemp("llava") / "model"
    model = write_tiny_llava(directory)
    return directory, model


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory, llava_dir: tuple[Path, object]) -> Iterator[TandemServer]:
    root = tmp_path_factory.mktemp("llava-server")
    limits = ("--max-image-pixels", str(MAX_PIXELS), "--max-images-per-request", "2")
    server = start_with_shard_metrics(root, llava_dir[0], *limits)
    yield server
    assert server.stop() == 0, server.log_tail()


def reference_text(directory: Path, model: LlavaForConditionalGeneration, image: bytes, max_tokens: int) -> str:
    """`transformers`' greedy continuation of the same rendered prompt and image."""
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    prompt = f"USER: {PREAMBLE}{LLAVA_IMAGE_TOKEN}\nASSISTANT:"
    ids = tokenizer.encode(prompt, add_special_tokens=False).ids
    image_token_id = model.config.image_token_id
    expanded = [t for i in ids for t in ([i] * TOKENS_PER_IMAGE if i == image_token_id else [i])]
    processor = AutoImageProcessor.from_pretrained(directory, backend="pil")
    pixels = processor(images=Image.open(io.BytesIO(image)).convert("RGB"), return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        output = model.generate(
            input_ids=torch.tensor([expanded]), pixel_values=pixels, max_new_tokens=max_tokens, do_sample=False
        )
    return tokenizer.decode(output[0, len(expanded) :].tolist(), skip_special_tokens=True)


def test_greedy_answers_equal_transformers_on_the_same_image(
    llava: TandemServer, llava_dir: tuple[Path, LlavaForConditionalGeneration]
) -> None:
    image = png("teal")
    answer = chat(llava, chat_body(data_url(image)))
    assert answer["usage"]["completion_tokens"] == 8
    expected = reference_text(*llava_dir, image, 8)
    assert answer["choices"][0]["message"]["content"] == expected


def test_the_same_image_reuses_its_kv_blocks_and_its_encoding(llava: TandemServer) -> None:
    url = data_url(png("orange"))
    runs = shard_metric(llava, "tandem_shard_image_encoder_runs_total")
    first = chat(llava, chat_body(url))
    assert shard_metric(llava, "tandem_shard_image_encoder_runs_total") == runs + 1
    second = chat(llava, chat_body(url))
    assert second["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]
    prompt_tokens = second["usage"]["prompt_tokens"]
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    # Every full block is reused, the image's included: only the last partial block is recomputed.
    assert cached == (prompt_tokens - 1) // 16 * 16, second["usage"]
    assert shard_metric(llava, "tandem_shard_image_encoder_runs_total") == runs + 1
    assert llava.metric("tandem_request_images_sum", route="chat_completions") >= 2


def test_a_different_image_shares_only_the_text_before_it(llava: TandemServer) -> None:
    chat(llava, chat_body(data_url(png("navy"))))
    other = chat(llava, chat_body(data_url(png("gold"))))
    usage = other["usage"]
    tokens_before_image = usage["prompt_tokens"] - TOKENS_PER_IMAGE - 4
    assert 0 < usage["prompt_tokens_details"]["cached_tokens"] <= tokens_before_image, usage


def test_the_openai_and_anthropic_sdks_send_images_unchanged(llava: TandemServer) -> None:
    image = png("purple")
    client = openai.OpenAI(base_url=f"{llava.base_url}/v1", api_key="unused")
    body = chat_body(data_url(image))
    answer = client.chat.completions.create(
        model="llava", messages=body["messages"], max_tokens=8, temperature=0, extra_body={"ignore_eos": True}
    )
    via_openai = answer.choices[0].message.content
    assert via_openai == chat(llava, body)["choices"][0]["message"]["content"]
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(image).decode()}
    content = [{"type": "text", "text": PREAMBLE}, {"type": "image", "source": source}]
    messages = anthropic.Anthropic(base_url=llava.base_url, api_key="unused").messages.create(
        model="llava", max_tokens=4, messages=[{"role": "user", "content": content}]
    )
    assert messages.usage.input_tokens + (messages.usage.cache_read_input_tokens or 0) > TOKENS_PER_IMAGE


def stream_text(server: TandemServer, body: dict[str, object]) -> str:
    response = requests.post(
        f"{server.base_url}/v1/chat/completions", json={**body, "stream": True}, stream=True, timeout=120
    )
    assert response.status_code == 200, response.text
    text = []
    for line in response.iter_lines():
        if line.startswith(b"data: {"):
            for choice in json.loads(line[6:])["choices"]:
                text.append(choice["delta"].get("content") or "")
    return "".join(text)


BAD_IMAGES = {
    "truncated PNG": (data_url(png("red")[:60]), "cannot be decoded"),
    "not an image": (data_url(b"%PDF-1.7 definitely not an image"), "not a PNG, JPEG, WebP or GIF"),
    "over the pixel limit": (data_url(png("red", (200, 200))), "--max-image-pixels"),
    "a URL without the allow-list": ("http://example.com/cat.png", "--allowed-media-domains"),
}


def test_bad_images_get_a_4xx_and_leave_a_concurrent_stream_unchanged(llava: TandemServer) -> None:
    body = chat_body(data_url(png("white")), max_tokens=48)
    alone = stream_text(llava, body)
    with ThreadPoolExecutor(1) as pool:
        concurrent = pool.submit(stream_text, llava, body)
        for name, (url, message) in BAD_IMAGES.items():
            refused = requests.post(f"{llava.base_url}/v1/chat/completions", json=chat_body(url), timeout=60)
            assert refused.status_code == 400, (name, refused.text)
            assert message in refused.json()["error"]["message"], (name, refused.text)
        three = chat_body(*[data_url(png(colour)) for colour in ("red", "green", "blue")])
        too_many = requests.post(f"{llava.base_url}/v1/chat/completions", json=three, timeout=60)
        assert too_many.status_code == 400, too_many.text
        assert "at most 2" in too_many.json()["error"]["message"]
        assert concurrent.result(timeout=120) == alone
    assert llava.metric("tandem_running_requests") == 0


# 2,000,000 bytes for text plus one base64 image of the default --max-image-bytes (20 MiB).
VISION_PAYLOAD_LIMIT = 2_000_000 + (20 * 1024 * 1024 + 2) // 3 * 4


def noise_png(side: int) -> bytes:
    """A PNG of random pixels, which compress to about their raw size."""
    buffer = io.BytesIO()
    Image.frombytes(
        "RGB", (side, side), torch.randint(0, 256, (side * side * 3,), dtype=torch.uint8).numpy().tobytes()
    ).save(buffer, format="PNG")
    return buffer.getvalue()


def test_bodies_carry_an_image_over_2_mb_but_no_more_text_than_one_tokenization_takes(llava: TandemServer) -> None:
    info = requests.get(f"{llava.base_url}/info", timeout=10).json()
    assert info["payload_limit"] == VISION_PAYLOAD_LIMIT
    large = noise_png(1000)
    assert len(large) > 2_000_000
    # The body is read whole and the image checked: it is refused for its pixels, not for its size.
    refused = requests.post(f"{llava.base_url}/v1/chat/completions", json=chat_body(data_url(large)), timeout=60)
    assert refused.status_code == 400, refused.text
    assert "--max-image-pixels" in refused.json()["error"]["message"]
    # Text is bounded by what one tokenization job may take (two 2,000,000-byte bodies), not by the larger body.
    text = {"messages": [{"role": "user", "content": "a" * 4_000_001}], "max_tokens": 1}
    too_much = requests.post(f"{llava.base_url}/v1/chat/completions", json=text, timeout=60)
    assert too_much.status_code == 413, too_much.text
    assert "4000001 bytes of text" in too_much.json()["error"]["message"]
    assert llava.metric("tandem_running_requests") == 0


class MediaServer(http.server.BaseHTTPRequestHandler):
    """A stand-in media host: `/image.png`, `/slow.png` (answers after 10 s), `/huge.png` (1 MB) and
    `/elsewhere.png` (a redirect to the cloud metadata address)."""

    image = png("teal")

    def do_GET(self) -> None:
        if self.path == "/slow.png":
            time.sleep(10)
        if self.path == "/elsewhere.png":
            self.send_response(302)
            self.send_header("Location", "http://169.254.169.254/latest/meta-data/")
            self.end_headers()
            return
        body = b"\0" * 1_000_000 if self.path == "/huge.png" else self.image
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture(scope="module")
def media_host() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), MediaServer)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def fetching(tmp_path_factory: pytest.TempPathFactory, llava_dir: tuple[Path, object]) -> Iterator[TandemServer]:
    root = tmp_path_factory.mktemp("llava-fetching")
    server = TandemServer.start(
        root / "launcher.log",
        "--model-id", str(llava_dir[0]), *FLOAT32_EAGER,
        "--kv-cache-memory", "32MiB",
        "--allowed-media-domains", "127.0.0.1",
        "--allow-private-media-addresses",
        "--media-fetch-timeout", "2",
        "--max-image-bytes", "100000",
    )  # fmt: skip
    yield server
    assert server.stop() == 0, server.log_tail()


def test_an_allowed_host_serves_images_by_url_as_inline(fetching: TandemServer, media_host: str) -> None:
    by_url = chat(fetching, chat_body(f"{media_host}/image.png"))
    inline = chat(fetching, chat_body(data_url(MediaServer.image)))
    assert by_url["choices"][0]["message"]["content"] == inline["choices"][0]["message"]["content"]


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("/slow.png", "timed out"),
        ("/huge.png", "--max-image-bytes"),
        ("/elsewhere.png", "169.254.169.254"),
    ],
)
def test_slow_huge_and_redirected_fetches_are_refused_within_the_limits(
    fetching: TandemServer, media_host: str, path: str, message: str
) -> None:
    started = time.monotonic()
    refused = requests.post(f"{fetching.base_url}/v1/chat/completions", json=chat_body(media_host + path), timeout=60)
    assert refused.status_code == 400, refused.text
    assert message in refused.json()["error"]["message"], refused.text
    assert time.monotonic() - started < 5


def test_two_shards_answer_as_one(
    tmp_path_factory: pytest.TempPathFactory, llava_dir: tuple[Path, object], llava: TandemServer
) -> None:
    body = chat_body(data_url(png("maroon")), max_tokens=12)
    one = chat(llava, body)["choices"][0]["message"]["content"]
    root = tmp_path_factory.mktemp("llava-tp2")
    server = TandemServer.start(
        root / "launcher.log", "--model-id", str(llava_dir[0]), *FLOAT32_EAGER, "--kv-cache-memory", "32MiB",
        "--num-shard", "2",
    )  # fmt: skip
    try:
        assert chat(server, body)["choices"][0]["message"]["content"] == one
    finally:
        assert server.stop() == 0, server.log_tail()
