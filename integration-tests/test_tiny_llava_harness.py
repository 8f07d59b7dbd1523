"""The tiny LLaVA the launcher tests serve: its tokenizer, chat template and weights fit together without a launch."""

from __future__ import annotations

import io
from pathlib import Path

import jinja2
import torch
from PIL import Image
from tandem_harness import LLAVA_IMAGE_TOKEN, write_tiny_llava
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.loader import load_image_embedder
from tokenizers import Tokenizer


def test_the_tiny_llava_reads_its_image_token_template_and_images(tmp_path: Path) -> None:
    model = write_tiny_llava(tmp_path)
    image_token_id = model.config.image_token_id
    tokenizer = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    template = jinja2.Environment().from_string((tmp_path / "chat_template.jinja").read_text())
    content = [{"type": "text", "text": "What is this?"}, {"type": "image"}]
    prompt = template.render(messages=[{"role": "user", "content": content}], add_generation_prompt=True)
    assert prompt == f"USER: What is this?{LLAVA_IMAGE_TOKEN}\nASSISTANT:"
    assert template.render(messages=[{"role": "user", "content": "Hi"}]) == "USER: Hi\n"
    assert tokenizer.encode(prompt).ids.count(image_token_id) == 1
    assert tokenizer.decode([image_token_id], skip_special_tokens=False) == LLAVA_IMAGE_TOKEN
    checkpoint = read_checkpoint_config(tmp_path)
    assert checkpoint.hf["vocab_size"] == image_token_id + 1
    embedder = load_image_embedder(checkpoint, torch.float32, torch.device("cpu"), 1 << 20)
    assert embedder is not None and embedder.image_token_id == image_token_id
    buffer = io.BytesIO()
    Image.new("RGB", (80, 60), "teal").save(buffer, format="PNG")
    assert embedder.embeddings(buffer.getvalue(), b"\0" * 32).shape == (16, 64)
