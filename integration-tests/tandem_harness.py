"""Boots the real stack through `tandem-launcher` and talks to it: readiness, metrics, generation."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests
import torch
from tandem_launcher.config import DEFAULT_MODEL_CACHE_DIR, EMBEDDED_MODEL_ID
from tandem_launcher.model_resolution import ModelSource, resolve_source
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    Gemma3Config,
    Gemma3ForConditionalGeneration,
    Gemma3ImageProcessorPil,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    LlavaConfig,
    LlavaForConditionalGeneration,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    SiglipVisionConfig,
)

LAUNCHER = Path(sys.executable).parent / "tandem-launcher"
FIRST_START_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 120.0
# What the launcher logs once it considers start-up over (supervisor.py).
LAUNCHER_READY = "Tandem is ready at"
MAX_INPUT_TOKENS = 1024
MAX_TOTAL_TOKENS = 2048

# The flags of a server whose weights and activations are the checkpoint's float32 and whose steps all run eagerly, as
# the reference computes.
FLOAT32_EAGER = ("--quantize", "none", "--dtype", "float32", "--torch-compile", "off")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@dataclass
class TandemServer:
    """A launcher process serving on `base_url`, its merged output written to `log_path`."""

    process: subprocess.Popen[bytes]
    base_url: str
    log_path: Path

    @classmethod
    def start(cls, log_path: Path, *flags: str, compile_in_background: bool = False) -> TandemServer:
        """A server with `flags`. Its steps all run eagerly unless the flags name a --torch-compile mode or
        `compile_in_background` keeps the CPU default (a background compile beside every suite's servers would
        load the machine the suites share)."""
        port = free_port()
        eager = () if compile_in_background or "--torch-compile" in flags else ("--torch-compile", "off")
        argv = [str(LAUNCHER), "--hostname", "127.0.0.1", "--port", str(port), *flags, *eager]
        with log_path.open("wb") as log:
            process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        server = cls(process, f"http://127.0.0.1:{port}", log_path)
        server.wait_until_healthy(FIRST_START_TIMEOUT_S)
        return server

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def wait_until_healthy(self, timeout: float) -> None:
        """Until the router answers /health and the launcher has said it is ready: start-up ends there for the
        launcher, which treats a child that dies before it (a test killing a shard, say) as a failed start."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tandem-launcher exited with {self.process.returncode}:\n{self.log_tail()}")
            try:
                healthy = requests.get(f"{self.base_url}/health", timeout=2).status_code == 200
            except requests.ConnectionError:
                healthy = False
            if healthy and LAUNCHER_READY in self.log_path.read_text(errors="replace"):
                return
            time.sleep(0.5)
        self.process.kill()
        raise RuntimeError(f"tandem-launcher not healthy after {timeout:g}s:\n{self.log_tail()}")

    def stop(self) -> int:
        """SIGTERM, as an orchestrator would; the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise

    def info(self) -> dict[str, Any]:
        return requests.get(f"{self.base_url}/info", timeout=10).json()

    def metric(self, name: str, **labels: str) -> float:
        """Sum over every series of the Prometheus metric `name` that carries `labels` (0 when absent)."""
        text = requests.get(f"{self.base_url}/metrics", timeout=10).text
        wanted = {f'{label}="{value}"' for label, value in labels.items()}
        total = 0.0
        for line in text.splitlines():
            if line.startswith("#"):
                continue
            series, _, value = line.rpartition(" ")
            metric_name, _, series_labels = series.partition("{")
            if metric_name == name and wanted <= set(series_labels.removesuffix("}").split(",")):
                total += float(value)
        return total

    def wait_for_metric(self, name: str, expected: float, timeout: float, **labels: str) -> float:
        """Polls until `name` (its series carrying `labels`) equals `expected`; the last value seen."""
        deadline = time.monotonic() + timeout
        value = self.metric(name, **labels)
        while value != expected and time.monotonic() < deadline:
            time.sleep(0.05)
            value = self.metric(name, **labels)
        return value

    def generate_ids(self, prompt: str, max_new_tokens: int) -> list[int]:
        """Greedy token ids from the native `/generate` route."""
        body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens, "details": True}}
        response = requests.post(f"{self.base_url}/generate", json=body, timeout=300)
        assert response.status_code == 200, response.text
        return [token["id"] for token in response.json()["details"]["tokens"]]

    def stream_ids(self, prompt: str, max_new_tokens: int) -> list[int]:
        """Greedy token ids from `/generate_stream`, one SSE event per token."""
        body = {"inputs": prompt, "parameters": {"max_new_tokens": max_new_tokens}}
        ids = []
        with requests.post(f"{self.base_url}/generate_stream", json=body, stream=True, timeout=300) as response:
            assert response.status_code == 200, response.text
            for line in response.iter_lines(decode_unicode=True):
                if line and line.startswith("data:"):
                    event = json.loads(line[len("data:") :])
                    ids.append(event["token"]["id"])
        return ids


def model_cache_dir() -> Path:
    """The launcher's model cache: its default unless MODEL_CACHE_DIR says otherwise."""
    return Path(os.environ.get("MODEL_CACHE_DIR", DEFAULT_MODEL_CACHE_DIR)).expanduser()


def embedded_model_dir() -> Path:
    """The embedded model as the launcher serves it (converted once into the model cache)."""
    return resolve_source(ModelSource(EMBEDDED_MODEL_ID, None, model_cache_dir())).path


def tiny_llama_config(vocab_size: int, **overrides: Any) -> LlamaConfig:
    """A two-layer Llama over `vocab_size` tokens with the embedded model's BOS and EOS ids, which the launcher serves
    in seconds; `overrides` change any other setting."""
    embedded_config = json.loads((embedded_model_dir() / "config.json").read_text())
    settings: dict[str, Any] = {
        "vocab_size": vocab_size,
        "bos_token_id": embedded_config["bos_token_id"],
        "eos_token_id": embedded_config["eos_token_id"],
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 1024,
    }
    return LlamaConfig(**{**settings, **overrides})


def added_token(token_id: int, content: str, *, special: bool) -> dict[str, Any]:
    """An entry of tokenizer.json's `added_tokens`: `content` as one token, matched as written."""
    return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}  # fmt: skip


def write_tiny_llama(directory: Path) -> LlamaForCausalLM:
    """Saves a random two-layer Llama (seed 0) with the embedded model's vocabulary, tokenizer and chat template in
    `directory`, where the launcher serves it in seconds; returns the `transformers` model."""
    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    torch.manual_seed(0)
    config = tiny_llama_config(embedded_config["vocab_size"], tie_word_embeddings=True)
    model = LlamaForCausalLM(config).eval()
    model.save_pretrained(directory)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (directory / name).symlink_to(embedded / name)
    return model


# LLaVA-1.5's prompt format: a message's text parts as they are, each image part as the image placeholder.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ 'USER: ' }}"
    "{% elif message['role'] == 'assistant' %}{{ 'ASSISTANT: ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<image>' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)
LLAVA_IMAGE_TOKEN = "<image>"


def write_tiny_llava(directory: Path) -> LlavaForConditionalGeneration:
    """Saves a random LLaVA (seed 0): a two-layer CLIP tower reading 56x56 images in 14x14 patches (16 image tokens)
    and a two-layer Llama with the embedded model's vocabulary plus the special token `<image>` (its id is the
    embedded vocabulary's size), its tokenizer, CLIP image processor and a LLaVA-1.5 chat template; returns the
    `transformers` model."""
    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    image_token_id = embedded_config["vocab_size"]
    torch.manual_seed(0)
    text = tiny_llama_config(image_token_id + 1)
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=56, patch_size=14
    )
    config = LlavaConfig(vision_config=vision, text_config=text, image_token_index=image_token_id)
    model = LlavaForConditionalGeneration(config).eval()
    model.save_pretrained(directory)
    CLIPImageProcessorPil(size={"shortest_edge": 56}, crop_size={"height": 56, "width": 56}).save_pretrained(directory)
    tokenizer = json.loads((embedded / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append(added_token(image_token_id, LLAVA_IMAGE_TOKEN, special=True))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (directory / "tokenizer_config.json").write_bytes((embedded / "tokenizer_config.json").read_bytes())
    (directory / "chat_template.jinja").write_text(LLAVA_CHAT_TEMPLATE)
    return model


# Gemma 3's prompt format: turns between `<start_of_turn>` and `<end_of_turn>`, each image part as the token that
# Gemma3Processor expands (and the router likewise) into the image's whole span.
GEMMA3_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% set role = 'model' if message['role'] == 'assistant' else message['role'] %}"
    "{{ '<start_of_turn>' + role + '\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<start_of_image>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] | trim }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<end_of_turn>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\\n' }}{% endif %}"
)
# The tokens around and inside an image's span, by the tokenizer attribute Gemma3Processor reads each from.
GEMMA3_IMAGE_TOKENS = {
    "boi_token": "<start_of_image>",
    "image_token": "<image_soft_token>",
    "eoi_token": "<end_of_image>",
}
GEMMA3_TOKENS_PER_IMAGE = 16


def write_tiny_gemma3_vision(directory: Path) -> Gemma3ForConditionalGeneration:
    """Saves a random Gemma 3 (seed 0): a two-layer SigLIP tower reading 64x64 images in 8x8 patches, pooled to 16
    image tokens, and a sliding then a global text layer (window 8) over the embedded model's vocabulary plus the
    special tokens `<start_of_image>`, `<image_soft_token>` and `<end_of_image>` (ids from the embedded vocabulary's
    size on); its tokenizer, Gemma 3 image processor and processor settings (so `AutoProcessor` loads it) and a
    Gemma 3 style chat template; returns the `transformers` model. Tensors whose init is one value (norms, biases, the
    zero projection matrix) are randomised, so images change what it generates."""
    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    boi_id, image_id, eoi_id = (embedded_config["vocab_size"] + offset for offset in range(3))
    torch.manual_seed(0)
    text = Gemma3TextConfig(
        vocab_size=eoi_id + 1, bos_token_id=embedded_config["bos_token_id"],
        eos_token_id=embedded_config["eos_token_id"], hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=1024, sliding_window=8,
        layer_types=["sliding_attention", "full_attention"],
    )  # fmt: skip
    vision = SiglipVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=64, patch_size=8
    )
    config = Gemma3Config(
        text_config=text.to_dict(),
        vision_config=vision.to_dict(),
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        boi_token_index=boi_id,
        image_token_index=image_id,
        eoi_token_index=eoi_id,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(directory)
    Gemma3ImageProcessorPil(size={"height": 64, "width": 64}).save_pretrained(directory)
    processor = {"processor_class": "Gemma3Processor", "image_seq_length": GEMMA3_TOKENS_PER_IMAGE}
    (directory / "processor_config.json").write_text(json.dumps(processor))
    tokenizer = json.loads((embedded / "tokenizer.json").read_text())
    for token_id, content in zip((boi_id, image_id, eoi_id), GEMMA3_IMAGE_TOKENS.values(), strict=True):
        tokenizer["added_tokens"].append(added_token(token_id, content, special=True))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tokenizer_config = json.loads((embedded / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    tokenizer_config["extra_special_tokens"] = GEMMA3_IMAGE_TOKENS
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, ensure_ascii=False))
    (directory / "chat_template.jinja").write_text(GEMMA3_CHAT_TEMPLATE)
    return model


# Qwen2-VL's prompt format: ChatML turns, each image part as the span Qwen2_5_VLProcessor widens (and the router
# likewise) to one pad token per merged patch.
QWEN2_5_VL_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# The tokens around and inside an image's span, and the video token the processor also looks up, in id order.
QWEN2_5_VL_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>")
# 8x8-pixel patches merged 2x2; images are resized to hold 4 to 64 merged patches.
QWEN2_5_VL_PATCH, QWEN2_5_VL_MIN_PIXELS, QWEN2_5_VL_MAX_PIXELS = 8, 4 * 256, 64 * 256


def write_tiny_qwen2_5_vl(directory: Path) -> Qwen2_5_VLForConditionalGeneration:
    """Saves a random Qwen2.5-VL (seed 0): a two-layer vision tower over 8x8 patches (windowed, then full attention)
    merged 2x2 into 4 to 64 image tokens per image, and a two-layer Qwen2 text decoder with multimodal rotary over
    the embedded model's vocabulary plus the special tokens of QWEN2_5_VL_TOKENS (ids from the embedded vocabulary's
    size on); its tokenizer, image processor, processor settings and a Qwen2-VL style chat template; returns the
    `transformers` model. Tensors whose init is one value are randomised. (`AutoProcessor` also builds the video
    processor, which needs torchvision: without it, widen each `<|image_pad|>` by the image processor's grid.)"""
    embedded = embedded_model_dir()
    embedded_config = json.loads((embedded / "config.json").read_text())
    start_id, image_id, end_id, video_id = (embedded_config["vocab_size"] + offset for offset in range(4))
    torch.manual_seed(0)
    sizes = ("bos_token_id", "eos_token_id", "hidden_size", "intermediate_size", "num_hidden_layers",
             "num_attention_heads", "num_key_value_heads", "max_position_embeddings")  # fmt: skip
    text = {key: getattr(tiny_llama_config(video_id + 1), key) for key in ("vocab_size", *sizes)}
    text["rope_parameters"] = {"rope_type": "default", "rope_theta": 10_000.0, "mrope_section": [2, 3, 3]}
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 48, "num_heads": 2, "patch_size": QWEN2_5_VL_PATCH,
              "window_size": 32, "fullatt_block_indexes": [1], "out_hidden_size": 64}  # fmt: skip
    config = Qwen2_5_VLConfig(
        text_config=text,
        vision_config=vision,
        image_token_id=image_id,
        video_token_id=video_id,
        vision_start_token_id=start_id,
        vision_end_token_id=end_id,
    )
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    with torch.no_grad():
        for param in model.parameters():
            if param.numel() > 1 and bool((param == param.flatten()[0]).all()):
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(directory)
    size = {"shortest_edge": QWEN2_5_VL_MIN_PIXELS, "longest_edge": QWEN2_5_VL_MAX_PIXELS}
    Qwen2VLImageProcessorPil(size=size, patch_size=QWEN2_5_VL_PATCH).save_pretrained(directory)
    (directory / "processor_config.json").write_text(json.dumps({"processor_class": "Qwen2_5_VLProcessor"}))
    tokenizer = json.loads((embedded / "tokenizer.json").read_text())
    for token_id, content in zip((start_id, image_id, end_id, video_id), QWEN2_5_VL_TOKENS, strict=True):
        tokenizer["added_tokens"].append(added_token(token_id, content, special=True))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    tokenizer_config = json.loads((embedded / "tokenizer_config.json").read_text())
    tokenizer_config.pop("chat_template", None)
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, ensure_ascii=False))
    (directory / "chat_template.jinja").write_text(QWEN2_5_VL_CHAT_TEMPLATE)
    return model


def all_gone(processes: list[psutil.Process]) -> bool:
    """True once none of `processes` runs (zombies waiting for a reaper count as gone)."""
    for process in processes:
        try:
            if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def sse_lines(response: requests.Response) -> Iterator[str]:
    """The lines of a streamed body. Only CR and LF end one: a token's text may hold U+2028 or U+0085 unescaped
    inside a JSON event, and `str.splitlines` (behind requests' `decode_unicode`) splits at those too."""
    for raw in response.iter_lines():
        yield raw.decode("utf-8")
