"""The repos a Hub stand-in serves: files at one commit with the sizes, git oids and LFS sha256 the Hub lists, and
builders for a tiny real Llama repo and a synthetic one."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pth", ".pt")
POINTER_SIZE = 134


def git_blob_oid(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class StandinRepo:
    """A model repo at one commit; `files` maps paths (with `/` for subdirectories) to their bytes."""

    repo_id: str
    files: dict[str, bytes]
    commit: str = ""
    branches: dict[str, str] = field(default_factory=dict)
    gated: bool = False
    private: bool = False
    # Tokens whose account may read the files of a gated or private repo.
    allowed_tokens: set[str] = field(default_factory=set)
    # Sizes the listing reports instead of the real ones (a repo too large for the disk).
    listed_sizes: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.commit:
            digest = hashlib.sha1(self.repo_id.encode())
            for name in sorted(self.files):
                digest.update(name.encode() + hashlib.sha256(self.files[name]).digest())
            self.commit = digest.hexdigest()
        self.branches.setdefault("main", self.commit)

    @classmethod
    def from_directory(cls, repo_id: str, directory: Path, **kwargs: Any) -> StandinRepo:
        files = {
            path.relative_to(directory).as_posix(): path.read_bytes()
            for path in sorted(directory.rglob("*"))
            if path.is_file()
        }
        return cls(repo_id, files, **kwargs)

    def is_lfs(self, path: str) -> bool:
        return path.endswith(LFS_SUFFIXES)

    def sha256(self, path: str) -> str:
        return hashlib.sha256(self.files[path]).hexdigest()

    def listed_size(self, path: str) -> int:
        return self.listed_sizes.get(path, len(self.files[path]))

    def resolve(self, revision: str) -> str | None:
        if revision in self.branches:
            return self.branches[revision]
        return revision if revision == self.commit else None


TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def write_tiny_llama_repo(directory: Path, tokenizer_dir: Path, seed: int = 0) -> Path:
    """A 2-layer random-weight Llama with SmolLM2's vocabulary, tokenizer and chat template, its weights in two
    safetensors shards with an index, plus files serving must not fetch (README, a pickle copy of the weights, an
    `original/` copy and a `consolidated.safetensors` duplicate)."""
    import torch  # noqa: PLC0415
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415

    tokenizer = json.loads((tokenizer_dir / "tokenizer.json").read_text())
    generation = json.loads((tokenizer_dir / "generation_config.json").read_text())
    vocab_size = len(tokenizer["model"]["vocab"]) + sum(
        1 for token in tokenizer.get("added_tokens", []) if token["id"] >= len(tokenizer["model"]["vocab"])
    )
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        tie_word_embeddings=True,
        bos_token_id=generation.get("bos_token_id", 1),
        eos_token_id=generation.get("eos_token_id", 2),
        initializer_range=0.2,
    )
    model = LlamaForCausalLM(config).eval()
    directory.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(directory, max_shard_size="4MB")
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copyfile(tokenizer_dir / name, directory / name)
    (directory / "README.md").write_text("---\nlicense: apache-2.0\n---\n# tiny random Llama for Tandem's tests\n")
    (directory / ".gitattributes").write_text("*.safetensors filter=lfs diff=lfs merge=lfs -text\n")
    (directory / "original").mkdir(exist_ok=True)
    shards = sorted(directory.glob("model-*.safetensors"))
    shutil.copyfile(shards[0], directory / "original" / "model.safetensors")
    shutil.copyfile(shards[0], directory / "consolidated.safetensors")
    (directory / "pytorch_model.bin").write_bytes(b"pickle copy that serving never fetches")
    return directory


def synthetic_repo(repo_id: str, weights_size: int = 4 * 1024 * 1024, **kwargs: Any) -> StandinRepo:
    """A repo with the files resolution checks for and `weights_size` random bytes of "weights" (for download tests
    that never load the model)."""
    import random  # noqa: PLC0415

    weights = random.Random(repo_id).randbytes(weights_size)
    files = {
        "config.json": json.dumps({"model_type": "llama", "max_position_embeddings": 1024}).encode(),
        "generation_config.json": b'{"eos_token_id": 2}',
        "tokenizer.json": b'{"version": "1.0"}',
        "tokenizer_config.json": b"{}",
        "model.safetensors": weights,
        "README.md": b"# synthetic\n",
        "original/consolidated.00.pth": b"not fetched",
    }
    return StandinRepo(repo_id, files, **kwargs)
