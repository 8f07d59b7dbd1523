"""Which shards build a decode package, and what names it in the compile cache."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest
import torch
from tandem_server.bootstrap import decode_package_spec
from tandem_server.config import CompileMode, ShardConfig
from tandem_server.execution.decode_package import DecodePackageSpec, package_key, prune_cache
from tandem_server.layers.attention import create_backend
from tandem_server.quant.mode import QuantizeMode


def checkpoint(path: Path) -> Path:
    path.mkdir()
    (path / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}')
    (path / "model.safetensors").write_bytes(b"weights")
    return path


def shard_config(model_path: Path, **overrides: object) -> ShardConfig:
    config = ShardConfig(
        model_path=model_path,
        uds_path=model_path / "shard.sock",
        dtype=torch.bfloat16,
        quantize=QuantizeMode.GGUF,
        decode_mirror_memory=2**20,
        quantized_dense_memory=None,
        torch_compile=CompileMode.BACKGROUND,
        cpp_compiler="g++",
        compile_cache_dir=model_path.parent / "compiled",
    )
    return dataclasses.replace(config, **overrides)


def test_a_single_cpu_rank_on_the_decode_mirror_builds_a_package_with_its_weight_flags(tmp_path: Path) -> None:
    config = shard_config(checkpoint(tmp_path / "model"), num_threads=3)
    spec = decode_package_spec(config, create_backend("torch", decode_mirror_memory=2**20))
    assert spec == DecodePackageSpec(
        model_path=str(tmp_path / "model"),
        dtype="bfloat16",
        kv_cache_dtype="bfloat16",
        quantize="gguf",
        dense_copy_memory=None,
        packed_gemm_rows=(),
        allow_pickle_weights=False,
        num_threads=3,
        cache_dir=str(tmp_path / "compiled"),
    )
    assert DecodePackageSpec.from_json(spec.to_json()) == spec


@pytest.mark.parametrize(
    ("overrides", "mirror_memory", "backend"),
    [
        ({"torch_compile": CompileMode.OFF}, 2**20, "torch"),
        ({"torch_compile": CompileMode.WARMUP}, 2**20, "torch"),
        ({"world_size": 2}, 2**20, "torch"),
        ({}, 0, "torch"),
        ({}, 0, "sdpa"),
    ],
    ids=["compile-off", "compile-at-warmup", "two-ranks", "no-decode-mirror", "sdpa-backend"],
)
def test_other_shards_build_no_package(
    tmp_path: Path, overrides: dict[str, object], mirror_memory: int, backend: str
) -> None:
    config = shard_config(checkpoint(tmp_path / "model"), **overrides)
    assert decode_package_spec(config, create_backend(backend, decode_mirror_memory=mirror_memory)) is None


def spec_for(model_path: Path, **overrides: object) -> DecodePackageSpec:
    spec = DecodePackageSpec(
        model_path=str(model_path),
        dtype="bfloat16",
        kv_cache_dtype="bfloat16",
        quantize="gguf",
        dense_copy_memory=None,
        packed_gemm_rows=(32,),
        allow_pickle_weights=False,
        num_threads=2,
        cache_dir=str(model_path.parent / "compiled"),
    )
    return dataclasses.replace(spec, **overrides)


def test_the_package_name_follows_the_weights_and_flags_but_not_threads_or_the_cache_directory(tmp_path: Path) -> None:
    model = checkpoint(tmp_path / "model")
    spec = spec_for(model)
    key = package_key(spec)
    assert package_key(spec_for(model)) == key
    assert package_key(dataclasses.replace(spec, num_threads=7, cache_dir="/elsewhere")) == key
    for changed in (
        {"dtype": "float32"},
        {"kv_cache_dtype": "float32"},
        {"quantize": "none"},
        {"dense_copy_memory": 0},
        {"packed_gemm_rows": ()},
    ):
        assert package_key(dataclasses.replace(spec, **changed)) != key, changed
    # A rewritten weight file (another size or time) names another package.
    weights = model / "model.safetensors"
    weights.write_bytes(b"other weights")
    os.utime(weights, ns=(1, 1))
    assert package_key(spec) != key
    assert spec.package_path().parent == tmp_path / "compiled"


def test_a_used_package_is_kept_with_the_most_recently_used_others_and_the_rest_are_removed(tmp_path: Path) -> None:
    packages = [tmp_path / f"decode-{index}.pt2" for index in range(6)]
    for age, package in enumerate(packages):
        package.write_bytes(b"package")
        package.with_suffix(".log").write_text("log")
        os.utime(package, ns=(age, age))
    unrelated = tmp_path / "notes.txt"
    unrelated.write_text("kept")
    # The oldest package is the one loaded now: it becomes the most recently used.
    removed = prune_cache(packages[0], keep=2)
    assert sorted(removed) == sorted(packages[1:4])
    assert sorted(tmp_path.glob("decode-*.pt2")) == sorted([packages[0], packages[4], packages[5]])
    assert not packages[1].with_suffix(".log").exists() and packages[5].with_suffix(".log").exists()
    assert unrelated.exists()
