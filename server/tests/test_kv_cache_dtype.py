"""`--kv-cache-dtype`: a bfloat16 cache under a float32 model holds twice the tokens and attends close to float32."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from shard_testing import make_runner, staggered_decodes, warmed, write_tiny_llama
from tandem_server.cli import config_from_args
from tandem_server.config import resolve_kv_cache_dtype
from tandem_server.errors import ConfigError
from tandem_server.interfaces.attention_registry import FLASH_ATTN_4, TRITON
from tandem_server.layers.attention.selection import AttentionNeeds, ProbedPackages, select_backend

KV_MEMORY = 1 << 20


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    write_tiny_llama(path)
    return path


def test_a_bfloat16_cache_under_a_float32_model_holds_twice_the_blocks(checkpoint: Path) -> None:
    full = warmed(make_runner(checkpoint, KV_MEMORY))
    half = warmed(make_runner(checkpoint, KV_MEMORY, kv_cache_dtype=torch.bfloat16))
    assert full.cache is not None and half.cache is not None
    assert {layer.key.dtype for layer in half.cache.layers} == {torch.bfloat16}
    assert {layer.value.dtype for layer in full.cache.layers} == {torch.float32}
    assert next(half.model.parameters()).dtype == torch.float32
    # Each runner keeps one reserved block beyond those it reports.
    assert half.cache.num_blocks + 1 == 2 * (full.cache.num_blocks + 1)
    assert half.cache.nbytes == full.cache.nbytes


@pytest.mark.parametrize("mirror_memory", [KV_MEMORY // 2, 0], ids=["mirror", "gather"])
def test_attention_over_a_bfloat16_cache_stays_within_bfloat16_rounding_of_float32(
    checkpoint: Path, mirror_memory: int
) -> None:
    half = warmed(make_runner(checkpoint, KV_MEMORY, mirror_memory, kv_cache_dtype=torch.bfloat16))
    full = warmed(make_runner(checkpoint, KV_MEMORY, mirror_memory))
    half_tokens, half_logits = staggered_decodes(half)
    full_tokens, full_logits = staggered_decodes(full)
    assert half_tokens == full_tokens
    assert len(half_logits) == len(full_logits)
    for got, want in zip(half_logits, full_logits, strict=True):
        assert got.dtype == torch.float32
        # bfloat16 keeps 8 significant bits (0.4 % per value); through this random model's layers the logits, up to
        # 5.4 in size, moved by at most 0.11. A wrong key or value would move them by whole units.
        torch.testing.assert_close(got, want, atol=0.25, rtol=0)
    differs = any(not torch.equal(got, want) for got, want in zip(half_logits, full_logits, strict=True))
    assert differs, "the bfloat16 cache changed nothing: it was not used"


def test_kv_cache_dtype_flag_defaults_to_the_model_dtype() -> None:
    base = ["--model-path", "m", "--uds-path", "s", "--dtype", "float32"]
    default = config_from_args(base)
    assert default.kv_cache_dtype is None and default.cache_dtype == torch.float32
    half = config_from_args([*base, "--kv-cache-dtype", "bfloat16"])
    assert half.kv_cache_dtype == torch.bfloat16 and half.cache_dtype == torch.bfloat16
    assert half.dtype == torch.float32
    with pytest.raises(SystemExit):
        config_from_args([*base, "--kv-cache-dtype", "fp8"])
    with pytest.raises(ConfigError, match="unknown KV cache dtype 'fp8'"):
        resolve_kv_cache_dtype("fp8")


def test_a_cache_dtype_other_than_the_models_needs_the_torch_backend() -> None:
    packages = ProbedPackages({"flash": FLASH_ATTN_4, "triton": TRITON})
    needs = AttentionNeeds("cuda", torch.bfloat16, 64, kv_cache_dtype=torch.float16)
    choice = select_backend("auto", needs, packages)
    assert choice.name == "torch"
    assert [name for name, _ in choice.skipped] == ["flash", "triton", "sdpa"]
    assert all("--kv-cache-dtype" in reason for _, reason in choice.skipped)
    with pytest.raises(ConfigError, match=r"--attention-backend flash is unavailable: .*--kv-cache-dtype"):
        select_backend("flash", needs, packages)
    same = AttentionNeeds("cuda", torch.bfloat16, 64, kv_cache_dtype=torch.bfloat16, block_size=128)
    assert select_backend("auto", same, packages).name == "flash"
