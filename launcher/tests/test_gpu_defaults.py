"""Defaults derived from the GPUs (device, shard count) and the CUDA flags passed to every shard."""

from __future__ import annotations

from pathlib import Path

import pytest
from tandem_launcher.cli import parse_config
from tandem_launcher.commands import shard_argv
from tandem_launcher.config import ChildCommands, LauncherConfig
from tandem_launcher.gpus import resolve_device, resolve_num_shard
from tandem_launcher.model_resolution import ResolvedModel

COMMANDS = ChildCommands(shard=("shard-bin",), router=("router-bin",))


def gpus(count: int):
    return lambda: count


def test_auto_device_is_cuda_exactly_when_a_gpu_is_visible() -> None:
    assert resolve_device("auto", gpus(2)) == "cuda"
    assert resolve_device("auto", gpus(0)) == "cpu"
    assert resolve_device("cpu", gpus(8)) == "cpu"


def test_unset_num_shard_is_one_per_gpu_on_cuda_and_one_on_cpu() -> None:
    assert resolve_num_shard(None, "cuda", gpus(4)) == 4
    assert resolve_num_shard(None, "cpu", gpus(4)) == 1
    assert resolve_num_shard(2, "cuda", gpus(8)) == 2


def test_parse_config_derives_device_and_shards_from_gpus_unless_set() -> None:
    on_gpu_machine = parse_config([], {}, count_gpus=gpus(8))
    assert (on_gpu_machine.device, on_gpu_machine.num_shard) == ("cuda", 8)
    explicit = parse_config(["--num-shard", "2"], {"DEVICE": "cuda"}, count_gpus=gpus(8))
    assert (explicit.device, explicit.num_shard) == ("cuda", 2)
    on_cpu_machine = parse_config([], {}, count_gpus=gpus(0))
    assert (on_cpu_machine.device, on_cpu_machine.num_shard) == ("cpu", 1)


def test_cpu_machine_never_counts_gpus_when_device_is_cpu() -> None:
    def forbidden() -> int:
        raise AssertionError("GPUs must not be counted for --device cpu --num-shard 1")

    config = parse_config(["--device", "cpu", "--num-shard", "1"], {}, count_gpus=forbidden)
    assert config.device == "cpu"


def test_cuda_flags_reach_the_shard_with_auto_for_the_shard_to_resolve() -> None:
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    cuda = parse_config(["--attention-backend", "triton", "--cuda-memory-fraction", "0.8"], {}, count_gpus=gpus(1))
    argv = shard_argv(LauncherConfig(**{**cuda.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
    assert argv[argv.index("--attention-backend") + 1] == "triton"
    assert argv[argv.index("--cuda-memory-fraction") + 1] == "0.8"
    # The shard resolves each by its device (tandem_server/device_defaults.py, weight_defaults.py).
    for flag in ("--cuda-graphs", "--packed-gemm-rows", "--decode-mirror-memory", "--quantized-dense-memory"):
        assert argv[argv.index(flag) + 1] == "auto"
    from_env = parse_config([], {"CUDA_GRAPHS": "1, 8", "ATTENTION_BACKEND": "sdpa"}, count_gpus=gpus(1))
    argv = shard_argv(LauncherConfig(**{**from_env.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
    assert argv[argv.index("--cuda-graphs") + 1] == "1,8"
    assert argv[argv.index("--attention-backend") + 1] == "sdpa"


def test_packed_gemm_rows_reach_the_cpu_shard_from_flag_and_environment() -> None:
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    for argv, env, expected in (
        (["--packed-gemm-rows", "16, 32"], {}, "16,32"),
        ([], {"PACKED_GEMM_ROWS": "0"}, "0"),
    ):
        config = parse_config(["--device", "cpu", *argv], env, count_gpus=gpus(0))
        shard = shard_argv(LauncherConfig(**{**config.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
        assert shard[shard.index("--packed-gemm-rows") + 1] == expected


def test_decode_mirror_memory_is_the_shards_default_on_cpu_unless_given() -> None:
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    for argv, env, expected in (
        (["--kv-cache-memory", "6GiB"], {}, "auto"),
        (["--kv-cache-memory", "6GiB", "--decode-mirror-memory", "2GiB"], {}, "2GiB"),
        ([], {"DECODE_MIRROR_MEMORY": "0"}, "0"),
    ):
        config = parse_config(["--device", "cpu", *argv], env, count_gpus=gpus(0))
        shard = shard_argv(LauncherConfig(**{**config.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
        assert shard[shard.index("--decode-mirror-memory") + 1] == expected


def test_torch_compile_reaches_the_shard_only_when_asked_by_flag_or_env() -> None:
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    for argv, env, expected in (
        ([], {}, None),
        (["--torch-compile"], {}, "warmup"),
        (["--torch-compile", "background"], {}, "background"),
        (["--torch-compile", "off"], {"TORCH_COMPILE": "true"}, "off"),
        ([], {"TORCH_COMPILE": "true"}, "warmup"),
        ([], {"TORCH_COMPILE": "false"}, "off"),
        ([], {"TORCH_COMPILE": "Background"}, "background"),
    ):
        config = parse_config(["--device", "cpu", *argv], env, count_gpus=gpus(0))
        shard = shard_argv(LauncherConfig(**{**config.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
        given = shard[shard.index("--torch-compile") + 1] if "--torch-compile" in shard else None
        assert given == expected, (argv, env)


def test_an_unknown_compile_mode_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config(["--torch-compile", "sometimes"], {}, count_gpus=gpus(0))
    assert "not one of auto, off, warmup, background" in capsys.readouterr().err


def test_any_spelling_of_zero_turns_the_decode_mirror_off_on_cuda() -> None:
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    for zero in ("0", "0GiB", "0.0 MB"):
        config = parse_config(["--device", "cuda", "--decode-mirror-memory", zero], {}, count_gpus=gpus(1))
        shard = shard_argv(LauncherConfig(**{**config.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
        assert shard[shard.index("--decode-mirror-memory") + 1] == zero


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--cuda-memory-fraction", "1.5"], "--cuda-memory-fraction must be in (0, 1]"),
        (["--cuda-memory-fraction", "0"], "--cuda-memory-fraction must be in (0, 1]"),
        (["--cuda-graphs", "1,x"], "--cuda-graphs must be batch sizes"),
        (["--device", "cpu", "--cuda-graphs", "1,2"], "--cuda-graphs needs --device cuda"),
        (["--packed-gemm-rows", "32,x"], "--packed-gemm-rows must be row counts"),
        (["--device", "cuda", "--packed-gemm-rows", "32"], "--packed-gemm-rows is a CPU option"),
        (["--device", "cuda", "--decode-mirror-memory", "1GiB"], "--decode-mirror-memory is a CPU option"),
        (["--device", "cuda", "--quantize", "int8"], "--quantize int8 is a CPU option; on CUDA use none, int4 or fp8"),
        (["--decode-mirror-memory", "lots"], "--decode-mirror-memory"),
        (["--device", "cuda", "--quantized-dense-memory", "1GiB"], "--quantized-dense-memory is a CPU option"),
        (["--quantized-dense-memory", "lots"], "--quantized-dense-memory"),
        (["--attention-backend", "flashy"], "invalid choice"),
        (["--device", "cuda", "--torch-compile"], "--torch-compile is a CPU option"),
        (["--device", "cuda", "--torch-compile", "background"], "--torch-compile is a CPU option"),
    ],
)
def test_bad_cuda_flags_are_rejected_with_the_flag_named(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        parse_config(argv, {}, count_gpus=gpus(0))
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("quantize", ["fp8", "int4"])
def test_fp8_and_int4_weights_are_allowed_on_cuda(quantize: str) -> None:
    model = ResolvedModel(path=Path("/models/m"), served_name="m", max_position_embeddings=None)
    config = parse_config(["--device", "cuda", "--quantize", quantize], {}, count_gpus=gpus(1))
    shard = shard_argv(LauncherConfig(**{**config.__dict__, "commands": COMMANDS}), model, 0, Path("/s"), 1)
    assert shard[shard.index("--quantize") + 1] == quantize


def test_env_attention_backend_is_validated_like_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_config([], {"ATTENTION_BACKEND": "flashy"}, count_gpus=gpus(0))
    assert "--attention-backend must be one of auto, torch, sdpa, triton, flash" in capsys.readouterr().err
