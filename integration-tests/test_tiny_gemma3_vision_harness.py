"""The tiny Gemma 3 the launcher tests serve: transformers' processor, its chat template, its special tokens and the
shard's image encoder fit together without a launch."""

from __future__ import annotations

import io
from pathlib import Path

import torch
from PIL import Image
from tandem_harness import GEMMA3_IMAGE_TOKENS, GEMMA3_TOKENS_PER_IMAGE, write_tiny_gemma3_vision
from tandem_server.models.config import read_checkpoint_config
from tandem_server.vision.loader import load_image_embedder
from transformers import AutoProcessor


def test_the_tiny_gemma3_expands_its_images_as_gemma3_processor_does(tmp_path: Path) -> None:
    model = write_tiny_gemma3_vision(tmp_path)
    processor = AutoProcessor.from_pretrained(tmp_path)
    tokenizer = processor.tokenizer
    config = model.config
    ids = [tokenizer.convert_tokens_to_ids(token) for token in GEMMA3_IMAGE_TOKENS.values()]
    assert ids == [config.boi_token_id, config.image_token_id, config.eoi_token_id]
    content = [{"type": "text", "text": "What is this?"}, {"type": "image"}]
    messages = [{"role": "user", "content": content}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert prompt == "<start_of_turn>user\nWhat is this?<start_of_image><end_of_turn>\n<start_of_turn>model\n"
    image = Image.new("RGB", (80, 60), "teal")
    inputs = processor(text=prompt, images=[image], return_tensors="pt")
    input_ids = inputs["input_ids"][0].tolist()
    first = input_ids.index(config.image_token_id)
    span = [config.boi_token_id, *[config.image_token_id] * GEMMA3_TOKENS_PER_IMAGE, config.eoi_token_id]
    assert input_ids[first - 1 : first + GEMMA3_TOKENS_PER_IMAGE + 1] == span
    assert inputs["token_type_ids"][0].tolist() == [int(token == config.image_token_id) for token in input_ids]
    embedder = load_image_embedder(read_checkpoint_config(tmp_path), torch.float32, torch.device("cpu"), 1 << 20)
    assert embedder is not None and embedder.image_token_id == config.image_token_id
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    ours = embedder.embeddings(buffer.getvalue(), b"\0" * 32)
    with torch.no_grad():
        features = model.model.get_image_features(pixel_values=inputs["pixel_values"]).pooler_output[0]
    assert ours.shape == (GEMMA3_TOKENS_PER_IMAGE, 64)
    assert (ours - features).abs().max().item() <= 1e-5
